"""Image data for both models: ImageNet on disk (tfds TFRecords or class folders), digits.

dataset = vision.data.open_dataset("/data/imagenet")        # or "digits"
train = repl.distribute(dataset.input_fn("train", global_batch_size=256, image_size=224))
gan = repl.distribute(dataset.input_fn("train", 256, 128, task="gan", channels=3))
"""

from vision.data.digits import Digits, load_digits_arrays
from vision.data.imagenet import FolderImageNet, TFRecordImageNet
from vision.data.pipeline import (
    CLASSIFICATION,
    EVAL,
    GAN,
    SPLITS,
    TASKS,
    TRAIN,
    DataError,
    ImageDataset,
    Shard,
)
from vision.data.preprocessing import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    eval_image,
    gan_image,
    normalize,
    train_image,
)
from vision.data.sources import open_dataset
from vision.data.tiny import write_tiny_imagenet

__all__ = [
    "CLASSIFICATION",
    "EVAL",
    "GAN",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "SPLITS",
    "TASKS",
    "TRAIN",
    "DataError",
    "Digits",
    "FolderImageNet",
    "ImageDataset",
    "Shard",
    "TFRecordImageNet",
    "eval_image",
    "gan_image",
    "load_digits_arrays",
    "normalize",
    "open_dataset",
    "train_image",
    "write_tiny_imagenet",
]
