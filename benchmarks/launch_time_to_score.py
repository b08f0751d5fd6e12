"""Distributed time to score: wall-clock until D4PG's evaluation return reaches a target.

Runs the default `replicator launch d4pg` program (quick preset, local backend,
2 actors, 1 learner, 1 evaluator) on cartpole:swingup until an evaluation's mean
return reaches `--target` (800) or `--max-minutes` pass, and puts the figure next to
the single-process runner's (`agents.d4pg.local_runner.run_single_process`, same
config), taken from benchmarks/results/agents_time_to_score.json when the agents
benchmark wrote one, or measured here with `--single-process`.

    python benchmarks/launch_time_to_score.py [--single-process] [--max-minutes 45]

Writes benchmarks/results/launch_time_to_score.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launch import d4pg_program, launcher  # noqa: E402
from launch.metrics import read_csv  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results")


def distributed(task: str, config: dict, target: float, max_s: float, actors: int) -> dict:
    run_dir = tempfile.mkdtemp(prefix="time-to-score-")
    settings = d4pg_program.D4PGProgramSettings(
        task=task, num_actors=actors, eval_every_s=20.0, eval_episodes=2
    )
    start = time.monotonic()

    def done(progress) -> bool:
        hit = progress.last_eval is not None and progress.last_eval["return"] >= target
        return hit or time.monotonic() - start > max_s

    outcome = launcher.run(
        d4pg_program.make_program(settings, config),
        run_dir,
        "local",
        stop_when=done,
        progress_every=30.0,
    )
    rows = read_csv(os.path.join(run_dir, "metrics.csv"))
    hit = next((r for r in rows if r["eval_return"] >= target), None)
    return {
        "backend": "local",
        "actors": actors,
        "outcome": outcome.reason,
        "run_dir": run_dir,
        "reached": hit is not None,
        "seconds_to_target": hit["wall_time_s"] if hit else None,
        "actor_steps_to_target": hit["actor_steps"] if hit else None,
        "learner_steps_to_target": hit["learner_steps"] if hit else None,
        "best_eval_return": max((r["eval_return"] for r in rows), default=None),
        "curve": [(r["wall_time_s"], r["actor_steps"], r["eval_return"]) for r in rows],
    }


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
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--max-minutes", type=float, default=45.0)
    parser.add_argument(
        "--single-process",
        action="store_true",
        help="also run the single-process runner here (doubles the time)",
    )
    parser.add_argument(
        "--only-single-process",
        action="store_true",
        help="run only the single-process runner; keep the distributed figure "
        "already in the results file",
    )
    args = parser.parse_args()
    from agents.d4pg.config import D4PGConfig

    config = D4PGConfig.from_overrides(d4pg_program.PRESETS["quick"]).to_dict()
    out = os.path.join(RESULTS, "launch_time_to_score.json")
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
            args.task, config, args.target, args.max_minutes * 60, args.actors
        )
    agents_file = os.path.join(RESULTS, "agents_time_to_score.json")
    if args.single_process or args.only_single_process:
        result["single_process_command"] = "python " + " ".join(sys.argv)
        result["single_process"] = single_process(
            args.task, config, args.target, args.max_minutes * 60
        )
    elif os.path.exists(agents_file):
        with open(agents_file) as f:
            result["single_process_from_agents_benchmark"] = json.load(f)
    result["machine"] = {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_1_5_15": os.getloadavg(),
        "note": "2-core machine shared with other engineers' jobs; noisy.",
    }
    os.makedirs(RESULTS, exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2, default=str)
    if "single_process" in result:
        sp = result["single_process"]["results"]
        print(
            f"single process: reached={sp['reached_target']} in {sp['seconds_to_target']}s, "
            f"{sp['steps_to_target']} actor steps"
        )
    d = result["distributed"]
    print(
        f"distributed ({args.actors} actors): "
        + (
            f"{d['seconds_to_target']:.0f}s, {d['actor_steps_to_target']:,.0f} actor steps "
            f"to {args.target:g}"
            if d["reached"]
            else f"did not reach {args.target:g} in {args.max_minutes:g} min "
            f"(best {d['best_eval_return']})"
        )
        + f" -> {out}"
    )


if __name__ == "__main__":
    main()
