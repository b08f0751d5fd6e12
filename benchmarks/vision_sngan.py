"""SN-GAN training throughput on `cpu:2` over `cpu` at the same global batch.

Both learners are built in ONE process (two logical CPU devices; `cpu` uses the first) on the
digits data and measured in interleaved rounds (each round times every configuration back to
back), so a change in machine load hits both alike; the result is the median of the per-round
ratios. A training step is `disc_steps` discriminator updates (one global batch of real images
each) and one generator update; images/s counts real images, i.e. global batch x disc_steps
per step. Process CPU seconds per step are recorded too (all threads; less sensitive to other
jobs competing for the cores).

Global batches 64 and 256 by default (32 and 128 images per replica on `cpu:2`).

Usage: .venv/bin/python benchmarks/vision_sngan.py [--batch-sizes 64,256 --image-size 16
       --channels 16 --disc-steps 2 --rounds 7 --steps-per-round 5]
Writes benchmarks/results/vision_sngan.json.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import replication  # noqa: E402

REPLICATORS = {
    "cpu:2": replication.make("cpu:2"),  # logical devices before TF starts
    "cpu": replication.make("cpu"),
}

import tensorflow as tf  # noqa: E402

from vision import data  # noqa: E402
from vision.sngan import learning as sngan_learner  # noqa: E402
from vision.sngan import training  # noqa: E402


def build(repl, batch_size, args):
    """A `() -> None` SN-GAN training step on `repl` (fetches the losses, so it is finished)."""
    tf.random.set_seed(0)
    config = sngan_learner.SNGANConfig(
        image_size=args.image_size,
        channels=1,
        g_base_channels=args.channels,
        d_base_channels=args.channels,
        global_batch_size=batch_size,
        disc_steps=args.disc_steps,
    )
    learner = sngan_learner.SNGANLearner(config, repl)
    dataset = data.open_dataset("digits")
    iterator = iter(repl.distribute(training.learner_input_fn(dataset, config)))
    return lambda: {k: float(v) for k, v in learner.train_step(iterator).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="64,256", help="global batch sizes")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--channels", type=int, default=16, help="G and D base widths")
    parser.add_argument("--disc-steps", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps-per-round", type=int, default=5)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vision_sngan.json"))
    args = parser.parse_args()
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]

    load_at_start = os.getloadavg()[0]
    steps = {}
    for batch in batch_sizes:
        for spec, repl in REPLICATORS.items():
            steps[(spec, batch)] = build(repl, batch, args)
            for _ in range(args.warmup_steps):  # tracing and graph optimisation
                steps[(spec, batch)]()
    wall = {key: [] for key in steps}
    cpu = {key: [] for key in steps}
    ratios = {batch: [] for batch in batch_sizes}
    for round_index in range(args.rounds):
        for (spec, batch), step in steps.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(args.steps_per_round):
                step()
            elapsed = time.perf_counter() - start
            wall[(spec, batch)].append(args.steps_per_round * batch * args.disc_steps / elapsed)
            cpu[(spec, batch)].append((time.process_time() - cpu_start) / args.steps_per_round)
        for batch in batch_sizes:
            ratios[batch].append(wall[("cpu:2", batch)][-1] / wall[("cpu", batch)][-1])
        print(
            f"round {round_index + 1}/{args.rounds}: "
            + "  ".join(
                f"[{spec} batch {batch}] {wall[(spec, batch)][-1]:6.1f} images/s"
                for spec, batch in steps
            ),
            flush=True,
        )

    def by_batch(values, summary=statistics.median):
        return {
            str(batch): {
                spec: summary(values[(spec, batch)]) if summary else values[(spec, batch)]
                for spec in REPLICATORS
            }
            for batch in batch_sizes
        }

    result = {
        "benchmark": "vision_sngan",
        "what": "SN-GAN training-step throughput (real images/s), cpu:2 over cpu, same global "
        "batch; median of per-round ratios",
        "command": "python benchmarks/vision_sngan.py " + " ".join(sys.argv[1:]),
        "config": {
            "image_size": args.image_size,
            "channels": 1,
            "data": "digits",
            "g_base_channels": args.channels,
            "d_base_channels": args.channels,
            "global_batch_sizes": batch_sizes,
            "disc_steps": args.disc_steps,
            "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
        },
        "images_per_second_median": by_batch(wall),
        "images_per_second_rounds": by_batch(wall, None),
        "cpu_seconds_per_step_median": by_batch(cpu),
        "ratio_cpu2_over_cpu_median": {str(b): statistics.median(r) for b, r in ratios.items()},
        "ratio_cpu2_over_cpu_rounds": {str(b): r for b, r in ratios.items()},
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1_5_15_at_end": [round(x, 2) for x in os.getloadavg()],
            "note": "2-core machine shared with other engineers' TensorFlow jobs; "
            "timings are noisy (see load average).",
        },
        "load_average_at_start": load_at_start,
        # 2 cores: a 1-minute load average above 2 means other jobs competed for them.
        "noisy": max(load_at_start, os.getloadavg()[0]) > 2.0,
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, sort_keys=True)
        f.write("\n")
    for batch in batch_sizes:
        print(
            f"global batch {batch}: cpu:2 / cpu images/s = "
            f"{result['ratio_cpu2_over_cpu_median'][str(batch)]:.3f} "
            f"(median of {args.rounds} rounds)"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
