"""Numeric precision of a vision model: float32, or bfloat16 compute on float32 weights.

`bfloat16` here means what the TF-Replicator paper and Keras' `mixed_bfloat16`
policy mean by it:

  * master weights, optimizer state, gradients and batch-norm statistics are
    float32 (bfloat16 keeps only 8 bits of mantissa: small SGD updates to a
    bfloat16 weight would round away);
  * the forward pass casts the input images and each weight to bfloat16 where
    it is used, so convolutions and matrix products run in bfloat16;
  * batch-norm moments, the pooled features, the classifier head and the loss
    are computed in float32.

The cast's gradient casts back, so gradients arrive in float32 without any
loss scaling (bfloat16 has float32's exponent range, unlike float16).
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf

PRECISIONS = ("float32", "bfloat16")


def compute_dtype(precision: str) -> tf.DType:
    """The dtype convolutions run in for `precision` ("float32" or "bfloat16").

    Raises:
      ValueError: unknown precision (the message lists the valid ones).
    """
    if precision not in PRECISIONS:
        raise ValueError(
            f"Unknown precision {precision!r}; use one of {', '.join(PRECISIONS)} "
            "(bfloat16 = bfloat16 compute with float32 weights)."
        )
    return tf.bfloat16 if precision == "bfloat16" else tf.float32


def check_float32(tensors: Iterable[tf.Tensor | tf.Variable], what: str) -> None:
    """Raises TypeError unless every floating-point tensor in `tensors` is float32.

    Used to guard the mixed-precision contract: variables, gradients and
    optimizer state stay float32 whatever the compute dtype.
    """
    wrong = [
        getattr(t, "name", "?")
        for t in tensors
        if t is not None and t.dtype.is_floating and t.dtype != tf.float32
    ]
    if wrong:
        raise TypeError(
            f"{what} must be float32 under every precision; got others for: "
            f"{', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}"
        )


def cpu_has_native_bfloat16() -> bool | None:
    """Whether this CPU advertises bfloat16 arithmetic (AVX512-BF16 or AMX-BF16).

    Without it TensorFlow emulates bfloat16 on CPU, and bfloat16 training is
    much slower than float32 (measured here on an AVX2-only AMD EPYC: a ResNet
    3x3 convolution's forward+backward took 14x longer). Returns None where the
    flags cannot be read (not Linux).
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return None
