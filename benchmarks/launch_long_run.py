"""Throughput over a long launch: does a 500k-step run keep the pace of its first 100k?

Runs the README's command with `--env TASK --steps STEPS` (quick preset, local backend, 2
actors, the default evaluation schedule), one launch, and reads the run's own metrics:

* actor steps over wall time, from the actors' step counts (one record per episode);
* learner updates over wall time, from the learner's gauges (every 5 s);
* each replay checkpoint's duration and the table size it saved.

It reports actor steps/s and learner updates/s over two windows of `--window` actor steps:
the first after start-up (from `--warmup` actor steps on, so that TensorFlow's start, the
learner's compile and the replay's filling to `min_replay_size` are not counted against
the early pace) and the last (the run's final `--window` steps), and their ratios, last /
first. The throughput issue's target is >= 0.9 for a 500k launch. The 1-minute load
average is sampled every 10 s; a launch keeps ~2 of it busy itself, so a load well above
that during a window marks other work on the machine (recorded per window; "noisy"
above the suite's OWN_LOAD, 4).

    python benchmarks/launch_long_run.py [--task cheetah:run --steps 500000 --seeds 0,1]

Writes benchmarks/results/launch_long_run.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from agents_learning_suite import OWN_LOAD, run_one  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")
LOAD_EVERY_S = 10.0


def read_records(run_dir: str) -> list[dict]:
    """Every metrics record of the run's nodes (a line cut by a stop is skipped)."""
    records = []
    metrics_dir = os.path.join(run_dir, "metrics")
    for name in sorted(os.listdir(metrics_dir)):
        with open(os.path.join(metrics_dir, name), encoding="utf-8") as f:
            for line in f:
                try:
                    records.append(json.loads(line))
                except ValueError:
                    continue
    return records


