"""gpu-check `replication`: `gpu` replicas update exactly like `cpu` on the same global batch.

Runs the training of tests/replication/test_equivalence.py (an MLP, Sonnet Adam, 5 steps;
the guarantee `cpu:N == cpu` is tested there) on `gpu` (one replica per visible GPU) and,
with 2+ GPUs, on `gpu:2`, each against `cpu` at the same global batch: losses and every
variable and optimizer slot must agree to 1e-5. TensorFloat-32 is switched off first:
Ampere and newer GPUs otherwise run float32 matrix products with a 10-bit mantissa, which
is a documented TensorFlow default, not a replication error.

It also reports the all-reduce that ran: the strategy's cross-device ops class and
communication implementation (what TensorFlow was asked for), and whether the NCCL library
itself logged anything (NCCL_DEBUG=INFO into a file): the only evidence of what the
collective runtime actually chose.

    .venv/bin/python benchmarks/gpu_check_replication.py   (one JSON line last; see gpu_check.py)
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# NCCL reads these when it first initialises, so they must be set before any collective.
NCCL_LOG_DIR = tempfile.mkdtemp(prefix="gpu-check-nccl-")
os.environ["NCCL_DEBUG"] = "INFO"
os.environ["NCCL_DEBUG_FILE"] = os.path.join(NCCL_LOG_DIR, "nccl.%h.%p.log")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import replication  # noqa: E402
from benchmarks.gpu_check import emit  # noqa: E402
from tests.replication import test_equivalence as equivalence  # noqa: E402

TOLERANCE = 1e-5


def max_differences(reference, candidate) -> dict:
    """Largest absolute and relative gaps between two (losses, state) trainings."""
    ref_losses, ref_state = reference
    losses, state = candidate
    if sorted(state) != sorted(ref_state):
        raise ValueError(f"variables differ: {sorted(set(state) ^ set(ref_state))}")
    pairs = [(np.asarray(losses), np.asarray(ref_losses))]
    pairs += [(np.asarray(state[k]), np.asarray(v)) for k, v in ref_state.items()]
    absolute = max(float(np.max(np.abs(a - b))) for a, b in pairs)
    relative = max(float(np.max(np.abs(a - b) / (np.abs(b) + 1e-12))) for a, b in pairs)
    within = all(np.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE) for a, b in pairs)
    return {"max_abs": absolute, "max_rel": relative, "within_tolerance": within}


def all_reduce_used(spec: str) -> dict:
    """The cross-device ops a `spec` Replicator's strategy reduces with, and its options."""
    strategy = replication.make(spec).strategy
    ops = strategy.extended._get_cross_device_ops(tf.constant(1.0))  # pylint: disable=protected-access
    options = getattr(ops, "_options", None)
    implementation = getattr(options, "implementation", None)
    return {
        "cross_device_ops": type(ops).__name__,
        "communication": getattr(implementation, "name", str(implementation)),
    }


def nccl_log_lines() -> int:
    """Lines the NCCL library wrote so far (0: NCCL never initialised in this process)."""
    lines = 0
    for path in glob.glob(os.path.join(NCCL_LOG_DIR, "*")):
        with open(path, errors="replace") as f:
            lines += sum(1 for line in f if "NCCL" in line)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--specs",
        default=None,
        help="specs to compare with cpu (default: gpu, and gpu:2 with 2+ GPUs); "
        "e.g. cpu:2 for a dry run of this script on a machine without a GPU",
    )
    args = parser.parse_args()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if args.specs:
        specs = args.specs.split(",")
        cpus = [int(s.split(":")[1]) for s in specs if s.startswith("cpu:")]
        replication.ensure_logical_cpus(max(cpus, default=1))  # before TensorFlow starts
    elif not gpus:
        emit(False, "TensorFlow sees no GPU in this process")
        return 1
    else:
        specs = ["gpu"] + (["gpu:2"] if len(gpus) >= 2 else [])
    results, ok = {}, True
    for spec in specs:
        replicas = len(gpus) if spec == "gpu" else int(spec.split(":")[1])
        batch = equivalence.PER_REPLICA_BATCH * replicas
        reference = equivalence.train("cpu", batch)
        candidate = equivalence.train(spec, batch)
        results[spec] = {
            "replicas": replicas,
            "global_batch": batch,
            **max_differences(reference, candidate),
            **all_reduce_used(spec),
        }
        ok = ok and results[spec]["within_tolerance"]
        print(f"{spec}: {results[spec]}", flush=True)
    nccl = nccl_log_lines()
    shutil.rmtree(NCCL_LOG_DIR, ignore_errors=True)
    first = results[specs[-1]]
    figure = "; ".join(
        f"{spec} ({r['replicas']} replica(s)) vs cpu: max |diff| {r['max_abs']:.1e}"
        for spec, r in results.items()
    )
    figure += f"; all-reduce {first['cross_device_ops']}/{first['communication']}, " + (
        f"NCCL ran ({nccl} NCCL log lines)" if nccl else "NCCL did not run"
    )
    emit(ok, figure, specs=results, nccl_log_lines=nccl, tolerance=TOLERANCE, gpus=len(gpus))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
