"""`replicator list-tasks`: the dm-control tasks `--env` accepts."""

from __future__ import annotations

import argparse


def register(commands) -> None:
    """Adds `list-tasks`."""
    list_tasks = commands.add_parser("list-tasks", help="list the dm-control tasks")
    list_tasks.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    del args
    import environments  # pylint: disable=import-outside-toplevel

    print("\n".join(environments.list_tasks()))
    return 0
