"""The SN-GAN training loop: data, learner, run directory, metrics, samples, checkpoints.

    config = SNGANRunConfig(data="digits", replicas="cpu:2", steps=1000,
                            model=SNGANConfig(image_size=16, channels=1, global_batch_size=64))
    train(config, run_dir="runs/sngan")          # rerunning with the same run_dir resumes

A run directory (see `vision.training_common`) holds config.json, metrics.csv (train/* every
`log_every` steps, eval/* at evaluations), tensorboard/ (the same scalars plus sample grids),
checkpoints/, and samples/step_<N>.png + samples.png: a grid of EMA-generator samples with one
row per class. Resuming restores networks, EMA generator, optimiser moments, spectral-norm and
batch-norm state and the step; the data stream and the latent noise are functions of the step,
so the resumed run continues exactly as the uninterrupted one would have.
"""

import dataclasses
import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import PIL.Image
import tensorflow as tf

import replication
from vision import gan_data, gan_metrics, sngan_learner, training_common
from vision.sngan_learner import SNGANConfig

KIND = "sngan"
# Keys that may change when a run directory is resumed (length, hardware, reporting).
RESUMABLE_KEYS = (
    "steps",
    "replicas",
    "classifier",
    "eval_every",
    "eval_samples",
    "log_every",
    "checkpoint_every",
    "keep_checkpoints",
    "grid_classes",
    "grid_columns",
)


class ConfigError(ValueError):
    """A config value that cannot work; the message names it and what to use."""


