"""The `replicator` parser and entry point: each command module registers its own
subcommand (`register(commands)`) and the function that runs it (``func``)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from launch.cli import evaluate, export, launch_d4pg, list_tasks, plot, train
from launch.cli.common import DESCRIPTION, PROG, Parser, split_config_flags
from launch.runtime.errors import LaunchError


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The whole command line; `argv` decides whether the vision trainers are imported."""
    parser = Parser(prog=PROG, description=DESCRIPTION, allow_abbrev=False)
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show TensorFlow's, XLA's and Reverb's C++ log lines on the console",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    launch_d4pg.register(commands)
    evaluate.register(commands)
    export.register(commands)
    plot.register(commands)
    list_tasks.register(commands)
    train.register(commands, argv)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `replicator` console script; returns the exit status."""
    from launch.cli import quiet  # pylint: disable=import-outside-toplevel

    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = "--verbose" in argv[: argv.index("--") if "--" in argv else len(argv)]
    argv = [a for a in argv if a != "--verbose"]
    os.environ.setdefault("MUJOCO_GL", "egl")
    command = next((a for a in argv if not a.startswith("-")), "")
    with quiet.console(verbose, command):
        return _main(argv)


def _main(argv: list[str]) -> int:
    try:
        parser = build_parser(argv)
        args, extra = parser.parse_known_args(argv)
        overrides, rest = split_config_flags(extra)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if overrides and getattr(args, "program", None) != "d4pg":
            parser.error("--config.KEY=VALUE flags apply to `launch d4pg` only")
        args.config_overrides = overrides
        code = args.func(args)
    except LaunchError as e:
        stream = sys.stdout if e.exit_code == 0 else sys.stderr
        prefix = "" if e.exit_code == 0 else f"{PROG}: error: "
        print(f"{prefix}{e}", file=stream, flush=True)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except SystemExit as e:  # argparse: --help (0) and usage errors (2).
        return e.code if isinstance(e.code, int) else 0
    return int(code or 0)
