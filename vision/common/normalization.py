"""The one batch norm of the vision models: cross-replica, float32 state, optional fused path.

ResNet uses it as plain batch norm; the SN-GAN generator uses it with
per-example scale and offset (conditional batch norm) and without learned
ones. Statistics are those of the global batch (`replication.CrossReplicaBatchNorm`
all-reduces the moments), so N replicas of batch B compute what one replica
of batch N*B does.
"""

from __future__ import annotations

import sonnet as snt
import tensorflow as tf

import replication


class BatchNorm(replication.CrossReplicaBatchNorm):
    """Cross-replica batch norm whose parameters and statistics stay float32.

    Accepts float32 or bfloat16 inputs and returns the input's dtype; moments
    are computed in float32. With several replicas in sync the moments are
    all-reduced across replicas. With `fused=True` and one replica there is
    nothing to reduce, and the same maths runs as TensorFlow's fused batch-norm
    kernel, which on CPU is several times faster than the unfused ops; both
    paths keep the biased (population) batch variance in the moving statistics,
    so switching replica counts changes nothing but rounding.

    Args:
      decay_rate: decay of the moving averages (debiased, `snt.ExponentialMovingAverage`).
      eps: added to the variance.
      create_scale: learn a scale and an offset (False: pass them to the call,
        as conditional batch norm does, or use none).
      scale_init: initialiser of the scale (default ones).
      fused: use the fused kernel when there is one replica and no per-call
        scale/offset.
      name: module name.

    Example::

        bn = BatchNorm(0.9, name="bn")
        y = bn(x, is_training=False)
    """

    def __init__(
        self,
        decay_rate: float = 0.9,
        eps: float = 1e-5,
        create_scale: bool = True,
        scale_init: snt.initializers.Initializer | None = None,
        fused: bool = True,
        name: str | None = None,
    ):
        # Moving averages made inside this module's name scope, as snt.BatchNorm
        # does, so their variables are named ".../bn_0/moving_mean/..." per layer.
        with tf.name_scope(name or "batch_norm"):
            moving_mean = snt.ExponentialMovingAverage(decay_rate, name="moving_mean")
            moving_variance = snt.ExponentialMovingAverage(decay_rate, name="moving_variance")
        super().__init__(
            create_scale=create_scale,
            create_offset=create_scale,
            moving_mean=moving_mean,
            moving_variance=moving_variance,
            eps=eps,
            scale_init=scale_init,
            name=name,
        )
        # Not `self._fused`: Sonnet's CrossReplicaBatchNorm._initialize sets
        # `self._fused = False` on the first call (it computes the moments itself,
        # so the fused op would gain it nothing), which silently overwrote a flag of
        # that name and left the fused kernel unused even with one replica.
        self._use_fused_kernel = fused

    def __call__(
        self,
        inputs: tf.Tensor,
        is_training: bool,
        test_local_stats: bool = False,
        scale: tf.Tensor | None = None,
        offset: tf.Tensor | None = None,
    ) -> tf.Tensor:
        """Normalises `inputs` [..., C].

        Args:
          is_training: batch statistics, and update the moving ones.
          test_local_stats: when not training, batch statistics all the same.
          scale, offset: per-call (e.g. per-example [N, 1, 1, C]) scale and
            offset, replacing the learned ones.
        """
        channels = int(inputs.shape[-1])
        # Variables are shaped by the channel count and typed float32, whatever the
        # input dtype: a float32 probe of shape [1, ..., 1, C] creates them.
        probe = tf.zeros([1] * (inputs.shape.rank - 1) + [channels], tf.float32)
        self._create_moving_averages(probe)
        self._initialize(probe)
        scale = self.scale if scale is None else scale
        offset = self.offset if offset is None else offset

        if not is_training and not test_local_stats:
            mean, variance = self.moving_mean.value, self.moving_variance.value
            return self._normalize(inputs, mean, variance, scale, offset)

        context = tf.distribute.get_replica_context()
        single_replica = context is not None and context.num_replicas_in_sync == 1
        fusable = self._use_fused_kernel and scale is self.scale and offset is self.offset
        if fusable and single_replica and inputs.shape.rank == 4 and self.scale is not None:
            outputs, mean, variance = self._fused_training(inputs)
        else:
            # Outside a replica context this raises the parent's clear TypeError.
            mean, variance = self._moments(tf.cast(inputs, tf.float32), True)
            outputs = self._normalize(inputs, mean, variance, scale, offset)
        if is_training:
            self.moving_mean.update(tf.reshape(mean, self.shape))
            self.moving_variance.update(tf.reshape(variance, self.shape))
        return outputs

    def _normalize(self, inputs, mean, variance, scale, offset) -> tf.Tensor:
        # y = (x - mean) * scale / sqrt(var + eps) + offset, folded into one
        # multiply-add on x; the per-channel coefficients are computed in float32.
        multiplier = tf.math.rsqrt(variance + self._eps)
        if scale is not None:
            multiplier = multiplier * scale
        shift = -mean * multiplier
        if offset is not None:
            shift = shift + offset
        return inputs * tf.cast(multiplier, inputs.dtype) + tf.cast(shift, inputs.dtype)

    def _fused_training(self, inputs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        empty = tf.constant([], tf.float32)
        outputs, mean, variance, _, _, _ = tf.raw_ops.FusedBatchNormV3(
            x=inputs,
            scale=tf.reshape(self.scale, [-1]),
            offset=tf.reshape(self.offset, [-1]),
            mean=empty,
            variance=empty,
            epsilon=self._eps,
            data_format="NHWC",
            is_training=True,
        )
        # The kernel normalises with the population variance but returns the
        # Bessel-corrected one (n / (n - 1)); undo that for the moving statistics.
        count = tf.cast(tf.size(inputs) // int(inputs.shape[-1]), tf.float32)
        variance = variance * (count - 1.0) / tf.maximum(count, 1.0)
        return outputs, mean, variance

    def reset_moving_statistics(self) -> None:
        """Forgets the moving statistics (before re-estimating them, see `standing statistics`)."""
        self.moving_mean.reset()
        self.moving_variance.reset()
