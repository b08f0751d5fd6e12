"""Training an SN-GAN: data, learner, run directory, the shared loop, samples, IS/FID.

    config = SNGANRunConfig(data="digits", replicas="cpu:2", steps=1000,
                            model=SNGANConfig(image_size=16, channels=1, global_batch_size=64))
    train(config, run_dir="runs/sngan")          # rerunning with the same run_dir resumes

A run directory (see `vision.common.run_dir`) holds config.json, metrics.csv (train/* every
`log_every` steps, eval/* at evaluations), tensorboard/ (the same scalars plus sample grids),
checkpoints/, and samples/step_<N>.png + samples.png: a grid of EMA-generator samples with one
row per class. Samples and metrics come from the EMA generator with standing batch-norm
statistics. Resuming restores networks, EMA generator, optimiser moments, spectral-norm and
batch-norm state and the step; the data stream and the latent noise are functions of the step,
so the resumed run continues exactly as the uninterrupted one would have.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import PIL.Image
import tensorflow as tf

import replication
from vision.common import loop
from vision.common import run_dir as run_dir_lib
from vision.common.cli import ConfigError
from vision.common.run_dir import RunDir, RunDirError
from vision.common.workers import WorkerRole
from vision.data import GAN, TRAIN, ImageDataset, open_dataset
from vision.metrics import gan as gan_metrics
from vision.sngan.learning import SNGANConfig, SNGANLearner

KIND = "sngan"
# Keys that may change when a run directory is resumed (length, hardware, reporting).
RESUMABLE_KEYS = (
    *run_dir_lib.RESUMABLE_KEYS,
    "total_steps",
    "classifier",
    "eval_samples",
    "grid_classes",
    "grid_columns",
)


@dataclasses.dataclass
class SNGANRunConfig:
    """A training run: the model (`model`) plus data, hardware, length and reporting."""

    data: str = "digits"  # "digits", an ImageNet directory (TFRecords or class folders)
    replicas: str = "cpu"  # replication spec of each worker
    workers: int = 1  # processes forming one multi-worker strategy (--workers)
    steps: int = 2000  # generator steps to train to
    classifier: str | None = None  # classifier directory for IS/FID (vision.metrics.gan)
    eval_every: int = 500  # steps between sample grids / IS / FID; 0: end only
    # Generated (and real) images per IS/FID evaluation: 50,000 and 10 IS splits as papers
    # report them (Salimans et al. 2016); the digits default is 1,000 (see the CLI).
    eval_samples: int = gan_metrics.PAPER_SAMPLES
    log_every: int = 50
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    grid_classes: int = 10  # rows of the sample grid (first classes)
    grid_columns: int = 8  # samples per class in the grid
    model: SNGANConfig = dataclasses.field(default_factory=SNGANConfig)

    def validate(self) -> None:
        for name in (
            "steps",
            "workers",
            "log_every",
            "checkpoint_every",
            "keep_checkpoints",
            "eval_samples",
            "grid_classes",
            "grid_columns",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)}).")
        if self.eval_samples < gan_metrics.IS_SPLITS:
            raise ConfigError(
                f"eval_samples must be at least {gan_metrics.IS_SPLITS}, the Inception Score's "
                f"splits (got {self.eval_samples})."
            )
        if self.eval_every < 0:
            raise ConfigError(f"eval_every must be >= 0 (got {self.eval_every}).")
        try:
            self.model.validate()
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def to_flat_dict(self) -> dict[str, Any]:
        """One flat JSON-able dict: run fields and model fields side by side."""
        flat = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"
        }
        flat.update(dataclasses.asdict(self.model))
        return flat

    @classmethod
    def from_flat_dict(cls, flat: dict[str, Any]) -> SNGANRunConfig:
        model_keys = {f.name for f in dataclasses.fields(SNGANConfig)}
        run_keys = {f.name for f in dataclasses.fields(cls)} - {"model"}
        return cls(
            **{k: v for k, v in flat.items() if k in run_keys},
            model=SNGANConfig(**{k: v for k, v in flat.items() if k in model_keys}),
        )


def sample_grid(
    learner: SNGANLearner, num_classes: int, columns: int, seed: int = 1234
) -> np.ndarray:
    """uint8 grid `[rows*(S+1)+1, columns*(S+1)+1, C]` of EMA samples; row r is class r."""
    labels = np.repeat(np.arange(num_classes), columns)
    images = learner.sample(labels, seed=seed).numpy()
    images = np.clip(np.round((images + 1.0) * 127.5), 0, 255).astype(np.uint8)
    s, c = images.shape[1], images.shape[3]
    grid = np.full((num_classes * (s + 1) + 1, columns * (s + 1) + 1, c), 255, np.uint8)
    for i, image in enumerate(images):
        r, col = divmod(i, columns)
        grid[1 + r * (s + 1) : 1 + r * (s + 1) + s, 1 + col * (s + 1) : 1 + col * (s + 1) + s] = (
            image
        )
    return grid


def write_png(grid: np.ndarray, path: str, min_tile: int = 64, tile: int = 0) -> None:
    """Writes a uint8 grid as PNG, enlarged (nearest) so small images stay visible."""
    scale = max(1, min_tile // max(tile, 1)) if tile else 1
    image = PIL.Image.fromarray(grid[..., 0] if grid.shape[-1] == 1 else grid)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), PIL.Image.NEAREST)
    temporary = f"{path}.tmp-{os.getpid()}.png"
    image.save(temporary)
    os.replace(temporary, path)


class _Evaluator:
    """IS / FID / class accuracy of EMA samples against real-image classifier statistics.

    Works in chunks, so 50,000 ImageNet-sized samples never sit in memory at once.
    """

    CHUNK = 500

    def __init__(
        self,
        classifier: gan_metrics.Classifier,
        dataset: ImageDataset,
        config: SNGANRunConfig,
    ):
        model = config.model
        self.classifier = classifier
        self.num_samples = config.eval_samples
        # Real images: the first eval_samples of the (shuffled) training stream.
        input_fn = dataset.input_fn(
            TRAIN, self.CHUNK, model.image_size, seed=model.seed, task=GAN, channels=model.channels
        )
        features = []
        for images, _ in input_fn(tf.distribute.InputContext()).take(
            -(-self.num_samples // self.CHUNK)
        ):
            features.append(classifier(images.numpy())[0])
        real = np.concatenate(features)[: self.num_samples]
        self.reference = gan_metrics.gaussian_statistics(real)

    def __call__(self, learner: SNGANLearner) -> dict[str, float]:
        labels = np.arange(self.num_samples) % learner.config.num_classes
        features, logits = [], []
        for i in range(0, len(labels), self.CHUNK):
            images = learner.sample(labels[i : i + self.CHUNK], seed=10_000 + i).numpy()
            f, lg = self.classifier(images)
            features.append(f)
            logits.append(lg)
        return gan_metrics.scores(
            np.concatenate(features), np.concatenate(logits), labels, self.reference
        )


def learner_input_fn(dataset: ImageDataset, model: SNGANConfig, start_step: int = 0):
    """`input_fn` of per-replica training batches {"image" in [-1, 1], "label"} for the learner.

    `start_step` counts global batches already read (generator steps x disc_steps).
    """
    base = dataset.input_fn(
        TRAIN,
        model.global_batch_size,
        model.image_size,
        seed=model.seed,
        start_step=start_step,
        task=GAN,
        channels=model.channels,
    )

    def input_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return base(ctx).map(lambda images, labels: {"image": images, "label": labels})

    return input_fn


def open_data(config: SNGANRunConfig) -> ImageDataset:
    """The training data (DataError if unusable, ConfigError for a channel mismatch)."""
    dataset = open_dataset(config.data)
    if config.data == "digits" and config.model.channels != 1:
        raise ConfigError(f"the digits are grey: use --channels 1 (got {config.model.channels}).")
    return dataset


def train(
    config: SNGANRunConfig,
    run_dir: str,
    repl: replication.Replicator | None = None,
    print_fn: Callable[[str], None] = print,
    stop_at: int | None = None,
    worker: WorkerRole | None = None,
) -> dict[str, float]:
    """Trains (or resumes) an SN-GAN as `config` says; returns the last metrics.

    Everything that can be wrong with the request is checked before the run directory is
    touched. `stop_at` (or a first SIGTERM/SIGINT) ends this invocation at a checkpoint;
    `worker` is this process's role in a multi-worker run (only the chief writes).

    Raises:
        ConfigError, DataError, RunDirError, BatchSplitError, ClassifierExportError (all
            ValueError): messages say what to do.
        FloatingPointError: the losses diverged.
    """
    config.validate()
    chief = worker is None or worker.chief
    if not chief:
        print_fn = _quiet
    repl = repl or replication.make(config.replicas)  # before any other TF op (logical CPUs)
    per_replica_batch = repl.per_replica_batch_size(config.model.global_batch_size)
    dataset = open_data(config)
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(
            config.model, num_classes=dataset.num_classes, total_steps=config.steps
        ),
    )
    classifier = gan_metrics.Classifier(config.classifier) if config.classifier else None

    run = RunDir(run_dir, config.to_flat_dict(), kind=KIND, mutable=RESUMABLE_KEYS, chief=chief)
    config = SNGANRunConfig.from_flat_dict(run.config)
    model = config.model
    with run:
        tf.random.set_seed(model.seed)  # initial weights and spectral-norm vectors
        learner = SNGANLearner(model, repl)
        start = run.attach(tf.train.Checkpoint(learner=learner), config.keep_checkpoints)
        if int(learner.step.numpy()) != start:
            raise RunDirError(
                f"checkpoint of step {start} holds step counter {int(learner.step.numpy())}; "
                "the run directory is inconsistent: use a new --run-dir."
            )
        run.record_invocation(start)
        evaluator = _Evaluator(classifier, dataset, config) if classifier and chief else None
        if start < config.steps:
            print_fn(
                f"Training SN-GAN on {config.data}: {config.steps} steps, global batch "
                f"{model.global_batch_size} ({per_replica_batch} per replica x "
                f"{repl.num_replicas} [{config.replicas}]), {model.disc_steps} D step(s) per "
                f"G step, {model.image_size}x{model.image_size}x{model.channels}, "
                f"{model.num_classes} classes."
            )
        # Every D step reads one global batch: the stream position is a function of the step.
        input_fn = learner_input_fn(dataset, model, start_step=start * model.disc_steps)
        iterator = iter(repl.distribute(input_fn))

        def train_step():
            return learner.train_step(iterator)

        def evaluate(step: int) -> dict[str, float]:
            with learner.standing_statistics():  # every worker: a replicated step
                return _report(config, learner, run, step, evaluator, print_fn) if chief else {}

        result = loop.train_loop(
            cadence=loop.Cadence(
                config.steps, config.log_every, config.checkpoint_every, config.eval_every
            ),
            start=start,
            train_step=train_step,
            evaluate=evaluate,
            run=run,
            items_per_step=model.global_batch_size * model.disc_steps,
            print_fn=print_fn,
            stop_at=stop_at,
            baseline=evaluator is not None,
            diverged_hint="lower the learning rates or check the data",
            stream=None if chief else open(os.devnull, "w"),
        )
        return {"step": result.step, **result.results}


def _quiet(_: str) -> None:
    """The print_fn of non-chief workers: the chief speaks for the run."""


def _report(config, learner, run, step, evaluator, print_fn) -> dict[str, float]:
    """Sample grid (PNG + TensorBoard) and, with a classifier, IS/FID/class accuracy."""
    rows = min(config.grid_classes, config.model.num_classes)
    grid = sample_grid(learner, rows, config.grid_columns)
    os.makedirs(os.path.join(run.path, "samples"), exist_ok=True)
    path = os.path.join(run.path, "samples", f"step_{step:07d}.png")
    write_png(grid, path, tile=config.model.image_size)
    shutil.copyfile(path, os.path.join(run.path, "samples.png"))
    with run.summary_writer.as_default():
        tf.summary.image("samples", grid[None], step=step)
    if evaluator is None:
        return {}
    results = evaluator(learner)
    print_fn(f"step {step}: " + "  ".join(f"{k} {v:.4g}" for k, v in results.items()))
    return results
