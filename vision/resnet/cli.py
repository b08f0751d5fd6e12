"""`replicator train resnet50`: train a ResNet classifier on any replication spec.

    replicator train resnet50 --data digits --replicas cpu:2 --steps 300 \\
        --blocks 1,1 --channels 32,64 --stem-channels 16 --batch-size 64
    replicator train resnet50 --data /data/imagenet --replicas gpu --batch-size 1024 \\
        --precision bfloat16 --run-dir runs/r50          # 90 epochs, 5 of warmup
    replicator train resnet50 --data digits --workers 2 --steps 100   # 2 processes, one run
    replicator train resnet50 --run-dir runs/r50          # resume with the saved settings

Every flag left out takes the run directory's saved value when resuming, else
the default below. Usage errors print one line and exit with status 2.

Without the `replicator` console script: `python -m vision.resnet.cli train resnet50 ...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence

from vision.common import cli as common_cli
from vision.common.run_dir import saved_config

MODULE = "vision.resnet.cli"
# Flag (argparse dest) -> ClassificationConfig field; flags default to None = "not given".
_FLAGS = {
    "blocks": "blocks_per_group",
    "channels": "channels_per_group",
    **{
        name: name
        for name in (
            "data",
            "num_classes",
            "image_size",
            "stem",
            "stem_channels",
            "zero_init_last_bn",
            "bn_decay",
            "stride_in_1x1",
            "batch_size",
            "steps",
            "epochs",
            "base_learning_rate",
            "warmup_steps",
            "warmup_epochs",
            "schedule",
            "step_boundaries",
            "step_decay",
            "momentum",
            "label_smoothing",
            "weight_decay",
            "precision",
            "replicas",
            "workers",
            "seed",
            "log_every",
            "eval_every",
            "evaluate",
            "checkpoint_every",
            "keep_checkpoints",
        )
    },
}


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the `resnet50` command to the `train` command's subparsers."""
    # pylint: disable=import-outside-toplevel
    from vision.common.precision import PRECISIONS
    from vision.resnet.learning import SCHEDULES, ClassificationConfig

    d = ClassificationConfig()
    parser = subparsers.add_parser(
        "resnet50",
        help="ResNet-50 v1.5 (or a smaller ResNet) image classification",
        description=__doc__.split("\n")[0] + " Rerunning with the same --run-dir resumes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    add(
        "--data",
        help=f"'digits' or an ImageNet directory: tfds TFRecords or "
        f"train/<class>/ folders (default: {d.data})",
    )
    common_cli.add_run_flags(parser, "resnet50", dataclasses.asdict(d))
    add(
        "--batch-size",
        type=int,
        help=f"global batch size over all replicas of all workers (default: {d.batch_size})",
    )
    add(
        "--epochs",
        type=float,
        help=f"length of a new run in passes over the training split (default: {d.epochs:g})",
    )
    add("--steps", type=int, help="train until this step (default: from --epochs)")
    add(
        "--precision",
        choices=PRECISIONS,
        help="bfloat16 = bfloat16 compute on float32 weights (default: float32)",
    )
    add("--image-size", type=int, help="input side in pixels (default: 224; digits 16)")
    add("--num-classes", type=int, help="for TFRecords without label metadata")
    add("--blocks", type=common_cli.ints, help="blocks per group (default: 3,4,6,3)")
    add(
        "--channels",
        type=common_cli.ints,
        help="output channels per group (default: 256,512,1024,2048)",
    )
    add(
        "--stem",
        choices=("auto", "imagenet", "small"),
        help="imagenet = 7x7/2 conv + max-pool; small = 3x3/1 conv; auto picks by image "
        "size (>= 128: imagenet)",
    )
    add("--stem-channels", type=int, help=f"(default: {d.stem_channels})")
    add(
        "--zero-init-last-bn",
        type=common_cli.boolean,
        metavar="true|false",
        help="start each block's last batch-norm scale at zero (default: true)",
    )
    add("--bn-decay", type=float, help=f"batch-norm moving-average decay (default: {d.bn_decay})")
    add(
        "--stride-in-1x1",
        type=common_cli.boolean,
        metavar="true|false",
        help="downsample in each block's first 1x1 conv (ResNet v1, as Keras) instead of the "
        "3x3 (v1.5; default: false)",
    )
    add(
        "--base-learning-rate",
        "--lr",
        type=float,
        dest="base_learning_rate",
        help=f"learning rate for a batch of 256, scaled linearly (default: {d.base_learning_rate})",
    )
    add(
        "--warmup-epochs",
        type=float,
        help=f"linear warmup in epochs, at most a tenth of the run (default: {d.warmup_epochs:g})",
    )
    add("--warmup-steps", type=int, help="linear warmup in steps (overrides --warmup-epochs)")
    add("--schedule", choices=SCHEDULES, help="decay after warmup (default: cosine)")
    add(
        "--step-boundaries",
        type=common_cli.floats,
        help="fractions of --steps where 'step' decays (default: 30/90,60/90,80/90)",
    )
    add("--step-decay", type=float, help=f"(default: {d.step_decay})")
    add("--momentum", type=float, help=f"(default: {d.momentum})")
    add("--label-smoothing", type=float, help=f"(default: {d.label_smoothing})")
    add("--weight-decay", type=float, help=f"L2 on conv/linear weights (default: {d.weight_decay})")
    add("--eval-every", type=int, help="steps between evaluations; 0 = at the end (default: 0)")
    add(
        "--no-eval",
        dest="evaluate",
        action="store_const",
        const=False,
        help="never evaluate (for data without an evaluation split)",
    )
    parser.set_defaults(func=run)
    return parser


def resolve_config(args: argparse.Namespace):
    """Defaults <- the run directory's saved config <- flags given on the command line."""
    from vision.resnet.learning import ClassificationConfig  # pylint: disable=import-outside-toplevel

    saved = saved_config(args.run_dir) if args.run_dir else None
    values = common_cli.resolve(dataclasses.asdict(ClassificationConfig()), saved, args, _FLAGS)
    if values["data"] != "digits":  # saved absolute: a resume may start elsewhere
        values["data"] = os.path.abspath(values["data"])
    return ClassificationConfig(**values)


def _config_from_args(args):
    config = resolve_config(args)
    config.validate()
    return config


def _config_from_dict(values):
    from vision.resnet.learning import ClassificationConfig  # pylint: disable=import-outside-toplevel

    return ClassificationConfig(**values)


def run(args: argparse.Namespace) -> int:
    """Runs `train resnet50`; returns the exit status (0 done, 2 usage error, 1 diverged)."""
    from vision.resnet import training  # pylint: disable=import-outside-toplevel

    return common_cli.run_command(
        args,
        kind="resnet50",
        module=MODULE,
        config_from_args=_config_from_args,
        config_to_dict=dataclasses.asdict,
        config_from_dict=_config_from_dict,
        global_batch=lambda config: config.batch_size,
        train=training.train,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m vision.resnet.cli train resnet50 ...` (same as `replicator train resnet50`)."""
    return common_cli.main(register, MODULE, argv)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
