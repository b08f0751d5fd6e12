"""The README's command with its defaults against one candidate setting, in one run.

Runs `replicator launch d4pg` as the README does (quick preset, local backend, 2 actors,
cartpole:swingup, the default budget) once per seed with the defaults and once with the
candidate's flags, alternated (`launch_alternating`): learner updates/s, actor steps/s,
wall time and actor steps to --target, medians over seeds, and the candidate's ratios to
the defaults. This is the quick check of a throughput setting; what it does to learning
is the learning suite's to say (`agents_learning_suite.py --launch-flag=...`).

    python benchmarks/launch_setting_ab.py --name spi_tolerance_1 \\
        --flag=--config.samples_per_insert_tolerance_rate=1.0 [--seeds 0,1,2]
    python benchmarks/launch_setting_ab.py --name budget_150k --candidate-steps 150000

`--candidate-steps` gives the candidate another actor-step budget (a budget is a setting
of its own: the quick preset's learning-rate decay spans it); times and steps to the
target stay comparable, since both count from the start of the run.

Writes benchmarks/results/launch_setting_ab_NAME.json. `--add-seeds` runs only the seeds
that file lacks and stores them beside its runs (the same candidate flags and target, or
it refuses), so more seeds can be added in a later session; the medians cover them all.

    python benchmarks/launch_setting_ab.py --name lr_hold_half \\
        --flag=--config.lr_decay_start_fraction=0.5 --seeds 4,5 --add-seeds
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from agents_common import RESULTS, write_result  # noqa: E402
from launch_alternating import TASK, run_alternating, summarise  # noqa: E402

from launch.d4pg import program as d4pg_program  # noqa: E402


def check_same_setting(stored: dict, candidate_flags: list, target: float) -> None:
    """ValueError when `stored` measured another candidate or target: medians over its
    seeds and new ones would mix two settings."""
    if stored["candidate_flags"] != candidate_flags or stored["target_return"] != target:
        raise ValueError(
            f"the stored result measured {' '.join(stored['candidate_flags'])} to "
            f"{stored['target_return']:g}, not {' '.join(candidate_flags)} to {target:g}: "
            "give another --name, or the stored flags and --target"
        )


def merge_into_stored(stored: dict, runs: dict) -> dict:
    """`stored`'s runs with `runs` (per setting, per seed as a string) beside them."""
    return {name: {**stored["runs"][name], **runs[name]} for name in ("default", "candidate")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="names the results file (a-z, 0-9, _)")
    parser.add_argument(
        "--flag",
        action="append",
        default=[],
        help="a flag of the candidate, e.g. --flag=--config.samples_per_insert_tolerance_rate=1 "
        "(repeatable)",
    )
    parser.add_argument(
        "--candidate-steps",
        type=int,
        default=d4pg_program.QUICK_STEPS,
        help=f"the candidate's actor-step budget (default: the launch's, {d4pg_program.QUICK_STEPS:,})",
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--target", type=float, default=800.0)
    parser.add_argument("--max-minutes", type=float, default=20.0, help="per launch")
    parser.add_argument(
        "--add-seeds",
        action="store_true",
        help="keep the stored result's runs and run only the --seeds it lacks",
    )
    args = parser.parse_args()
    if not re.fullmatch(r"[a-z0-9_]+", args.name):
        parser.error(f"--name takes a-z, 0-9 and _ (it names a file), got {args.name!r}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds takes comma-separated integers, e.g. 0,1,2; got {args.seeds!r}")
    if args.candidate_steps <= 0:
        parser.error(
            f"--candidate-steps takes a positive number of actor steps, got {args.candidate_steps}"
        )
    candidate_flags = list(args.flag)
    if args.candidate_steps != d4pg_program.QUICK_STEPS:
        candidate_flags += ["--steps", str(args.candidate_steps)]
    if not candidate_flags:
        parser.error(
            "give the candidate at least one --flag or a --candidate-steps other than the default"
        )

    command = "python benchmarks/launch_setting_ab.py " + " ".join(sys.argv[1:])
    stored = None
    if args.add_seeds:
        path = RESULTS / f"launch_setting_ab_{args.name}.json"
        if not path.exists():
            parser.error(f"--add-seeds: no stored result {path}; run without --add-seeds first")
        stored = json.loads(path.read_text())
        try:
            check_same_setting(stored, candidate_flags, args.target)
        except ValueError as e:
            parser.error(f"--add-seeds: {e}")
        seeds = [s for s in seeds if str(s) not in stored["runs"]["candidate"]]
        if not seeds:
            parser.error(f"--add-seeds: {path} holds every seed of --seeds already")
    runs = run_alternating(
        {"default": [], "candidate": candidate_flags}, seeds, args.target, args.max_minutes
    )
    if stored is not None:
        runs = merge_into_stored(stored, runs)
        seeds = sorted({*stored["seeds"], *seeds})
        command = f"{stored['command']}; then {command}"
    summary = summarise(runs)
    base, cand = summary["default"], summary["candidate"]
    ratios = {
        "learner_updates_per_s": cand["median_learner_updates_per_s"]
        / base["median_learner_updates_per_s"],
        "actor_steps_per_s": cand["median_actor_steps_per_s"] / base["median_actor_steps_per_s"],
    }
    if base["median_seconds_to_target"] and cand["median_seconds_to_target"]:
        ratios["seconds_to_target"] = (
            cand["median_seconds_to_target"] / base["median_seconds_to_target"]
        )
    print(
        f"candidate / default: learner updates/s x{ratios['learner_updates_per_s']:.2f}; "
        f"median time to {args.target:g}: {cand['median_seconds_to_target']} s against "
        f"{base['median_seconds_to_target']} s; seeds reached {cand['seeds_reached']} and "
        f"{base['seeds_reached']} of {len(seeds)}"
    )
    write_result(
        f"launch_setting_ab_{args.name}",
        {
            "task": TASK,
            "target_return": args.target,
            "budget_actor_steps": d4pg_program.QUICK_STEPS,
            "candidate_budget_actor_steps": args.candidate_steps,
            "candidate_flags": candidate_flags,
            "seeds": seeds,
            "summary": summary,
            "candidate_over_default": ratios,
            "runs": runs,
            "noisy": any(r["noisy"] for per in runs.values() for r in per.values()),
            "command": command,
        },
    )


if __name__ == "__main__":
    main()
