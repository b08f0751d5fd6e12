"""`replicator train resnet50`: train a ResNet classifier on any replication spec.

    replicator train resnet50 --data digits --replicas cpu:2 --steps 300 \\
        --blocks 1,1 --channels 32,64 --stem-channels 16 --batch-size 64
    replicator train resnet50 --data /data/imagenet --replicas gpu --batch-size 1024 \\
        --steps 112590 --precision bfloat16 --run-dir runs/r50
    replicator train resnet50 --run-dir runs/r50          # resume with the saved settings

Every flag left out takes the run directory's saved value when resuming, else
the default below. Usage errors print one line and exit with status 2.

Without the `replicator` console script: `python -m vision.resnet_cli train resnet50 ...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence

from vision import training_common

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
            "base_learning_rate",
            "warmup_steps",
            "schedule",
            "step_boundaries",
            "step_decay",
            "momentum",
            "label_smoothing",
            "weight_decay",
            "precision",
            "replicas",
            "seed",
            "log_every",
            "eval_every",
            "checkpoint_every",
            "keep_checkpoints",
        )
    },
}


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the `resnet50` command to the `train` command's subparsers."""
    # pylint: disable=import-outside-toplevel
    from vision.classification import SCHEDULES, ClassificationConfig
    from vision.precision import PRECISIONS

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
    add(
        "--replicas",
        help=f"replication spec: cpu, cpu:N, gpu, multiworker, tpu (default: {d.replicas})",
    )
    add("--run-dir", help="run directory (default: runs/resnet50-<time>); reusing one resumes")
    add(
        "--batch-size",
        type=int,
        help=f"global batch size over all replicas (default: {d.batch_size})",
    )
    add("--steps", type=int, help=f"train until this step (default: {d.steps})")
    add(
        "--precision",
        choices=PRECISIONS,
        help="bfloat16 = bfloat16 compute on float32 weights (default: float32)",
    )
    add("--image-size", type=int, help="input side in pixels (default: 224; digits 16)")
    add("--num-classes", type=int, help="for TFRecords without label metadata")
    add("--blocks", type=_ints, help="blocks per group (default: 3,4,6,3)")
    add("--channels", type=_ints, help="output channels per group (default: 256,512,1024,2048)")
    add(
        "--stem",
        choices=("auto", "imagenet", "small"),
        help="imagenet = 7x7/2 conv + max-pool; small = 3x3/1 conv; auto picks by image "
        "size (>= 128: imagenet)",
    )
    add("--stem-channels", type=int, help=f"(default: {d.stem_channels})")
    add(
        "--zero-init-last-bn",
        type=_bool,
        metavar="true|false",
        help="start each block's last batch-norm scale at zero (default: true)",
    )
    add("--bn-decay", type=float, help=f"batch-norm moving-average decay (default: {d.bn_decay})")
    add(
        "--stride-in-1x1",
        type=_bool,
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
    add("--warmup-steps", type=int, help="linear warmup steps (default: 5%% of --steps)")
    add("--schedule", choices=SCHEDULES, help="decay after warmup (default: cosine)")
    add(
        "--step-boundaries",
        type=_floats,
        help="fractions of --steps where 'step' decays (default: 30/90,60/90,80/90)",
    )
    add("--step-decay", type=float, help=f"(default: {d.step_decay})")
    add("--momentum", type=float, help=f"(default: {d.momentum})")
    add("--label-smoothing", type=float, help=f"(default: {d.label_smoothing})")
    add("--weight-decay", type=float, help=f"L2 on conv/linear weights (default: {d.weight_decay})")
    add("--seed", type=int, help="data order and augmentation seed (default: 0)")
    add("--log-every", type=int, help=f"steps between progress lines (default: {d.log_every})")
    add("--eval-every", type=int, help="steps between evaluations; 0 = at the end (default: 0)")
    add("--checkpoint-every", type=int, help=f"(default: {d.checkpoint_every})")
    add("--keep-checkpoints", type=int, help=f"(default: {d.keep_checkpoints})")
    add(
        "--stop-at",
        type=int,
        metavar="STEP",
        help="end this invocation at STEP with a checkpoint, as if preempted (the schedule "
        "still spans --steps); rerun to continue",
    )
    parser.set_defaults(func=run)
    return parser


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def resolve_config(args: argparse.Namespace):
    """Defaults <- the run directory's saved config <- flags given on the command line."""
    # pylint: disable=import-outside-toplevel
    from vision.classification import ClassificationConfig

    values = dataclasses.asdict(ClassificationConfig())
    saved = training_common.saved_config(args.run_dir) if args.run_dir else None
    values.update({k: v for k, v in (saved or {}).items() if k in values})
    for flag, field in _FLAGS.items():
        given = getattr(args, flag, None)
        if given is not None:
            values[field] = given
    return ClassificationConfig(**values)


def run(args: argparse.Namespace) -> int:
    """Runs `train resnet50`; returns the exit status (0 done, 2 usage error, 1 diverged)."""
    prog = "replicator train resnet50"
    if not args.run_dir:
        args.run_dir = os.path.join("runs", time.strftime("resnet50-%Y%m%d-%H%M%S"))
    try:
        config = resolve_config(args)
        config.validate()
        import replication  # pylint: disable=import-outside-toplevel
        from vision import classification  # pylint: disable=import-outside-toplevel

        try:
            repl = replication.make(config.replicas)
        except RuntimeError as error:  # e.g. 'gpu' without a GPU, devices set too late
            raise classification.ConfigError(str(error)) from None
        classification.train(
            config, run_dir=args.run_dir, repl=repl, stop_at=getattr(args, "stop_at", None)
        )
    except _usage_errors() as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 2
    except FloatingPointError as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"Run directory: {args.run_dir}")
    return 0


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean "the command line asked for something impossible"."""
    # pylint: disable=import-outside-toplevel
    import replication
    from vision.classification import ConfigError
    from vision.data import DataError

    return (
        ConfigError,
        DataError,
        training_common.RunDirError,
        replication.BatchSplitError,
        replication.DeploymentSpecError,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m vision.resnet_cli train resnet50 ...` (same as `replicator train resnet50`)."""
    parser = argparse.ArgumentParser(prog="python -m vision.resnet_cli")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train")
    register(train.add_subparsers(dest="model", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
