"""What the SN-GAN quality benchmarks share: the digits classifier, the training command and
reading a finished run's EMA-generator metrics.

`vision_sngan_defaults.py` (does the paper's optimisation learn?) and
`vision_sngan_batches.py` (do larger batches give better samples?) both train
`replicator train sngan --data digits` with the CLI's default (Miyato et al. 2018)
optimisation and read IS / FID / class accuracy from the run directory, so they measure
the same thing the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# EMA-generator metrics logged as `eval/<name>` by the trainer; FID is better lower.
METRIC_NAMES = ("class_accuracy", "fid", "inception_score")
LOWER_IS_BETTER = {"class_accuracy": False, "fid": True, "inception_score": False}
# The run-config fields a result records: the optimisation, the model size and the batch.
CONFIG_KEYS = (
    "disc_steps",
    "g_learning_rate",
    "d_learning_rate",
    "beta1",
    "beta2",
    "lr_decay",
    "global_batch_size",
    "steps",
    "image_size",
    "g_base_channels",
    "d_base_channels",
    "eval_samples",
)


def train_classifier(out: str) -> float:
    """Trains the digits classifier into `out` and returns its test accuracy.

    In a subprocess, so the caller's TensorFlow devices stay unconfigured for a trainer's
    replication spec (logical devices must be set before TensorFlow starts).
    """
    trained = subprocess.run(
        [sys.executable, "-m", "vision.metrics.digits_classifier", "--out", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(trained.stdout.split("test accuracy ")[1].split(";")[0])


def train_argv(
    run: str,
    steps: int,
    batch_size: int,
    classifier: str,
    extra: Sequence[str] = (),
    checkpoint_every: int | None = None,
) -> list[str]:
    """`train sngan` arguments on the digits with the default optimisation, evaluating the
    EMA generator at step 0 and at the end only, with checkpoints every `checkpoint_every`
    steps (default: at the end only), plus `extra`."""
    return [
        "train",
        "sngan",
        "--data",
        "digits",
        "--run-dir",
        run,
        "--steps",
        str(steps),
        "--batch-size",
        str(batch_size),
        "--classifier",
        classifier,
        "--eval-every",
        "0",
        "--log-every",
        "100",
        "--checkpoint-every",
        str(checkpoint_every or steps),
        *extra,
    ]


def eval_metrics(run: str, step: int) -> dict[str, float]:
    """The EMA generator's METRIC_NAMES at `step` of the run in directory `run`."""
    from vision.common import run_dir  # pylint: disable=import-outside-toplevel

    values = {(r["step"], r["name"]): r["value"] for r in run_dir.read_metrics(run)}
    missing = [n for n in METRIC_NAMES if (step, f"eval/{n}") not in values]
    if missing:
        raise KeyError(f"{run}: no evaluation of {', '.join(missing)} at step {step}")
    return {n: values[(step, f"eval/{n}")] for n in METRIC_NAMES}


def run_config(run: str) -> dict:
    """The CONFIG_KEYS of the run in directory `run`, as the trainer saved them."""
    from vision.common import run_dir  # pylint: disable=import-outside-toplevel

    with open(os.path.join(run, run_dir.CONFIG_FILE)) as f:
        config: Mapping = json.load(f)["config"]
    return {k: config[k] for k in CONFIG_KEYS}
