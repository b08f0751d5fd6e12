"""Per-replica input pipelines over any labelled-image source, resumable at any step.

A source (ImageNet TFRecords, ImageNet folders, digits) only says how to list
the raw examples of one shard and how to turn one raw example into a
normalised image. This module builds the rest, the same way for all of them:

  * Sharding: input pipeline `i` of `n` (`ctx.input_pipeline_id`,
    `ctx.num_input_pipelines`) gets a disjoint shard, chosen before anything is
    decoded (whole files where possible).
  * Training stream: epoch `e` of a shard is a permutation drawn from the
    stateless seed (seed, e); epochs are concatenated, so the stream is a pure
    function of (seed, shard). Example `k` of epoch `e` is augmented with a
    stateless seed folded from (seed, pipeline, e, k). A pipeline built with
    `start_step=s` therefore starts exactly where an uninterrupted run would be
    after `s` steps: whole epochs are skipped arithmetically and the remainder of
    the current epoch by skipping raw records (read, not decoded).
  * Evaluation stream: every example of the shard once, in order, with a mask
    of 1, then padding examples with mask 0 forever. The evaluation loop stops
    at the first step whose batches are all padding, so every example counts
    exactly once whatever the shard sizes and replica count.

  * Global order (in-memory sources such as digits): every pipeline reads the
    whole stream and keeps its slice of each global batch, so the examples of
    a global batch do not depend on how many pipelines (workers) there are,
    and K workers train exactly like one.

Two tasks preprocess differently:

  * "classification": normalised images (ImageNet: random-resized crop and
    flip for training, centre crop for evaluation), 3 channels;
  * "gan": images in [-1, 1] with `channels` channels (ImageNet: the centre
    square, area-resized, flipped at random for training; digits: resized).

Elements are `(images, labels)` for training and `(images, labels, mask)` for
evaluation: float32 [B, S, S, C], int32 [B], float32 [B], with B the
per-replica batch size.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable

import numpy as np
import tensorflow as tf

TRAIN = "train"
EVAL = "eval"
SPLITS = (TRAIN, EVAL)
CLASSIFICATION = "classification"
GAN = "gan"
TASKS = (CLASSIFICATION, GAN)

_MAX_EPOCHS = 2**40


class DataError(ValueError):
    """Missing, empty or malformed data; the message says what to do."""


@dataclasses.dataclass
class Shard:
    """The raw examples one input pipeline reads.

    Attributes:
      records: `records(seed)` returns a dataset of `(raw, label)` pairs covering
        the shard once: in a fixed order when `seed` is None, otherwise in an
        order that is a pure function of `seed` (int64 tensor of shape [2]).
      size: `size()` counts the shard's examples (may be slow for TFRecords
        without a tfds `dataset_info.json`; only needed to resume mid-run).
    """

    records: Callable[[tf.Tensor | None], tf.data.Dataset]
    size: Callable[[], int]


class ImageDataset(abc.ABC):
    """A labelled image dataset with a train and an eval split.

    Attributes:
      name: short description for logs and the run config.
      num_classes: labels are in [0, num_classes).
      default_image_size: the input size the data is usually trained at.
    """

    name: str
    num_classes: int
    default_image_size: int
    # True: the global batches do not depend on the number of input pipelines.
    global_order: bool = False

    @abc.abstractmethod
    def shard(self, split: str, num_shards: int, index: int) -> Shard:
        """The raw examples of shard `index` of `num_shards` of `split`."""

    @abc.abstractmethod
    def preprocess(
        self, raw: tf.Tensor, training: bool, image_size: int, seed: tf.Tensor | None
    ) -> tf.Tensor:
        """One raw example to a normalised float32 [image_size, image_size, 3] image."""

    @abc.abstractmethod
    def preprocess_gan(
        self, raw: tf.Tensor, image_size: int, channels: int, seed: tf.Tensor | None
    ) -> tf.Tensor:
        """One raw example to a float32 [image_size, image_size, channels] image in [-1, 1].

        `seed` (None: no augmentation) draws the random flip where the data allows one.
        """

    def num_examples(self, split: str) -> int | None:
        """Examples in `split`, or None if unknown without reading the data."""
        return None

    def has_split(self, split: str) -> bool:
        """Whether `split` holds any example (checked before a run writes anything)."""
        return bool(self.num_examples(split))

    def arrays(
        self, split: str, image_size: int, *, task: str = GAN, channels: int = 3
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every example of `split` in its fixed order, unaugmented, as numpy (small data only)."""
        input_fn = self.input_fn(
            split, 256, image_size, training=False, task=task, channels=channels
        )
        images, labels = [], []
        for x, y, mask in input_fn(tf.distribute.InputContext()):
            keep = mask.numpy() > 0
            if not keep.any():
                break
            images.append(x.numpy()[keep])
            labels.append(y.numpy()[keep])
        return np.concatenate(images), np.concatenate(labels)

    def input_fn(
        self,
        split: str,
        global_batch_size: int,
        image_size: int,
        *,
        training: bool | None = None,
        seed: int = 0,
        start_step: int = 0,
        task: str = CLASSIFICATION,
        channels: int = 3,
    ) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """Returns `input_fn(ctx)` for `Replicator.distribute`.

        Args:
          split: "train" or "eval".
          global_batch_size: examples per step over all replicas.
          image_size: side of the square images produced.
          training: the infinite shuffled, augmented stream (default for "train")
            or the single masked, padded evaluation pass (default for "eval").
          seed: data order and augmentation seed.
          start_step: training steps (of `global_batch_size`) already taken; the
            stream starts after the examples those steps consumed.
          task: "classification" or "gan" (see the module docstring).
          channels: image channels for "gan" (1 or 3).
        """
        if split not in SPLITS:
            raise ValueError(f"Unknown split {split!r}; use one of {SPLITS}.")
        if task not in TASKS:
            raise ValueError(f"Unknown task {task!r}; use one of {TASKS}.")
        training = split == TRAIN if training is None else training
        if task == CLASSIFICATION:
            channels = 3

        def preprocess(raw, augment, seed):
            if task == GAN:
                return self.preprocess_gan(raw, image_size, channels, seed if augment else None)
            return self.preprocess(raw, augment, image_size, seed)

        def input_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            per_replica = ctx.get_per_replica_batch_size(global_batch_size)
            pipelines, pipeline_id = ctx.num_input_pipelines, ctx.input_pipeline_id
            per_pipeline = global_batch_size // pipelines
            if training and self.global_order:
                shard = self.shard(split, 1, 0)
                dataset = self._training_stream(
                    shard, preprocess, seed, 0, start_step * global_batch_size
                )
                if pipelines > 1:  # this pipeline's slice of every global batch
                    first = pipeline_id * per_pipeline
                    dataset = (
                        dataset.batch(global_batch_size, drop_remainder=True)
                        .map(
                            lambda x, y: (
                                x[first : first + per_pipeline],
                                y[first : first + per_pipeline],
                            )
                        )
                        .unbatch()
                    )
            elif training:
                shard = self.shard(split, pipelines, pipeline_id)
                dataset = self._training_stream(
                    shard, preprocess, seed, pipeline_id, start_step * per_pipeline
                )
            else:
                shard = self.shard(split, pipelines, pipeline_id)
                dataset = self._evaluation_stream(shard, preprocess, image_size, channels)
            dataset = dataset.batch(per_replica, drop_remainder=True)
            return dataset.prefetch(tf.data.AUTOTUNE)

        return input_fn

    def _training_stream(
        self, shard: Shard, preprocess: Callable, seed: int, pipeline_id: int, position: int
    ) -> tf.data.Dataset:
        start_epoch, offset = divmod(position, shard.size()) if position else (0, 0)
        base_seed = tf.constant([seed, 0], tf.int64)

        def epoch(index: tf.Tensor) -> tf.data.Dataset:
            # The same order seed on every pipeline: sources that shard records
            # after shuffling files need all pipelines to agree on the file order.
            order_seed = tf.random.experimental.stateless_fold_in(base_seed, index)
            augment_seed = tf.random.experimental.stateless_fold_in(
                tf.random.experimental.stateless_fold_in(order_seed, pipeline_id + 1), index
            )
            records = shard.records(order_seed).enumerate()
            records = records.skip(tf.where(index == start_epoch, tf.constant(offset, tf.int64), 0))

            def decode(k, record):
                raw, label = record
                example_seed = tf.random.experimental.stateless_fold_in(augment_seed, k)
                return preprocess(raw, True, example_seed), tf.cast(label, tf.int32)

            return records.map(decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

        epochs = tf.data.Dataset.range(start_epoch, _MAX_EPOCHS)
        return epochs.flat_map(epoch)

    def _evaluation_stream(
        self, shard: Shard, preprocess: Callable, image_size: int, channels: int
    ) -> tf.data.Dataset:
        def decode(raw, label):
            return (
                preprocess(raw, False, None),
                tf.cast(label, tf.int32),
                tf.constant(1.0),
            )

        examples = shard.records(None).map(
            decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
        )
        padding = tf.data.Dataset.from_tensors(
            (
                tf.zeros([image_size, image_size, channels]),
                tf.constant(0, tf.int32),
                tf.constant(0.0),
            )
        )
        return examples.concatenate(padding.repeat())
