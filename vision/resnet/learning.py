"""Image classification with a ResNet on the replication layer: config, schedule, the replica step.

The researcher-facing part is `Classifier._replica_train_step`: the forward,
loss and update of ONE replica on its share of the batch. `replication` runs it
on every replica; the only cross-replica operations are the batch-norm moments
(inside the model) and the gradient mean (inside the wrapped optimizer), so the
same code trains on `cpu`, `cpu:8`, `gpu` or `multiworker`.

The maths, per step t with global batch size N, T steps (by default 90 epochs)
and w warmup steps (by default 5 epochs, at most a tenth of the run):

    peak_lr = base_learning_rate * N / 256                      (linear scaling, Goyal et al.)
    lr(t)   = peak_lr * (t + 1) / warmup_steps                  for t < warmup_steps
            = peak_lr * 0.5 * (1 + cos(pi * (t - w) / (T - w)))  ("cosine", w = warmup, T = steps)
            = peak_lr * decay ** #{boundaries b : t >= b * T}    ("step")
    q       = (1 - eps) * onehot(label) + eps / K                (label smoothing, K classes)
    loss    = mean_batch(-sum_k q_k log softmax(logits)_k) + wd * sum_w ||w||^2 / 2
                                                               (w: conv and linear weights only;
                                                                the L2 gradient wd * w is added
                                                                to the gradient directly)
    v <- momentum * v + grad;  theta <- theta - lr(t) * v       (SGD with momentum)
"""

from __future__ import annotations

import dataclasses
import math

import sonnet as snt
import tensorflow as tf

import replication
from vision.common import precision as precision_lib
from vision.common.cli import ConfigError
from vision.common.momentum import Momentum
from vision.data import EVAL, ImageDataset
from vision.metrics.classification import top_k_counts
from vision.resnet import networks as resnet

SCHEDULES = ("cosine", "step")


