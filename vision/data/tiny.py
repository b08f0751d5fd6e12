"""Tiny ImageNet-format datasets with real JPEGs, for tests and demos.

    root = write_tiny_imagenet("/tmp/tiny", form="tfrecord", num_classes=4,
                               images_per_class=8, size=32)
    dataset = vision.data.open_dataset(root)

Each class has its own colour and stripe orientation plus noise, so a model can
learn it. Image sizes vary around `size` (some are wider than tall) to exercise
the crop and resize code. Nothing here initialises TensorFlow devices (JPEGs are
encoded with Pillow), so it is safe before `replication.make("cpu:N")`.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

FORMS = ("tfrecord", "folders")
TFDS_NAME = "imagenet2012"
TFDS_VERSION = "5.1.0"


def class_name(label: int) -> str:
    """A WordNet-style id; sorting the names keeps the labels in order."""
    return f"n{label:08d}"


def write_tiny_imagenet(
    directory: str,
    form: str = "tfrecord",
    num_classes: int = 4,
    images_per_class: int = 8,
    size: int = 32,
    eval_images_per_class: int | None = None,
    num_shards: int = 4,
    seed: int = 0,
) -> str:
    """Writes a small ImageNet-format dataset; returns the directory to read it from.

    Args:
      directory: created if missing; must not already hold a dataset.
      form: "tfrecord" (tfds layout: `imagenet2012/5.1.0/imagenet2012-train.tfrecord-...`
        plus `dataset_info.json` and `label.labels.txt`) or "folders"
        (`train/<class>/*.JPEG`, `val/<class>/*.JPEG`).
      num_classes, images_per_class: training images = their product.
      size: nominal image side in pixels (at least 8).
      eval_images_per_class: default max(1, images_per_class // 4).
      num_shards: TFRecord files for the train split (validation gets half).
      seed: pixel noise seed.

    Raises:
      ValueError: unknown form, a too small size, or a non-empty target.
    """
    if form not in FORMS:
        raise ValueError(f"Unknown form {form!r}; use one of {FORMS}.")
    if size < 8 or num_classes < 1 or images_per_class < 1:
        raise ValueError("Need size >= 8, num_classes >= 1 and images_per_class >= 1.")
    if os.path.isdir(directory) and os.listdir(directory):
        raise ValueError(f"{directory} is not empty; write tiny datasets to a new directory.")
    eval_per_class = eval_images_per_class or max(1, images_per_class // 4)
    rng = np.random.default_rng(seed)
    splits = {
        "train": [
            (label, _jpeg(label, i, size, rng))
            for label in range(num_classes)
            for i in range(images_per_class)
        ],
        "validation": [
            (label, _jpeg(label, i, size, rng))
            for label in range(num_classes)
            for i in range(eval_per_class)
        ],
    }
    if form == "folders":
        for split, examples in splits.items():
            folder = "val" if split == "validation" else split
            for index, (label, data) in enumerate(examples):
                class_dir = os.path.join(directory, folder, class_name(label))
                os.makedirs(class_dir, exist_ok=True)
                path = os.path.join(class_dir, f"{class_name(label)}_{index:05d}.JPEG")
                with open(path, "wb") as f:
                    f.write(data)
        return directory
    _write_tfds(
        os.path.join(directory, TFDS_NAME, TFDS_VERSION),
        splits,
        num_classes,
        {"train": num_shards, "validation": max(1, num_shards // 2)},
    )
    return directory


def _jpeg(label: int, index: int, size: int, rng: np.random.Generator) -> bytes:
    from PIL import Image  # pylint: disable=import-outside-toplevel

    height, width = size, size + (index % 3) * (size // 4)
    hue = (label * 0.618034) % 1.0
    colour = 255 * np.array([abs(hue * 6 - 3) - 1, 2 - abs(hue * 6 - 2), 2 - abs(hue * 6 - 4)])
    colour = np.clip(colour, 40, 215)
    yy, xx = np.mgrid[0:height, 0:width]
    angle = np.pi * label / max(label + 1, 4)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * (2 * np.pi / 6))
    image = colour[None, None, :] * (0.75 + 0.25 * stripes[..., None])
    image += rng.normal(0, 12, image.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _write_tfds(version_dir: str, splits: dict, num_classes: int, shards: dict) -> None:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    os.makedirs(version_dir, exist_ok=True)
    split_infos = []
    for split, examples in splits.items():
        count = shards[split]
        lengths = []
        for shard in range(count):
            path = os.path.join(
                version_dir, f"{TFDS_NAME}-{split}.tfrecord-{shard:05d}-of-{count:05d}"
            )
            mine = examples[shard::count]
            lengths.append(len(mine))
            with tf.io.TFRecordWriter(path) as writer:
                for index, (label, data) in enumerate(mine):
                    writer.write(_example(data, label, f"{class_name(label)}_{index}.JPEG"))
        split_infos.append(
            {"name": split, "shardLengths": [str(n) for n in lengths], "numBytes": "0"}
        )
    info = {
        "name": TFDS_NAME,
        "version": TFDS_VERSION,
        "description": "Tiny synthetic stand-in written by vision.data.write_tiny_imagenet.",
        "features": {
            "featuresDict": {
                "features": {
                    "image": {
                        "pythonClassName": "tensorflow_datasets.core.features.image_feature.Image"
                    },
                    "label": {
                        "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                        "classLabel": {"numClasses": str(num_classes)},
                    },
                    "file_name": {
                        "pythonClassName": "tensorflow_datasets.core.features.text_feature.Text"
                    },
                }
            }
        },
        "splits": split_infos,
    }
    with open(os.path.join(version_dir, "dataset_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    with open(os.path.join(version_dir, "label.labels.txt"), "w") as f:
        f.write("".join(class_name(label) + "\n" for label in range(num_classes)))


def _example(image: bytes, label: int, file_name: str) -> bytes:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "file_name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[file_name.encode()])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()
