"""`replicator train MODEL`: the vision trainers, registered by their own modules."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence

from launch.cli.common import Parser
from launch.runtime.errors import LaunchError

# Modules that may register `replicator train NAME` (each has `register(subparsers)`).
TRAIN_MODULES = ("vision.resnet.cli", "vision.sngan.cli")


def register(commands, argv: Sequence[str]) -> None:
    """Adds `train`; imports the vision code only when `argv` asks for it."""
    train = commands.add_parser(
        "train", help="train a vision model (resnet50, sngan)", allow_abbrev=False
    )
    models = train.add_subparsers(dest="model", metavar="MODEL", parser_class=Parser)
    models.required = True
    if argv and argv[0] == "train":  # Import vision code only when it is asked for.
        found = [m for m in TRAIN_MODULES if importlib.util.find_spec(m) is not None]
        if not found:
            raise LaunchError(
                "`replicator train` needs the vision trainers (vision.resnet.cli, "
                "vision.sngan.cli), which this installation does not have yet."
            )
        for module in found:
            importlib.import_module(module).register(models)
