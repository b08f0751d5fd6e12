"""ImageNet preprocessing: random-resized crop and flip for training, centre crop for eval.

Both work on encoded image bytes so JPEGs are decoded only inside the crop
window (`tf.image.decode_and_crop_jpeg`), the standard trick that makes
ImageNet input pipelines CPU-affordable. Randomness is stateless: the caller
passes a seed per example, so a pipeline started at any position reproduces
the augmentations an uninterrupted run would have drawn.
"""

from __future__ import annotations

import tensorflow as tf

# Per-channel RGB statistics of the ImageNet training set, on a 0..255 scale.
IMAGENET_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
IMAGENET_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

# Evaluation crops the central 87.5% of the shorter side: the classic
# "resize to 256, centre-crop 224" done as crop-then-resize.
EVAL_CROP_FRACTION = 224 / 256

AREA_RANGE = (0.08, 1.0)
ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)


def normalize(image: tf.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> tf.Tensor:
    """Maps a float image on a 0..255 scale to zero mean, unit variance per channel."""
    mean, std = tf.constant(mean, tf.float32), tf.constant(std, tf.float32)
    return (tf.cast(image, tf.float32) - mean) / std


def _decode_window(encoded: tf.Tensor, window: tf.Tensor) -> tf.Tensor:
    """Decodes the [y, x, h, w] window of an encoded image into uint8 RGB."""

    def jpeg():
        return tf.image.decode_and_crop_jpeg(encoded, window, channels=3)

    def other():  # PNG/GIF/BMP files with a .JPEG name exist in real ImageNet folders.
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        return tf.image.crop_to_bounding_box(image, window[0], window[1], window[2], window[3])

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def _image_shape(encoded: tf.Tensor) -> tf.Tensor:
    """[height, width] of an encoded image, reading only the header for JPEGs."""

    def jpeg():
        return tf.image.extract_jpeg_shape(encoded)[:2]

    def other():
        return tf.shape(tf.io.decode_image(encoded, channels=3, expand_animations=False))[:2]

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def train_image(encoded: tf.Tensor, image_size: int, seed: tf.Tensor) -> tf.Tensor:
    """Random-resized crop (area 8%-100%, aspect 3/4-4/3) and a random horizontal flip.

    Args:
      encoded: scalar string, an encoded JPEG (or PNG) image.
      image_size: side of the square output.
      seed: int32/int64 tensor of shape [2], the example's stateless seed.

    Returns:
      float32 [image_size, image_size, 3] on a 0..255 scale (not normalised).
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = _image_shape(encoded)
    whole_image = tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4])
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.concat([shape, [3]], 0),
        whole_image,
        seed=crop_seed,
        min_object_covered=0.1,
        aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    window = tf.stack([begin[0], begin[1], size[0], size[1]])
    image = _decode_window(encoded, window)
    image = tf.image.resize(image, [image_size, image_size], method="bilinear")
    image = tf.image.stateless_random_flip_left_right(image, seed=flip_seed)
    return tf.ensure_shape(image, [image_size, image_size, 3])


def eval_image(encoded: tf.Tensor, image_size: int) -> tf.Tensor:
    """Centre crop of 87.5% of the shorter side, resized to image_size x image_size.

    Same result as resizing the shorter side to image_size / 0.875 (256 for 224)
    and cropping the centre, but decodes only the crop.

    Returns:
      float32 [image_size, image_size, 3] on a 0..255 scale (not normalised).
    """
    shape = _image_shape(encoded)
    height, width = shape[0], shape[1]
    side = tf.cast(tf.cast(tf.minimum(height, width), tf.float32) * EVAL_CROP_FRACTION, tf.int32)
    side = tf.maximum(side, 1)
    window = tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])
    image = _decode_window(encoded, window)
    image = tf.image.resize(image, [image_size, image_size], method="bilinear")
    return tf.ensure_shape(image, [image_size, image_size, 3])


def gan_image(
    encoded: tf.Tensor, image_size: int, channels: int = 3, seed: tf.Tensor | None = None
) -> tf.Tensor:
    """The centre square of an image, area-resized, flipped at random: a GAN's training image.

    The usual preprocessing of class-conditional ImageNet GANs (SN-GAN, BigGAN):
    crop the largest centred square, resize it with area averaging (antialiased),
    and, when `seed` is given, flip it horizontally with probability 1/2.

    Returns:
      float32 [image_size, image_size, channels] in [-1, 1].
    """
    shape = _image_shape(encoded)
    height, width = shape[0], shape[1]
    side = tf.minimum(height, width)
    window = tf.stack([(height - side) // 2, (width - side) // 2, side, side])
    image = tf.cast(_decode_window(encoded, window), tf.float32)
    image = tf.image.resize(image, [image_size, image_size], method="area", antialias=True)
    if seed is not None:
        image = tf.image.stateless_random_flip_left_right(image, seed=seed)
    if channels == 1:
        image = tf.image.rgb_to_grayscale(image)
    image = tf.clip_by_value(image / 127.5 - 1.0, -1.0, 1.0)
    return tf.ensure_shape(image, [image_size, image_size, channels])
