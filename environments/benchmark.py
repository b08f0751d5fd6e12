"""Measures what `make`'s wrappers cost per step against the raw dm-control env.

    MUJOCO_GL=egl python -m environments.benchmark [domain:task] [--steps N] [--rounds R]

Two measurements, because on a loaded machine the first is noisy:
  end to end: the raw env and `make(name)` step with pre-drawn random actions (drawing
    them is not timed) in alternating rounds; like `timeit`, each env's speed is its best
    round. ratio = wrapped steps/s / raw steps/s, 1.0 meaning free wrappers.
  isolated: the same wrapper stack around an env that replays one recorded dm-control
    timestep, so only wrapper time is measured (microseconds per step);
    estimated ratio = raw step time / (raw step time + wrapper time).
"""

from __future__ import annotations

import argparse
import time

import dm_env
import numpy as np

from environments import suite, wrappers


def _seconds_per_step(env, actions: np.ndarray) -> float:
    env.reset()
    step = env.step
    start = time.perf_counter()
    for action in actions:
        step(action)
    return (time.perf_counter() - start) / len(actions)


class _Replay(wrappers.Wrapper):
    """Returns one recorded timestep from every call: the physics costs nothing."""

    def __init__(self, environment: dm_env.Environment, timestep: dm_env.TimeStep):
        super().__init__(environment)
        self._recorded = timestep

    def reset(self) -> dm_env.TimeStep:
        return self._recorded

    def step(self, action) -> dm_env.TimeStep:
        return self._recorded


def measure(name: str = "cartpole:swingup", steps: int = 2000, rounds: int = 10) -> dict:
    """Returns raw and wrapped seconds per step (best rounds) and the wrapper-only time."""
    domain, task = suite.parse_task_name(name)
    wrapped = suite.make(name, seed=0)
    raw = suite._dm_suite().load(domain, task, task_kwargs={"random": 0})
    spec = raw.action_spec()
    rng = np.random.default_rng(0)
    canonical = rng.uniform(-1.0, 1.0, size=(steps,) + spec.shape).astype(np.float32)
    raw_actions = rng.uniform(spec.minimum, spec.maximum, size=(steps,) + spec.shape)
    raw_time = wrapped_time = float("inf")
    for _ in range(rounds):
        raw_time = min(raw_time, _seconds_per_step(raw, raw_actions))
        wrapped_time = min(wrapped_time, _seconds_per_step(wrapped, canonical))

    raw.reset()
    replay = _Replay(raw, raw.step(raw_actions[0]))
    isolated = wrappers.CanonicalActions(wrappers.FlattenFeatures(replay))
    replay_time = isolated_time = float("inf")
    for _ in range(rounds):
        replay_time = min(replay_time, _seconds_per_step(replay, canonical))
        isolated_time = min(isolated_time, _seconds_per_step(isolated, canonical))
    return {
        "raw": raw_time,
        "wrapped": wrapped_time,
        "wrappers_only": max(isolated_time - replay_time, 0.0),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default="cartpole:swingup")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    t = measure(args.task, args.steps, args.rounds)
    print(
        f"{args.task}, best of {args.rounds} rounds of {args.steps} steps:\n"
        f"  end to end: raw {1 / t['raw']:.0f} steps/s ({t['raw'] * 1e6:.1f} us), "
        f"make() {1 / t['wrapped']:.0f} steps/s ({t['wrapped'] * 1e6:.1f} us), "
        f"ratio {t['raw'] / t['wrapped']:.3f}\n"
        f"  isolated: wrappers add {t['wrappers_only'] * 1e6:.2f} us/step, "
        f"estimated ratio {t['raw'] / (t['raw'] + t['wrappers_only']):.3f}"
    )


if __name__ == "__main__":
    main()
