"""D4PG learner updates/s with K updates per compiled call, and its per-update overhead.

For each network size ("quick": policy 64-64, critic 128-128, batch 64; "paper": the
published 256x3 / 512-512-256, batch 256) and each K in --ks, measures:

  * "fixed": updates/s on in-memory batches (the update alone);
  * "reverb": updates/s sampling from a prefilled Reverb server in another process (the
    learner as deployed: sampling, padded batch, n-step return map, host copies);
  * a breakdown of one update: the input pipeline alone (batches/s pulled through the
    distributed iterator, K per call), the XLA forward/backward alone (`_compute` on one
    batch), and the rest (optimiser, target copy, counters, metrics) by difference.

FLOPs per update are counted analytically (matrix multiplies only, 2 per multiply-add;
layer norms, activations and Adam ignored), and the machine's float32 matmul rate is
measured in the same run (tf.matmul of 2048^2 matrices, best of 3). The per-update
overhead is (measured seconds per update) - FLOPs / (matmul FLOP/s): time that is not
arithmetic. Configurations are measured in rotated order over --rounds rounds and the
medians reported; the load average is recorded (noisy when it exceeded 2).

Usage: python benchmarks/agents_learner.py [--sizes quick,paper --ks 1,4,16 --rounds 3]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

from agents_common import (
    ReplayServerProcess,
    fill_random_episodes,
    fixed_batch_input_fn,
    rotated,
    write_result,
)

TASK = "cartpole:swingup"
SIZES = {
    "quick": {"policy_layers": "64,64", "critic_layers": "128,128", "batch_size": 64},
    "paper": {},
}


def _matmul_flops(sizes: list[int]) -> tuple[int, int]:
    """(forward FLOPs, FLOPs of the first layer) of an MLP with layer sizes [in, ..., out]."""
    layers = list(itertools.pairwise(sizes))
    return sum(2 * a * b for a, b in layers), 2 * sizes[0] * sizes[1]


def flops_per_update(config, obs_dim: int, act_dim: int) -> dict:
    """Analytic matmul FLOPs of one D4PG update (features torso), per the learner's graph.

    critic loss: online critic forward, target policy + target critic forward, critic
      backward (weight gradients of every layer, input gradients of all but the first);
    policy loss: policy forward, critic forward at pi(o), backward through the critic to
      the action (input gradients of every critic layer) and through the policy (weight
      gradients, input gradients of all but the first layer).
    """
    critic, critic_first = _matmul_flops(
        [obs_dim + act_dim, *config.critic_layers, config.num_atoms]
    )
    policy, policy_first = _matmul_flops([obs_dim, *config.policy_layers, act_dim])
    per_sample = (
        critic  # online critic forward
        + policy
        + critic  # target policy, target critic forward
        + critic
        + (critic - critic_first)  # critic backward
        + policy
        + critic  # policy forward, critic at pi(o)
        + critic  # critic input gradients down to the action
        + policy
        + (policy - policy_first)  # policy backward
    )
    return {"per_sample": per_sample, "per_update": per_sample * config.batch_size}


def measured_matmul_flops(n: int = 2048, repeats: int = 10) -> float:
    import tensorflow as tf

    a = tf.random.normal((n, n))
    b = tf.random.normal((n, n))

    @tf.function
    def run():
        c = a
        for _ in range(repeats):
            c = tf.matmul(c, b) * 1e-3  # Scaled to stay finite; the scale is negligible work.
        return c

    run().numpy()
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        run().numpy()
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start))
    return best


def _timed(fn, calls: int) -> float:
    """Seconds per call of `fn` (after 2 warm-up calls)."""
    for _ in range(2):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def _cpu_and_wall(fn, calls: int) -> tuple[float, float]:
    """(wall seconds, process CPU seconds of all threads) per call of `fn`."""
    for _ in range(2):
        fn()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - wall) / calls, (time.process_time() - cpu) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="quick,paper")
    parser.add_argument("--ks", default="1,4,16", help="updates per call to compare")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per measurement (about)")
    parser.add_argument("--replication", default="cpu")
    args = parser.parse_args()

    import replication

    repl = replication.make(args.replication)
    import tensorflow as tf

    import environments
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.learning import D4PGLearner, reverb_input_fn

    ks = [int(k) for k in args.ks.split(",")]
    if 1 not in ks:
        parser.error("--ks must include 1: the speedups and the breakdown are relative to K=1")
    env = environments.make(TASK, seed=0)
    spec = environments.make_environment_spec(env)
    obs_dim, act_dim = spec.observations.shape[0], spec.actions.shape[0]
    peak = measured_matmul_flops()
    loads = [os.getloadavg()[0]]
    results: dict = {}

    base = D4PGConfig.from_overrides({"samples_per_insert": 0, "min_replay_size": 1000})
    with ReplayServerProcess(base, TASK) as server:
        # 20 episodes of random actions (20k transitions) in the default layout's items.
        fill_random_episodes(base, server.address, TASK, 20)

        for size in args.sizes.split(","):
            overrides = {**SIZES[size], "samples_per_insert": 0, "min_replay_size": 1000}

            def fixed_input_fn(ctx, config):
                return fixed_batch_input_fn(config, obs_dim, act_dim, seed=0)(ctx)

            learners = {}
            for k in ks:
                config = D4PGConfig.from_overrides({**overrides, "updates_per_call": k})
                learners[("fixed", k)] = D4PGLearner(
                    config, spec, repl, lambda ctx, c=config: fixed_input_fn(ctx, c)
                )
                learners[("reverb", k)] = D4PGLearner(
                    config, spec, repl, reverb_input_fn(server.address, config, env_spec=spec)
                )
            config = D4PGConfig.from_overrides({**overrides, "updates_per_call": 1})
            flops = flops_per_update(config, obs_dim, act_dim)
            flop_seconds = flops["per_update"] / peak
            # Rough call counts so that each measurement takes about --seconds.
            probe = _timed(learners[("fixed", 1)].step, 5)
            # The breakdown pieces, on the K=1 learners.
            one = learners[("reverb", 1)]
            batch = next(iter(repl.distribute(lambda ctx, c=config: fixed_input_fn(ctx, c))))
            compute = tf.function(lambda b, one=one: repl.run(one._compute, b))
            iterator = iter(repl.distribute(reverb_input_fn(server.address, config, env_spec=spec)))
            pull = tf.function(lambda it: repl.run(lambda b: tf.reduce_sum(b.reward), next(it)))

            rates = {key: [] for key in learners}
            cpu = {key: [] for key in learners}
            breakdown = {"input_pipeline": [], "forward_backward": []}
            keys = list(learners)
            for r in range(args.rounds):
                for key in rotated(keys, r):
                    calls = max(3, int(args.seconds / (probe * key[1])))
                    wall, cpu_s = _cpu_and_wall(learners[key].step, calls)
                    rates[key].append(key[1] / wall)
                    cpu[key].append(cpu_s / key[1])
                calls = max(3, int(args.seconds / probe))
                breakdown["input_pipeline"].append(_timed(lambda p=pull, it=iterator: p(it), calls))
                breakdown["forward_backward"].append(_timed(lambda f=compute, b=batch: f(b), calls))
                loads.append(os.getloadavg()[0])
                print(
                    f"{size} round {r}: "
                    + ", ".join(f"{s} K={k} {rates[(s, k)][-1]:.0f}/s" for s, k in keys),
                    flush=True,
                )
            median = {f"{s}_k{k}": statistics.median(v) for (s, k), v in rates.items()}
            fixed_1 = median["fixed_k1"]
            seconds_fixed = {k: 1 / median[f"fixed_k{k}"] for k in ks}
            seconds_reverb = {k: 1 / median[f"reverb_k{k}"] for k in ks}
            input_s = statistics.median(breakdown["input_pipeline"])
            compute_s = statistics.median(breakdown["forward_backward"])
            results[size] = {
                "policy_layers": list(config.policy_layers),
                "critic_layers": list(config.critic_layers),
                "batch_size": config.batch_size,
                "flops_per_update": flops["per_update"],
                "flop_seconds_per_update": flop_seconds,
                "updates_per_second_median": median,
                "updates_per_second_rounds": {f"{s}_k{k}": v for (s, k), v in rates.items()},
                "cpu_seconds_per_update_median": {
                    f"{s}_k{k}": statistics.median(v) for (s, k), v in cpu.items()
                },
                "speedup_fixed_over_k1": {k: median[f"fixed_k{k}"] / fixed_1 for k in ks},
                "speedup_reverb_over_k1": {
                    k: median[f"reverb_k{k}"] / median["reverb_k1"] for k in ks
                },
                "overhead_seconds_per_update_fixed": {
                    k: seconds_fixed[k] - flop_seconds for k in ks
                },
                "overhead_over_flop_time_fixed": {
                    k: (seconds_fixed[k] - flop_seconds) / flop_seconds for k in ks
                },
                "overhead_over_flop_time_reverb": {
                    k: (seconds_reverb[k] - flop_seconds) / flop_seconds for k in ks
                },
                "breakdown_seconds_k1": {
                    "input_pipeline_per_batch": input_s,
                    "forward_backward_xla_call": compute_s,
                    "update_fixed_batch": seconds_fixed[1],
                    "rest_of_update_by_difference": seconds_fixed[1] - compute_s,
                    "flop_time": flop_seconds,
                    "note": "input_pipeline runs concurrently with updates (prefetch), so the "
                    "reverb rate is bounded by max(update, input) rather than their sum.",
                },
                "breakdown_rounds": breakdown,
            }
            print(
                f"{size}: FLOP time {flop_seconds * 1e3:.2f} ms/update; "
                + "; ".join(
                    f"K={k}: fixed {median[f'fixed_k{k}']:.0f}/s "
                    f"(x{median[f'fixed_k{k}'] / fixed_1:.2f}), reverb "
                    f"{median[f'reverb_k{k}']:.0f}/s, overhead/FLOP "
                    f"{(seconds_fixed[k] - flop_seconds) / flop_seconds:.2f}"
                    for k in ks
                )
                + f"; input {input_s * 1e3:.2f} ms/batch, fwd/bwd {compute_s * 1e3:.2f} ms",
                flush=True,
            )

    max_load = max(loads)
    write_result(
        "agents_learner",
        {
            "task": TASK,
            "replication": args.replication,
            "ks": ks,
            "rounds": args.rounds,
            "jit_compile": base.jit_compile,
            "matmul_peak_flops_per_second": peak,
            "sizes": results,
            "load_average_1min_per_round": loads,
            "noisy": max_load > 2,
            "targets": {"quick_fixed_speedup_k_over_k1": 3, "paper_overhead_over_flop_time": 0.5},
            "command": "python benchmarks/agents_learner.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
