"""What every `replicator` command shares: the program name, the parser class, and
the ``--config.KEY=VALUE`` flags `launch d4pg` takes beyond argparse."""

from __future__ import annotations

import argparse

from launch.runtime.errors import LaunchError

PROG = "replicator"
DESCRIPTION = "`replicator`: launch distributed D4PG, evaluate and plot runs, list tasks, train vision models."


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage stays available through --help)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def add_run_dir_arguments(parser: argparse.ArgumentParser, help_text: str) -> None:
    """A run directory as `RUN_DIR` or `--run-dir RUN_DIR`: `plot` takes runs positionally,
    so a user who learned it types `evaluate RUN_DIR` too. Read with `run_dir_of`."""
    parser.add_argument("run", nargs="?", default=None, metavar="RUN_DIR", help=help_text)
    parser.add_argument("--run-dir", default=None, help="the same as RUN_DIR")


def run_dir_of(args: argparse.Namespace, required: bool) -> str | None:
    """The run directory given either way (None if neither and not `required`).

    Raises:
      LaunchError: both given and different, or neither given when `required`.
    """
    if args.run and args.run_dir and args.run != args.run_dir:
        raise LaunchError(
            f"two run directories given ({args.run} and --run-dir {args.run_dir}): pass one."
        )
    run_dir = args.run or args.run_dir
    if run_dir is None and required:
        raise LaunchError("which run? Pass its directory: RUN_DIR or --run-dir RUN_DIR.")
    return run_dir


def split_config_flags(extra: list[str]) -> tuple[dict[str, str], list[str]]:
    """Pulls ``--config.KEY=VALUE`` and ``--config.KEY VALUE`` out of unknown arguments."""
    overrides, rest = {}, []
    i = 0
    while i < len(extra):
        arg = extra[i]
        if arg.startswith("--config."):
            key, eq, value = arg[len("--config.") :].partition("=")
            if not eq:
                if i + 1 >= len(extra):
                    raise LaunchError(f"{arg} needs a value: {arg}=VALUE")
                value = extra[i + 1]
                i += 1
            overrides[key] = value
        else:
            rest.append(arg)
        i += 1
    return overrides, rest


def flag_value(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
