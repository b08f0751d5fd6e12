"""Class-conditional SN-GAN networks: a conditional-BN residual generator and a projection
discriminator with spectral normalisation (Miyato et al. 2018; Miyato & Koyama 2018; the
BigGAN layout of Brock et al. 2019 for 64/128 pixels).

Both networks start from / end at 4x4 feature maps, so `image_size` must be `4 * 2**k` with
`1 <= k <= 6` (8, 16, 32, 64, 128, 256). Channel widths are `base_channels` times a per-level
multiplier (`generator_multipliers`, `discriminator_multipliers`).

Generator:      z, y -> Linear -> 4x4xC0 -> k x UpBlock(CBN-ReLU-up-conv-CBN-ReLU-conv + skip)
                -> BN -> ReLU -> conv3x3 -> tanh                                 (values in [-1, 1])
Discriminator:  x, y -> DownBlock(first) -> ... -> DownBlock(no pooling) -> ReLU -> sum over HxW = h
                D(x, y) = w . h + b + <embed(y), h>                    (the class projection term)
"""

from collections.abc import Sequence

import sonnet as snt
import tensorflow as tf

from vision.common.normalization import BatchNorm
from vision.sngan import layers as gan_layers

MIN_IMAGE_SIZE = 8
MAX_IMAGE_SIZE = 256


def check_image_size(image_size: int) -> int:
    """Returns the number of up/down-sampling levels for `image_size`.

    Raises:
        ValueError: if the networks cannot produce/consume images of that size.
    """
    levels = 0
    size = image_size
    while size > 4 and size % 2 == 0:
        size //= 2
        levels += 1
    if size != 4 or not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise ValueError(
            f"image size {image_size} is not supported by the SN-GAN networks: they double the "
            f"resolution from 4x4, so the size must be a power of two between {MIN_IMAGE_SIZE} "
            f"and {MAX_IMAGE_SIZE} (e.g. 16, 32, 64, 128). Pass --image-size to resize the data."
        )
    return levels


def generator_multipliers(image_size: int) -> list[int]:
    """Channel multipliers of the generator: the 4x4 input, then each up-block's output.

    BigGAN's widths (16, 16, 8, 4, 2, 1 at 128 pixels), cut to the number of levels.
    """
    levels = check_image_size(image_size)
    return [min(16, 2 ** (levels - i)) for i in range(levels + 1)]


def discriminator_multipliers(image_size: int) -> list[int]:
    """Channel multipliers of the discriminator's blocks; all but the last one downsample."""
    levels = check_image_size(image_size)
    mults = [min(16, 2**i) for i in range(levels)]
    return mults + [mults[-1]]


def _upsample(x: tf.Tensor) -> tf.Tensor:
    """Nearest-neighbour 2x upsampling."""
    return tf.repeat(tf.repeat(x, 2, axis=1), 2, axis=2)


def _downsample(x: tf.Tensor) -> tf.Tensor:
    """2x2 average pooling."""
    return tf.nn.avg_pool2d(x, ksize=2, strides=2, padding="VALID")


class UpBlock(snt.Module):
    """Generator residual block: doubles resolution, class-conditional batch norms."""

    def __init__(
        self,
        output_channels: int,
        num_classes: int,
        bn_decay: float = 0.999,
        name: str | None = None,
    ):
        super().__init__(name=name)
        w_init = gan_layers.default_w_init()

        # No biases: from here to the output every path reaches a batch norm through linear
        # maps only, so a per-channel constant is cancelled. Such a bias gets rounding noise
        # as its gradient, which Adam turns into full-size (and replica-count-dependent) steps.
        def conv(c, k, name):
            return snt.Conv2D(c, k, with_bias=False, w_init=w_init, name=name)

        self.bn1 = gan_layers.ConditionalBatchNorm(num_classes, bn_decay, name="cbn1")
        self.conv1 = conv(output_channels, 3, "conv1")
        self.bn2 = gan_layers.ConditionalBatchNorm(num_classes, bn_decay, name="cbn2")
        self.conv2 = conv(output_channels, 3, "conv2")
        self.shortcut = conv(output_channels, 1, "shortcut")

    def __call__(self, x, labels, is_training, test_local_stats=False):
        h = tf.nn.relu(self.bn1(x, labels, is_training, test_local_stats))
        h = self.conv1(_upsample(h))
        h = tf.nn.relu(self.bn2(h, labels, is_training, test_local_stats))
        h = self.conv2(h)
        return h + self.shortcut(_upsample(x))


