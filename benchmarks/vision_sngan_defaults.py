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
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import vision_sngan_common as common  # noqa: E402
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
        classifier = os.path.join(scratch, "classifier")
        accuracy = common.train_classifier(classifier)
        run = os.path.join(scratch, "run")
        argv = common.train_argv(run, args.steps, args.batch_size, classifier)
        start = time.perf_counter()
        code = sngan_cli.main(argv)
        seconds = time.perf_counter() - start
        loads.append(os.getloadavg()[0])
        if code != 0:
            print(f"training failed with status {code}", file=sys.stderr)
            return code
        at_step_0 = common.eval_metrics(run, 0)
        at_end = common.eval_metrics(run, args.steps)
        config = common.run_config(run)

    result = {
        "benchmark": "vision_sngan_defaults",
        "what": "SN-GAN on the digits with the default (Miyato et al. 2018) optimisation: "
        "EMA-generator metrics at step 0 and at the end",
        "command": "python benchmarks/vision_sngan_defaults.py " + " ".join(sys.argv[1:]),
        "config": config,
        "classifier_eval_accuracy": accuracy,
        "at_step_0": at_step_0,
        "at_end": at_end,
        "learned": at_end["class_accuracy"] > 2 * at_step_0["class_accuracy"]
        and at_end["fid"] < at_step_0["fid"],
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
