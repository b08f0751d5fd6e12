"""ResNet v1.5 as Sonnet modules, with cross-replica batch norm and bfloat16 compute.

ResNet v1.5 is the bottleneck ResNet of He et al. (2016) with the stride of each
downsampling block on its 3x3 convolution instead of its first 1x1 (as in the
MLPerf / NVIDIA / TF-official reference models). Width and depth are arguments,
so tests can train a two-group ResNet on 16x16 digits with the same code as
ResNet-50 on ImageNet:

    model = resnet50(num_classes=1000)                          # 25.6M parameters
    tiny = ResNet(blocks_per_group=(1, 1), channels_per_group=(32, 64),
                  num_classes=10, stem="small", stem_channels=16)
    logits = tiny(images, is_training=True)                     # float32 logits

Every batch norm is a `vision.common.normalization.BatchNorm` (cross-replica: statistics of the global
batch), so N replicas of batch B compute what one replica of batch N*B does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import sonnet as snt
import tensorflow as tf

from vision.common import precision as precision_lib
from vision.common.normalization import BatchNorm


class Conv2D(snt.Module):
    """Bias-free 2-D convolution ("SAME" padding) with a float32 kernel.

    The kernel is cast to the input's dtype where it is used, so a bfloat16
    input gives a bfloat16 convolution while the variable stays float32.
    """

    def __init__(
        self,
        output_channels: int,
        kernel_size: int,
        stride: int = 1,
        w_init: snt.initializers.Initializer | None = None,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.output_channels = output_channels
        self.kernel_size = kernel_size
        self.stride = stride
        # He initialisation for ReLU networks, fan-out mode.
        self._w_init = w_init or snt.initializers.VarianceScaling(
            2.0, "fan_out", "truncated_normal"
        )

    @snt.once
    def _initialize(self, inputs: tf.Tensor) -> None:
        shape = [self.kernel_size, self.kernel_size, int(inputs.shape[-1]), self.output_channels]
        self.w = tf.Variable(self._w_init(shape, tf.float32), name="w")

    def __call__(self, inputs: tf.Tensor) -> tf.Tensor:
        self._initialize(inputs)
        return tf.nn.conv2d(inputs, tf.cast(self.w, inputs.dtype), self.stride, "SAME")


class BottleneckBlock(snt.Module):
    """1x1 -> 3x3 (strided) -> 1x1 convolutions plus a shortcut, v1.5 style.

    With `stride_in_1x1` the stride moves to the first 1x1 convolution: the
    original ResNet v1 (and Keras' `ResNet50`), ~6% fewer FLOPs, a bit less
    accurate.

    The shortcut is the identity, or a strided 1x1 convolution and batch norm
    when the shape changes. With `zero_init_last_bn` the last batch norm's scale
    starts at zero, so each block starts as the identity (Goyal et al., 2017),
    which helps large-batch training.
    """

    def __init__(
        self,
        channels: int,
        stride: int,
        use_projection: bool,
        zero_init_last_bn: bool = True,
        bn_decay: float = 0.9,
        stride_in_1x1: bool = False,
        name: str | None = None,
    ):
        super().__init__(name=name)
        inner = max(channels // 4, 1)
        self.stride = stride
        stride_0, stride_1 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.convs = [
            Conv2D(inner, 1, stride_0, name="conv_0"),
            Conv2D(inner, 3, stride_1, name="conv_1"),
            Conv2D(channels, 1, name="conv_2"),
        ]
        last_scale = snt.initializers.Zeros() if zero_init_last_bn else None
        self.bns = [
            BatchNorm(bn_decay, name="bn_0"),
            BatchNorm(bn_decay, name="bn_1"),
            BatchNorm(bn_decay, scale_init=last_scale, name="bn_2"),
        ]
        self.projection = None
        if use_projection:
            self.projection = Conv2D(channels, 1, stride, name="projection")
            self.projection_bn = BatchNorm(bn_decay, name="projection_bn")

    def __call__(self, inputs: tf.Tensor, is_training: bool) -> tf.Tensor:
        shortcut = inputs
        if self.projection is not None:
            shortcut = self.projection_bn(self.projection(inputs), is_training)
        net = inputs
        for i, (conv, bn) in enumerate(zip(self.convs, self.bns)):
            net = bn(conv(net), is_training)
            if i < 2:
                net = tf.nn.relu(net)
        return tf.nn.relu(net + shortcut)


class ResNet(snt.Module):
    """A bottleneck ResNet v1.5 image classifier.

    Args:
      blocks_per_group: bottleneck blocks in each group, e.g. (3, 4, 6, 3).
      channels_per_group: output channels of each group, e.g. (256, 512, 1024, 2048).
      num_classes: size of the logits.
      stem: "imagenet" (7x7/2 convolution and 3x3/2 max-pool, for 224x224 inputs)
        or "small" (one 3x3/1 convolution, for 8x8 to 32x32 inputs).
      stem_channels: output channels of the stem convolution.
      strides: stride of each group's first block; by default 1 for the first
        group and 2 for the others.
      zero_init_last_bn: start each block's last batch-norm scale at zero.
      bn_decay: decay of the batch-norm moving averages.
      stride_in_1x1: downsample in the first 1x1 convolution of a block (ResNet
        v1, as Keras' ResNet50) instead of the 3x3 (v1.5, the default).
      precision: "float32", or "bfloat16" for bfloat16 compute on float32 weights
        (see `vision.precision`).
      name: module name.

    Calling it maps images [B, H, W, C] (float32) to float32 logits
    [B, num_classes]. Example::

        model = ResNet((1, 1), (32, 64), num_classes=10, stem="small")
        logits = model(tf.zeros([8, 16, 16, 3]), is_training=False)
    """

    def __init__(
        self,
        blocks_per_group: Sequence[int],
        channels_per_group: Sequence[int],
        num_classes: int,
        stem: str = "imagenet",
        stem_channels: int = 64,
        strides: Sequence[int] | None = None,
        zero_init_last_bn: bool = True,
        bn_decay: float = 0.9,
        precision: str = "float32",
        stride_in_1x1: bool = False,
        name: str | None = None,
    ):
        super().__init__(name=name)
        if len(blocks_per_group) != len(channels_per_group) or not blocks_per_group:
            raise ValueError(
                f"blocks_per_group {tuple(blocks_per_group)} and channels_per_group "
                f"{tuple(channels_per_group)} must be non-empty and of equal length."
            )
        if stem not in ("imagenet", "small"):
            raise ValueError(f"Unknown stem {stem!r}; use 'imagenet' (224x224 inputs) or 'small'.")
        if strides is None:
            strides = (1,) + (2,) * (len(blocks_per_group) - 1)
        strides = tuple(strides)
        if len(strides) != len(blocks_per_group):
            raise ValueError(
                f"Need one stride per group; got {strides} for {len(blocks_per_group)} groups."
            )
        self.compute_dtype = precision_lib.compute_dtype(precision)
        self.precision = precision
        self.num_classes = num_classes
        self.stem = stem
        self.downsampling = (4 if stem == "imagenet" else 1) * math.prod(strides)

        self.stem_conv = Conv2D(
            stem_channels,
            7 if stem == "imagenet" else 3,
            2 if stem == "imagenet" else 1,
            name="stem_conv",
        )
        self.stem_bn = BatchNorm(bn_decay, name="stem_bn")
        self.blocks = []
        in_channels = stem_channels
        for group, (count, channels, stride) in enumerate(
            zip(blocks_per_group, channels_per_group, strides)
        ):
            for index in range(count):
                block_stride = stride if index == 0 else 1
                self.blocks.append(
                    BottleneckBlock(
                        channels,
                        block_stride,
                        use_projection=block_stride != 1 or in_channels != channels,
                        zero_init_last_bn=zero_init_last_bn,
                        bn_decay=bn_decay,
                        stride_in_1x1=stride_in_1x1,
                        name=f"group_{group}_block_{index}",
                    )
                )
                in_channels = channels
        self.head = snt.Linear(
            num_classes, w_init=snt.initializers.TruncatedNormal(0.01), name="logits"
        )

    def check_image_size(self, image_size: int) -> None:
        """Raises ValueError unless `image_size` x `image_size` inputs suit this network."""
        if image_size < self.downsampling:
            hint = " or use the 'small' stem" if self.stem == "imagenet" else ""
            raise ValueError(
                f"Image size {image_size} is too small for this ResNet: its stem and "
                f"groups downsample by {self.downsampling}, so images must be at least "
                f"{self.downsampling}x{self.downsampling}. Use a larger image size{hint}."
            )

    def __call__(self, images: tf.Tensor, is_training: bool) -> tf.Tensor:
        net = tf.cast(images, self.compute_dtype)
        net = tf.nn.relu(self.stem_bn(self.stem_conv(net), is_training))
        if self.stem == "imagenet":
            net = tf.nn.max_pool2d(net, 3, 2, "SAME")
        for block in self.blocks:
            net = block(net, is_training)
        # Pool and classify in float32: cheap, and the logits feed a float32 loss.
        features = tf.reduce_mean(tf.cast(net, tf.float32), axis=[1, 2])
        return self.head(features)


def resnet50(num_classes: int = 1000, **kwargs) -> ResNet:
    """ResNet-50 v1.5: groups of (3, 4, 6, 3) blocks, 256 to 2048 channels.

    Keyword arguments go to `ResNet` (stem, precision, zero_init_last_bn, ...).
    """
    kwargs.setdefault("name", "resnet50")
    return ResNet((3, 4, 6, 3), (256, 512, 1024, 2048), num_classes, **kwargs)


def weight_decay_variables(module: snt.Module) -> list[tf.Variable]:
    """The variables L2 weight decay applies to: convolution and linear weights.

    Batch-norm scales/offsets and biases (all rank 1) are excluded, as usual.
    """
    return [v for v in module.trainable_variables if v.shape.rank > 1]