@dataclasses.dataclass
class SNGANRunConfig:
    """A training run: the model (`model`) plus data, hardware, length and reporting."""

    data: str = "digits"  # "digits" or a folder of class sub-folders
    replicas: str = "cpu"  # replication spec
    steps: int = 2000  # generator steps to train to
    classifier: str | None = None  # classifier directory for IS/FID (gan_metrics)
    eval_every: int = 500  # steps between sample grids / IS / FID; 0: end only
    eval_samples: int = 1000  # generated (and real) images per IS/FID evaluation
    log_every: int = 50
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    grid_classes: int = 10  # rows of the sample grid (first classes)
    grid_columns: int = 8  # samples per class in the grid
    model: SNGANConfig = dataclasses.field(default_factory=SNGANConfig)

    def validate(self) -> None:
        for name in (
            "steps",
            "log_every",
            "checkpoint_every",
            "keep_checkpoints",
            "eval_samples",
            "grid_classes",
            "grid_columns",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1 (got {getattr(self, name)}).")
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
    def from_flat_dict(cls, flat: dict[str, Any]) -> "SNGANRunConfig":
        model_keys = {f.name for f in dataclasses.fields(SNGANConfig)}
        run_keys = {f.name for f in dataclasses.fields(cls)} - {"model"}
        return cls(
            **{k: v for k, v in flat.items() if k in run_keys},
            model=SNGANConfig(**{k: v for k, v in flat.items() if k in model_keys}),
        )


def open_source(config: SNGANRunConfig) -> gan_data.LabelledImages:
    """The training images at the model's size and channel count (DataError if unusable)."""
    size, channels = config.model.image_size, config.model.channels
    if config.data == "digits":
        source = gan_data.load_digits(size, "train")
        if channels != 1:
            raise ConfigError(f"the digits are grey: use --channels 1 (got {channels}).")
        return source
    return gan_data.load_folder(config.data, size, channels)


def sample_grid(
    learner: sngan_learner.SNGANLearner, num_classes: int, columns: int, seed: int = 1234
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
    """IS / FID / class accuracy of EMA samples against real-image classifier statistics."""

    def __init__(
        self,
        classifier: gan_metrics.Classifier,
        source: gan_data.LabelledImages,
        num_samples: int,
        seed: int,
    ):
        n = min(num_samples, source.num_examples)
        indices = next(iter(gan_data.index_stream(source.num_examples, seed).batch(n)))
        real_images, _ = source.load_batch(indices)
        self.classifier = classifier
        self.reference = gan_metrics.gaussian_statistics(classifier(real_images.numpy())[0])
        self.num_samples = num_samples

    def __call__(self, learner: sngan_learner.SNGANLearner) -> dict[str, float]:
        labels = np.arange(self.num_samples) % learner.config.num_classes
        images = np.concatenate(
            [
                learner.sample(labels[i : i + 500], seed=10_000 + i).numpy()
                for i in range(0, len(labels), 500)
            ]
        )
        return gan_metrics.evaluate(self.classifier, images, labels, self.reference)


def train(
    config: SNGANRunConfig,
    run_dir: str,
    repl: replication.Replicator | None = None,
    print_fn: Callable[[str], None] = print,
) -> dict[str, float]:
    """Trains (or resumes) an SN-GAN as `config` says; returns the last metrics.

    Everything that can be wrong with the request is checked before the run directory is
    touched.

    Raises:
        ConfigError, DataError, RunDirError, BatchSplitError, ClassifierExportError (all
            ValueError): messages say what to do.
        FloatingPointError: the losses diverged.
    """
    config.validate()
    repl = repl or replication.make(config.replicas)  # before any other TF op (logical CPUs)
    per_replica_batch = repl.per_replica_batch_size(config.model.global_batch_size)
    source = open_source(config)
    config = dataclasses.replace(
        config, model=dataclasses.replace(config.model, num_classes=source.num_classes)
    )
    classifier = gan_metrics.Classifier(config.classifier) if config.classifier else None

    run = training_common.RunDir(run_dir, config.to_flat_dict(), kind=KIND, mutable=RESUMABLE_KEYS)
    config = SNGANRunConfig.from_flat_dict(run.config)
    with run:
        tf.random.set_seed(config.model.seed)  # initial weights and spectral-norm vectors
        learner = sngan_learner.SNGANLearner(config.model, repl)
        manager = run.checkpoint_manager(
            tf.train.Checkpoint(learner=learner), config.keep_checkpoints
        )
        start = run.restore(manager)
        if int(learner.step.numpy()) != start:
            raise training_common.RunDirError(
                f"checkpoint of step {start} holds step counter {int(learner.step.numpy())}; "
                "the run directory is inconsistent: use a new --run-dir."
            )
        run.record_invocation(start)
        evaluator = (
            _Evaluator(classifier, source, config.eval_samples, config.model.seed)
            if classifier
            else None
        )
        return _loop(
            config,
            learner,
            source,
            repl,
            run,
            manager,
            start,
            per_replica_batch,
            evaluator,
            print_fn,
        )


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
    run.log(step, results, prefix="eval")
    print_fn(f"step {step}: " + "  ".join(f"{k} {v:.4g}" for k, v in results.items()))
    return results


def _loop(
    config, learner, source, repl, run, manager, start, per_replica_batch, evaluator, print_fn
):
    model = config.model
    if start >= config.steps:
        print_fn(
            f"Already trained {start} of {config.steps} steps; pass a larger --steps to "
            "train further."
        )
        return {"step": start, **_report(config, learner, run, start, evaluator, print_fn)}
    if start:
        print_fn(f"Resuming from step {start} ({run.path}).")
    print_fn(
        f"Training SN-GAN on {config.data}: {config.steps} steps, global batch "
        f"{model.global_batch_size} ({per_replica_batch} per replica x "
        f"{repl.num_replicas} [{config.replicas}]), {model.disc_steps} D step(s) per G step, "
        f"{model.image_size}x{model.image_size}x{model.channels}, "
        f"{model.num_classes} classes."
    )
    results: dict[str, float] = {}
    if start == 0 and evaluator is not None:  # the baseline the metrics improve on
        results = _report(config, learner, run, 0, evaluator, print_fn)
    # Every D step reads one global batch: the stream position is a function of the step.
    consumed = start * model.disc_steps * model.global_batch_size
    iterator = iter(
        repl.distribute(
            gan_data.make_input_fn(source, per_replica_batch, seed=model.seed, start=consumed)
        )
    )
    progress = training_common.Progress(
        config.steps, start, model.global_batch_size * model.disc_steps, "images"
    )
    step = start
    while step < config.steps:
        try:
            values = learner.train_step(iterator)
        except tf.errors.InvalidArgumentError as error:
            if "decode" in error.message.lower() or "image" in error.message.lower():
                raise gan_data.DataError(
                    f"cannot read a training image: "
                    f"{error.message.splitlines()[0]}. Remove or replace "
                    "the file."
                ) from None
            raise
        step += 1
        if step == start + 1:  # the first call traces and compiles: keep it out of images/s
            values = {k: float(v) for k, v in values.items()}
            progress.reset_clock(step)
        if step % config.log_every == 0 or step == config.steps:
            metrics = {k: float(v) for k, v in values.items()}
            if not all(np.isfinite(v) for v in metrics.values()):
                raise FloatingPointError(
                    f"losses became non-finite at step {step} ({metrics}); lower the learning "
                    "rates or check the data."
                )
            # No rate for the first step: it is all tracing and compiling.
            rate = progress.throughput(step) if step > start + 1 else float("nan")
            progress.line(step, metrics, rate)
            if np.isfinite(rate):
                metrics["images_per_second"] = rate
            run.log(step, metrics, prefix="train")
        if (config.eval_every and step % config.eval_every == 0) or step == config.steps:
            results = _report(config, learner, run, step, evaluator, print_fn)
            progress.reset_clock(step)
        if step % config.checkpoint_every == 0 or step == config.steps:
            manager.save(checkpoint_number=step)
    return {"step": step, **results}
