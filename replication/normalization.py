"""Normalisation layers whose state stays identical on every replica.

Batch statistics and spectral-norm power-iteration vectors are state that a
naive data-parallel run lets drift apart between replicas. Here the statistics
are computed over the global batch and the power-iteration vectors are averaged
across replicas, so N replicas of batch B behave like one replica of batch N*B.
"""

from __future__ import annotations

import sonnet as snt
import tensorflow as tf

from replication.variables import create_in_scope


class CrossReplicaBatchNorm(snt.distribute.CrossReplicaBatchNorm):
    """Sonnet's cross-replica batch norm, with moving averages made for you.

    Batch moments are all-reduced across replicas in training, so statistics are
    those of the global batch. Arguments follow `snt.distribute.CrossReplicaBatchNorm`
    in order; `moving_mean`/`moving_variance` may be omitted, in which case
    exponential moving averages with `decay_rate` are created.

    Context: replica (inside `Replicator.run`) with `is_training=True`, whose moments
    are all-reduced; with `is_training=False` (moving statistics, no collective) also
    cross-replica, e.g. to build the model once in `scope()`.
    """

    def __init__(
        self,
        create_scale: bool = True,
        create_offset: bool = True,
        moving_mean: snt.Metric | None = None,
        moving_variance: snt.Metric | None = None,
        eps: float = 1e-5,
        scale_init=None,
        offset_init=None,
        data_format: str = "channels_last",
        decay_rate: float = 0.999,
        name: str | None = None,
    ):
        super().__init__(
            create_scale,
            create_offset,
            moving_mean or snt.ExponentialMovingAverage(decay_rate, name="moving_mean"),
            moving_variance or snt.ExponentialMovingAverage(decay_rate, name="moving_variance"),
            eps=eps,
            scale_init=scale_init,
            offset_init=offset_init,
            data_format=data_format,
            name=name,
        )

    def __call__(
        self,
        inputs: tf.Tensor,
        is_training,
        test_local_stats=False,
        scale: tf.Tensor | None = None,
        offset: tf.Tensor | None = None,
    ) -> tf.Tensor:
        self._create_moving_averages(inputs)
        return super().__call__(
            inputs, is_training, test_local_stats=test_local_stats, scale=scale, offset=offset
        )

    @snt.once
    def _create_moving_averages(self, inputs: tf.Tensor) -> None:
        # Sonnet's moving averages create their variables on their first update,
        # i.e. inside the replicated training step, where each replica would make
        # its own from its own batch. Create them up front, zero, in scope.
        shape = [1] * inputs.shape.rank
        shape[self._channel_index] = int(inputs.shape[self._channel_index])
        dtype = inputs.dtype

        def create():
            for average in (self.moving_mean, self.moving_variance):
                if hasattr(average, "initialize"):
                    average.initialize(tf.zeros(shape, dtype))

        create_in_scope(create)

    def _moments(self, inputs: tf.Tensor, use_batch_stats) -> tuple[tf.Tensor, tf.Tensor]:
        # Sonnet refuses cross-replica context outright, which also forbids the
        # common "call the model once in scope() to build it" with
        # is_training=False. Moving statistics need no collective, so allow that.
        if tf.distribute.get_replica_context() is None:
            if use_batch_stats is False:
                return self.moving_mean.value, self.moving_variance.value
            raise TypeError(
                "CrossReplicaBatchNorm with batch statistics (is_training=True) must "
                "run inside a step function run by Replicator.run; outside a step "
                "call it with is_training=False."
            )
        return super()._moments(inputs, use_batch_stats)


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

    Context: replica (inside `Replicator.run`) with `is_training=True`, which updates u
    (averaged across replicas); with `is_training=False` (u only read) also cross-replica.

    Example::

        sn = SpectralNorm()
        w_bar = sn(linear.w, is_training=True)
    """

    def __init__(
        self, n_power_iterations: int = 1, epsilon: float = 1e-12, name: str | None = None
    ):
        super().__init__(name=name)
        if n_power_iterations < 1:
            raise ValueError("n_power_iterations must be >= 1.")
        self.n_power_iterations = n_power_iterations
        self.epsilon = epsilon
        self.u: tf.Variable | None = None
        self.sigma: tf.Variable | None = None

    @snt.once
    def _initialize(self, weight: tf.Tensor) -> None:
        fan_out = int(weight.shape[-1])
        dtype = weight.dtype

        def create():
            initial = tf.random.normal([1, fan_out], dtype=dtype)
            self.u = tf.Variable(initial / tf.norm(initial), trainable=False, name="u")
            self.sigma = tf.Variable(tf.ones([], dtype), trainable=False, name="sigma")

        # In scope and eagerly, so u starts identical on every replica even when
        # the first call is inside a replicated step.
        create_in_scope(create)

    def __call__(self, weight: tf.Tensor, is_training: bool = True) -> tf.Tensor:
        self._initialize(weight)
        assert self.u is not None and self.sigma is not None  # made by _initialize
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
