"""`replicator export`: writes a run's policy as a self-contained TF SavedModel."""

from __future__ import annotations

import argparse
import os

from launch.cli.common import add_run_dir_arguments, run_dir_of


def register(commands) -> None:
    """Adds `export`."""
    export = commands.add_parser(
        "export",
        help="write a policy snapshot (TF SavedModel) of a run",
        allow_abbrev=False,
        description="Writes a self-contained TF SavedModel of a run's policy: "
        "tf.saved_model.load(OUT).act(observations) -> actions.",
    )
    add_run_dir_arguments(export, "a D4PG run directory")
    export.add_argument(
        "--step", type=int, default=None, help="learner step of a kept checkpoint (default: latest)"
    )
    export.add_argument("--out", required=True, metavar="DIR", help="a new directory")
    export.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from launch.d4pg import snapshots  # pylint: disable=import-outside-toplevel

    out, step = snapshots.export(run_dir_of(args, required=True), args.out, args.step)
    print(
        f"policy snapshot of learner step {step:,}: {os.path.abspath(out)}\n"
        f"  load it: policy = tf.saved_model.load({out!r}); actions = policy.act(observations)"
    )
    return 0
