"""scikit-learn's handwritten digits as a small, real, download-free image dataset.

1797 grey 8x8 images of the digits 0-9 (`sklearn.datasets.load_digits`, shipped
with scikit-learn), split once and for all into 1437 training and 360 test
images (stratified, seed 0). Images are upsampled to the requested size
(bilinear) and repeated over 3 channels, so they flow through the same
pipeline, models and metrics as ImageNet:

    digits = Digits()
    input_fn = digits.input_fn("train", global_batch_size=64, image_size=16)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from vision.data.pipeline import EVAL, TRAIN, DataError, ImageDataset, Shard

TEST_FRACTION = 0.2
SPLIT_SEED = 0


def load_digits_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The fixed split: {"train": (images, labels), "eval": (images, labels)}.

    Images are float32 [N, 8, 8, 1] on a 0..255 scale; labels int64 [N].
    """
    from sklearn.datasets import load_digits  # pylint: disable=import-outside-toplevel
    from sklearn.model_selection import train_test_split  # pylint: disable=import-outside-toplevel

    data = load_digits()
    images = (data.images[..., None] * (255.0 / 16.0)).astype(np.float32)
    labels = data.target.astype(np.int64)
    train, test = train_test_split(
        np.arange(len(labels)), test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=labels
    )
    return {TRAIN: (images[train], labels[train]), EVAL: (images[test], labels[test])}


class Digits(ImageDataset):
    """The digits split as an `ImageDataset` (no augmentation: flips would change digits)."""

    name = "digits"
    num_classes = 10
    default_image_size = 16
    global_order = True  # in memory: every worker reads the same global batches

    def __init__(self):
        self._arrays = load_digits_arrays()
        train_images = self._arrays[TRAIN][0]
        self._mean = float(train_images.mean())
        self._std = float(train_images.std())

    def num_examples(self, split):
        return len(self._arrays[split][1])

    def shard(self, split: str, num_shards: int, index: int) -> Shard:
        images, labels = self._arrays[split]
        images, labels = images[index::num_shards], labels[index::num_shards]
        if not len(labels):
            raise DataError(
                f"Digits shard {index} of {num_shards} is empty: use fewer input pipelines."
            )

        def records(seed):
            dataset = tf.data.Dataset.from_tensor_slices((images, labels))
            if seed is None:
                return dataset
            order = tf.random.experimental.stateless_shuffle(tf.range(len(labels)), seed)
            return tf.data.Dataset.from_tensor_slices(order).map(
                lambda i: (tf.gather(images, i), tf.gather(labels, i))
            )

        return Shard(records, lambda: len(labels))

    def preprocess(self, raw, training, image_size, seed):
        del training, seed  # no augmentation
        image = tf.image.resize(raw, [image_size, image_size], method="bilinear")
        image = tf.tile(image, [1, 1, 3])
        return (image - self._mean) / self._std

    def preprocess_gan(self, raw, image_size, channels, seed):
        del seed  # no flips: they would change the digits
        image = tf.image.resize(raw, [image_size, image_size], method="bilinear")
        image = tf.clip_by_value(image / 127.5 - 1.0, -1.0, 1.0)
        return tf.tile(image, [1, 1, channels]) if channels != 1 else image
