"""`replicator train sngan`: train a class-conditional SN-GAN on any replication spec.

    replicator train sngan --data digits --replicas cpu:2 --steps 1000 --batch-size 64 \\
        --run-dir runs/sngan-digits --classifier runs/digits-classifier
    replicator train sngan --data /data/imagenet --replicas gpu --image-size 128 \\
        --batch-size 2048 --g-channels 96 --d-channels 96 --steps 100000 --run-dir runs/sngan
    replicator train sngan --run-dir runs/sngan-digits --steps 2000   # resume, train longer

Every flag left out takes the run directory's saved value when resuming, else the default
below. Usage errors (bad flags, data, run directory, batch split) print one line and exit
with status 2; diverged losses exit with 1.

For IS/FID pass --classifier: a directory written by `vision.gan_metrics.save_classifier`,
e.g. `python -m vision.digits_classifier --out runs/digits-classifier` for the digits.

Without the `replicator` console script: `python -m vision.sngan_cli train sngan ...`.
"""

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from vision import training_common

# Flag (argparse dest) -> field of SNGANRunConfig.to_flat_dict(); flags default to None.
_FLAGS = {
    "data": "data",
    "replicas": "replicas",
    "steps": "steps",
    "classifier": "classifier",
    "eval_every": "eval_every",
    "eval_samples": "eval_samples",
    "log_every": "log_every",
    "checkpoint_every": "checkpoint_every",
    "keep_checkpoints": "keep_checkpoints",
    "grid_classes": "grid_classes",
    "grid_columns": "grid_columns",
    "image_size": "image_size",
    "channels": "channels",
    "latent_dim": "latent_dim",
    "g_channels": "g_base_channels",
    "d_channels": "d_base_channels",
    "batch_size": "global_batch_size",
    "disc_steps": "disc_steps",
    "g_lr": "g_learning_rate",
    "d_lr": "d_learning_rate",
    "beta1": "beta1",
    "beta2": "beta2",
    "ema_decay": "ema_decay",
    "ema_start": "ema_start",
    "bn_decay": "bn_decay",
    "seed": "seed",
}
# The defaults that depend on the data: grey 16x16 digits, else 32x32 RGB.
_DATA_DEFAULTS = {
    "digits": {
        "image_size": 16,
        "channels": 1,
        "g_base_channels": 16,
        "d_base_channels": 16,
        "ema_start": 100,
        "ema_decay": 0.99,
    }
}
_FOLDER_DEFAULTS = {"image_size": 32, "channels": 3}


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the `sngan` command to the `train` command's subparsers."""
    from vision.sngan_train import SNGANRunConfig  # pylint: disable=import-outside-toplevel

    d = SNGANRunConfig().to_flat_dict()
    parser = subparsers.add_parser(
        "sngan",
        help="class-conditional SN-GAN (projection D, conditional-BN G, hinge loss)",
        description=__doc__.split("\n")[0] + " Rerunning with the same --run-dir resumes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add = parser.add_argument
    add(
        "--data",
        help="'digits' or a directory with one sub-directory of images per class "
        f"(DIR/<class>/*.png or DIR/train/<class>/*.JPEG) (default: {d['data']})",
    )
    add(
        "--replicas",
        help=f"replication spec: cpu, cpu:N, gpu, multiworker, tpu (default: {d['replicas']})",
    )
    add("--run-dir", help="run directory (default: runs/sngan-<time>); reusing one resumes")
    add(
        "--batch-size",
        type=int,
        help=f"global batch size over all replicas (default: {d['global_batch_size']})",
    )
    add("--steps", type=int, help=f"train until this generator step (default: {d['steps']})")
    add(
        "--disc-steps",
        type=int,
        help=f"discriminator steps per generator step (default: {d['disc_steps']})",
    )
    add(
        "--image-size",
        type=int,
        help="generated image side: 8, 16, 32, 64, 128 or 256 (default: digits 16, folders 32)",
    )
    add(
        "--channels",
        type=int,
        choices=(1, 3),
        help="1 = grey, 3 = RGB (default: digits 1, folders 3)",
    )
    add("--latent-dim", type=int, help=f"(default: {d['latent_dim']})")
    add(
        "--g-channels",
        type=int,
        help="generator width: channels of its last block, "
        f"doubling per level up to x16 (default: {d['g_base_channels']}; digits 16)",
    )
    add(
        "--d-channels",
        type=int,
        help="discriminator width: channels of its first block "
        f"(default: {d['d_base_channels']}; digits 16)",
    )
    add(
        "--g-lr", type=float, help=f"generator Adam learning rate (default: {d['g_learning_rate']})"
    )
    add(
        "--d-lr",
        type=float,
        help=f"discriminator Adam learning rate (default: {d['d_learning_rate']})",
    )
    add("--beta1", type=float, help=f"Adam beta1 (default: {d['beta1']})")
    add("--beta2", type=float, help=f"Adam beta2 (default: {d['beta2']})")
    add(
        "--ema-decay",
        type=float,
        help=f"generator weight EMA decay (default: {d['ema_decay']}; digits 0.99)",
    )
    add(
        "--ema-start",
        type=int,
        help="generator steps before the EMA starts averaging "
        f"(default: {d['ema_start']}; digits 100)",
    )
    add(
        "--bn-decay", type=float, help=f"batch-norm moving-average decay (default: {d['bn_decay']})"
    )
    add("--seed", type=int, help="initialisation, data order and noise seed (default: 0)")
    add(
        "--classifier",
        help="classifier directory for Inception Score / FID / class accuracy "
        "(see vision.digits_classifier); none: no IS/FID",
    )
    add(
        "--eval-every",
        type=int,
        help=f"steps between sample grids and IS/FID; 0 = at the end (default: {d['eval_every']})",
    )
    add(
        "--eval-samples",
        type=int,
        help=f"images per IS/FID evaluation (default: {d['eval_samples']})",
    )
    add("--log-every", type=int, help=f"steps between progress lines (default: {d['log_every']})")
    add("--checkpoint-every", type=int, help=f"(default: {d['checkpoint_every']})")
    add("--keep-checkpoints", type=int, help=f"(default: {d['keep_checkpoints']})")
    add(
        "--grid-classes",
        type=int,
        help=f"rows (classes) of the sample grid (default: {d['grid_classes']})",
    )
    add(
        "--grid-columns",
        type=int,
        help=f"samples per class in the grid (default: {d['grid_columns']})",
    )
    parser.set_defaults(func=run)
    return parser


def resolve_config(args: argparse.Namespace):
    """Defaults (by data) <- the run directory's saved config <- flags given."""
    from vision.sngan_train import SNGANRunConfig  # pylint: disable=import-outside-toplevel

    values = SNGANRunConfig().to_flat_dict()
    saved = {}
    config_path = os.path.join(args.run_dir, training_common.CONFIG_FILE)
    if os.path.exists(config_path):
        try:
            with open(config_path) as f:
                saved = json.load(f).get("config", {})
        except (OSError, ValueError, AttributeError) as error:
            raise training_common.RunDirError(
                f"cannot read {config_path} ({error}); use another --run-dir."
            ) from None
    data = args.data if args.data is not None else saved.get("data", values["data"])
    values.update(_DATA_DEFAULTS.get(data, _FOLDER_DEFAULTS))
    values.update({k: v for k, v in saved.items() if k in values})
    for flag, field in _FLAGS.items():
        given = getattr(args, flag, None)
        if given is not None:
            values[field] = given
    # Paths are saved absolute, so a resume from another working directory finds them.
    if values["data"] != "digits":
        values["data"] = os.path.abspath(values["data"])
    if values["classifier"]:
        values["classifier"] = os.path.abspath(values["classifier"])
    return SNGANRunConfig.from_flat_dict(values)


def _usage_errors():
    """Errors that mean "the command line asked for something impossible"."""
    # pylint: disable=import-outside-toplevel
    import replication
    from vision.data import DataError
    from vision.gan_metrics import ClassifierExportError
    from vision.sngan_train import ConfigError

    return (
        ConfigError,
        DataError,
        ClassifierExportError,
        training_common.RunDirError,
        replication.BatchSplitError,
        replication.DeploymentSpecError,
    )


def run(args: argparse.Namespace) -> int:
    """Runs `train sngan`; returns the exit status (0 done, 2 usage error, 1 diverged)."""
    prog = "replicator train sngan"
    if not args.run_dir:
        args.run_dir = os.path.join("runs", time.strftime("sngan-%Y%m%d-%H%M%S"))
    try:
        config = resolve_config(args)
        config.validate()
        import replication  # pylint: disable=import-outside-toplevel
        from vision import sngan_train  # pylint: disable=import-outside-toplevel

        try:
            repl = replication.make(config.replicas)
        except RuntimeError as error:  # e.g. 'gpu' without a GPU, devices set too late
            raise sngan_train.ConfigError(str(error)) from None
        sngan_train.train(config, run_dir=args.run_dir, repl=repl)
    except _usage_errors() as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 2
    except FloatingPointError as error:
        print(f"{prog}: error: {error}", file=sys.stderr, flush=True)
        return 1
    print(f"Run directory: {args.run_dir}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m vision.sngan_cli train sngan ...` (same as `replicator train sngan`)."""
    parser = argparse.ArgumentParser(prog="python -m vision.sngan_cli")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train")
    register(train.add_subparsers(dest="model", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
