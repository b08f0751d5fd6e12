"""Where a ResNet-50 training step's time goes: ours vs Keras, per op group, in one run.

Builds the training steps of `benchmarks/vision_resnet.py` (the same models,
optimiser, loss and weight decay, inputs from memory), runs each once untraced,
then traces `--steps` steps of each with the TensorFlow profiler (host tracer
level 2: one event per executed kernel) and sums the kernels' durations by
op group. The models take turns, rotated every round, so machine load hits all
alike.

Groups (first match wins): convolution (Conv2D and its two backprops), batch
norm (FusedBatchNorm* and every op under a `bn` name scope: moments, moving
averages, their gradients), cast, weight decay (the `weight_decay` name scope),
optimizer (Sonnet's momentum ops or Keras' fused apply), relu and pooling,
head and loss (the classifier's matmul, softmax cross-entropy), variable reads
and writes (ReadVariableOp, Assign*), and other (the rest: the step counter,
learning-rate schedule, metrics, the residual adds and gradient sums; its
largest ops are listed).

Kernel times are thread time: on 2 cores two kernels can run at once and one
kernel may itself use both cores, so the groups add up to more or less than
the step's wall time, which is reported beside them (measured while tracing,
so a little slower than untraced).

Usage: .venv/bin/python benchmarks/vision_resnet_profile.py [--rounds 2 --steps 1
       --only ours_float32,keras_float32,ours_bfloat16,keras_mixed_bfloat16 --out PATH]
Smallest run: ... --image-size 32 --batch-size 2 --rounds 1 --out /tmp/p.json
Writes benchmarks/results/vision_resnet_profile.json by default.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tensorflow as tf  # noqa: E402  (importing starts no device)
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from benchmarks import vision_resnet  # noqa: E402  (makes the replicators before any op)

DEFAULT = ("ours_float32", "keras_float32", "ours_bfloat16", "keras_mixed_bfloat16")
GROUPS = (
    "convolution",
    "batch_norm",
    "cast",
    "weight_decay",
    "optimizer",
    "relu_and_pooling",
    "head_and_loss",
    "variable_reads_writes",
    "other",
)
# A name-scope component of a batch norm: ours "bn_0", "stem_bn", "projection_bn";
# Keras "conv1_bn", "conv2_block1_0_bn".
_BN_SCOPE = re.compile(r"(^|/)(\w+_)?bn(_\d+)?(/|$)")
_NOT_KERNELS = ("ExecutorState::Process", "EagerLocalExecute", "KernelAndDeviceFunc")


def group_of(name: str, op_type: str) -> str:
    """The op group of a kernel `name` (its node name) of type `op_type`."""
    if "Conv2D" in op_type:
        return "convolution"
    if op_type.startswith("FusedBatchNorm") or _BN_SCOPE.search(name):
        return "batch_norm"
    if op_type == "Cast":
        return "cast"
    if "weight_decay/" in name:
        return "weight_decay"
    if op_type.startswith("ResourceApply") or re.search(r"(^|/)(momentum|SGD)(_\d+)?/", name):
        return "optimizer"
    if op_type.startswith(("Relu", "MaxPool")):
        return "relu_and_pooling"
    if re.search(r"(^|/)(logits|predictions|loss|softmax)", name, re.IGNORECASE) or (
        "SoftmaxCrossEntropy" in op_type
    ):
        return "head_and_loss"
    if op_type in ("ReadVariableOp", "AssignVariableOp", "AssignSubVariableOp", "Assign"):
        return "variable_reads_writes"
    return "other"


def kernel_times(logdir: str) -> dict[str, float]:
    """Summed duration (ms) of every traced kernel, keyed "node_name:OpType"."""
    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    if not paths:
        raise RuntimeError(f"the profiler wrote no trace under {logdir}")
    space = xplane_pb2.XSpace.FromString(Path(paths[-1]).read_bytes())
    times: collections.Counter = collections.Counter()
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" in name and not name.startswith(_NOT_KERNELS):
                    times[name] += event.duration_ps / 1e9
    return dict(times)


def profile_steps(step, steps: int) -> tuple[dict[str, float], float]:
    """Traces `steps` calls of `step`; returns per-step kernel ms and wall ms."""
    options = tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=2, python_tracer_level=0, device_tracer_level=0
    )
    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir, options)
        start = time.perf_counter()
        for _ in range(steps):
            loss = step()
        float(loss)
        wall_ms = (time.perf_counter() - start) * 1e3 / steps
        tf.profiler.experimental.stop()
        times = kernel_times(logdir)
    return {k: v / steps for k, v in times.items()}, wall_ms


def summarise(per_round: list[dict[str, float]], walls: list[float]) -> dict:
    """Median over rounds of group totals, op-type totals and the largest ops."""
    groups = {g: [] for g in GROUPS}
    types: dict[str, list[float]] = collections.defaultdict(list)
    largest_other: collections.Counter = collections.Counter()
    for times in per_round:
        totals: collections.Counter = collections.Counter()
        by_type: collections.Counter = collections.Counter()
        for key, ms in times.items():
            name, op_type = key.rsplit(":", 1)
            group = group_of(name, op_type)
            totals[group] += ms
            by_type[op_type] += ms
            if group == "other":
                largest_other[key] += ms / len(per_round)
        for group in GROUPS:
            groups[group].append(totals[group])
        for op_type, ms in by_type.items():
            types[op_type].append(ms)
    group_ms = {g: statistics.median(v) for g, v in groups.items()}
    type_ms = {
        t: statistics.median(v + [0.0] * (len(per_round) - len(v))) for t, v in types.items()
    }
    return {
        "wall_ms_per_step_traced": statistics.median(walls),
        "kernel_ms_per_step": group_ms,
        "kernel_ms_per_step_total": sum(group_ms.values()),
        "kernel_ms_by_op_type_top": dict(sorted(type_ms.items(), key=lambda item: -item[1])[:25]),
        "largest_other_ops_ms": dict(largest_other.most_common(15)),
        "rounds": len(per_round),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1, help="traced steps per model per round")
    parser.add_argument("--only", default=",".join(DEFAULT))
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "vision_resnet_profile.json")
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(vision_resnet.CONFIGS))
    if unknown or args.rounds < 1 or args.steps < 1:
        parser.error(
            f"unknown configurations {unknown}; use some of {vision_resnet.CONFIGS}"
            if unknown
            else "need --rounds >= 1 and --steps >= 1"
        )

    load_at_start = os.getloadavg()[0]
    steps = {}
    for name in names:
        steps[name] = vision_resnet.build(name, args.batch_size, args.image_size)
        float(steps[name]())  # trace and first step, untraced
        float(steps[name]())  # a second untraced step: lazily built kernels settle
        print(f"built {name}", flush=True)
    traced: dict[str, list] = {n: [] for n in names}
    walls: dict[str, list] = {n: [] for n in names}
    loads = [load_at_start]
    for round_index in range(args.rounds):
        for name in vision_resnet.rotated(names, round_index):
            times, wall = profile_steps(steps[name], args.steps)
            traced[name].append(times)
            walls[name].append(wall)
            print(f"round {round_index + 1}: {name} {wall:.0f} ms/step (traced)", flush=True)
        loads.append(os.getloadavg()[0])

    result = {
        "benchmark": "vision_resnet_profile",
        "command": " ".join(
            [".venv/bin/python", "benchmarks/vision_resnet_profile.py", *sys.argv[1:]]
        ),
        "model": f"ResNet-50, {args.image_size}x{args.image_size}, global batch "
        f"{args.batch_size}, one replica ('cpu'), as benchmarks/vision_resnet.py",
        "note": "kernel ms are thread time per step (kernels overlap on 2 cores), medians "
        "over rounds; wall ms measured while tracing",
        "profiles": {n: summarise(traced[n], walls[n]) for n in names},
        "load_average": {"at_start": load_at_start, "max": max(loads), "at_end": loads[-1]},
        "noisy": max(loads) > vision_resnet.NOISY_LOAD,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    header = f"{'group (ms/step)':24s}" + "".join(f"{n:>22s}" for n in names)
    print(header)
    for group in (*GROUPS, "total"):
        key = "kernel_ms_per_step_total" if group == "total" else None
        row = [
            result["profiles"][n][key]
            if key
            else result["profiles"][n]["kernel_ms_per_step"][group]
            for n in names
        ]
        print(f"{group:24s}" + "".join(f"{v:22.0f}" for v in row))
    print(
        f"{'wall (traced)':24s}"
        + "".join(f"{result['profiles'][n]['wall_ms_per_step_traced']:22.0f}" for n in names)
    )
    if result["noisy"]:
        print(f"NOISY: the load average reached {max(loads):.1f}.")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
