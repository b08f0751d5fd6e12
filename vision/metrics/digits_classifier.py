"""A small CNN trained on the digits data, saved as the classifier the GAN metrics load.

It plays the role Inception-v3 plays for ImageNet GANs: its penultimate layer gives the FID
features and its logits the Inception Score and the class accuracy of conditional samples.

    python -m vision.metrics.digits_classifier --out runs/digits_classifier --image-size 16
"""

import argparse
import dataclasses
import sys
from collections.abc import Sequence

import numpy as np
import sonnet as snt
import tensorflow as tf

from vision.data import EVAL, GAN, TRAIN, Digits
from vision.metrics import gan as gan_metrics


@dataclasses.dataclass
class ClassifierConfig:
    image_size: int = 16
    steps: int = 400
    batch_size: int = 64
    learning_rate: float = 1e-3
    max_shift: int = 1  # random translation (pixels) for robustness to generated samples
    seed: int = 0


class DigitsClassifier(snt.Module):
    """conv16-pool-conv32-pool-conv64-linear128 (features)-linear(num_classes) (logits)."""

    def __init__(
        self, num_classes: int = 10, feature_dim: int = 128, name: str | None = "digits_classifier"
    ):
        super().__init__(name=name)
        self.convs = [
            snt.Conv2D(16, 3, name="conv1"),
            snt.Conv2D(32, 3, name="conv2"),
            snt.Conv2D(64, 3, name="conv3"),
        ]
        self.features_linear = snt.Linear(feature_dim, name="features")
        self.logits_linear = snt.Linear(num_classes, name="logits")

    def __call__(self, images: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """`images` `[N, S, S, 1]` in [-1, 1] -> (features `[N, 128]`, logits `[N, classes]`)."""
        h = tf.nn.max_pool2d(tf.nn.relu(self.convs[0](images)), 2, 2, "VALID")
        h = tf.nn.max_pool2d(tf.nn.relu(self.convs[1](h)), 2, 2, "VALID")
        h = tf.nn.relu(self.convs[2](h))
        features = tf.nn.relu(self.features_linear(snt.Flatten()(h)))
        return features, self.logits_linear(features)


def _random_shift(images: tf.Tensor, max_shift: int, seed: tf.Tensor) -> tf.Tensor:
    if max_shift == 0:
        return images
    size = images.shape[1]
    padded = tf.pad(
        images, [[0, 0], [max_shift] * 2, [max_shift] * 2, [0, 0]], constant_values=-1.0
    )
    offsets = tf.random.stateless_uniform([2], seed, maxval=2 * max_shift + 1, dtype=tf.int32)
    return tf.slice(padded, [0, offsets[0], offsets[1], 0], [-1, size, size, -1])


def accuracy(model: DigitsClassifier, images: np.ndarray, labels: np.ndarray) -> float:
    _, logits = model(tf.constant(images))
    return float(np.mean(np.argmax(logits.numpy(), 1) == labels))


def train(config: ClassifierConfig) -> tuple[DigitsClassifier, float]:
    """Trains on the digits train split; returns the model and its eval-split accuracy."""
    digits = Digits()
    train_x, train_y = digits.arrays(TRAIN, config.image_size, task=GAN, channels=1)
    test_x, test_y = digits.arrays(EVAL, config.image_size, task=GAN, channels=1)
    tf.random.set_seed(config.seed)
    model = DigitsClassifier()
    optimizer = snt.optimizers.Adam(config.learning_rate)
    data = iter(
        tf.data.Dataset.from_tensor_slices((train_x, train_y))
        .shuffle(len(train_x), seed=config.seed)
        .repeat()
        .batch(config.batch_size, drop_remainder=True)
        .enumerate()
    )

    @tf.function
    def step(i, batch):
        images, labels = batch
        images = _random_shift(images, config.max_shift, tf.stack([config.seed, i]))
        with tf.GradientTape() as tape:
            _, logits = model(images)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    for _ in range(config.steps):
        step(*next(data))
    return model, accuracy(model, test_x, test_y)


def save(model: DigitsClassifier, path: str, image_size: int) -> None:
    """Writes `model` as a classifier directory for `vision.metrics.gan.Classifier`."""
    gan_metrics.save_classifier(path, model, image_size=image_size, channels=1, module=model)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the classifier to")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=ClassifierConfig.steps)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    config = ClassifierConfig(image_size=args.image_size, steps=args.steps, seed=args.seed)
    model, test_accuracy = train(config)
    save(model, args.out, config.image_size)
    print(f"digits classifier: test accuracy {test_accuracy:.4f}; saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