class Generator(snt.Module):
    """Class-conditional generator `G(z, y) -> images [N, S, S, channels]` in [-1, 1].

    Example:
        >>> g = Generator(num_classes=10, image_size=16, channels=1, base_channels=16)
        >>> g(tf.zeros([2, 128]), tf.constant([3, 7]), is_training=True).shape
        TensorShape([2, 16, 16, 1])
    """

    def __init__(
        self,
        num_classes: int,
        image_size: int,
        channels: int = 3,
        base_channels: int = 64,
        latent_dim: int = 128,
        bn_decay: float = 0.999,
        multipliers: Sequence[int] | None = None,
        name: str | None = "generator",
    ):
        super().__init__(name=name)
        self.num_classes = num_classes
        self.image_size = image_size
        self.latent_dim = latent_dim
        mults = list(multipliers or generator_multipliers(image_size))
        if len(mults) != check_image_size(image_size) + 1:
            raise ValueError(
                f"need {check_image_size(image_size) + 1} generator multipliers "
                f"for {image_size}x{image_size} images, got {mults}"
            )
        w_init = gan_layers.default_w_init()
        self._c0 = base_channels * mults[0]
        # No bias, as in UpBlock: the batch norms downstream cancel it.
        self.linear = snt.Linear(4 * 4 * self._c0, with_bias=False, w_init=w_init, name="linear")
        self.blocks = [
            UpBlock(base_channels * m, num_classes, bn_decay, name=f"block{i}")
            for i, m in enumerate(mults[1:])
        ]
        self.bn = BatchNorm(bn_decay, gan_layers.BN_EPS, fused=False, name="bn_out")
        self.conv_out = snt.Conv2D(channels, 3, w_init=w_init, name="conv_out")

    def __call__(
        self, z: tf.Tensor, labels: tf.Tensor, is_training: bool, test_local_stats: bool = False
    ) -> tf.Tensor:
        """Generates one image per (z, label).

        Args:
            z: latents `[N, latent_dim]`.
            labels: int class ids `[N]`.
            is_training: use (cross-replica) batch statistics and update the moving averages.
            test_local_stats: when not training, use batch statistics instead of the moving ones.
        """
        h = tf.reshape(self.linear(z), [-1, 4, 4, self._c0])
        for block in self.blocks:
            h = block(h, labels, is_training, test_local_stats)
        h = tf.nn.relu(self.bn(h, is_training=is_training, test_local_stats=test_local_stats))
        return tf.tanh(self.conv_out(h))


class DownBlock(snt.Module):
    """Discriminator residual block (pre-activation, except the first block, which sees images)."""

    def __init__(
        self, output_channels: int, downsample: bool, first: bool = False, name: str | None = None
    ):
        super().__init__(name=name)
        self._downsample = downsample
        self._first = first
        self.conv1 = gan_layers.SNConv2D(output_channels, 3, name="conv1")
        self.conv2 = gan_layers.SNConv2D(output_channels, 3, name="conv2")
        self.shortcut = gan_layers.SNConv2D(output_channels, 1, name="shortcut")

    def __call__(self, x: tf.Tensor, is_training: bool) -> tf.Tensor:
        h = x if self._first else tf.nn.relu(x)
        h = self.conv1(h, is_training)
        h = self.conv2(tf.nn.relu(h), is_training)
        if self._downsample:
            h = _downsample(h)
        if self._first:  # pool, then project: the cheaper order on full-resolution images.
            shortcut = self.shortcut(_downsample(x) if self._downsample else x, is_training)
        else:
            shortcut = self.shortcut(x, is_training)
            if self._downsample:
                shortcut = _downsample(shortcut)
        return h + shortcut


class Discriminator(snt.Module):
    """Projection discriminator `D(x, y) -> logits [N]`; every weight spectrally normalised.

    Example:
        >>> d = Discriminator(num_classes=10, image_size=16, base_channels=16)
        >>> d(tf.zeros([2, 16, 16, 1]), tf.constant([3, 7]), is_training=True).shape
        TensorShape([2])
    """

    def __init__(
        self,
        num_classes: int,
        image_size: int,
        base_channels: int = 64,
        multipliers: Sequence[int] | None = None,
        name: str | None = "discriminator",
    ):
        super().__init__(name=name)
        self.num_classes = num_classes
        self.image_size = image_size
        mults = list(multipliers or discriminator_multipliers(image_size))
        if len(mults) != check_image_size(image_size) + 1:
            raise ValueError(
                f"need {check_image_size(image_size) + 1} discriminator "
                f"multipliers for {image_size}x{image_size} images, got {mults}"
            )
        self.blocks = [
            DownBlock(
                base_channels * m, downsample=i < len(mults) - 1, first=i == 0, name=f"block{i}"
            )
            for i, m in enumerate(mults)
        ]
        feature_dim = base_channels * mults[-1]
        self.linear = gan_layers.SNLinear(1, name="linear")
        self.embed = gan_layers.SNEmbed(num_classes, feature_dim, name="class_embedding")

    def __call__(self, images: tf.Tensor, labels: tf.Tensor, is_training: bool) -> tf.Tensor:
        """Returns the unnormalised realness score of each (image, label).

        `is_training` advances the spectral-norm power iterations; pass False when only the
        generator is being updated.
        """
        h = images
        for block in self.blocks:
            h = block(h, is_training)
        h = tf.reduce_sum(tf.nn.relu(h), axis=[1, 2])
        projection = tf.reduce_sum(self.embed(labels, is_training) * h, axis=1)
        return tf.squeeze(self.linear(h, is_training), axis=1) + projection
