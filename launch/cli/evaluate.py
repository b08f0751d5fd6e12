"""`replicator evaluate`: a policy snapshot's return without exploration noise, one
snapshot or all of a run (evaluation itself: `launch.reporting.evaluate`)."""

from __future__ import annotations

import argparse
import os

from launch.cli.common import add_run_dir_arguments, run_dir_of
from launch.runtime.errors import LaunchError


def register(commands) -> None:
    """Adds `evaluate`."""
    evaluate = commands.add_parser(
        "evaluate",
        help="evaluate a policy snapshot (no learner, no replay server)",
        allow_abbrev=False,
        description="Evaluates a policy snapshot without exploration noise: the latest of a "
        "run, --step N of a run, or --snapshot DIR.",
    )
    add_run_dir_arguments(evaluate, "a D4PG run directory (or --snapshot DIR)")
    evaluate.add_argument(
        "--step", type=int, default=None, help="learner step of a kept snapshot (default: latest)"
    )
    evaluate.add_argument(
        "--snapshot", default=None, metavar="DIR", help="a snapshot directory (replicator export)"
    )
    evaluate.add_argument(
        "--all-snapshots",
        action="store_true",
        help="evaluate every kept snapshot of the run and write a CSV (see --out)",
    )
    evaluate.add_argument(
        "--out",
        default=None,
        metavar="CSV",
        help="CSV of --all-snapshots (default: RUN_DIR/snapshot_returns.csv)",
    )
    evaluate.add_argument(
        "--env", default=None, help="task (default: the snapshot's own; same specs needed)"
    )
    evaluate.add_argument(
        "--episodes", type=int, default=10, help="episodes per seed (default: %(default)s)"
    )
    evaluate.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        metavar="SEED",
        help="environment seeds, --episodes each (default: 12345)",
    )
    evaluate.add_argument("--seed", type=int, default=None, help=argparse.SUPPRESS)
    evaluate.add_argument(
        "--video",
        default=None,
        metavar="OUT.mp4|OUT.gif",
        help="render the first episode into this file, its return written on the frames",
    )
    evaluate.add_argument(
        "--json", action="store_true", help="print one machine-readable JSON line"
    )
    evaluate.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json  # pylint: disable=import-outside-toplevel

    from launch.reporting import evaluate  # pylint: disable=import-outside-toplevel

    if args.episodes < 1:
        raise LaunchError("--episodes must be at least 1.")
    if args.seed is not None and args.seeds is not None:
        raise LaunchError("pass --seeds (one or more), not --seed with it.")
    seeds = args.seeds or ([args.seed] if args.seed is not None else [12345])
    run_dir = run_dir_of(args, required=False)
    if args.all_snapshots:
        if run_dir is None or args.snapshot or args.step is not None or args.video:
            raise LaunchError(
                "--all-snapshots evaluates every snapshot of a run (RUN_DIR): drop "
                "--snapshot, --step and --video."
            )
        out = args.out or os.path.join(run_dir, "snapshot_returns.csv")
        rows = evaluate.evaluate_all(
            run_dir,
            out,
            task=args.env,
            episodes=args.episodes,
            seeds=seeds,
            echo=None if args.json else print,
        )
        if args.json:
            print(json.dumps({"csv": os.path.abspath(out), "snapshots": rows}))
        else:
            print(f"{len(rows)} snapshot(s) evaluated: {os.path.abspath(out)}")
        return 0
    if args.out:
        raise LaunchError("--out names the CSV of --all-snapshots; use --video for a video.")
    result = evaluate.evaluate(
        run_dir,
        snapshot=args.snapshot,
        step=args.step,
        task=args.env,
        episodes=args.episodes,
        seeds=seeds,
        video=args.video,
    )
    if args.video:
        result["video"] = os.path.abspath(args.video)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{result['task']}: return over {result['episodes']} episode(s): mean "
        f"{result['mean']:.1f}, std {result['std']:.1f} (learner step "
        f"{result['learner_step']:,}; seeds {' '.join(map(str, result['seeds']))})"
    )
    if args.video:
        print(f"video of episode 1: {result['video']}")
    return 0
