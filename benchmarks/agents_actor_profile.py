"""Where a K-environment actor's time per step goes, beside the physics (issue 21).

`agents_replay_layout` and `agents_actor_throughput` give the ratio of one K=16 actor to raw
dm-control `env.step`; this says what fills the difference. Three configurations, each a
block of --steps environment steps, in rotated order over --rounds rounds:

- `raw`: K unwrapped `dm_control.suite` environments stepped in turn with uniformly random
  actions (the physics and the task's reward and observation code, nothing of ours);
- `no_reverb`: the K environments as the agent sees them (`environments.make`), the numpy
  policy, Gaussian noise and `BatchedEnvironmentLoop`: the actor without adders or pulls;
- `actor`: the deployed K-environment actor (`builder.make_batched_actor`): the same plus
  one n-step adder per environment into a Reverb server in another process and weight
  pulls from its "params" table;
- `actor_one_write_per_item`: the same actor handing each item to Reverb as it is drawn
  (`items_per_write` 1, the default until 2026-12-07) instead of --items-per-write
  together (the config's default): the same items.

Per block: CPU time per step of the whole process (`time.process_time`, Reverb's writer and
gRPC threads included) and of the stepping thread alone (`time.thread_time`). Then, in a
second block per round of `no_reverb` and `actor` with timers around each part (thread
time; the timers themselves cost ~0.3 us per call), the stepping thread's time per step in
dm-control's `step`, our wrappers, the policy call (with the noise), the adders
(`observe`) and the pulls (`update`). The disabled timers stay in place in the first
blocks: one more Python call around each timed call (~0.1 us, ~0.5 us per step of
`no_reverb` and `actor`, none of `raw`). Medians over rounds; the 1-minute load average is
recorded per round and the result is marked noisy above 2 (the core count).

Usage: python benchmarks/agents_actor_profile.py [--steps 16000 --rounds 5 --envs 16]
       [--items-per-write N]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # The repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent))  # agents_common.

import numpy as np
from agents_actor_throughput import TASK, loop_runner
from agents_common import ReplayServerProcess, rotated, write_result

CONFIGS = ["raw", "no_reverb", "actor", "actor_one_write_per_item"]
# The parts timed in the instrumented blocks (the wrapped step includes dm-control's).
PARTS = ["wrapped_step", "dm_control_step", "select_actions", "observe", "update"]


class PartTimer:
    """Adds the stepping thread's CPU time inside wrapped callables, per part name."""

    def __init__(self) -> None:
        self.nanoseconds: collections.Counter = collections.Counter()
        self.enabled = False

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            if not self.enabled:
                return fn(*args, **kwargs)
            start = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.nanoseconds[name] += time.thread_time_ns() - start

        return timed


def _raw_runner(num_envs: int, seed: int) -> Callable[[int], int]:
    from dm_control import suite

    domain, task = TASK.split(":")
    envs = [suite.load(domain, task, task_kwargs={"random": seed + i}) for i in range(num_envs)]
    timesteps = [env.reset() for env in envs]
    shape = envs[0].action_spec().shape
    rng = np.random.default_rng(seed)

    def run(steps: int) -> int:
        actions = rng.uniform(-1.0, 1.0, size=(steps,) + shape)
        for n in range(steps):
            i = n % num_envs
            if timesteps[i].last():
                timesteps[i] = envs[i].reset()
            timesteps[i] = envs[i].step(actions[n])
        return steps

    return run


def instrument(envs: list, actor, timer: PartTimer) -> None:
    """Wraps each env's outer step, dm-control's step inside it, and the actor's calls."""
    for env in envs:
        inner = env
        while hasattr(inner, "environment"):  # Down the wrappers to dm-control's env.
            inner = inner.environment
        inner.step = timer.wrap("dm_control_step", inner.step)
        env.step = timer.wrap("wrapped_step", env.step)
    for name in ("select_actions", "observe", "update"):
        setattr(actor, name, timer.wrap(name, getattr(actor, name)))


