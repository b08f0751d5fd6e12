"""Replication overhead: our layer against plain tf.distribute on the same logical devices.

The same model (MLP 256-W-W-W-10, softmax cross-entropy, Adam, fixed global batch) runs
on `cpu`, `cpu:2`, ... with three implementations:

  ours   `replication.make(spec)`, `repl.wrap_optimizer(snt Adam)`, `repl.run/reduce`;
  snt    a plain `snt.distribute.Replicator` over the same devices, Sonnet Adam, the
         gradient mean-all-reduce written in the step (what our optimizer wrapper does);
  tf     a plain `tf.distribute.MirroredStrategy` over the same devices with mirrored
         variables and `tf.keras.optimizers.Adam` (which aggregates gradients itself).

ours / plain at the same spec is the layer's own cost (target <= 1.05); plain `cpu:N` /
plain `cpu` is what N logical devices on shared cores cost TensorFlow itself (the
layer cannot do better than that). Keras' Adam is a fused kernel and Sonnet's is not, so
ours / tf differs from 1 at `cpu` already: compare ours with snt for the layer, and the
ratio ours / tf at `cpu:N` against the same ratio at `cpu`.

Each (implementation, spec) runs in its own process (logical devices are fixed per
process), in rotated order over --rounds rounds; each process times --repeats blocks of
--steps steps and reports its median block. Results: medians over rounds; the load
average is recorded per run (noisy when it exceeded 2, the core count).

    python benchmarks/replication_overhead.py [--rounds 3 --steps 20 --specs cpu,cpu:2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "replication.json"
IMPLS = ("ours", "snt", "tf")

CHILD = r"""
import json, statistics, sys, time
impl, spec = sys.argv[1], sys.argv[2]
batch, steps, width, repeats = (int(a) for a in sys.argv[3:7])
n = 1 if spec == "cpu" else int(spec.split(":")[1])
if impl == "ours":
    import replication
    repl = replication.make(spec)
import numpy as np, sonnet as snt, tensorflow as tf
if impl != "ours":
    cpus = tf.config.list_physical_devices("CPU")
    if n > 1:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:n]
    strategy = (snt.distribute.Replicator(devices) if impl == "snt"
                else tf.distribute.MirroredStrategy(devices))
else:
    strategy = repl.strategy
x = np.random.RandomState(0).randn(batch, 256).astype(np.float32)
y = np.random.RandomState(1).randint(0, 10, batch)
def input_fn(ctx):
    b = ctx.get_per_replica_batch_size(batch)
    return tf.data.Dataset.from_tensors((x[:b], y[:b])).repeat()
scope = repl.scope if impl == "ours" else strategy.scope
with scope():
    model = snt.nets.MLP([width, width, width, 10])
    model(tf.zeros([1, 256]))
    if impl == "ours":
        opt = repl.wrap_optimizer(snt.optimizers.Adam(1e-3))
    elif impl == "snt":
        opt = snt.optimizers.Adam(1e-3)
        # Sonnet's lazy slot creation fails inside a replicated tf.function on TF 2.15:
        # create the slots eagerly (as our optimizer wrapper does).
        opt._initialize(list(model.trainable_variables))
    else:
        opt = tf.keras.optimizers.Adam(1e-3)
        opt.build(model.trainable_variables)
data = (repl.distribute(input_fn) if impl == "ours"
        else strategy.distribute_datasets_from_function(input_fn))
def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(yb, model(xb)))
    grads = tape.gradient(loss, model.trainable_variables)
    if impl == "snt":
        ctx = tf.distribute.get_replica_context()
        if ctx.num_replicas_in_sync > 1:
            grads = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, grads)
        opt.apply(grads, model.trainable_variables)
    elif impl == "tf":
        opt.apply_gradients(zip(grads, model.trainable_variables))
    else:
        opt.apply(grads, model.trainable_variables)
    return loss
@tf.function
def train(it):
    if impl == "ours":
        return repl.reduce(repl.run(step, *next(it)), "mean")
    return strategy.reduce(tf.distribute.ReduceOp.MEAN, strategy.run(step, args=next(it)), axis=None)
it = iter(data)
for _ in range(5): train(it).numpy()
blocks = []
for _ in range(repeats):
    start = time.perf_counter()
    for _ in range(steps): loss = train(it)
    loss.numpy()
    blocks.append((time.perf_counter() - start) / steps)
print(json.dumps({"impl": impl, "spec": spec, "step_seconds": statistics.median(blocks),
                  "blocks": blocks}))
"""


def measure(impl: str, spec: str, args) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            impl,
            spec,
            str(args.batch),
            str(args.steps),
            str(args.width),
            str(args.repeats),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{impl} {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="timed blocks per process")
    parser.add_argument("--specs", default="cpu,cpu:2,cpu:4")
    parser.add_argument("--batch", type=int, default=512, help="global batch, divisible by 4")
    parser.add_argument("--width", type=int, default=1024, help="MLP hidden width")
    args = parser.parse_args()
    specs = args.specs.split(",")
    configs = [(impl, spec) for spec in specs for impl in IMPLS]
    rounds: dict[str, list[float]] = {f"{impl} {spec}": [] for impl, spec in configs}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        shift = r % len(configs)
        for impl, spec in configs[shift:] + configs[:shift]:
            result = measure(impl, spec, args)
            rounds[f"{impl} {spec}"].append(result["step_seconds"])
            loads.append(os.getloadavg()[0])
            print(
                f"round {r + 1}: {impl:4s} {spec:6s} {result['step_seconds'] * 1e3:8.2f} ms/step"
                f"  (load {loads[-1]:.2f})",
                flush=True,
            )
    median = {key: statistics.median(values) for key, values in rounds.items()}
    ours_over = {
        plain: {spec: median[f"ours {spec}"] / median[f"{plain} {spec}"] for spec in specs}
        for plain in ("snt", "tf")
    }
    scaling = {
        impl: {spec: median[f"{impl} {spec}"] / median[f"{impl} cpu"] for spec in specs}
        for impl in IMPLS
    }
    noisy = max(loads) > 2
    summary = {
        "benchmark": "replication_overhead",
        "model": f"MLP 256-{args.width}x3-10, Adam, global batch {args.batch}",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cores": os.cpu_count(),
        "command": "python benchmarks/replication_overhead.py " + " ".join(sys.argv[1:]),
        "step_seconds_median": median,
        "step_seconds_rounds": rounds,
        "ours_over_plain_same_spec": ours_over,
        "target_ours_over_plain_at_most": 1.05,
        "step_time_over_cpu_same_impl": scaling,
        "load_average_1min_per_run": loads,
        "noisy": noisy,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    for spec in specs:
        print(
            f"{spec:6s} ours/snt {ours_over['snt'][spec]:.3f}  ours/tf {ours_over['tf'][spec]:.3f}"
            f"  | vs cpu: ours {scaling['ours'][spec]:.2f} snt {scaling['snt'][spec]:.2f} "
            f"tf {scaling['tf'][spec]:.2f}"
        )
    print(f"max load {max(loads):.2f}" + (" (NOISY: above the 2 cores)" if noisy else ""))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
