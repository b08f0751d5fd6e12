"""Image classification with a ResNet on the replication layer: the per-replica step and its loop.

The researcher-facing part is `Classifier._replica_train_step`: the forward,
loss and update of ONE replica on its share of the batch. `replication` runs it
on every replica; the only cross-replica operations are the batch-norm moments
(inside the model) and the gradient mean (inside the wrapped optimizer), so the
same code trains on `cpu`, `cpu:8`, `gpu` or `multiworker`.

The maths, per step t with global batch size N:

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

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np
import sonnet as snt
import tensorflow as tf

import replication
from vision import precision as precision_lib
from vision import resnet, training_common
from vision.data import EVAL, TRAIN, ImageDataset, open_dataset

SCHEDULES = ("cosine", "step")


class ConfigError(ValueError):
    """A config value that cannot work; the message names it and what to use."""


@dataclasses.dataclass
class ClassificationConfig:
    """Everything that defines a classification run (saved as the run's config).

    Defaults are ResNet-50 v1.5 on ImageNet at a batch size of 256.
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
    steps: int = 1000
    base_learning_rate: float = 0.1  # for a batch of 256; scaled linearly
    warmup_steps: int | None = None  # None: 5% of steps
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
    checkpoint_every: int = 500
    keep_checkpoints: int = 3

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
        positive = {
            "batch_size": self.batch_size,
            "steps": self.steps,
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
        return round(0.05 * self.steps)


def learning_rate(step: tf.Tensor, config: ClassificationConfig) -> tf.Tensor:
    """The learning rate at `step` (0-based): linear warmup, then cosine or step decay."""
    step = tf.cast(step, tf.float32)
    peak = config.peak_learning_rate
    warmup = float(config.resolved_warmup_steps)
    total = float(config.steps)
    if config.schedule == "cosine":
        progress = tf.clip_by_value((step - warmup) / max(total - warmup, 1.0), 0.0, 1.0)
        decayed = peak * 0.5 * (1.0 + tf.cos(math.pi * progress))
    else:
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
                snt.optimizers.Momentum(self.learning_rate, config.momentum)
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
        gradients = [
            g + decay * w if w.ref() in self._decayed else g for g, w in zip(gradients, parameters)
        ]
        self.optimizer.apply(gradients, parameters)  # mean-all-reduced across replicas here
        self.step.assign_add(1)
        correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
        return {"loss": loss, "accuracy": tf.reduce_mean(correct), "learning_rate": lr}

    def _replica_eval_step(
        self, images: tf.Tensor, labels: tf.Tensor, mask: tf.Tensor
    ) -> dict[str, tf.Tensor]:
        logits = self.model(images, is_training=False)
        valid = mask > 0
        top1 = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels)
        top5 = tf.math.in_top_k(labels, logits, min(5, self.num_classes))

        def count(hits):
            return tf.reduce_sum(tf.cast(tf.logical_and(hits, valid), tf.int32))

        return {"top1": count(top1), "top5": count(top5), "count": count(tf.ones_like(valid))}

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


# ------------------------------------------------------------------- the loop
# Keys that may change when a run directory is resumed: how long to train,
# on which hardware, and how often to report. Everything else must match.
RESUMABLE_KEYS = (
    "steps",
    "replicas",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "keep_checkpoints",
)


def train(
    config: ClassificationConfig,
    run_dir: str | None = None,
    repl: replication.Replicator | None = None,
    print_fn: Callable[[str], None] = print,
    stop_at: int | None = None,
) -> dict[str, float]:
    """Trains (or resumes) a classifier as `config` says; returns the final metrics.

    With `run_dir`, writes config, metrics, summaries and checkpoints there and
    resumes from its latest checkpoint: model, batch-norm statistics, momentum,
    step counter and data position (the input stream restarts at the example
    the interrupted run would have read next) all continue exactly. Note that a
    resumed run whose `steps` changed follows a different cosine schedule.

    `stop_at` (or a first SIGTERM/SIGINT) ends this invocation early, at a
    checkpoint, as if preempted; the schedule still spans `config.steps`.

    Raises:
      ConfigError, DataError, RunDirError, BatchSplitError (all ValueError): bad
        config, data, run directory or batch size; messages say what to do.
    """
    config.validate()
    saved = training_common.saved_config(run_dir) if run_dir else None
    if saved is not None:  # resuming: unspecified (None) fields take the saved values
        config = dataclasses.replace(
            config,
            **{
                k: saved[k]
                for k, v in dataclasses.asdict(config).items()
                if v is None and saved.get(k) is not None
            },
        )
    repl = repl or replication.make(config.replicas)
    dataset = open_dataset(config.data, num_classes=config.num_classes)
    if saved is None:
        # A new run saves the values None stood for, so resuming it with another
        # --steps keeps its warmup length and image size.
        config = dataclasses.replace(
            config,
            image_size=config.image_size or dataset.default_image_size,
            warmup_steps=config.resolved_warmup_steps,
        )
    image_size = config.image_size or dataset.default_image_size
    # Refuse impossible settings before anything is written to the run directory.
    repl.per_replica_batch_size(config.batch_size)
    try:
        build_model(config, dataset.num_classes, image_size).check_image_size(image_size)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    run = None
    if run_dir is not None:
        fields = dataclasses.asdict(config)
        run = training_common.RunDir(run_dir, fields, kind="resnet50", mutable=RESUMABLE_KEYS)
        config = ClassificationConfig(**{k: v for k, v in run.config.items() if k in fields})
    with contextlib.ExitStack() as stack:
        if run:
            stack.enter_context(run)  # lock: one process per run directory
        tf.random.set_seed(config.seed)  # same initial parameters for the same seed
        classifier = Classifier(config, repl, dataset.num_classes, image_size)
        manager = start = None
        if run:
            manager = run.checkpoint_manager(classifier.checkpoint(), config.keep_checkpoints)
            start = run.restore(manager)
            run.record_invocation(start)
        return _loop(
            config,
            classifier,
            dataset,
            image_size,
            repl,
            run,
            manager,
            start or 0,
            print_fn,
            stop_at,
        )


def _loop(config, classifier, dataset, image_size, repl, run, manager, start, print_fn, stop_at):
    if start >= config.steps:
        print_fn(
            f"Already trained {start} of {config.steps} steps; pass a larger --steps to "
            "train further."
        )
        results = classifier.evaluate(dataset)
        print_fn(_eval_line(start, results))
        return {"step": start, **results}
    if start:
        print_fn(f"Resuming from step {start} ({run.path}).")
    print_fn(
        f"Training {dataset.name}: {config.steps} steps of {config.batch_size} images "
        f"({image_size}x{image_size}) on {repl.num_replicas} replica(s) "
        f"[{config.replicas}], {config.precision}."
    )
    if (
        config.precision == "bfloat16"
        and config.replicas.startswith("cpu")
        and precision_lib.cpu_has_native_bfloat16() is False
    ):
        print_fn(
            "Warning: this CPU has no bfloat16 instructions (avx512_bf16/amx_bf16), so "
            "TensorFlow emulates bfloat16 and training is slower than in float32. "
            "bfloat16 pays off on TPUs, recent GPUs and CPUs with AMX or AVX512-BF16."
        )
    iterator = iter(
        repl.distribute(
            dataset.input_fn(
                TRAIN, config.batch_size, image_size, seed=config.seed, start_step=start
            )
        )
    )
    progress = training_common.Progress(config.steps, start, config.batch_size, "images")
    end = min(config.steps, stop_at) if stop_at else config.steps
    metrics: dict[str, float] = {}
    results: dict[str, float] = {}
    step = start
    with training_common.GracefulStop() as stop:
        while step < end and not stop.requested:
            values = classifier.train_step(iterator)
            step += 1
            if step == start + 1:  # the first call traces and compiles: not throughput
                values = {k: float(v) for k, v in values.items()}
                progress.reset_clock(step)
            if step % config.log_every == 0 or step == end or stop.requested:
                metrics = {k: float(v) for k, v in values.items()}
                if not np.isfinite(metrics["loss"]):
                    raise FloatingPointError(
                        f"Loss became {metrics['loss']} at step {step}; lower "
                        "--base-learning-rate or check the data."
                    )
                rate = progress.throughput(step)
                progress.line(step, metrics, rate)
                if run:
                    run.log(step, {**metrics, "images_per_second": rate}, prefix="train")
            if run and (step % config.checkpoint_every == 0 or step == end or stop.requested):
                manager.save(checkpoint_number=step)
            if (config.eval_every and step % config.eval_every == 0) or step == config.steps:
                results = classifier.evaluate(dataset)
                print_fn(_eval_line(step, results))
                if run:
                    run.log(step, results, prefix="eval")
                progress.reset_clock(step)
    if step < config.steps:
        where = f"rerun with --run-dir {run.path}" if run else "use a run directory"
        print_fn(f"Stopped at step {step} of {config.steps}; {where} to continue.")
    return {"step": step, **metrics, **results}


def _eval_line(step: int, results: Mapping[str, float]) -> str:
    return (
        f"eval at step {step}: top-1 {100 * results['top1']:.2f}%  top-5 "
        f"{100 * results['top5']:.2f}%  ({results['count']} images)"
    )
