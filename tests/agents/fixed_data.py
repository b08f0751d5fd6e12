"""Random observations and a repeating fixed batch: learner updates without a replay."""

import numpy as np
import tensorflow as tf

from agents.d4pg.learning import Transition


def observations(spec, n, seed):
    """`n` random observations of `spec` (pixels: uint8 in [0, 255]; features: N(0, 2^2))."""
    rng = np.random.default_rng(seed)
    if spec.observations.dtype == np.uint8:
        return rng.integers(0, 256, (n, *spec.observations.shape)).astype(np.uint8)
    return rng.normal(0.0, 2.0, (n, *spec.observations.shape)).astype(np.float32)


def fixed_batches(batch_size, spec):
    """An input_fn repeating one batch of `batch_size` transitions split over the replicas."""

    def input_fn(ctx):
        b = ctx.get_per_replica_batch_size(batch_size)
        rng = np.random.default_rng(0)
        data = Transition(
            observations(spec, b, 1),
            rng.uniform(-1, 1, (b, *spec.actions.shape)).astype(np.float32),
            rng.normal(size=b).astype(np.float32),
            np.full(b, 0.9, np.float32),
            observations(spec, b, 2),
        )
        return tf.data.Dataset.from_tensors(data).repeat()

    return input_fn
