"""Layers for GANs: spectrally-normalised linear/conv/embedding and class-conditional batch norm.

Every weight of an `SN*` layer is divided by its largest singular value, estimated with
`replication.SpectralNorm` (one power iteration per training call, its vector `u` kept identical
on all replicas), so the layer is 1-Lipschitz whatever the batch or replica count.

`ConditionalBatchNorm` normalises with cross-replica batch statistics
(`vision.common.normalization.BatchNorm`: the mean and variance are all-reduced over the global batch)
and then applies a per-class scale and offset looked up from learned class embeddings:

    y = gamma[c] * (x - mean) / sqrt(var + eps) + beta[c]
"""

import sonnet as snt
import tensorflow as tf

import replication
from vision.common.normalization import BatchNorm


def default_w_init() -> snt.initializers.Initializer:
    """Glorot-uniform initialiser (SN-GAN's choice for every conv/linear weight)."""
    return snt.initializers.VarianceScaling(1.0, "fan_avg", "uniform")


class SNLinear(snt.Module):
    """Linear layer whose weight is spectrally normalised: `y = x @ (w / sigma(w)) + b`."""

    def __init__(
        self,
        output_size: int,
        with_bias: bool = True,
        w_init: snt.initializers.Initializer | None = None,
        n_power_iterations: int = 1,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.output_size = output_size
        self._with_bias = with_bias
        self._w_init = w_init or default_w_init()
        self.spectral_norm = replication.SpectralNorm(
            n_power_iterations=n_power_iterations, name="spectral_norm"
        )

    @snt.once
    def _initialize(self, inputs: tf.Tensor):
        input_size = inputs.shape[-1]
        self.w = tf.Variable(self._w_init([input_size, self.output_size], inputs.dtype), name="w")
        if self._with_bias:
            self.b = tf.Variable(tf.zeros([self.output_size], inputs.dtype), name="b")

    def __call__(self, inputs: tf.Tensor, is_training: bool) -> tf.Tensor:
        self._initialize(inputs)
        out = tf.matmul(inputs, self.spectral_norm(self.w, is_training=is_training))
        return out + self.b if self._with_bias else out


class SNConv2D(snt.Module):
    """2D convolution (NHWC, SAME padding, stride 1) with a spectrally-normalised kernel.

    The kernel `[k, k, in, out]` is normalised as the `[k*k*in, out]` matrix (Miyato et al. 2018).
    """

    def __init__(
        self,
        output_channels: int,
        kernel_shape: int = 3,
        with_bias: bool = True,
        w_init: snt.initializers.Initializer | None = None,
        n_power_iterations: int = 1,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.output_channels = output_channels
        self._kernel_shape = kernel_shape
        self._with_bias = with_bias
        self._w_init = w_init or default_w_init()
        self.spectral_norm = replication.SpectralNorm(
            n_power_iterations=n_power_iterations, name="spectral_norm"
        )

    @snt.once
    def _initialize(self, inputs: tf.Tensor):
        k = self._kernel_shape
        shape = [k, k, inputs.shape[-1], self.output_channels]
        self.w = tf.Variable(self._w_init(shape, inputs.dtype), name="w")
        if self._with_bias:
            self.b = tf.Variable(tf.zeros([self.output_channels], inputs.dtype), name="b")

    def __call__(self, inputs: tf.Tensor, is_training: bool) -> tf.Tensor:
        self._initialize(inputs)
        w = self.spectral_norm(self.w, is_training=is_training)
        out = tf.nn.conv2d(inputs, w, strides=1, padding="SAME")
        return out + self.b if self._with_bias else out


class SNEmbed(snt.Module):
    """Class embedding table `[num_classes, embed_dim]`, spectrally normalised as a linear map
    from one-hot labels (used by the projection discriminator)."""

    def __init__(
        self,
        num_classes: int,
        embed_dim: int,
        w_init: snt.initializers.Initializer | None = None,
        n_power_iterations: int = 1,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.num_classes = num_classes
        self.embed_dim = embed_dim
        w_init = w_init or default_w_init()
        self.embeddings = tf.Variable(
            w_init([num_classes, embed_dim], tf.float32), name="embeddings"
        )
        self.spectral_norm = replication.SpectralNorm(
            n_power_iterations=n_power_iterations, name="spectral_norm"
        )

    def __call__(self, labels: tf.Tensor, is_training: bool) -> tf.Tensor:
        table = self.spectral_norm(self.embeddings, is_training=is_training)
        # A one-hot matmul (not a gather) keeps the gradient dense, so the optimiser all-reduces
        # a plain tensor rather than IndexedSlices.
        return tf.matmul(tf.one_hot(labels, self.num_classes, dtype=table.dtype), table)


# The generator's batch norms: eps 1e-4 as in SN-GAN, unfused (one code path for any
# replica count, so 1 and N replicas differ only by the all-reduce's rounding).
BN_EPS = 1e-4


class ConditionalBatchNorm(snt.Module):
    """Cross-replica batch norm whose scale and offset are per-class embeddings.

    Example:
        >>> cbn = ConditionalBatchNorm(num_classes=10)
        >>> y = cbn(tf.zeros([4, 8, 8, 16]), tf.constant([0, 1, 2, 3]), is_training=True)
    """

    def __init__(
        self,
        num_classes: int,
        decay_rate: float = 0.999,
        eps: float = BN_EPS,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.num_classes = num_classes
        self.batch_norm = BatchNorm(
            decay_rate, eps, create_scale=False, fused=False, name="batch_norm"
        )

    @snt.once
    def _initialize(self, inputs: tf.Tensor):
        channels = inputs.shape[-1]
        # Identity transform at initialisation: gamma = 1, beta = 0 for every class.
        self.gamma = tf.Variable(tf.ones([self.num_classes, channels], inputs.dtype), name="gamma")
        self.beta = tf.Variable(tf.zeros([self.num_classes, channels], inputs.dtype), name="beta")

    def __call__(
        self,
        inputs: tf.Tensor,
        labels: tf.Tensor,
        is_training: bool,
        test_local_stats: bool = False,
    ) -> tf.Tensor:
        """Normalises `inputs` `[N, H, W, C]` and applies the scale/offset of `labels` `[N]`."""
        self._initialize(inputs)
        one_hot = tf.one_hot(labels, self.num_classes, dtype=inputs.dtype)
        scale = tf.matmul(one_hot, self.gamma)[:, None, None, :]
        offset = tf.matmul(one_hot, self.beta)[:, None, None, :]
        return self.batch_norm(
            inputs,
            is_training=is_training,
            test_local_stats=test_local_stats,
            scale=scale,
            offset=offset,
        )
