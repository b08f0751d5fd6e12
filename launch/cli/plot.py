"""`replicator plot`: runs against actor steps and wall time (`launch.reporting.plot`)."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    """Adds `plot`."""
    from launch.reporting import references  # pylint: disable=import-outside-toplevel

    plot = commands.add_parser(
        "plot",
        help="plot runs (mean and 95%% band over seeds) vs actor steps and wall time",
        allow_abbrev=False,
        description="Plots runs grouped by task and config (runs differing only by seed are "
        "averaged, with a 95% confidence band), against actor steps and wall time.",
    )
    plot.add_argument("runs", nargs="*", metavar="RUN", help="run directories")
    plot.add_argument("--run-dir", default=None, help="one run (same as a single RUN)")
    plot.add_argument(
        "--metric",
        default="eval_return",
        help="a metrics.csv column, e.g. critic_loss (default: %(default)s)",
    )
    plot.add_argument(
        "--group-by",
        default=None,
        metavar="FIELDS",
        help="group runs by these fields instead of task and config: task, config, "
        "config.KEY (comma-separated); needed to plot several tasks together",
    )
    plot.add_argument(
        "--out", default=None, help="PNG path (default: RUN_DIR/METRIC.png, or ./METRIC.png)"
    )
    plot.add_argument(
        "--reference",
        default=None,
        metavar="METHOD[,METHOD...]|all",
        help="also draw these agents' published eval_return curves on the task, from state "
        "features, dashed on the actor-steps panel: "
        f"{', '.join(references.METHOD_NAMES)} or all (source: launch/reporting/data/"
        "dmc_proprio_baselines.json)",
    )
    plot.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from launch.reporting import plot  # pylint: disable=import-outside-toplevel

    runs = list(args.runs) + ([args.run_dir] if args.run_dir else [])
    print(
        plot.plot(
            runs,
            args.out,
            metric=args.metric,
            group_by=plot.parse_group_by(args.group_by),
            reference=plot.parse_references(args.reference),
        )
    )
    return 0
