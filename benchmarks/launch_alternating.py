"""The README's command under several settings, alternated seed by seed, in one run.

Each setting is a list of extra `replicator launch d4pg` flags. Per seed, every setting
runs once, one launch at a time; the order flips from seed to seed, so that a drift of
the machine's load falls on all of them. Per run: learner updates per second of wall time
(learner steps at the end / the run's wall time), the learner's running rate once started
(`running_learner_updates_per_s`: without the start-up, ~10 s of every launch whatever
its speed, as the progress line's rate), actor steps per second, wall time and actor steps
to the first evaluation at or above the target; per setting, the medians over seeds (a
seed that misses counts as never reaching).

Used by `launch_replay_layout.py` (settings: transitions per item) and
`launch_setting_ab.py` (the defaults against one candidate setting).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from agents_learning_suite import first_reaching, run_one

from launch.d4pg import program as d4pg_program

TASK = "cartpole:swingup"


def _median(values: list) -> float | None:
    inf = float("inf")
    value = statistics.median([inf if v is None else v for v in values])
    return None if value == inf else value


# Evaluations before this many seconds of a launch fall in its start-up (processes,
# tracing and compiling the learner's update, min_replay_size): not in the running rate.
STARTED_AFTER_S = 15.0


def running_learner_updates_per_s(run: Mapping) -> float:
    """Learner updates/s once the launch has started: actor steps/s between its first
    evaluation at or after `STARTED_AFTER_S` and its last (the curve's points), times the
    run's learner steps per actor step (which the rate limiter holds near
    samples_per_insert / batch_size)."""
    curve = run["curve"]
    start = next(point for point in curve if point[1] >= STARTED_AFTER_S)
    end = curve[-1]
    actor_steps_per_s = (end[0] - start[0]) / (end[1] - start[1])
    return actor_steps_per_s * run["learner_steps"] / run["actor_steps"]


def run_alternating(
    settings: Mapping[str, Sequence[str]],
    seeds: Sequence[int],
    target: float,
    max_minutes: float,
) -> dict[str, dict[str, dict]]:
    """Runs per setting name, per seed (as strings): `run_one`'s record plus the rates."""
    names = list(settings)
    runs: dict = {name: {} for name in names}
    for i, seed in enumerate(seeds):
        for name in names if i % 2 == 0 else names[::-1]:
            run = run_one(
                TASK,
                seed,
                d4pg_program.QUICK_STEPS,
                max_minutes * 60,
                keep=False,
                extra_flags=list(settings[name]),
            )
            hit = first_reaching(run["curve"], target)
            run.update(
                {
                    "learner_updates_per_s": run["learner_steps"] / run["wall_s"],
                    "running_learner_updates_per_s": running_learner_updates_per_s(run),
                    "actor_steps_per_s": run["actor_steps"] / run["wall_s"],
                    "seconds_to_target": hit["wall_time_s"] if hit else None,
                    "actor_steps_to_target": hit["actor_steps"] if hit else None,
                }
            )
            runs[name][str(seed)] = run
            print(
                f"{name} seed {seed}: {run['learner_updates_per_s']:.0f} updates/s, "
                f"{run['actor_steps_per_s']:.0f} actor steps/s, "
                + (
                    f"{hit['wall_time_s']:.0f} s / {hit['actor_steps']:,.0f} steps to {target:g}"
                    if hit
                    else f"missed {target:g}"
                )
                + f", final {run['final_eval_return']:.0f}",
                flush=True,
            )
    return runs


def summarise(runs: Mapping[str, Mapping[str, dict]]) -> dict[str, dict]:
    """Per setting: medians over its seeds, seeds that reached the target, final returns."""
    summary = {}
    for name, by_seed in runs.items():
        per_seed = list(by_seed.values())
        summary[name] = {
            "median_learner_updates_per_s": statistics.median(
                r["learner_updates_per_s"] for r in per_seed
            ),
            "median_running_learner_updates_per_s": statistics.median(
                running_learner_updates_per_s(r) for r in per_seed
            ),
            "median_actor_steps_per_s": statistics.median(r["actor_steps_per_s"] for r in per_seed),
            "median_seconds_to_target": _median([r["seconds_to_target"] for r in per_seed]),
            "median_actor_steps_to_target": _median([r["actor_steps_to_target"] for r in per_seed]),
            "seeds_reached": sum(r["seconds_to_target"] is not None for r in per_seed),
            "final_eval_returns": [r["final_eval_return"] for r in per_seed],
        }
    return summary
