"""Normalisation layers whose state stays identical on every replica.

Batch statistics and spectral-norm power-iteration vectors are state that a
naive data-parallel run lets drift apart between replicas. Here the statistics
are computed over the global batch and the power-iteration vectors are averaged
across replicas, so N replicas of batch B behave like one replica of batch N*B.
"""

from __future__ import annotations

import sonnet as snt
import tensorflow as tf

# Moments all-reduced across replicas; reused from Sonnet rather than rewritten.
CrossReplicaBatchNorm = snt.distribute.CrossReplicaBatchNorm


class SpectralNorm(snt.Module):
    """Divides a weight by an estimate of its largest singular value.

    The estimate comes from power iteration (Miyato et al., 2018): with the weight
    reshaped to a matrix W of shape [fan_in, fan_out] and a persistent vector u of
    shape [1, fan_out], one iteration computes v = normalise(u W^T),
    u = normalise(v W) and sigma = v W u^T; the layer returns weight / sigma.
    Gradients do not flow through u and v.

    u is a variable created on first call, inside `Replicator.scope()` for
    replicated use. In replica context the updated u is averaged across replicas
    before it is stored, so every replica keeps the same u even where the local
    computations differ by rounding.

    Example::

        sn = SpectralNorm()
        w_bar = sn(linear.w, is_training=True)
    """

    def __init__(self, n_power_iterations: int = 1, epsilon: float = 1e-12,
                 name: str | None = None):
        super().__init__(name=name)
        if n_power_iterations < 1:
            raise ValueError("n_power_iterations must be >= 1.")
        self.n_power_iterations = n_power_iterations
        self.epsilon = epsilon
        self.u = None
        self.sigma = None

    @snt.once
    def _initialize(self, weight: tf.Tensor) -> None:
        fan_out = int(weight.shape[-1])
        initial = tf.random.normal([1, fan_out], dtype=weight.dtype)
        self.u = tf.Variable(initial / tf.norm(initial), trainable=False, name="u")
        self.sigma = tf.Variable(tf.ones([], weight.dtype), trainable=False, name="sigma")

    def __call__(self, weight: tf.Tensor, is_training: bool = True) -> tf.Tensor:
        self._initialize(weight)
        matrix = tf.reshape(weight, [-1, weight.shape[-1]])
        u = tf.stop_gradient(tf.cast(self.u, matrix.dtype))
        for _ in range(self.n_power_iterations):
            v = _l2_normalize(tf.matmul(u, matrix, transpose_b=True), self.epsilon)
            u = _l2_normalize(tf.matmul(v, matrix), self.epsilon)
        u, v = tf.stop_gradient(u), tf.stop_gradient(v)
        sigma = tf.reshape(tf.matmul(tf.matmul(v, matrix), u, transpose_b=True), [])
        if is_training:
            context = tf.distribute.get_replica_context()
            if context is not None and context.num_replicas_in_sync > 1:
                u = context.all_reduce(tf.distribute.ReduceOp.MEAN, u)
            self.u.assign(tf.cast(u, self.u.dtype))
            self.sigma.assign(tf.cast(sigma, self.sigma.dtype))
        return weight / sigma


def _l2_normalize(x: tf.Tensor, epsilon: float) -> tf.Tensor:
    return x / (tf.norm(x) + epsilon)
