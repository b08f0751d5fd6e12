"""Replay layouts compared in one run: one transition per Reverb item against G per item.

Learner: quick-preset D4PG learners (its `updates_per_call`, one op thread as the launch
gives a one-replica learner of features; both settable) fed from a fixed in-memory batch
and from Reverb with each layout, updates/s. Actor: raw unwrapped `env.step` and one
actor process at K=1 and K=16 environments with each layout, steps/s. Replay servers run
in their own processes (prefilled for the learners; `samples_per_insert` 0, so neither
side waits for the other). Every configuration runs in each of --rounds rounds, in an
order rotated per round; figures are medians over rounds and ratios are taken within the
run. Both wall-clock rates and rates per second of process CPU time (every thread of the
measuring process, Reverb's included) are kept. The 1-minute load average is kept per
round; above 2 (the cores) the run is noisy and only the CPU-time ratios mean something.

Usage: python benchmarks/agents_replay_layout.py [--groups 16 --rounds 5]
       [--updates-per-call K --intra-op-threads T]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common, benchmarks.

from agents_actor_throughput import batched_runner, raw_runner, single_runner
from agents_common import (
    ReplayServerProcess,
    fill_random_episodes,
    fixed_batch_input_fn,
    rotated,
    write_result,
)

TASK = "cartpole:swingup"


def _rounds(measure, names: list[str], rounds: int, loads: list, label: str) -> tuple:
    """`measure(name)` -> (per s wall, per CPU second) for each name, in rotated order per
    round; returns the rounds ({name: [wall...]}, {name: [cpu...]}), loads appended."""
    wall: dict = {name: [] for name in names}
    cpu: dict = {name: [] for name in names}
    for r in range(rounds):
        for name in rotated(names, r):
            w, c = measure(name)
            wall[name].append(w)
            cpu[name].append(c)
        loads.append(os.getloadavg()[0])
        print(
            f"{label} round {r}: "
            + ", ".join(f"{n} {wall[n][-1]:.0f}/s" for n in names)
            + f"; load {loads[-1]:.2f}",
            flush=True,
        )
    return wall, cpu


def _rate(fn, units_per_call: int, seconds: float, probe: float) -> tuple[float, float]:
    """(units/s wall, units per process-CPU second) of `fn` over about `seconds`."""
    calls = max(3, int(seconds / probe))
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    units = calls * units_per_call
    return units / (time.perf_counter() - wall), units / max(time.process_time() - cpu, 1e-9)


def learner_rounds(configs: dict, args, loads: list) -> dict:
    import environments
    import replication
    from agents.d4pg.learning import D4PGLearner, reverb_input_fn

    spec = environments.make_environment_spec(environments.make(TASK, seed=0))
    obs_dim, act_dim = spec.observations.shape[0], spec.actions.shape[0]
    repl = replication.make("cpu")

    servers = {}
    try:
        base = configs["g1"]
        fixed = fixed_batch_input_fn(base, obs_dim, act_dim)
        learners = {"fixed": D4PGLearner(base, spec, repl, fixed)}
        for name, config in configs.items():
            servers[name] = ReplayServerProcess(config, TASK)
            fill_random_episodes(config, servers[name].address, TASK, args.fill_episodes)
            learners[f"reverb_{name}"] = D4PGLearner(
                config, spec, repl, reverb_input_fn(servers[name].address, config, env_spec=spec)
            )
        for learner in learners.values():  # Compile and warm the pipelines.
            for _ in range(5):
                learner.step()
        start = time.perf_counter()
        learners["fixed"].step()
        probe = max(time.perf_counter() - start, 1e-3)
        wall, cpu = _rounds(
            lambda name: _rate(learners[name].step, args.updates_per_call, args.seconds, probe),
            list(learners),
            args.rounds,
            loads,
            "learner",
        )
    finally:
        for server in servers.values():
            server.close()
    median = {n: statistics.median(v) for n, v in wall.items()}
    return {
        "updates_per_second_rounds": wall,
        "updates_per_cpu_second_rounds": cpu,
        "median_updates_per_second": median,
        "median_updates_per_cpu_second": {n: statistics.median(v) for n, v in cpu.items()},
        "reverb_over_fixed": {n: median[n] / median["fixed"] for n in median if n != "fixed"},
    }


def actor_rounds(configs: dict, args, loads: list) -> dict:
    import reverb

    import environments
    from agents.d4pg import networks, variables

    spec = environments.make_environment_spec(environments.make(TASK, seed=0))
    domain, task = TASK.split(":")
    servers = {}
    runners = {"raw": raw_runner(domain, task)}
    try:
        for name, config in configs.items():
            server = servers[name] = ReplayServerProcess(config, TASK)
            nets = networks.make_networks(config, spec)
            variables.publish(
                reverb.Client(server.address), 0, [v.numpy() for v in nets.acting_variables()]
            )
            runners[f"{name}_k1"], _ = single_runner(config, spec, server.address)
            runners[f"{name}_k16"], _ = batched_runner(config, spec, server.address, 16)
        for run in runners.values():  # Warm-up: first pull, writer setup, caches.
            run(512)

        def measure(name: str) -> tuple[float, float]:
            w0, c0 = time.perf_counter(), time.process_time()
            done = runners[name](args.actor_steps)
            return done / (time.perf_counter() - w0), done / max(time.process_time() - c0, 1e-9)

        wall, cpu = _rounds(measure, list(runners), args.rounds, loads, "actor")
    finally:
        for server in servers.values():
            server.close()
    median = {n: statistics.median(v) for n, v in wall.items()}
    median_cpu = {n: statistics.median(v) for n, v in cpu.items()}
    return {
        "steps_per_second_rounds": wall,
        "steps_per_cpu_second_rounds": cpu,
        "median_steps_per_second": median,
        "median_steps_per_cpu_second": median_cpu,
        "actor_over_raw_wall": {n: median[n] / median["raw"] for n in median if n != "raw"},
        "actor_over_raw_process_cpu": {
            n: median_cpu[n] / median_cpu["raw"] for n in median_cpu if n != "raw"
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="16", help="transitions per item to set beside 1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="per learner measurement")
    parser.add_argument("--actor-steps", type=int, default=4096, help="per actor measurement")
    parser.add_argument("--fill-episodes", type=int, default=20, help="prefill per layout")
    parser.add_argument("--parts", default="learner,actor")
    parser.add_argument(
        "--updates-per-call", type=int, default=None, help="default: the quick preset's"
    )
    parser.add_argument(
        "--intra-op-threads",
        type=int,
        default=1,
        help="threads per TensorFlow op (1: as the launch's learner of features; 0: TF's)",
    )
    args = parser.parse_args()

    import tensorflow as tf

    from agents.d4pg.config import D4PGConfig
    from launch.d4pg.program import PRESETS

    if args.intra_op_threads:  # Before TensorFlow runs anything in this process.
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    quick = D4PGConfig.from_overrides(PRESETS["quick"])
    args.updates_per_call = args.updates_per_call or quick.updates_per_call
    groups = [1] + [int(g) for g in args.groups.split(",")]
    configs = {
        f"g{g}": D4PGConfig.from_overrides(
            {
                "samples_per_insert": 0,
                "min_replay_size": 1000,
                "updates_per_call": args.updates_per_call,
                "transitions_per_item": g,
            },
            base=quick,
        )
        for g in groups
    }
    loads = [os.getloadavg()[0]]
    result: dict = {
        "task": TASK,
        "preset": "quick",
        "batch_size": quick.batch_size,
        "updates_per_call": args.updates_per_call,
        "intra_op_threads": args.intra_op_threads,
        "transitions_per_item": groups,
        "item_pool_size": quick.item_pool_size,
        "rounds": args.rounds,
    }
    parts = args.parts.split(",")
    if "learner" in parts:
        result["learner"] = learner_rounds(configs, args, loads)
        for name, ratio in result["learner"]["reverb_over_fixed"].items():
            print(f"learner {name}: {ratio:.2f} x fixed batch (target >= 0.9)")
    if "actor" in parts:
        result["actor"] = actor_rounds(configs, args, loads)
        for name, ratio in result["actor"]["actor_over_raw_wall"].items():
            cpu = result["actor"]["actor_over_raw_process_cpu"][name]
            print(
                f"actor {name}: {ratio:.2f} x raw env.step (wall), {cpu:.2f} (process CPU "
                "time; K=16 target >= 0.8)"
            )
    noisy = max(loads) > 2
    if noisy:
        # With more runnable threads than cores, a wall-clock rate measures how much CPU
        # the scheduler gave each block, not the code: only the CPU-time ratios mean
        # something (the README's table then checks the target on those).
        print(
            f"NOISY: load reached {max(loads):.2f} on {os.cpu_count()} cores: read the "
            "process-CPU ratios, not the wall ones"
        )
    write_result(
        "agents_replay_layout",
        {
            **result,
            "targets": {
                "learner_reverb_over_fixed": 0.9,
                "actor_k16_over_raw_wall": 0.8,
                "actor_k16_over_raw_process_cpu": 0.8,  # Checked instead when noisy.
            },
            "load_average_1min_per_round": loads,
            "noisy": noisy,
            "command": "python benchmarks/agents_replay_layout.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
