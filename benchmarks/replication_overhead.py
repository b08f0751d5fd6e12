"""Replication overhead: step time of a fixed global batch on `cpu:N` over `cpu`.

Each spec runs in its own process (logical devices are fixed per process), in
alternating rounds so that load from elsewhere hits every spec alike; the best
round of each is kept. Writes benchmarks/results/replication.json.

    .venv/bin/python benchmarks/replication_overhead.py [--rounds 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "replication.json"
SPECS = ("cpu", "cpu:2", "cpu:4")

CHILD = r"""
import json, sys, time
import numpy as np, sonnet as snt, tensorflow as tf
import replication
spec, batch, steps, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
repl = replication.make(spec)
with repl.scope():
    model = snt.nets.MLP([width, width, width, 10])
    model(tf.zeros([1, 256]))
    opt = repl.wrap_optimizer(snt.optimizers.Adam(1e-3))
x = np.random.RandomState(0).randn(batch, 256).astype(np.float32)
y = np.random.RandomState(1).randint(0, 10, batch)
data = repl.distribute(lambda ctx: tf.data.Dataset.from_tensors(
    (x[: ctx.get_per_replica_batch_size(batch)], y[: ctx.get_per_replica_batch_size(batch)])).repeat())
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, model(xb)))
    opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return loss
@tf.function
def train(it):
    return repl.reduce(repl.run(step, *next(it)), "mean")
it = iter(data)
for _ in range(5): train(it).numpy()
start = time.perf_counter()
for _ in range(steps): loss = train(it)
loss.numpy()
elapsed = time.perf_counter() - start
print(json.dumps({"spec": spec, "step_seconds": elapsed / steps, "examples_per_second": batch * steps / elapsed}))
"""


def measure(spec: str, batch: int, steps: int, width: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", CHILD, spec, str(batch), str(steps), str(width)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=512, help="global batch, divisible by 4")
    parser.add_argument("--width", type=int, default=1024, help="MLP hidden width")
    args = parser.parse_args()
    best: dict[str, dict] = {}
    for round_index in range(args.rounds):
        for spec in SPECS:
            result = measure(spec, args.batch, args.steps, args.width)
            if spec not in best or result["step_seconds"] < best[spec]["step_seconds"]:
                best[spec] = result
            print(
                f"round {round_index + 1}: {spec:6s} {result['step_seconds'] * 1e3:8.2f} ms/step "
                f"{result['examples_per_second']:9.0f} examples/s",
                flush=True,
            )
    base = best["cpu"]["step_seconds"]
    summary = {
        "benchmark": "replication_overhead",
        "model": f"MLP 256-{args.width}x3-10, Adam, global batch {args.batch}",
        "date": time.strftime("%Y-%m-%d"),
        "cores": os.cpu_count(),
        "load_average_at_end": os.getloadavg()[0],
        "step_time_ratio_cpu2_over_cpu": best["cpu:2"]["step_seconds"] / base,
        "target_ratio_at_most": 1.15,
        "examples_per_second": {spec: best[spec]["examples_per_second"] for spec in SPECS},
        "step_seconds": {spec: best[spec]["step_seconds"] for spec in SPECS},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"cpu:2 / cpu step time: {summary['step_time_ratio_cpu2_over_cpu']:.3f} (target <= 1.15)")
    print("examples/s:", {k: round(v) for k, v in summary["examples_per_second"].items()})
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
