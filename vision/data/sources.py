"""`open_dataset(spec)`: from a command-line data argument to an `ImageDataset`."""

from __future__ import annotations

import os

from vision.data.digits import Digits
from vision.data.imagenet import _SHARD_PATTERN, FolderImageNet, TFRecordImageNet
from vision.data.pipeline import DataError, ImageDataset


def open_dataset(spec: str, num_classes: int | None = None) -> ImageDataset:
    """Opens "digits" or an ImageNet directory in either on-disk form.

    The form is detected: any tfds `*.tfrecord-*` shard under `spec` means
    TFRecords, a `train/` folder (or any sub-folder) means one folder per class.

    Args:
      spec: "digits", or a directory.
      num_classes: for TFRecords without label metadata.

    Raises:
      DataError: the directory is missing, empty or in neither form.
    """
    if spec == "digits":
        return Digits()
    if not os.path.isdir(spec):
        raise DataError(
            f"Data directory {spec} does not exist. Pass --data digits, or the "
            "directory of an ImageNet copy (tfds TFRecords or one folder per class)."
        )
    if _has_shards(spec):
        return TFRecordImageNet(spec, num_classes=num_classes)
    if os.path.isdir(os.path.join(spec, "train")) or _has_class_folders(spec):
        return FolderImageNet(spec)
    return TFRecordImageNet(spec, num_classes=num_classes)  # explains both layouts


def _has_class_folders(directory: str) -> bool:
    return any(entry.is_dir() for entry in os.scandir(directory))


def _has_shards(directory: str) -> bool:
    for _, _, files in os.walk(directory):
        if any(_SHARD_PATTERN.match(name) for name in files):
            return True
    return False
