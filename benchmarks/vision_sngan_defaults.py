"""Do the paper defaults learn? SN-GAN on the digits with Miyato et al. 2018's optimisation.

Trains `replicator train sngan --data digits` with the default optimisation settings
(5 discriminator steps per generator step, Adam lr 2e-4, betas (0, 0.9), learning rates
decayed linearly to 0) and only the digits' small-network defaults (16x16 grey images,
widths 16), then compares the EMA generator's class accuracy, FID and Inception Score
(digits classifier trained here first) at step 0 and at the end. The learning test in
tests/vision uses faster settings (1 D step, larger learning rates); this shows the
defaults themselves learn.

Usage: .venv/bin/python benchmarks/vision_sngan_defaults.py [--steps 1500 --batch-size 64
       --out benchmarks/results/vision_sngan_defaults.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from vision.common import run_dir as run_dir_lib  # noqa: E402
from vision.sngan import cli as sngan_cli  # noqa: E402

NOISY_LOAD = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "vision_sngan_defaults.json")
    )
    args = parser.parse_args()
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as scratch:
        # The classifier trains in its own process: this one's TensorFlow devices are
        # left for the trainer's replication spec.
        classifier = os.path.join(scratch, "classifier")
        trained = subprocess.run(
            [sys.executable, "-m", "vision.metrics.digits_classifier", "--out", classifier],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        accuracy = float(trained.stdout.split("test accuracy ")[1].split(";")[0])
        run = os.path.join(scratch, "run")
        argv = [
            "train",
            "sngan",
            "--data",
            "digits",
            "--run-dir",
            run,
            "--steps",
            str(args.steps),
            "--batch-size",
            str(args.batch_size),
            "--classifier",
            classifier,
            "--eval-every",
            "0",
            "--log-every",
            "100",
            "--checkpoint-every",
            str(args.steps),
        ]
        start = time.perf_counter()
        code = sngan_cli.main(argv)
        seconds = time.perf_counter() - start
        loads.append(os.getloadavg()[0])
        if code != 0:
            print(f"training failed with status {code}", file=sys.stderr)
            return code
        values = {(r["step"], r["name"]): r["value"] for r in run_dir_lib.read_metrics(run)}
        with open(os.path.join(run, run_dir_lib.CONFIG_FILE)) as f:
            config = json.load(f)["config"]

    def metric(step: int, name: str) -> float:
        return values[(step, f"eval/{name}")]

    names = ("class_accuracy", "fid", "inception_score")
    result = {
        "benchmark": "vision_sngan_defaults",
        "what": "SN-GAN on the digits with the default (Miyato et al. 2018) optimisation: "
        "EMA-generator metrics at step 0 and at the end",
        "command": "python benchmarks/vision_sngan_defaults.py " + " ".join(sys.argv[1:]),
        "config": {
            k: config[k]
            for k in (
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
        },
        "classifier_eval_accuracy": accuracy,
        "at_step_0": {n: metric(0, n) for n in names},
        "at_end": {n: metric(args.steps, n) for n in names},
        "learned": metric(args.steps, "class_accuracy") > 2 * metric(0, "class_accuracy")
        and metric(args.steps, "fid") < metric(0, "fid"),
        "train_seconds": seconds,
        "load_average": {"at_start": loads[0], "at_end": loads[-1]},
        "noisy": max(loads) > NOISY_LOAD,
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: result[k] for k in ("at_step_0", "at_end", "learned")}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