def cumulative(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(t, increment) pairs -> (t, running total), in time order."""
    total, out = 0.0, []
    for t, increment in sorted(points):
        total += increment
        out.append((t, total))
    return out


def time_at(series: list[tuple[float, float]], value: float) -> float | None:
    """When a nondecreasing (t, value) series first reaches `value` (linear in between)."""
    previous = None
    for t, v in series:
        if v >= value:
            if previous is None or v == previous[1]:
                return t
            t0, v0 = previous
            return t0 + (t - t0) * (value - v0) / (v - v0)
        previous = (t, v)
    return None


def value_at(series: list[tuple[float, float]], t: float) -> float | None:
    """A (t, value) series read at time `t` (linear in between; None outside it)."""
    for (t0, v0), (t1, v1) in itertools.pairwise(series):
        if t0 <= t <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
    return None


def window(actor, learner, loads, start: float, end: float) -> dict | None:
    """Actor steps/s and learner updates/s between actor steps `start` and `end`."""
    t0, t1 = time_at(actor, start), time_at(actor, end)
    if t0 is None or t1 is None or t1 <= t0:
        return None
    u0, u1 = value_at(learner, t0), value_at(learner, t1)
    inside = [load for t, load in loads if t0 <= t <= t1]
    return {
        "actor_steps": [start, end],
        "seconds": t1 - t0,
        "actor_steps_per_s": (end - start) / (t1 - t0),
        "learner_updates_per_s": None if u0 is None or u1 is None else (u1 - u0) / (t1 - t0),
        "max_load_average": max(inside, default=None),
    }


def analyse(run_dir: str, warmup: int, size: int, loads: list) -> dict:
    """The two windows of `size` actor steps (from `warmup`, and the run's last), their
    ratios and the replay checkpoints; times are seconds from the first actor count (the
    end of the first episode), as in the stored series."""
    records = read_records(run_dir)
    actor = cumulative(
        [
            (r["t"], r["actor_steps"])
            for r in records
            if r.get("kind") == "count" and "actor_steps" in r
        ]
    )
    learner = sorted(
        (r["t"], r["learner_steps"])
        for r in records
        if r.get("kind") == "gauge" and r.get("node") == "learner" and "learner_steps" in r
    )
    checkpoints = [
        {
            "t": r["t"] - actor[0][0] if actor else r["t"],
            "transitions": r.get("size_after"),
            "seconds": r.get("seconds"),
        }
        for r in sorted(records, key=lambda r: r["t"])
        if r.get("kind") == "replay_checkpoint"
    ]
    total = actor[-1][1] if actor else 0
    first = window(actor, learner, loads, warmup, warmup + size)
    last = window(actor, learner, loads, total - size, total)
    ratios = {}
    if first and last:
        ratios["actor_steps_per_s"] = last["actor_steps_per_s"] / first["actor_steps_per_s"]
        if first["learner_updates_per_s"] and last["learner_updates_per_s"]:
            ratios["learner_updates_per_s"] = (
                last["learner_updates_per_s"] / first["learner_updates_per_s"]
            )
    return {
        "actor_steps": total,
        "first_window": first,
        "last_window": last,
        "last_over_first": ratios,
        "replay_checkpoints": checkpoints,
        "actor_series": [[round(t - actor[0][0], 2), v] for t, v in actor] if actor else [],
        "learner_series": [[round(t - actor[0][0], 2), v] for t, v in learner] if actor else [],
    }


def measure(args, seed: int) -> dict:
    """One launch of `seed`, its load sampled every 10 s: `analyse`'s figures and more."""
    loads: list[tuple[float, float]] = []
    done = threading.Event()

    def sample_load() -> None:
        while not done.is_set():
            loads.append((time.time(), os.getloadavg()[0]))
            done.wait(LOAD_EVERY_S)

    sampler = threading.Thread(target=sample_load, daemon=True)
    sampler.start()
    try:
        run = run_one(args.task, seed, args.steps, args.max_minutes * 60, True, args.launch_flag)
    finally:
        done.set()
        sampler.join()
    figures = analyse(run["run_dir"], args.warmup, args.window, loads)
    shutil.rmtree(run["run_dir"], ignore_errors=True)
    return {
        "launch_command": run["command"],
        "wall_s": run["wall_s"],
        "final_eval_return": run["final_eval_return"],
        **figures,
        "load_average_every_10s": [[round(t - loads[0][0]), load] for t, load in loads],
        "max_load_average": max((load for _, load in loads), default=None),
        "noisy": max((load for _, load in loads), default=0.0) > OWN_LOAD,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def summarise(runs: dict) -> dict:
    """Medians over the runs of the windows' rates and of the last / first ratios."""

    def median_of(part: str, key: str) -> float | None:
        values = [r[part][key] for r in runs.values() if r.get(part) and r[part].get(key)]
        return statistics.median(values) if values else None

    return {
        "seeds": sorted(runs, key=int),
        "median_last_over_first": {
            key: median_of("last_over_first", key)
            for key in ("actor_steps_per_s", "learner_updates_per_s")
        },
        "median_first_window": {
            key: median_of("first_window", key)
            for key in ("actor_steps_per_s", "learner_updates_per_s")
        },
        "median_last_window": {
            key: median_of("last_window", key)
            for key in ("actor_steps_per_s", "learner_updates_per_s")
        },
    }


def stored_runs(path: str, setting: dict) -> dict:
    """The runs stored at `path`, which new seeds join (none if there is no file).

    Raises:
      ValueError: they were measured with another setting (windows, steps, task or
        flags): they do not mix, and writing would lose them.
    """
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    differs = {key for key in setting if stored.get(key) != setting[key]}
    if differs:
        raise ValueError(
            f"{path} holds runs of another setting ({', '.join(sorted(differs))}): "
            "give another --results file"
        )
    return dict(stored.get("runs", {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="cheetah:run")
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--seeds", default="0", help="one launch per seed, one at a time")
    parser.add_argument("--window", type=int, default=100_000, help="actor steps per window")
    parser.add_argument("--warmup", type=int, default=10_000, help="actor steps before the first")
    parser.add_argument("--max-minutes", type=float, default=60.0)
    parser.add_argument("--launch-flag", action="append", default=[], metavar="FLAG")
    parser.add_argument(
        "--results",
        default=os.path.join(RESULTS, "launch_long_run.json"),
        help="results JSON; runs of other seeds stored there are kept (a file of another "
        "task, steps, windows or flags is refused)",
    )
    args = parser.parse_args()
    if args.steps < args.warmup + 2 * args.window:
        parser.error("--steps must cover --warmup and two windows that do not overlap.")
    setting = {
        "task": args.task,
        "steps": args.steps,
        "window_actor_steps": args.window,
        "warmup_actor_steps": args.warmup,
        "launch_flags": list(args.launch_flag),
    }
    try:
        runs = stored_runs(args.results, setting)
    except ValueError as e:
        parser.error(str(e))
    for seed in [int(s) for s in args.seeds.split(",")]:
        run = runs[str(seed)] = measure(args, seed)
        first, last = run["first_window"], run["last_window"]
        if first and last:
            print(
                f"seed {seed}: {run['actor_steps']:,.0f} actor steps in {run['wall_s']:.0f} s: "
                f"actor steps/s {first['actor_steps_per_s']:.0f} -> "
                f"{last['actor_steps_per_s']:.0f}, learner updates/s "
                f"{first['learner_updates_per_s']:.0f} -> {last['learner_updates_per_s']:.0f} "
                f"(last / first {run['last_over_first']['actor_steps_per_s']:.2f})",
                flush=True,
            )
    result = {
        "benchmark": "launch_long_run",
        "command": "python " + " ".join(sys.argv),
        **setting,
        **summarise(runs),
        "max_load_average": max((r["max_load_average"] or 0.0) for r in runs.values()),
        "noisy": any(r["noisy"] for r in runs.values()),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform()},
        "runs": runs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    ratio = result["median_last_over_first"]["actor_steps_per_s"]
    print(
        f"median last / first actor steps/s over {len(runs)} run(s): {ratio:.2f} -> {args.results}"
    )


if __name__ == "__main__":
    main()
