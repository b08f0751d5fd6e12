"""`replicator train sngan`: train a class-conditional SN-GAN on any replication spec.

    replicator train sngan --data digits --replicas cpu:2 --steps 1000 --batch-size 64 \\
        --run-dir runs/sngan-digits --classifier runs/digits-classifier
    replicator train sngan --data /data/imagenet --replicas gpu --image-size 128 \\
        --batch-size 256 --g-channels 64 --d-channels 64 --steps 450000 --run-dir runs/sngan
    replicator train sngan --data digits --workers 2 --steps 100    # 2 processes, one run
    replicator train sngan --run-dir runs/sngan-digits --steps 2000   # resume, train longer

The optimisation defaults are Miyato et al. 2018's (n_dis 5, Adam lr 2e-4, betas (0, 0.9),
learning rates decayed linearly to 0 over --steps). ImageNet data (tfds TFRecords or class
folders) is centre-cropped to a square, resized and flipped at random.

Every flag left out takes the run directory's saved value when resuming, else the default
below. Usage errors (bad flags, data, run directory, batch split) print one line and exit
with status 2; diverged losses exit with 1.

For IS/FID pass --classifier: a directory written by `vision.metrics.gan.save_classifier`,
e.g. `python -m vision.metrics.digits_classifier --out runs/digits-classifier` for the digits.
IS is the mean over 10 splits of --eval-samples samples (default 50,000, as papers report it;
1,000 for the digits).

Without the `replicator` console script: `python -m vision.sngan.cli train sngan ...`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from vision.common import cli as common_cli
from vision.common.run_dir import saved_config

MODULE = "vision.sngan.cli"
# Flag (argparse dest) -> field of SNGANRunConfig.to_flat_dict(); flags default to None.
_FLAGS = {
    "data": "data",
    "replicas": "replicas",
    "workers": "workers",
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
    "lr_decay": "lr_decay",
    "standing_samples": "standing_samples",
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
        "eval_samples": 1000,
    }
}
_FOLDER_DEFAULTS = {"image_size": 32, "channels": 3}


def register(subparsers) -> argparse.ArgumentParser:
    """Adds the `sngan` command to the `train` command's subparsers."""
    from vision.sngan.training import SNGANRunConfig  # pylint: disable=import-outside-toplevel

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
        help="'digits', ImageNet as tfds TFRecords, or a directory with one sub-directory of "
        f"images per class (DIR/<class>/*.png or DIR/train/<class>/*.JPEG) (default: {d['data']})",
    )
    common_cli.add_run_flags(parser, "sngan", d)
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
        "--lr-decay",
        choices=("linear", "constant"),
        help=f"learning rates decay linearly to 0 over --steps, or stay (default: {d['lr_decay']})",
    )
    add(
        "--standing-samples",
        type=int,
        help="latents used to recompute the EMA generator's batch-norm statistics before "
        f"sampling (default: {d['standing_samples']})",
    )
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
        help=f"images per IS/FID evaluation (default: {d['eval_samples']}; digits 1000)",
    )
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
    from vision.sngan.training import SNGANRunConfig  # pylint: disable=import-outside-toplevel

    defaults = SNGANRunConfig().to_flat_dict()
    saved = saved_config(args.run_dir) or {}
    data = args.data if args.data is not None else saved.get("data", defaults["data"])
    defaults.update(_DATA_DEFAULTS.get(data, _FOLDER_DEFAULTS))
    values = common_cli.resolve(defaults, saved, args, _FLAGS)
    # Paths are saved absolute, so a resume from another working directory finds them.
    if values["data"] != "digits":
        values["data"] = os.path.abspath(values["data"])
    if values["classifier"]:
        values["classifier"] = os.path.abspath(values["classifier"])
    return SNGANRunConfig.from_flat_dict(values)


def _config_from_args(args):
    config = resolve_config(args)
    config.validate()
    return config


def _config_from_dict(values):
    from vision.sngan.training import SNGANRunConfig  # pylint: disable=import-outside-toplevel

    return SNGANRunConfig.from_flat_dict(values)


def run(args: argparse.Namespace) -> int:
    """Runs `train sngan`; returns the exit status (0 done, 2 usage error, 1 diverged)."""
    from vision.sngan import training  # pylint: disable=import-outside-toplevel

    return common_cli.run_command(
        args,
        kind="sngan",
        module=MODULE,
        config_from_args=_config_from_args,
        config_to_dict=lambda config: config.to_flat_dict(),
        config_from_dict=_config_from_dict,
        global_batch=lambda config: config.model.global_batch_size,
        train=training.train,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m vision.sngan.cli train sngan ...` (same as `replicator train sngan`)."""
    return common_cli.main(register, MODULE, argv)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
