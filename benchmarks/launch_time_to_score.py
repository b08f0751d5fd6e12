"""Time to score of the README's main command: wall clock until evaluation return 800.

Runs `replicator launch d4pg` exactly as the README's first command does (quick preset,
local backend, 2 actors, 1 learner, 1 evaluator, cartpole:swingup, the default budget and
evaluation schedule), once per seed (`--config.seed=N`), one launch at a time, and reads
each run's metrics.csv: the wall time and actor steps of the first evaluation at or above
`--target` (800). The issue's figure is the median over 3 seeds; a seed that misses the
target within the budget counts as a miss (the median is then over the budget).
The single-process runner's figure (`agents.d4pg.local_runner.run_single_process`, same
config) is put next to it: taken from benchmarks/results/agents_time_to_score.json, or
measured here with `--single-process`.

    python benchmarks/launch_time_to_score.py [--seeds 0,1,2] [--single-process]

Writes benchmarks/results/launch_time_to_score.json. A candidate setting is measured with
`--launch-flag=--config.NAME=VALUE` (repeatable) and its own `--results` file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from agents_learning_suite import first_reaching, run_one  # noqa: E402

from launch.d4pg import program as d4pg_program  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")


def distributed(
    task: str, seeds: list[int], target: float, timeout_s: float, extra_flags=()
) -> dict:
    """The README command (plus `extra_flags`) once per seed, back to back; per-seed
    figures and medians."""
    runs = {}
    for seed in seeds:
        run = run_one(task, seed, d4pg_program.QUICK_STEPS, timeout_s, False, extra_flags)
        hit = first_reaching(run["curve"], target)
        runs[str(seed)] = {
            **run,
            "reached": hit is not None,
            "seconds_to_target": hit["wall_time_s"] if hit else None,
            "actor_steps_to_target": hit["actor_steps"] if hit else None,
        }
        print(
            f"seed {seed}: "
            + (
                f"{hit['wall_time_s']:.0f} s, {hit['actor_steps']:,.0f} actor steps to {target:g}"
                if hit
                else f"did not reach {target:g} (best {run['best_eval_return']:.0f})"
            ),
            flush=True,
        )
    reached = [r for r in runs.values() if r["reached"]]
    inf = float("inf")
    return {
        "backend": "local",
        "actors": 2,
        "budget_actor_steps": d4pg_program.QUICK_STEPS,
        "seeds": seeds,
        "seeds_reached": len(reached),
        # A miss sorts after every hit, so the median is finite only if most seeds reach.
        "median_seconds_to_target": _finite(
            statistics.median([r["seconds_to_target"] or inf for r in runs.values()])
        ),
        "median_actor_steps_to_target": _finite(
            statistics.median([r["actor_steps_to_target"] or inf for r in runs.values()])
        ),
        "noisy": any(r["noisy"] for r in runs.values()),  # run_one's rule, per run.
        "runs": runs,
    }


def _finite(value: float) -> float | None:
    return None if value == float("inf") else value


def single_process(task: str, config: dict, target: float, max_s: float) -> dict:
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.local_runner import run_single_process

    start = time.monotonic()
    results = run_single_process(
        D4PGConfig.from_dict(config),
        task,
        num_actor_steps=10**7,
        eval_every=5000,
        eval_episodes=2,
        num_actors=1,
        target_return=target,
        max_seconds=max_s,
    )
    import dataclasses

    return {
        "seconds_total": time.monotonic() - start,
        "results": json.loads(json.dumps(dataclasses.asdict(results), default=str)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="cartpole:swingup")
    parser.add_argument("--target", type=float, default=800.0)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="per launch")
    parser.add_argument(
        "--single-process",
        action="store_true",
        help="also run the single-process runner here (about 10 more minutes)",
    )
    parser.add_argument(
        "--only-single-process",
        action="store_true",
        help="run only the single-process runner; keep the distributed figures "
        "already in the results file",
    )
    parser.add_argument(
        "--launch-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every launch, e.g. --launch-flag=--config.policy_lr=3e-4 "
        "(repeatable; use a separate --results file per setting)",
    )
    parser.add_argument(
        "--results",
        default=os.path.join(RESULTS, "launch_time_to_score.json"),
        help="results JSON to write",
    )
    args = parser.parse_args()
    from agents.d4pg.config import D4PGConfig

    config = D4PGConfig.from_overrides(d4pg_program.PRESETS["quick"]).to_dict()
    out = args.results
    result = {}
    if args.only_single_process and os.path.exists(out):
        with open(out) as f:
            result = json.load(f)
    result.update(
        {
            "benchmark": "launch_time_to_score",
            "task": args.task,
            "target_return": args.target,
            "config": "quick preset",
        }
    )
    if not args.only_single_process:
        result["command"] = "python " + " ".join(sys.argv)
        result["distributed"] = distributed(
            args.task,
            [int(s) for s in args.seeds.split(",")],
            args.target,
            args.max_minutes * 60,
            args.launch_flag,
        )
        result["launch_flags"] = list(args.launch_flag)
    agents_file = os.path.join(RESULTS, "agents_time_to_score.json")
    if args.single_process or args.only_single_process:
        result["single_process_command"] = "python " + " ".join(sys.argv)
        result["single_process"] = single_process(
            args.task, config, args.target, args.max_minutes * 60
        )
    elif os.path.exists(agents_file):
        with open(agents_file) as f:
            result["single_process_from_agents_benchmark"] = json.load(f)
    result["noisy"] = result["distributed"]["noisy"]
    result["machine"] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_1_5_15": os.getloadavg(),
        "note": "2-core machine shared with other engineers' jobs; each run's load before "
        "it started is in its record.",
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    d = result["distributed"]
    median = d["median_seconds_to_target"]
    print(
        f"README command: {d['seeds_reached']} of {len(d['seeds'])} seeds reached "
        f"{args.target:g}; median "
        + (f"{median:.0f} s" if median is not None else "not reached")
        + f" -> {out}"
    )


if __name__ == "__main__":
    main()
