"""Class-labelled images for GAN training, read in an order fixed by (seed, position).

Sources: the digits data (`load_digits`) or a folder with one sub-folder of images per class
(`load_folder`). Every source is a list of examples addressed by index; training reads the
stream of example indices

    epoch e: a permutation of range(N) drawn from stateless seed (seed, e), epochs concatenated

so the pipeline can start at any position in O(1): a resumed run reads exactly the examples the
uninterrupted run would have read. Input pipeline `i` of `n` takes every n-th index of the stream.
"""

import dataclasses
import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from vision.data import DataError  # one error type for bad data across the vision trainers

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif")


@dataclasses.dataclass
class LabelledImages:
    """N labelled images, loaded by index. Images are float32 in [-1, 1], `[S, S, C]`."""

    num_examples: int
    num_classes: int
    image_size: int
    channels: int
    class_names: list[str]
    # Maps a batch of int64 indices [B] to (images [B, S, S, C], labels [B] int32).
    load_batch: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
    # If set, the pipeline maps this over single indices in parallel instead of calling
    # load_batch once per batch (for file decoding; in-memory gathers are cheaper batched).
    load_example: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]] | None = None

    def arrays(self, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The first `limit` (default all) examples as numpy arrays."""
        n = self.num_examples if limit is None else min(limit, self.num_examples)
        images, labels = [], []
        for start in range(0, n, 256):
            x, y = self.load_batch(tf.range(start, min(n, start + 256), dtype=tf.int64))
            images.append(x.numpy())
            labels.append(y.numpy())
        return np.concatenate(images), np.concatenate(labels)


def _from_arrays(images: np.ndarray, labels: np.ndarray, class_names: list[str]) -> LabelledImages:
    images_t = tf.constant(images, tf.float32)
    labels_t = tf.constant(labels, tf.int32)

    def load_batch(indices):
        return tf.gather(images_t, indices), tf.gather(labels_t, indices)

    return LabelledImages(
        len(images), len(class_names), images.shape[1], images.shape[3], class_names, load_batch
    )


def load_digits(image_size: int = 16, split: str = "train") -> LabelledImages:
    """The scikit-learn digits (8x8 grey, 10 classes), resized to `image_size` (bilinear).

    Args:
        split: "train" (1437 images) or "eval" (360), the split `vision.data` fixes.
    """
    from vision.data import load_digits_arrays  # the shared, fixed train/eval split

    images, labels = load_digits_arrays()[split]
    images = tf.image.resize(images, [image_size, image_size], "bilinear").numpy()
    images = np.clip(images / 127.5 - 1.0, -1.0, 1.0)
    return _from_arrays(images, labels, [str(i) for i in range(10)])


def _list_folder(path: str) -> tuple[list[str], list[int], list[str]]:
    if not os.path.isdir(path):
        raise DataError(
            f"data directory {path!r} does not exist. Pass --data digits, or a "
            "directory with one sub-directory of images per class."
        )
    if os.path.isdir(os.path.join(path, "train")):  # the ImageNet folder layout of vision.data
        path = os.path.join(path, "train")
    class_names = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    files, labels, used = [], [], []
    for name in class_names:
        class_dir = os.path.join(path, name)
        class_files = sorted(
            f for f in os.listdir(class_dir) if f.lower().endswith(IMAGE_EXTENSIONS)
        )
        if not class_files:
            continue
        files += [os.path.join(class_dir, f) for f in class_files]
        labels += [len(used)] * len(class_files)
        used.append(name)
    if not used:
        raise DataError(
            f"no images found in {path!r}: expected one sub-directory per class containing "
            f"{'/'.join(IMAGE_EXTENSIONS)} files, e.g. {path}/cat/0001.png."
        )
    return files, labels, used


def _decode(path: tf.Tensor, image_size: int, channels: int) -> tf.Tensor:
    image = tf.io.decode_image(tf.io.read_file(path), channels=channels, expand_animations=False)
    image = tf.image.resize(
        tf.cast(image, tf.float32), [image_size, image_size], method="area", antialias=True
    )
    image.set_shape([image_size, image_size, channels])
    return image / 127.5 - 1.0


def load_folder(path: str, image_size: int, channels: int = 3) -> LabelledImages:
    """Images under `path/<class name>/*` or `path/train/<class name>/*` (classes sorted by
    name; label i is the i-th class with images), resized to `image_size` (area averaging).

    Raises:
        DataError: the folder is missing, holds no images, or the first image of a class does
            not decode (later files are checked as they are read).
    """
    files, labels, class_names = _list_folder(path)
    first_of_class = {}
    for f, y in zip(files, labels):
        first_of_class.setdefault(y, f)
    for f in first_of_class.values():
        try:
            _decode(tf.constant(f), image_size, channels)
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as e:
            raise DataError(
                f"cannot decode {f!r} as an image ({e.message.splitlines()[0]}). "
                "Remove or replace it."
            ) from e
    files_t = tf.constant(files)
    labels_t = tf.constant(labels, tf.int32)

    def load_example(index):
        return _decode(files_t[index], image_size, channels), labels_t[index]

    def load_batch(indices):
        return tf.map_fn(load_example, indices, fn_output_signature=(tf.float32, tf.int32))

    return LabelledImages(
        len(files), len(class_names), image_size, channels, class_names, load_batch, load_example
    )


def index_stream(num_examples: int, seed: int, start: int = 0) -> tf.data.Dataset:
    """Example indices, epoch after epoch, each epoch a seeded permutation; from `start`."""
    start_epoch, offset = divmod(start, num_examples)

    def epoch(e):
        keys = tf.random.stateless_uniform([num_examples], tf.stack([tf.cast(seed, tf.int64), e]))
        return tf.data.Dataset.from_tensor_slices(tf.argsort(keys, stable=True))

    return (
        tf.data.Dataset.range(start_epoch, 2**62)
        .flat_map(epoch)
        .skip(offset)
        .map(lambda i: tf.cast(i, tf.int64))
    )


def make_input_fn(
    source: LabelledImages, per_replica_batch_size: int, seed: int = 0, start: int = 0
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """An `input_fn` for `Replicator.distribute`: per-replica batches {"image", "label"}.

    Args:
        source: the examples.
        per_replica_batch_size: examples per batch (one replica's share of the global batch).
        seed: permutation seed.
        start: position in the global index stream to start at (examples already consumed).
    """

    def input_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        indices = index_stream(source.num_examples, seed, start)
        if ctx.num_input_pipelines > 1:
            indices = indices.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

        def to_dict(images, labels):
            return {"image": images, "label": labels}

        if source.load_example is None:
            ds = indices.batch(per_replica_batch_size, drop_remainder=True)
            ds = ds.map(lambda i: to_dict(*source.load_batch(i)))
        else:
            ds = indices.map(
                source.load_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
            )
            ds = ds.batch(per_replica_batch_size, drop_remainder=True).map(to_dict)
        return ds.prefetch(2)

    return input_fn