@dataclasses.dataclass
class ClassificationConfig:
    """Everything that defines a classification run (saved as the run's config).

    Defaults are ResNet-50 v1.5 on ImageNet at a batch size of 256, trained for
    90 epochs with a 5-epoch linear warmup (Goyal et al. 2017, "Accurate, Large
    Minibatch SGD"): `steps` and `warmup_steps` are derived from the size of the
    training split unless given (`resolve`).
    """

    data: str = "digits"  # "digits" or an ImageNet directory
    num_classes: int | None = None  # None: from the data
    image_size: int | None = None  # None: the data's usual size (224, digits 16)
    blocks_per_group: tuple[int, ...] = (3, 4, 6, 3)
    channels_per_group: tuple[int, ...] = (256, 512, 1024, 2048)
    stem: str = "auto"  # "imagenet", "small", or by image size
    stem_channels: int = 64
    zero_init_last_bn: bool = True
    bn_decay: float = 0.9
    stride_in_1x1: bool = False  # True: ResNet v1 (as Keras) instead of v1.5
    batch_size: int = 256  # global, over all replicas
    steps: int | None = None  # None: `epochs` of the training split
    epochs: float = 90.0
    base_learning_rate: float = 0.1  # for a batch of 256; scaled linearly
    warmup_steps: int | None = None  # None: warmup_epochs, at most a tenth of the steps
    warmup_epochs: float = 5.0
    schedule: str = "cosine"  # "cosine" or "step"
    step_boundaries: tuple[float, ...] = (30 / 90, 60 / 90, 80 / 90)  # fractions of steps
    step_decay: float = 0.1
    momentum: float = 0.9
    label_smoothing: float = 0.1
    weight_decay: float = 1e-4
    precision: str = "float32"  # or "bfloat16"
    replicas: str = "cpu"  # replication spec
    seed: int = 0
    log_every: int = 10
    eval_every: int = 0  # steps; 0: only at the end
    evaluate: bool = True  # False: never evaluate (e.g. data without an eval split)
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    workers: int = 1  # processes forming one multi-worker strategy (--workers)

    def __post_init__(self):
        self.blocks_per_group = tuple(self.blocks_per_group)
        self.channels_per_group = tuple(self.channels_per_group)
        self.step_boundaries = tuple(self.step_boundaries)

    def validate(self) -> None:
        """Raises ConfigError naming the first bad field and what to use."""
        try:
            self._validate()
        except ConfigError:
            raise
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def _validate(self) -> None:
        precision_lib.compute_dtype(self.precision)
        if len(self.blocks_per_group) != len(self.channels_per_group) or not self.blocks_per_group:
            raise ValueError(
                "blocks_per_group and channels_per_group need one entry per group "
                f"(got {self.blocks_per_group} and {self.channels_per_group})."
            )
        if min(self.blocks_per_group + self.channels_per_group) < 1:
            raise ValueError("blocks and channels per group must be positive.")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"Unknown schedule {self.schedule!r}; use one of {SCHEDULES}.")
        if self.stem not in ("auto", "imagenet", "small"):
            raise ValueError(f"Unknown stem {self.stem!r}; use auto, imagenet or small.")
        if self.steps is None and self.epochs <= 0:
            raise ValueError(f"epochs must be positive (got {self.epochs}).")
        positive = {
            "batch_size": self.batch_size,
            "steps": 1 if self.steps is None else self.steps,
            "workers": self.workers,
            "log_every": self.log_every,
            "checkpoint_every": self.checkpoint_every,
            "keep_checkpoints": self.keep_checkpoints,
            "stem_channels": self.stem_channels,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1 (got {value}).")
        if self.eval_every < 0 or (self.warmup_steps or 0) < 0:
            raise ValueError("eval_every and warmup_steps must be >= 0.")
        if self.image_size is not None and self.image_size < 1:
            raise ValueError(f"image_size must be positive (got {self.image_size}).")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError("label_smoothing must be in [0, 1).")

    @property
    def peak_learning_rate(self) -> float:
        return self.base_learning_rate * self.batch_size / 256

    @property
    def resolved_warmup_steps(self) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return round(0.05 * (self.steps or 0))

    def resolve(self, train_examples: int | None) -> ClassificationConfig:
        """This config with `steps` and `warmup_steps` set from the epochs they stand for.

        Raises:
          ConfigError: `steps` is not given and the size of the training split is unknown.
        """
        steps, warmup = self.steps, self.warmup_steps
        if not train_examples:
            if steps is None:
                raise ConfigError(
                    "The size of the training split is unknown (TFRecords without "
                    "dataset_info.json), so --epochs cannot be turned into steps: pass --steps."
                )
            warmup = round(steps / 20) if warmup is None else warmup
        if steps is None or warmup is None:
            steps_per_epoch = train_examples / self.batch_size
            if steps is None:
                steps = max(1, math.ceil(self.epochs * steps_per_epoch))
            if warmup is None:
                warmup = min(round(self.warmup_epochs * steps_per_epoch), round(steps / 10))
        return dataclasses.replace(self, steps=steps, warmup_steps=warmup)


def learning_rate(step: tf.Tensor, config: ClassificationConfig) -> tf.Tensor:
    """The learning rate at `step` (0-based): linear warmup, then cosine or step decay.

    A config whose length is not resolved yet (`steps` None) does not decay.
    """
    step = tf.cast(step, tf.float32)
    peak = config.peak_learning_rate
    warmup = float(config.resolved_warmup_steps)
    if config.steps is None:
        decayed = tf.constant(peak)
    elif config.schedule == "cosine":
        total = float(config.steps)
        progress = tf.clip_by_value((step - warmup) / max(total - warmup, 1.0), 0.0, 1.0)
        decayed = peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
    else:
        total = float(config.steps)
        passed = tf.add_n(
            [tf.cast(step >= b * total, tf.float32) for b in config.step_boundaries]
            or [tf.constant(0.0)]
        )
        decayed = peak * tf.pow(config.step_decay, passed)
    if warmup > 0:
        return tf.where(step < warmup, peak * (step + 1.0) / warmup, decayed)
    return decayed


def build_model(config: ClassificationConfig, num_classes: int, image_size: int) -> resnet.ResNet:
    """The ResNet the config describes ("auto" stem: imagenet from 128x128 up)."""
    stem = config.stem
    if stem == "auto":
        stem = "imagenet" if image_size >= 128 else "small"
    return resnet.ResNet(
        config.blocks_per_group,
        config.channels_per_group,
        num_classes,
        stem=stem,
        stem_channels=config.stem_channels,
        zero_init_last_bn=config.zero_init_last_bn,
        bn_decay=config.bn_decay,
        precision=config.precision,
        stride_in_1x1=config.stride_in_1x1,
        name="resnet",
    )


class Classifier(snt.Module):
    """A ResNet, its optimizer and its step counter, trained on a Replicator.

    Everything a checkpoint must hold lives here: model variables (with batch
    norm statistics), momentum slots, the step counter. Build it inside
    `repl.scope()`-free code: the constructor enters the scope itself.

    Example::

        repl = replication.make("cpu:2")
        classifier = Classifier(config, repl, num_classes=10, image_size=16)
        data = iter(repl.distribute(dataset.input_fn("train", config.batch_size, 16)))
        metrics = classifier.train_step(data)       # {"loss", "accuracy", "learning_rate"}
    """

    def __init__(
        self,
        config: ClassificationConfig,
        repl: replication.Replicator,
        num_classes: int,
        image_size: int,
        name: str | None = "classifier",
    ):
        super().__init__(name=name)
        self.config = config
        self.repl = repl
        self.num_classes = num_classes
        self.image_size = image_size
        with repl.scope():
            self.model = build_model(config, num_classes, image_size)
            self.model.check_image_size(image_size)
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.learning_rate = tf.Variable(0.0, trainable=False, name="learning_rate")
            self.optimizer = repl.wrap_optimizer(
                Momentum(self.learning_rate, config.momentum)  # snt's, fused on 1 replica
            )
            # Create every variable now, eagerly and in scope (batch norm with
            # moving statistics needs no collective outside a step).
            self.model(tf.zeros([1, image_size, image_size, 3]), is_training=False)
            # Momentum slots too: a checkpoint restored into a fresh Classifier must
            # find them (TF does not defer restoring Sonnet's lazily built slot lists).
            # TODO(vision): use a public ReplicatedOptimizer hook once replication has one.
            create = getattr(self.optimizer, "create_state", None) or self.optimizer._create_state  # pylint: disable=protected-access
            create(self.model.trainable_variables)
        self._decayed = {v.ref() for v in resnet.weight_decay_variables(self.model)}
        precision_lib.check_float32(self.model.variables, "Model variables")
        self._train_fn = tf.function(self._train_step)
        self._eval_fn = tf.function(self._eval_step)

    # ------------------------------------------------------------ replica code
    def _loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        targets = tf.one_hot(labels, self.num_classes)
        smoothing = self.config.label_smoothing
        targets = targets * (1.0 - smoothing) + smoothing / self.num_classes
        return tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(targets, logits))

    def _replica_train_step(self, images: tf.Tensor, labels: tf.Tensor) -> dict[str, tf.Tensor]:
        """One replica's update on its share of the global batch."""
        lr = self.learning_rate.assign(learning_rate(self.step, self.config))
        parameters = self.model.trainable_variables
        with tf.GradientTape() as tape:
            logits = self.model(images, is_training=True)
            loss = self._loss(logits, labels)
        gradients = tape.gradient(loss, parameters)
        precision_lib.check_float32(gradients, "Gradients")
        # L2 weight decay: the gradient of wd * ||w||^2 / 2 is wd * w, added
        # directly (one pass over the weights instead of a loss term and its
        # backward pass; identical for SGD).
        decay = self.config.weight_decay
        with tf.name_scope("weight_decay"):  # named for profiles
            gradients = [
                g + decay * w if w.ref() in self._decayed else g
                for g, w in zip(gradients, parameters)
            ]
        self.optimizer.apply(gradients, parameters)  # mean-all-reduced across replicas here
        self.step.assign_add(1)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        return {"loss": loss, "accuracy": tf.reduce_mean(correct), "learning_rate": lr}

    def _replica_eval_step(
        self, images: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor
    ) -> dict[str, tf.Tensor]:
        return top_k_counts(self.model(images, is_training=False), labels, mask, k=5)

    # ---------------------------------------------------- cross-replica code
    def _train_step(self, iterator) -> dict[str, tf.Tensor]:
        images, labels = next(iterator)
        return self.repl.reduce(self.repl.run(self._replica_train_step, images, labels), "mean")

    def _eval_step(self, batch) -> dict[str, tf.Tensor]:
        return self.repl.reduce(self.repl.run(self._replica_eval_step, *batch), "sum")

    def train_step(self, iterator) -> dict[str, tf.Tensor]:
        """Runs one synchronous training step on the next global batch; returns mean metrics."""
        return self._train_fn(iterator)

    def evaluate(self, dataset: ImageDataset) -> dict[str, float]:
        """Top-1/top-5 accuracy over the whole eval split, every example counted once.

        Counts are exact integers summed across replicas; the pass ends at the
        first step in which all replicas see only padding.
        """
        input_fn = dataset.input_fn(
            EVAL, self.config.batch_size, self.image_size, seed=self.config.seed
        )
        totals = {"top1": 0, "top5": 0, "count": 0}
        for batch in self.repl.distribute(input_fn):
            counts = {k: int(v) for k, v in self._eval_fn(batch).items()}
            if counts["count"] == 0:
                break
            for key in totals:
                totals[key] += counts[key]
        n = max(totals["count"], 1)
        return {"top1": totals["top1"] / n, "top5": totals["top5"] / n, "count": totals["count"]}

    def checkpoint(self) -> tf.train.Checkpoint:
        """What a checkpoint holds: model (incl. batch-norm statistics), optimizer, step."""
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step)
