"""D4PG learner update steps/s at batch 256 (default networks) and its FLOP efficiency.

FLOPs per update are counted analytically (matrix multiplies only, 2 FLOPs per
multiply-add; layer norms, activations and Adam are ignored, so the fraction is a lower
bound of the useful arithmetic). The machine's float32 matmul rate is measured in the
same run with tf.matmul of large square matrices. Two rates are reported:

  * "fixed batch": the update alone, on an in-memory batch (what the FLOP fraction uses);
  * "reverb": the same learner sampling its batches from a Reverb replay (prefilled,
    no rate limiting), i.e. the learner as deployed, input pipeline included.

Usage: .venv/bin/python benchmarks/agents_learner.py [--steps 100 --replication cpu]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

import itertools

import numpy as np
from agents_common import write_result

TASK = "cartpole:swingup"


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
        + (policy - policy_first)
    )  # policy backward
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


def steps_per_second(learner, steps: int) -> float:
    for _ in range(5):
        learner.step()
    start = time.perf_counter()
    for _ in range(steps):
        learner.step()
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--replication", default="cpu")
    args = parser.parse_args()

    import replication

    repl = replication.make(args.replication)
    import reverb
    import tensorflow as tf

    import environments
    from agents.d4pg import builder
    from agents.d4pg.adders import NStepTransitionAdder
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.learning import D4PGLearner, Transition

    config = D4PGConfig.from_overrides({"samples_per_insert": 0, "min_replay_size": 1000})
    env = environments.make(TASK, seed=0)
    spec = environments.make_environment_spec(env)
    obs_dim, act_dim = spec.observations.shape[0], spec.actions.shape[0]
    flops = flops_per_update(config, obs_dim, act_dim)

    rng = np.random.default_rng(0)

    def fixed_input_fn(ctx):
        b = ctx.get_per_replica_batch_size(config.batch_size)
        data = Transition(
            rng.normal(size=(b, obs_dim)).astype(np.float32),
            rng.uniform(-1, 1, (b, act_dim)).astype(np.float32),
            rng.normal(size=b).astype(np.float32),
            np.full(b, 0.95, np.float32),
            rng.normal(size=(b, obs_dim)).astype(np.float32),
        )
        return tf.data.Dataset.from_tensors(data).repeat()

    peak_before = measured_matmul_flops()
    learner = D4PGLearner(config, spec, repl, fixed_input_fn)
    fixed_rate = steps_per_second(learner, args.steps)
    print(f"fixed batch: {fixed_rate:.1f} updates/s", flush=True)

    server = builder.make_replay_server(config, spec)
    address = f"localhost:{server.port}"
    adder = NStepTransitionAdder(reverb.Client(address), config.n_step, spec.actions.shape)
    for _ in range(20):  # 20 episodes of random actions: 20k items.
        timestep = env.reset()
        adder.add_first(timestep)
        while not timestep.last():
            action = rng.uniform(-1, 1, spec.actions.shape).astype(np.float32)
            timestep = env.step(action)
            adder.add(action, timestep)
    reverb_learner = builder.make_learner(config, spec, address, repl, None)
    reverb_rate = steps_per_second(reverb_learner, args.steps)
    server.stop()
    print(f"reverb: {reverb_rate:.1f} updates/s", flush=True)

    # The best of the measurements before and after: on a shared machine both are noisy.
    peak = max(peak_before, measured_matmul_flops())
    fraction = fixed_rate * flops["per_update"] / peak
    print(
        f"FLOPs/update {flops['per_update'] / 1e9:.3f} GFLOP; achieved "
        f"{fixed_rate * flops['per_update'] / 1e9:.1f} GFLOP/s; tf.matmul peak "
        f"{peak / 1e9:.1f} GFLOP/s; fraction {fraction:.2f} (aim >= 0.3)"
    )
    write_result(
        "agents_learner",
        {
            "task": TASK,
            "replication": args.replication,
            "batch_size": config.batch_size,
            "policy_layers": list(config.policy_layers),
            "critic_layers": list(config.critic_layers),
            "num_atoms": config.num_atoms,
            "jit_compile": config.jit_compile,
            "updates_per_second_fixed_batch": fixed_rate,
            "updates_per_second_reverb": reverb_rate,
            "flops_per_update": flops["per_update"],
            "flops_per_sample": flops["per_sample"],
            "matmul_peak_flops_per_second": peak,
            "achieved_flops_per_second": fixed_rate * flops["per_update"],
            "fraction_of_matmul_peak": fraction,
            "aim": 0.3,
            "command": "python benchmarks/agents_learner.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