def _block(run: Callable[[int], int], steps: int) -> dict:
    wall, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
    done = run(steps)
    return {
        "wall_us": (time.perf_counter() - wall) / done * 1e6,
        "process_cpu_us": (time.process_time() - cpu) / done * 1e6,
        "thread_cpu_us": (time.thread_time() - thread) / done * 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16000, help="environment steps per block")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--envs", type=int, default=16, help="K, environments per actor")
    parser.add_argument(
        "--items-per-write",
        type=int,
        default=None,
        help="the `actor` configuration's items_per_write (default: the config's)",
    )
    args = parser.parse_args()
    if args.steps < args.envs or args.rounds < 1 or args.envs < 1:
        parser.error("--steps must be at least --envs, and --rounds and --envs at least 1")
    if args.items_per_write is not None and args.items_per_write < 1:
        parser.error("--items-per-write must be at least 1")

    import reverb

    import environments
    from agents.d4pg import acting, builder, networks, variables
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.numpy_policy import NumpyPolicy
    from agents.environment_loop import BatchedEnvironmentLoop
    from launch.d4pg.program import PRESETS

    config = D4PGConfig.from_overrides(
        {"samples_per_insert": 0, "min_replay_size": 1},
        base=D4PGConfig.from_overrides(PRESETS["quick"]),
    )
    spec = environments.make_environment_spec(environments.make(TASK, seed=0))
    k = args.envs
    if args.items_per_write is not None:
        config = D4PGConfig.from_overrides({"items_per_write": args.items_per_write}, base=config)
    timers = {name: PartTimer() for name in CONFIGS if name != "raw"}
    server = ReplayServerProcess(config, TASK)
    try:
        weights = [v.numpy() for v in networks.make_networks(config, spec).acting_variables()]
        variables.publish(reverb.Client(server.address), 0, weights)
        runners = {"raw": _raw_runner(k, seed=100)}

        envs = [environments.make(TASK, seed=100 + i) for i in range(k)]
        policy = NumpyPolicy(
            config, pixels=False, action_low=spec.actions.minimum, action_high=spec.actions.maximum
        )
        policy.set_weights(weights)
        bare = acting.BatchedD4PGActor(
            policy, spec.actions, None, None, k, sigma=config.sigma, seed=1
        )
        instrument(envs, bare, timers["no_reverb"])
        runners["no_reverb"] = loop_runner(BatchedEnvironmentLoop(envs, bare), k)

        one_write_per_item = D4PGConfig.from_overrides({"items_per_write": 1}, base=config)
        for name, cfg in (("actor", config), ("actor_one_write_per_item", one_write_per_item)):
            envs = [environments.make(TASK, seed=100 + i) for i in range(k)]
            actor = builder.make_batched_actor(cfg, spec, server.address, seed=1, num_envs=k)
            instrument(envs, actor, timers[name])
            runners[name] = loop_runner(BatchedEnvironmentLoop(envs, actor), k)

        for run in runners.values():  # Warm-up: first pull, writer setup, caches.
            run(1024)
        blocks: dict[str, list[dict]] = {name: [] for name in CONFIGS}
        parts: dict[str, dict[str, list[float]]] = {
            name: {part: [] for part in PARTS} for name in timers
        }
        loads = []
        for r in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for name in rotated(CONFIGS, r):
                blocks[name].append(_block(runners[name], args.steps))
            for name in rotated(list(timers), r):
                timer = timers[name]
                timer.nanoseconds.clear()
                timer.enabled = True
                done = runners[name](args.steps)
                timer.enabled = False
                for part in PARTS:
                    parts[name][part].append(timer.nanoseconds[part] / done / 1e3)
            print(
                f"round {r}: "
                + ", ".join(f"{n} {blocks[n][-1]['process_cpu_us']:.1f} us/step" for n in CONFIGS)
            )
        loads.append(os.getloadavg()[0])
    finally:
        server.close()

    median = {
        name: {m: statistics.median(b[m] for b in rounds) for m in rounds[0]}
        for name, rounds in blocks.items()
    }
    part_median = {
        name: {part: statistics.median(v) for part, v in by_part.items()}
        for name, by_part in parts.items()
    }
    raw = median["raw"]["process_cpu_us"]
    ratios = {n: raw / median[n]["process_cpu_us"] for n in CONFIGS if n != "raw"}
    actor_parts = part_median["actor"]
    bare_parts = part_median["no_reverb"]
    # What Reverb adds to the stepping thread: the adders and pulls it runs, and how much
    # slower the physics itself runs beside the writing (cache and memory contention).
    physics_slowdown = actor_parts["dm_control_step"] - bare_parts["dm_control_step"]
    # Held writes against one write per item, round by round (paired blocks).
    held_speedup = statistics.median(
        one["process_cpu_us"] / held["process_cpu_us"]
        for one, held in zip(blocks["actor_one_write_per_item"], blocks["actor"])
    )
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f} x raw env.step (process CPU time; K=16 target >= 0.8)")
    print(
        f"actor with {config.items_per_write} items per write / one write per item: "
        f"{held_speedup:.3f}x steps per CPU second"
    )
    print(
        "actor, stepping thread, us per step: "
        + ", ".join(f"{p} {v:.1f}" for p, v in actor_parts.items())
        + f"; dm-control's step {physics_slowdown:+.1f} beside Reverb's writing"
    )
    noisy = max(loads) > 2
    if noisy:
        print(f"NOISY: load reached {max(loads):.2f} on {os.cpu_count()} cores")
    write_result(
        "agents_actor_profile",
        {
            "command": "python benchmarks/agents_actor_profile.py "
            f"--steps {args.steps} --rounds {args.rounds} --envs {args.envs}"
            + (f" --items-per-write {args.items_per_write}" if args.items_per_write else ""),
            "task": TASK,
            "preset": "quick",
            "envs_per_actor": k,
            "transitions_per_item": config.resolved_transitions_per_item(),
            "items_per_write": config.items_per_write,
            "blocks": blocks,
            "median_us_per_step": median,
            "actor_over_raw_process_cpu": ratios,
            "parts_us_per_step_rounds": parts,
            "median_parts_us_per_step": part_median,
            "physics_slowdown_beside_reverb_us": physics_slowdown,
            "held_writes_speedup_process_cpu": held_speedup,
            "load_averages": loads,
            "max_load_average": max(loads),
            "noisy": noisy,
        },
    )


if __name__ == "__main__":
    main()
