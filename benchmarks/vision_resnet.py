"""ResNet-50 training throughput: ours vs Keras, bfloat16 vs float32, cpu:2 vs cpu.

All configurations train ResNet-50 (224x224, 1000 classes, global batch 32 by
default) the same way: SGD with momentum 0.9, label-smoothed cross-entropy and L2
weight decay on kernels, one `tf.function` step per batch (no XLA), inputs from
memory. They are built in ONE process and measured in interleaved rounds (every
round times each configuration once, back to back), so a change in machine load
hits all of them alike; the order of the configurations rotates by one every
round, so none is always first (or last) after the others. Ratios are medians of
per-round ratios, reported with their spread (min, quartiles, max over rounds).
Both wall-clock images/s and images per process-CPU-second are recorded; the
latter is less sensitive to other jobs competing for the cores, but counts all
threads. The 1-minute load average is recorded before and after every round;
a result measured while it exceeded 2 (this machine has 2 cores) is marked
"noisy".

    ours_float32         vision.resnet.learning.Classifier, replication "cpu"
    keras_float32        tf.keras.applications.ResNet50(weights=None)
    ours_bfloat16        --precision bfloat16: bf16 compute, float32 weights
    keras_mixed_bfloat16 Keras' mixed_bfloat16 policy (reference)
    ours_float32_cpu2    replication "cpu:2": 2 logical devices, 16 images each
    ours_v1_float32      ours with the stride in the first 1x1 conv (ResNet v1), the
                         architecture Keras' ResNet50 implements: same FLOPs as Keras,
                         while ours (v1.5, strided 3x3) does ~6% more work
    ours_v1_bfloat16     the same in bfloat16: our bfloat16 gain on Keras' architecture

The input pipeline is measured alone in the same rounds (its place in the order
rotates with the others): `vision.data`'s training pipeline over an ImageNet-format
TFRecord set written for the run (tfds layout, real JPEGs of 384 x 384-576 pixels,
about ImageNet's average), i.e. JPEG header read, random-resized crop decoded
with `decode_and_crop_jpeg`, bilinear resize to 224, random flip, batching, with
`tf.data.AUTOTUNE` parallelism and prefetch. Each round starts a fresh iterator,
takes one batch untimed (start-up), then times `--pipeline-batches` batches.
Its images/s over the training images/s of each configuration, per round, is
the headroom of the pipeline (target >= 3: never the limit).

Usage: .venv/bin/python benchmarks/vision_resnet.py [--batch-size 32 --rounds 5
       --steps-per-round 1 --only ours_float32,keras_float32 --pipeline-batches 8
       --out PATH]
Smallest run (checks the script, measures nothing useful):
       .venv/bin/python benchmarks/vision_resnet.py --image-size 32 --batch-size 2 \
           --rounds 2 --steps-per-round 1 --only ours_float32,keras_float32 --out /tmp/r.json
Writes benchmarks/results/vision_resnet.json by default.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import replication  # noqa: E402

REPL_2 = replication.make("cpu:2")  # logical devices must exist before TensorFlow starts
REPL_1 = replication.make("cpu")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from vision import data as vision_data  # noqa: E402
from vision.resnet import learning as classification  # noqa: E402

NUM_CLASSES = 1000
LABEL_SMOOTHING, WEIGHT_DECAY, LEARNING_RATE, MOMENTUM = 0.1, 1e-4, 0.1, 0.9
CONFIGS = (
    "ours_float32",
    "keras_float32",
    "ours_v1_float32",
    "ours_bfloat16",
    "ours_v1_bfloat16",
    "keras_mixed_bfloat16",
    "ours_float32_cpu2",
)


def _batch(batch_size: int, image_size: int):
    rng = np.random.RandomState(0)
    images = rng.normal(size=(batch_size, image_size, image_size, 3)).astype(np.float32)
    labels = rng.randint(0, NUM_CLASSES, size=batch_size).astype(np.int32)
    return images, labels


def ours(repl, precision: str, batch_size: int, image_size: int, stride_in_1x1: bool = False):
    """A `() -> loss` training step of our ResNet-50 on `repl`."""
    config = classification.ClassificationConfig(
        batch_size=batch_size,
        steps=1_000_000,
        precision=precision,
        stem="imagenet",
        stride_in_1x1=stride_in_1x1,
        base_learning_rate=LEARNING_RATE * 256 / batch_size,
        warmup_steps=0,
        label_smoothing=LABEL_SMOOTHING,
        weight_decay=WEIGHT_DECAY,
        momentum=MOMENTUM,
    )
    classifier = classification.Classifier(config, repl, NUM_CLASSES, image_size)
    images, labels = _batch(batch_size, image_size)

    def input_fn(ctx):
        per_replica = ctx.get_per_replica_batch_size(batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(per_replica)
        return dataset.cache().repeat()

    iterator = iter(repl.distribute(input_fn))
    return lambda: classifier.train_step(iterator)["loss"]


def keras(mixed: bool, batch_size: int, image_size: int, policy: str | None = None):
    """The same step for tf.keras.applications.ResNet50(weights=None).

    `policy` names a Keras mixed-precision policy and overrides `mixed` (which means
    "mixed_bfloat16"); "mixed_float16" adds Keras' dynamic loss scaling, without which
    small float16 gradients underflow (bin/gpu-check measures it on a GPU).
    """
    policy = policy or ("mixed_bfloat16" if mixed else "float32")
    previous = tf.keras.mixed_precision.global_policy()
    tf.keras.mixed_precision.set_global_policy(policy)
    try:
        model = tf.keras.applications.ResNet50(
            weights=None,
            input_shape=(image_size, image_size, 3),
            classes=NUM_CLASSES,
            classifier_activation=None,
        )
    finally:
        tf.keras.mixed_precision.set_global_policy(previous)
    optimizer = tf.keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    scaled = policy == "mixed_float16"
    if scaled:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    loss_fn = tf.keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=LABEL_SMOOTHING
    )
    kernels = {v.ref() for v in model.trainable_variables if v.shape.rank > 1}
    images, labels = (tf.constant(a) for a in _batch(batch_size, image_size))
    targets = tf.one_hot(labels, NUM_CLASSES)

    @tf.function(jit_compile=False)
    def step():
        with tf.GradientTape() as tape:
            logits = tf.cast(model(images, training=True), tf.float32)
            loss = loss_fn(targets, logits)
            scaled_loss = optimizer.get_scaled_loss(loss) if scaled else loss
        parameters = model.trainable_variables
        gradients = tape.gradient(scaled_loss, parameters)
        if scaled:
            gradients = optimizer.get_unscaled_gradients(gradients)
        with tf.name_scope("weight_decay"):  # as ours does, named alike for profiles
            gradients = [
                g + WEIGHT_DECAY * w if w.ref() in kernels else g
                for g, w in zip(gradients, parameters)
            ]
        optimizer.apply_gradients(zip(gradients, parameters))
        return loss

    return step


PIPELINE = "input_pipeline"
PIPELINE_IMAGE_SIDE = 384  # JPEG height; widths 384, 480, 576 (ImageNet averages ~400x350)


def input_pipeline(directory: str, batch_size: int, image_size: int, batches: int):
    """A `() -> images/s` measurement of the ImageNet TFRecord training pipeline alone.

    Writes a small tfds-layout TFRecord set under `directory` (8 classes x 32
    JPEGs), then each call starts a fresh iterator of `vision.data`'s training
    stream (decode, random-resized crop, flip, AUTOTUNE), takes one batch untimed
    and times the next `batches`.
    """
    root = vision_data.write_tiny_imagenet(
        os.path.join(directory, "imagenet"),
        form="tfrecord",
        num_classes=8,
        images_per_class=32,
        size=PIPELINE_IMAGE_SIDE,
        num_shards=4,
    )
    dataset = vision_data.open_dataset(root)
    input_fn = dataset.input_fn("train", batch_size, image_size, seed=0)

    def measure() -> float:
        iterator = iter(input_fn(tf.distribute.InputContext()))
        next(iterator)[0].numpy()  # start-up: threads, autotuning, first decode
        start = time.perf_counter()
        for _ in range(batches):
            images = next(iterator)[0]
        images.numpy()
        return batches * batch_size / (time.perf_counter() - start)

    return measure


def build(name: str, batch_size: int, image_size: int):
    if name == "ours_float32":
        return ours(REPL_1, "float32", batch_size, image_size)
    if name == "ours_v1_float32":
        return ours(REPL_1, "float32", batch_size, image_size, stride_in_1x1=True)
    if name == "ours_bfloat16":
        return ours(REPL_1, "bfloat16", batch_size, image_size)
    if name == "ours_v1_bfloat16":
        return ours(REPL_1, "bfloat16", batch_size, image_size, stride_in_1x1=True)
    if name == "ours_float32_cpu2":
        return ours(REPL_2, "float32", batch_size, image_size)
    if name == "keras_float32":
        return keras(False, batch_size, image_size)
    if name == "keras_mixed_bfloat16":
        return keras(True, batch_size, image_size)
    raise ValueError(f"unknown configuration {name!r}; use some of {CONFIGS}")


NOISY_LOAD = 2.0  # 1-minute load average above this on a 2-core machine: timings are noisy


def rotated(names: list[str], round_index: int) -> list[str]:
    """The measuring order of a round: `names` rotated left by `round_index`."""
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def spread(values: list[float]) -> dict:
    """Median, min, quartiles, max and all values of a list of per-round figures."""
    ordered = sorted(values)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) >= 2 else [ordered[0]] * 3
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "q1": quartiles[0],
        "q3": quartiles[2],
        "max": ordered[-1],
        "all": values,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-round", type=int, default=1)
    parser.add_argument("--only", default=",".join(CONFIGS))
    parser.add_argument(
        "--pipeline-batches",
        type=int,
        default=8,
        help="batches the input pipeline is timed over per round (0: do not measure it)",
    )
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "vision_resnet.json")
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown or args.rounds < 2 or args.steps_per_round < 1 or args.pipeline_batches < 0:
        parser.error(
            f"unknown configurations {unknown}; use some of {CONFIGS}"
            if unknown
            else "need --rounds >= 2 (to report a spread), --steps-per-round >= 1 and "
            "--pipeline-batches >= 0"
        )

    load_at_start = os.getloadavg()[0]
    steps, compile_seconds = {}, {}
    for name in names:
        start = time.perf_counter()
        steps[name] = build(name, args.batch_size, args.image_size)
        float(steps[name]())  # trace + first step
        compile_seconds[name] = time.perf_counter() - start
        print(f"built {name} in {compile_seconds[name]:.0f}s", flush=True)

    pipeline_dir = tempfile.TemporaryDirectory()
    measured = list(names)
    if args.pipeline_batches:
        pipeline = input_pipeline(
            pipeline_dir.name, args.batch_size, args.image_size, args.pipeline_batches
        )
        pipeline()  # first iterator: traces the map functions
        measured.append(PIPELINE)
    pipeline_rate: list[float] = []
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    rounds = []
    for round_index in range(args.rounds):
        order = rotated(measured, round_index)
        load_before = os.getloadavg()[0]
        for name in order:
            if name == PIPELINE:
                pipeline_rate.append(pipeline())
                continue
            wall_start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(args.steps_per_round):
                loss = steps[name]()
            float(loss)
            images = args.batch_size * args.steps_per_round
            wall[name].append(images / (time.perf_counter() - wall_start))
            cpu[name].append(images / (time.process_time() - cpu_start))
        load_after = os.getloadavg()[0]
        rounds.append(
            {
                "order": order,
                "load_average_before": load_before,
                "load_average_after": load_after,
                "images_per_second_wall": {n: wall[n][-1] for n in names},
                "images_per_cpu_second": {n: cpu[n][-1] for n in names},
                **(
                    {"input_pipeline_images_per_second": pipeline_rate[-1]} if pipeline_rate else {}
                ),
            }
        )
        rates = {
            **{n: wall[n][-1] for n in names},
            **({PIPELINE: pipeline_rate[-1]} if pipeline_rate else {}),
        }
        print(
            f"round {round_index + 1} (load {load_before:.1f}-{load_after:.1f}): "
            + "  ".join(f"{n} {rates[n]:.2f}" for n in order)
            + "  (images/s)",
            flush=True,
        )
    pipeline_dir.cleanup()

    def ratio(a: str, b: str):
        if a not in wall or b not in wall:
            return None
        return {
            "wall": spread([x / y for x, y in zip(wall[a], wall[b])]),
            "cpu_time": spread([x / y for x, y in zip(cpu[a], cpu[b])]),
        }

    def gain_over_gain(a: str, a_base: str, b: str, b_base: str):
        """Median over rounds of (a / a_base) / (b / b_base), e.g. our bf16 gain over Keras'."""
        if not {a, a_base, b, b_base} <= set(wall):
            return None
        return spread(
            [
                (w[0] / w[1]) / (w[2] / w[3])
                for w in zip(wall[a], wall[a_base], wall[b], wall[b_base])
            ]
        )

    def pipeline_ratio(name: str):
        if not pipeline_rate or name not in wall:
            return None
        return spread([p / t for p, t in zip(pipeline_rate, wall[name])])

    loads = [load_at_start] + [
        value for r in rounds for value in (r["load_average_before"], r["load_average_after"])
    ]
    result = {
        "benchmark": "vision_resnet",
        "model": f"ResNet-50, {args.image_size}x{args.image_size}, {NUM_CLASSES} classes, "
        f"global batch {args.batch_size}, SGD momentum, label smoothing, L2",
        "command": " ".join([".venv/bin/python", "benchmarks/vision_resnet.py", *sys.argv[1:]]),
        "rounds": args.rounds,
        "steps_per_round": args.steps_per_round,
        "order": "rotated by one configuration every round",
        "images_per_second_wall": {n: spread(v) for n, v in wall.items()},
        "images_per_cpu_second": {n: spread(v) for n, v in cpu.items()},
        "build_and_first_step_seconds": compile_seconds,
        "ratios": {
            "ours_over_keras_float32": ratio("ours_float32", "keras_float32"),
            "ours_v1_over_keras_float32_same_architecture": ratio(
                "ours_v1_float32", "keras_float32"
            ),
            "ours_bfloat16_over_ours_float32": ratio("ours_bfloat16", "ours_float32"),
            "keras_bfloat16_over_keras_float32": ratio("keras_mixed_bfloat16", "keras_float32"),
            "ours_bfloat16_over_keras_bfloat16": ratio("ours_bfloat16", "keras_mixed_bfloat16"),
            "ours_v1_bfloat16_over_keras_bfloat16_same_architecture": ratio(
                "ours_v1_bfloat16", "keras_mixed_bfloat16"
            ),
            "cpu2_over_cpu_float32": ratio("ours_float32_cpu2", "ours_float32"),
            "bfloat16_gain_ours_over_keras": gain_over_gain(
                "ours_bfloat16", "ours_float32", "keras_mixed_bfloat16", "keras_float32"
            ),
            # The same on Keras' v1 architecture: v1.5's extra convolution work is a larger
            # share of a bfloat16 step where convolutions gain most.
            "bfloat16_gain_ours_v1_over_keras_same_architecture": gain_over_gain(
                "ours_v1_bfloat16", "ours_v1_float32", "keras_mixed_bfloat16", "keras_float32"
            ),
            "input_pipeline_over_training": {
                name: pipeline_ratio(name) for name in names if pipeline_rate
            }
            or None,
            "input_pipeline_over_fastest_training": spread(
                [p / max(wall[n][i] for n in names) for i, p in enumerate(pipeline_rate)]
            )
            if pipeline_rate and names
            else None,
        },
        "input_pipeline": {
            "images_per_second": spread(pipeline_rate),
            "batches_timed_per_round": args.pipeline_batches,
            "data": f"ImageNet-format TFRecords (tfds layout), 256 JPEGs of "
            f"{PIPELINE_IMAGE_SIDE} x {PIPELINE_IMAGE_SIDE}-{PIPELINE_IMAGE_SIDE * 3 // 2} "
            "pixels, vision.data training stream: random-resized crop, flip, AUTOTUNE",
        }
        if pipeline_rate
        else None,
        "targets": {
            "ours_over_keras_float32": ">= 1.0",
            "ours_bfloat16_over_ours_float32": ">= Keras mixed_bfloat16 / float32",
            "bfloat16_gain_ours_over_keras": ">= 1.0",
            "input_pipeline_over_fastest_training": ">= 3",
        },
        "raw_rounds": rounds,
        "load_average": {"at_start": load_at_start, "max": max(loads), "at_end": loads[-1]},
        "noisy": max(loads) > NOISY_LOAD,
        "machine": {
            "cores": os.cpu_count(),
            "platform": platform.platform(),
            "tensorflow": tf.__version__,
            "note": "2-core machine shared with other engineers' jobs; 'noisy' marks a result "
            f"measured while the 1-minute load average exceeded {NOISY_LOAD:g}",
        },
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    medians = {
        k: v and {"wall": v["wall"]["median"], "cpu_time": v["cpu_time"]["median"]}
        for k, v in result["ratios"].items()
        if k
        in (
            "ours_over_keras_float32",
            "ours_bfloat16_over_ours_float32",
            "cpu2_over_cpu_float32",
            "keras_bfloat16_over_keras_float32",
            "ours_bfloat16_over_keras_bfloat16",
            "ours_v1_over_keras_float32_same_architecture",
        )
    }
    for key in (
        "bfloat16_gain_ours_over_keras",
        "bfloat16_gain_ours_v1_over_keras_same_architecture",
        "input_pipeline_over_fastest_training",
    ):
        medians[key] = result["ratios"][key] and result["ratios"][key]["median"]
    print(json.dumps(medians, indent=2))
    if result["noisy"]:
        print(f"NOISY: the load average reached {max(loads):.1f} (> {NOISY_LOAD:g}).")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
