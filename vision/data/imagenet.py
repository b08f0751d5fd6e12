"""ImageNet in its two usual on-disk forms, read with tf.data.

TFRecords as TensorFlow Datasets writes `imagenet2012`::

    DIR/imagenet2012/5.1.0/imagenet2012-train.tfrecord-00000-of-01024
                           imagenet2012-validation.tfrecord-00000-of-00064
                           dataset_info.json, label.labels.txt        (optional)

with features `image` (encoded JPEG bytes), `label` (int64) and `file_name`.
`DIR` may be any directory above the shards. Shards are dealt to input
pipelines whole (or record by record when there are fewer files than
pipelines), before anything is parsed or decoded.

One folder per class::

    DIR/train/<class>/*.JPEG        DIR/val/<class>/*.JPEG   (or DIR/validation/)
    DIR/<class>/*.png               (no train/: every image is for training)

Classes are the sorted sub-folder names of `train/`; label i is the i-th. The
official validation images come in one flat folder; sort them into class
folders first (the usual `valprep.sh` step).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence

import tensorflow as tf

from vision.data import preprocessing
from vision.data.pipeline import EVAL, TRAIN, DataError, ImageDataset, Shard

IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".gif")
_SHARD_PATTERN = re.compile(
    r"^(?P<name>.+)-(?P<split>train|validation)\.tfrecord-(?P<index>\d{5})-of-(?P<total>\d{5})$"
)
_TFDS_SPLITS = {TRAIN: "train", EVAL: "validation"}
_FEATURES = {
    "image": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
}
_LAYOUT_HELP = (
    "Expected either tfds TFRecords (files like imagenet2012-train.tfrecord-00000-of-01024 "
    "anywhere under the directory) or one folder per class (DIR/train/<class>/*.JPEG and "
    "DIR/val/<class>/*.JPEG). `vision.data.write_tiny_imagenet` writes a small example of each."
)


class _ImageNetBase(ImageDataset):
    default_image_size = 224

    def preprocess(self, raw, training, image_size, seed):
        if training:
            image = preprocessing.train_image(raw, image_size, seed)
        else:
            image = preprocessing.eval_image(raw, image_size)
        return preprocessing.normalize(image)

    def preprocess_gan(self, raw, image_size, channels, seed):
        return preprocessing.gan_image(raw, image_size, channels, seed)


class TFRecordImageNet(_ImageNetBase):
    """ImageNet (or any tfds image-classification set) stored as tfds TFRecords.

    Args:
      directory: a directory at or above the `*.tfrecord-*` shards.
      num_classes: overrides the class count read from `label.labels.txt` or
        `dataset_info.json` (needed if neither exists).
      shuffle_buffer: consecutive records shuffled together after interleaving the
        files (themselves in a new random order every epoch).
      cycle_length: files read in parallel per input pipeline.

    Raises:
      DataError: no shards, an incomplete set of shards, several candidate
        directories, unreadable records, or an unknown class count.
    """

    def __init__(
        self,
        directory: str,
        num_classes: int | None = None,
        shuffle_buffer: int = 10_000,
        cycle_length: int = 16,
    ):
        self.directory = _find_shard_directory(directory)
        self._shuffle_buffer = shuffle_buffer
        self._cycle_length = cycle_length
        self._files = {
            split: _split_files(self.directory, tfds_split)
            for split, tfds_split in _TFDS_SPLITS.items()
        }
        if not self._files[TRAIN] and not self._files[EVAL]:
            raise DataError(f"No TFRecord shards in {self.directory}. {_LAYOUT_HELP}")
        info = _read_dataset_info(self.directory)
        self._lengths = {
            split: _shard_lengths(info, tfds_split, len(self._files[split]))
            for split, tfds_split in _TFDS_SPLITS.items()
        }
        self.num_classes = num_classes or _num_classes(self.directory, info)
        self._has = {split: bool(files) for split, files in self._files.items()}
        self.name = f"tfrecord:{self.directory}"
        for split in (TRAIN, EVAL):
            if self._files[split]:
                self._check_first_record(self._files[split][0])

    def num_examples(self, split):
        lengths = self._lengths[split]
        return sum(lengths) if lengths is not None else None

    def has_split(self, split: str) -> bool:
        return self._has[split]

    def shard(self, split: str, num_shards: int, index: int) -> Shard:
        files = self._files[split]
        if not files:
            raise DataError(
                f"No {_TFDS_SPLITS[split]} shards in {self.directory} (files like "
                f"*-{_TFDS_SPLITS[split]}.tfrecord-00000-of-NNNNN); add them"
                + (" or pass --no-eval to skip evaluation." if split == EVAL else ".")
            )
        lengths = self._lengths[split]
        by_file = len(files) >= num_shards
        mine = files[index::num_shards] if by_file else files
        cycle = max(1, min(self._cycle_length, len(mine)))

        def records(seed):
            names = tf.constant(mine)
            if seed is not None:
                names = tf.random.experimental.stateless_shuffle(names, seed)
            dataset = tf.data.Dataset.from_tensor_slices(names).interleave(
                lambda name: tf.data.TFRecordDataset(name, buffer_size=8 << 20),
                cycle_length=cycle,
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
            if not by_file:
                dataset = dataset.shard(num_shards, index)
            if seed is not None:
                dataset = _window_shuffle(dataset, self._shuffle_buffer, seed)
            return dataset.map(_parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

        def size():
            if lengths is not None:
                total = sum(lengths[index::num_shards]) if by_file else sum(lengths)
            else:  # no dataset_info.json: count (reads the shard's records once)
                total = int(
                    tf.data.TFRecordDataset(mine).reduce(
                        tf.constant(0, tf.int64), lambda n, _: n + 1
                    )
                )
            return total if by_file else len(range(index, total, num_shards))

        return Shard(records, size)

    def _check_first_record(self, path: str) -> None:
        try:
            serialized = next(iter(tf.data.TFRecordDataset(path).take(1)), None)
            if serialized is None:
                raise DataError(f"{path} holds no records; regenerate or remove it.")
            image, label = _parse(serialized)
            if int(tf.strings.length(image)) == 0:
                raise DataError(f"{path}: the 'image' feature is empty.")
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as error:
            raise DataError(
                f"{path} is not a tfds image-classification TFRecord (expected features "
                f"'image': encoded JPEG bytes and 'label': int64): {error.message.splitlines()[0]}"
            ) from None
        if not 0 <= int(label) < self.num_classes:
            raise DataError(
                f"{path}: label {int(label)} is outside [0, {self.num_classes}); pass the "
                "right number of classes (--num-classes)."
            )


class FolderImageNet(_ImageNetBase):
    """ImageNet (or any image set) as one folder of images per class.

    Args:
      directory: holds `train/<class>/...` and optionally `val/<class>/...`
        (or `validation/<class>/...`); without `train/`, `directory/<class>/...`
        are the training images and there is no evaluation split.

    Raises:
      DataError: no class folders, no images, evaluation classes that training
        does not have, or a class whose first image does not decode.
    """

    def __init__(self, directory: str):
        self.directory = directory
        train_dir = os.path.join(directory, "train")
        if not os.path.isdir(train_dir):
            train_dir = directory
        self.classes = sorted(entry.name for entry in os.scandir(train_dir) if entry.is_dir())
        if not self.classes:
            raise DataError(f"{train_dir} has no class folders. {_LAYOUT_HELP}")
        self.num_classes = len(self.classes)
        self.name = f"folders:{directory}"
        self._examples = {TRAIN: _list_images(train_dir, self.classes), EVAL: []}
        if not self._examples[TRAIN]:
            raise DataError(
                f"The class folders of {train_dir} hold no images "
                f"({', '.join(IMAGE_EXTENSIONS)}). {_LAYOUT_HELP}"
            )
        for name in ("val", "validation"):
            eval_dir = os.path.join(directory, name)
            if os.path.isdir(eval_dir) and train_dir != directory:
                self._examples[EVAL] = _list_images(eval_dir, self.classes)
                break
        self._check_decodes()

    def _check_decodes(self) -> None:
        """Decodes the first image of each class, so a bad file fails before training."""
        first: dict[int, str] = {}
        for path, label in self._examples[TRAIN]:
            first.setdefault(label, path)
        for path in first.values():
            try:
                encoded = tf.io.read_file(path)
                tf.io.decode_image(encoded, channels=3, expand_animations=False)
            except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError) as error:
                raise DataError(
                    f"cannot decode {path!r} as an image ({error.message.splitlines()[0]}). "
                    "Remove or replace it."
                ) from None

    def num_examples(self, split):
        return len(self._examples[split])

    def shard(self, split: str, num_shards: int, index: int) -> Shard:
        if not self._examples[split]:
            raise DataError(
                f"No evaluation images in {self.directory}: add val/<class>/*.JPEG "
                "(or validation/<class>/...), or pass --no-eval to skip evaluation."
            )
        examples = self._examples[split][index::num_shards]
        if not examples:
            raise DataError(
                f"Shard {index} of {num_shards} of {split} is empty: the data has "
                "fewer images than input pipelines."
            )

        def records(seed):
            paths = tf.constant([path for path, _ in examples])
            labels = tf.constant([label for _, label in examples], tf.int64)
            if seed is not None:
                order = tf.random.experimental.stateless_shuffle(tf.range(len(examples)), seed)
                paths, labels = tf.gather(paths, order), tf.gather(labels, order)
            dataset = tf.data.Dataset.from_tensor_slices((paths, labels))
            return dataset.map(
                lambda path, label: (tf.io.read_file(path), label),
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )

        return Shard(records, lambda: len(examples))


def _window_shuffle(dataset: tf.data.Dataset, window: int, seed: tf.Tensor) -> tf.data.Dataset:
    """Shuffles each run of `window` consecutive elements, as a pure function of `seed`.

    Unlike `Dataset.shuffle`, whose order also depends on TensorFlow's global
    seed (and which refuses a tensor seed once one is set), the order here is
    fixed by `seed` alone: element i gets the random key U(fold_in(seed, i)).
    """

    def keyed(index, record):
        key = tf.random.stateless_uniform([], tf.random.experimental.stateless_fold_in(seed, index))
        return key, record

    def sort(keys, records):
        order = tf.argsort(keys)
        return tf.nest.map_structure(lambda r: tf.gather(r, order), records)

    return dataset.enumerate().map(keyed).batch(window).map(sort).unbatch()


def _parse(serialized: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    features = tf.io.parse_single_example(serialized, _FEATURES)
    return features["image"], features["label"]


def _find_shard_directory(directory: str) -> str:
    """The one directory at or below `directory` holding tfrecord shards."""
    if not os.path.isdir(directory):
        raise DataError(f"Data directory {directory} does not exist. {_LAYOUT_HELP}")
    found = []
    for root, dirs, files in os.walk(directory):
        dirs.sort()
        if any(_SHARD_PATTERN.match(name) for name in files):
            found.append(root)
        if root.count(os.sep) - directory.rstrip(os.sep).count(os.sep) >= 3:
            dirs.clear()  # tfds nests DATA_DIR/name/version/: no need to look deeper
    if not found:
        raise DataError(f"No TFRecord shards under {directory}. {_LAYOUT_HELP}")
    if len(found) > 1:
        raise DataError(
            f"Several directories under {directory} hold TFRecord shards "
            f"({', '.join(found)}); pass the one to use."
        )
    return found[0]


def _split_files(directory: str, tfds_split: str) -> list[str]:
    shards = {}
    for name in os.listdir(directory):
        match = _SHARD_PATTERN.match(name)
        if match and match["split"] == tfds_split:
            shards[int(match["index"])] = (int(match["total"]), os.path.join(directory, name))
    if not shards:
        return []
    totals = {total for total, _ in shards.values()}
    expected = max(totals)
    missing = sorted(set(range(expected)) - set(shards))
    if len(totals) > 1 or missing:
        raise DataError(
            f"The {tfds_split} shards in {directory} are incomplete or mixed: found "
            f"{len(shards)} of {expected} (missing indices {missing[:10]}). Re-copy the "
            "dataset or remove the stray files."
        )
    return [shards[i][1] for i in range(expected)]


def _read_dataset_info(directory: str) -> dict:
    path = os.path.join(directory, "dataset_info.json")
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}  # optional metadata: fall back to counting


def _shard_lengths(info: dict, tfds_split: str, num_files: int) -> list[int] | None:
    for split in info.get("splits", []):
        if split.get("name") == tfds_split:
            lengths = [int(n) for n in split.get("shardLengths", [])]
            if len(lengths) == num_files:
                return lengths
    return None


def _num_classes(directory: str, info: dict) -> int:
    labels = os.path.join(directory, "label.labels.txt")
    if os.path.exists(labels):
        with open(labels) as f:
            names = [line for line in f.read().splitlines() if line.strip()]
        if names:
            return len(names)
    found = _find_key(info, "numClasses")
    if found is not None:
        return int(found)
    raise DataError(
        f"Cannot tell the number of classes of {directory} (no label.labels.txt "
        "or dataset_info.json); pass --num-classes."
    )


def _find_key(tree, key: str):
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        children = tree.values()
    elif isinstance(tree, list):
        children = tree
    else:
        return None
    for child in children:
        found = _find_key(child, key)
        if found is not None:
            return found
    return None


def _list_images(split_dir: str, classes: Sequence[str]) -> list[tuple[str, int]]:
    present = sorted(entry.name for entry in os.scandir(split_dir) if entry.is_dir())
    unknown = sorted(set(present) - set(classes))
    if unknown:
        raise DataError(
            f"{split_dir} has classes that train/ does not ({', '.join(unknown[:5])}); "
            "evaluation labels follow the sorted train/ class folders."
        )
    examples = []
    for label, name in enumerate(classes):
        class_dir = os.path.join(split_dir, name)
        if not os.path.isdir(class_dir):
            continue
        files = sorted(f for f in os.listdir(class_dir) if f.lower().endswith(IMAGE_EXTENSIONS))
        examples.extend((os.path.join(class_dir, f), label) for f in files)
    return examples
