"""gpu-check `vision` and `sngan`: ResNet-50 and SN-GAN training on one GPU.

`resnet`: ResNet-50 (224x224, 1000 classes) training images/s on `gpu:1`, ours against
`tf.keras.applications.ResNet50(weights=None)` in the same process, with the steps of
benchmarks/vision_resnet.py (same optimiser, loss and weight decay), measured in rounds
whose order rotates: float32 (ours and Keras), Keras mixed_float16 with loss scaling (our
models have no float16 mode: bfloat16 needs no loss scaling, float16 does), and, on a GPU
of compute capability 8.0 or more (Ampere: bfloat16 tensor cores), ours in bfloat16 and
Keras mixed_bfloat16. It passes when every configuration trains with finite losses; the
figures are reported, not judged (a first GPU run is for finding what breaks).

`sngan`: a few hundred SN-GAN steps (benchmarks/vision_sngan.py's learner on the digits) on
`gpu:1`; passes when every loss stays finite.

    .venv/bin/python benchmarks/gpu_check_vision.py resnet|sngan [--batch-size 32 ...]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.gpu_check import emit  # noqa: E402


def compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability (None: no GPU or TensorFlow does not say)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    details = tf.config.experimental.get_device_details(gpus[0])
    cc = details.get("compute_capability")
    return (int(cc[0]), int(cc[1])) if cc else None


def resnet(args: argparse.Namespace) -> int:
    import replication  # pylint: disable=import-outside-toplevel

    # Imported after the GPU question: it builds its `cpu` Replicators at import.
    from benchmarks import vision_resnet as bench  # pylint: disable=import-outside-toplevel

    cc = compute_capability()
    if cc is None and args.spec.startswith("gpu"):
        emit(False, "TensorFlow sees no GPU in this process")
        return 1
    cc = cc or (0, 0)  # a dry run on the CPU: no bfloat16 configurations
    repl = replication.make(args.spec)
    b, size = args.batch_size, args.image_size
    builders = {
        "ours_float32": lambda: bench.ours(repl, "float32", b, size),
        "keras_float32": lambda: bench.keras(False, b, size),
        "keras_mixed_float16": lambda: bench.keras(False, b, size, policy="mixed_float16"),
    }
    if cc >= (8, 0):
        builders["ours_bfloat16"] = lambda: bench.ours(repl, "bfloat16", b, size)
        builders["keras_mixed_bfloat16"] = lambda: bench.keras(True, b, size)
    steps, build_seconds, losses = {}, {}, {}
    for name, build in builders.items():
        start = time.perf_counter()
        steps[name] = build()
        losses[name] = [float(steps[name]())]  # trace, autotune, first step
        build_seconds[name] = time.perf_counter() - start
        print(f"built {name} in {build_seconds[name]:.0f} s", flush=True)
    names = list(steps)
    rates: dict[str, list[float]] = {n: [] for n in names}
    for round_index in range(args.rounds):
        for name in bench.rotated(names, round_index):
            start = time.perf_counter()
            for _ in range(args.steps_per_round):
                loss = steps[name]()
            losses[name].append(float(loss))  # fetching the loss waits for the GPU
            rates[name].append(b * args.steps_per_round / (time.perf_counter() - start))
    medians = {n: statistics.median(v) for n, v in rates.items()}
    bad = [n for n, v in losses.items() if not all(math.isfinite(x) for x in v)]

    def ratio(a: str, c: str) -> float | None:
        return medians[a] / medians[c] if a in medians and c in medians else None

    ratios = {
        "ours_over_keras_float32": ratio("ours_float32", "keras_float32"),
        "keras_float16_over_float32": ratio("keras_mixed_float16", "keras_float32"),
        "ours_bfloat16_over_float32": ratio("ours_bfloat16", "ours_float32"),
        "keras_bfloat16_over_float32": ratio("keras_mixed_bfloat16", "keras_float32"),
    }
    figure = ", ".join(f"{n} {v:.0f}" for n, v in medians.items()) + " images/s"
    if cc == (0, 0):
        figure += f" (batch {b}, {args.spec} dry run: no GPU)"
    else:
        figure += f" (batch {b}, compute capability {cc[0]}.{cc[1]}"
        figure += ")" if cc >= (8, 0) else ", no bfloat16: needs 8.0)"
    if bad:
        figure = f"non-finite losses in {', '.join(bad)} | " + figure
    emit(
        not bad,
        figure,
        images_per_second=rates,
        median_images_per_second=medians,
        ratios=ratios,
        build_and_first_step_seconds=build_seconds,
        losses=losses,
        compute_capability=list(cc),
        batch_size=b,
        image_size=size,
        rounds=args.rounds,
        steps_per_round=args.steps_per_round,
        order="rotated by one configuration every round",
        load_average=os.getloadavg()[0],
    )
    return 0 if not bad else 1


def sngan(args: argparse.Namespace) -> int:
    import replication  # pylint: disable=import-outside-toplevel
    from benchmarks import vision_sngan as bench  # pylint: disable=import-outside-toplevel

    if compute_capability() is None and args.spec.startswith("gpu"):
        emit(False, "TensorFlow sees no GPU in this process")
        return 1
    settings = argparse.Namespace(image_size=16, channels=16, disc_steps=2)
    step = bench.build(replication.make(args.spec), args.batch_size, settings)
    first = step()  # trace
    start = time.perf_counter()
    history = [first]
    for _ in range(args.steps - 1):
        history.append(step())
    seconds = time.perf_counter() - start
    bad = sorted({k for h in history for k, v in h.items() if not math.isfinite(v)})
    last = history[-1]
    rate = (args.steps - 1) * args.batch_size * settings.disc_steps / seconds
    figure = f"{args.steps} steps, {rate:.0f} real images/s, last losses " + ", ".join(
        f"{k} {v:.3f}" for k, v in sorted(last.items())
    )
    if bad:
        figure = f"non-finite {', '.join(bad)} | " + figure
    emit(
        not bad,
        figure,
        steps=args.steps,
        batch_size=args.batch_size,
        images_per_second=rate,
        first_losses=first,
        last_losses=last,
        load_average=os.getloadavg()[0],
    )
    return 0 if not bad else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    res = commands.add_parser("resnet", help="ResNet-50 images/s, ours vs Keras")
    # 32 as in benchmarks/vision_resnet.py: five ResNet-50s in one process fit a 16 GB GPU.
    res.add_argument("--batch-size", type=int, default=32)
    res.add_argument("--image-size", type=int, default=224)
    res.add_argument("--rounds", type=int, default=3)
    res.add_argument("--steps-per-round", type=int, default=5)
    gan = commands.add_parser("sngan", help="SN-GAN steps with finite losses")
    gan.add_argument("--batch-size", type=int, default=64)
    gan.add_argument("--steps", type=int, default=300)
    for sub in (res, gan):
        sub.add_argument(
            "--spec", default="gpu:1", help="where to train (cpu: a dry run without a GPU)"
        )
    args = parser.parse_args()
    return resnet(args) if args.command == "resnet" else sngan(args)


if __name__ == "__main__":
    sys.exit(main())
