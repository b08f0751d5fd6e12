"""One actor's steps/s over raw dm-control env.step of the unwrapped task, for K = 1, 4, 16.

"raw" is `dm_control.suite.load(domain, task).step(zero_action)`: the physics and the
task's reward/observation code, nothing of ours. "actor K" is one process doing what a
distributed D4PG actor with `--envs-per-actor K` does: K environments as the agent sees
them (`environments.make`), the numpy policy (preset sizes) called once per step for all
K, Gaussian noise, one n-step adder per environment into a real Reverb server running in
another process, and weight pulls from its "params" table. K = 1 is the single actor
(`D4PGActor`), as deployed without the flag.

Both wall-clock steps/s and steps per second of process CPU time (`time.process_time`:
every thread of this process, including Reverb's writer and gRPC threads) are reported.
Blocks of --steps environment steps of each configuration run in rotated order over
--rounds rounds; the result is the ratio of the medians. The 1-minute load average is
recorded per round; with more than 2 (the core count) the result is marked noisy.

Usage: python benchmarks/agents_actor_throughput.py [--steps 4000 --rounds 5 --ks 1,4,16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

import numpy as np
from agents_common import ReplayServerProcess, rotated, write_result

TASK = "cartpole:swingup"


def _timed(run, steps: int) -> tuple[float, float]:
    """(wall steps/s, process-CPU steps/s) of `run(steps)`, which returns the steps done."""
    wall, cpu = time.perf_counter(), time.process_time()
    done = run(steps)
    return done / (time.perf_counter() - wall), done / max(time.process_time() - cpu, 1e-9)


def raw_runner(domain: str, task: str):
    from dm_control import suite

    env = suite.load(domain, task, task_kwargs={"random": 2})
    zero = np.zeros(env.action_spec().shape, np.float64)
    state = {"ts": env.reset()}

    def run(steps: int) -> int:
        ts = state["ts"]
        for _ in range(steps):
            if ts.last():
                ts = env.reset()
            ts = env.step(zero)
        state["ts"] = ts
        return steps

    return run


def single_runner(config, spec, address: str):
    import environments
    from agents.d4pg import builder

    env = environments.make(TASK, seed=1)
    actor = builder.make_actor(config, spec, address, seed=1)
    state = {"ts": None}

    def run(steps: int) -> int:  # The body of EnvironmentLoop.run_episode, step by step.
        ts = state["ts"]
        for _ in range(steps):
            if ts is None or ts.last():
                ts = env.reset()
                actor.observe_first(ts)
            action = actor.select_action(ts.observation)
            ts = env.step(action)
            actor.observe(action, ts)
            actor.update()
        state["ts"] = ts
        return steps

    return run, actor


def batched_runner(config, spec, address: str, k: int):
    import environments
    from agents.d4pg import builder
    from agents.environment_loop import BatchedEnvironmentLoop

    envs = [environments.make(TASK, seed=100 + j) for j in range(k)]
    actor = builder.make_batched_actor(config, spec, address, seed=1, num_envs=k)
    return loop_runner(BatchedEnvironmentLoop(envs, actor), k), actor


def loop_runner(loop, num_envs: int) -> Callable[[int], int]:
    """`run(steps)`: steps of a `BatchedEnvironmentLoop` of `num_envs` environments until at
    least `steps` environment steps; returns how many it made (a multiple of num_envs)."""

    def run(steps: int) -> int:
        done = 0
        while done < steps:
            loop.step()
            done += num_envs
        return done

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000, help="environment steps per block")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ks", default="1,4,16")
    parser.add_argument("--preset", default="quick", choices=["quick", "paper"])
    args = parser.parse_args()

    import reverb

    import environments
    from agents.d4pg import networks, variables
    from agents.d4pg.config import D4PGConfig
    from launch.d4pg.program import PRESETS

    config = D4PGConfig.from_overrides(
        {"samples_per_insert": 0, "min_replay_size": 1},
        base=D4PGConfig.from_overrides(PRESETS[args.preset]),
    )
    ks = [int(k) for k in args.ks.split(",")]
    spec = environments.make_environment_spec(environments.make(TASK, seed=0))
    domain, task = TASK.split(":")
    loads = [os.getloadavg()[0]]
    with ReplayServerProcess(config, TASK) as server:
        nets = networks.make_networks(config, spec)  # Published once, like a learner would.
        variables.publish(
            reverb.Client(server.address), 0, [v.numpy() for v in nets.acting_variables()]
        )
        runners = {"raw": raw_runner(domain, task)}
        actors = {}
        for k in ks:
            if k == 1:
                runners["k1"], actors["k1"] = single_runner(config, spec, server.address)
            else:
                name = f"k{k}"
                runners[name], actors[name] = batched_runner(config, spec, server.address, k)
        for run in runners.values():  # Warm-up: first pull, writer setup, caches.
            run(500)
        names = list(runners)
        wall = {name: [] for name in names}
        cpu = {name: [] for name in names}
        for r in range(args.rounds):
            for name in rotated(names, r):
                w, c = _timed(runners[name], args.steps)
                wall[name].append(w)
                cpu[name].append(c)
            loads.append(os.getloadavg()[0])
            print(
                f"round {r}: "
                + ", ".join(f"{n} {wall[n][-1]:.0f}/s ({cpu[n][-1]:.0f}/cpu-s)" for n in names)
                + f"; load {loads[-1]:.2f}",
                flush=True,
            )
        items = reverb.Client(server.address).server_info()["replay"].current_size
    median_wall = {n: statistics.median(v) for n, v in wall.items()}
    median_cpu = {n: statistics.median(v) for n, v in cpu.items()}
    ratio_wall = {n: median_wall[n] / median_wall["raw"] for n in names if n != "raw"}
    ratio_cpu = {n: median_cpu[n] / median_cpu["raw"] for n in names if n != "raw"}
    noisy = max(loads) > 2
    for n in ratio_wall:
        print(
            f"actor {n}: {median_wall[n]:.0f} steps/s = {ratio_wall[n]:.2f} x raw (wall), "
            f"{ratio_cpu[n]:.2f} x raw (process CPU time)"
        )
    print(
        f"raw env.step: {median_wall['raw']:.0f} steps/s; max load {max(loads):.2f}"
        + (" (NOISY: load above the 2 cores)" if noisy else "")
    )
    write_result(
        "agents_actor_throughput",
        {
            "task": TASK,
            "preset": args.preset,
            "policy_layers": list(config.policy_layers),
            "n_step": config.n_step,
            "variable_update_period": config.variable_update_period,
            "steps_per_block": args.steps,
            "rounds": args.rounds,
            "raw": "dm_control.suite.load(domain, task).step (unwrapped)",
            "steps_per_second_wall_rounds": wall,
            "steps_per_cpu_second_rounds": cpu,
            "median_steps_per_second_wall": median_wall,
            "median_steps_per_cpu_second": median_cpu,
            "actor_over_raw_wall": ratio_wall,
            "actor_over_raw_process_cpu": ratio_cpu,
            "target_k16_wall": 0.8,
            "replay_items_written": int(items),
            "weights_version": {n: a.weights_version for n, a in actors.items()},
            "load_average_1min_per_round": loads,
            "noisy": noisy,
            "command": "python benchmarks/agents_actor_throughput.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
