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
