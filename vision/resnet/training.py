"""Training a ResNet classifier: data, run directory, the shared loop, evaluation.

    config = ClassificationConfig(data="digits", replicas="cpu:2", steps=300, ...)
    train(config, run_dir="runs/r50")            # rerunning with the same run_dir resumes

Everything that can be wrong with the request (config, data, a missing
evaluation split, the batch split, the image size) is checked before the run
directory is touched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping

import tensorflow as tf

import replication
from vision.common import loop
from vision.common import precision as precision_lib
from vision.common import run_dir as run_dir_lib
from vision.common.cli import ConfigError
from vision.common.run_dir import RunDir, saved_config
from vision.common.workers import WorkerRole
from vision.data import EVAL, TRAIN, open_dataset
from vision.resnet.learning import ClassificationConfig, Classifier, build_model

KIND = "resnet50"
# Keys that may change when a run directory is resumed: how long to train,
# on which hardware, and how often to report. Everything else must match.
RESUMABLE_KEYS = (*run_dir_lib.RESUMABLE_KEYS, "epochs", "evaluate")


def train(
    config: ClassificationConfig,
    run_dir: str | None = None,
    repl: replication.Replicator | None = None,
    print_fn: Callable[[str], None] = print,
    stop_at: int | None = None,
    worker: WorkerRole | None = None,
) -> dict[str, float]:
    """Trains (or resumes) a classifier as `config` says; returns the final metrics.

    With `run_dir`, writes config, metrics, summaries and checkpoints there and
    resumes from its latest checkpoint: model, batch-norm statistics, momentum,
    step counter and data position (the input stream restarts at the example
    the interrupted run would have read next) all continue exactly. Note that a
    resumed run whose `steps` changed follows a different cosine schedule.

    `stop_at` (or a first SIGTERM/SIGINT) ends this invocation early, at a
    checkpoint, as if preempted; the schedule still spans `config.steps`.
    `worker` is this process's role in a multi-worker run: only the chief writes.

    Raises:
      ConfigError, DataError, RunDirError, BatchSplitError (all ValueError): bad
        config, data, run directory or batch size; messages say what to do.
      FloatingPointError: the loss diverged.
    """
    config.validate()
    chief = worker is None or worker.chief
    if not chief:
        print_fn = _quiet
    saved = saved_config(run_dir) if run_dir else None
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
    if config.evaluate and not dataset.has_split(EVAL):
        raise ConfigError(
            f"{config.data} has no evaluation split (validation TFRecords, or val/<class>/ "
            "folders); add one, or pass --no-eval to train without evaluating."
        )
    # A new run saves the values None stood for, so resuming it with another
    # --steps keeps its warmup length and image size.
    config = dataclasses.replace(
        config.resolve(dataset.num_examples(TRAIN)),
        image_size=config.image_size or dataset.default_image_size,
    )
    image_size = config.image_size
    # Refuse impossible settings before anything is written to the run directory.
    repl.per_replica_batch_size(config.batch_size)
    try:
        build_model(config, dataset.num_classes, image_size).check_image_size(image_size)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    run = None
    if run_dir is not None:
        fields = dataclasses.asdict(config)
        run = RunDir(run_dir, fields, kind=KIND, mutable=RESUMABLE_KEYS, chief=chief)
        config = ClassificationConfig(**{k: v for k, v in run.config.items() if k in fields})
    with contextlib.ExitStack() as stack:
        if run:
            stack.enter_context(run)  # lock: one process per run directory
        tf.random.set_seed(config.seed)  # same initial parameters for the same seed
        classifier = Classifier(config, repl, dataset.num_classes, image_size)
        start = 0
        if run:
            start = run.attach(classifier.checkpoint(), config.keep_checkpoints)
            run.record_invocation(start)
        if start < config.steps:
            _announce(config, dataset.name, image_size, repl, print_fn)
        iterator = iter(
            repl.distribute(
                dataset.input_fn(
                    TRAIN, config.batch_size, image_size, seed=config.seed, start_step=start
                )
            )
        )

        def evaluate(step: int) -> dict[str, float]:
            results = classifier.evaluate(dataset)
            print_fn(_eval_line(step, results))
            return results

        result = loop.train_loop(
            cadence=loop.Cadence(
                config.steps,
                config.log_every,
                config.checkpoint_every,
                config.eval_every,
                config.evaluate,
            ),
            start=start,
            train_step=lambda: classifier.train_step(iterator),
            evaluate=evaluate,
            run=run,
            items_per_step=config.batch_size,
            print_fn=print_fn,
            stop_at=stop_at,
            diverged_hint="lower --base-learning-rate or check the data",
            stream=None if chief else open(os.devnull, "w"),
        )
        return {"step": result.step, **result.metrics, **result.results}


def _quiet(_: str) -> None:
    """The print_fn of non-chief workers: the chief speaks for the run."""


def _announce(config, data_name, image_size, repl, print_fn) -> None:
    print_fn(
        f"Training {data_name}: {config.steps} steps of {config.batch_size} images "
        f"({image_size}x{image_size}) on {repl.num_replicas} replica(s) "
        f"[{config.replicas}{f' x {config.workers} workers' if config.workers > 1 else ''}], "
        f"{config.precision}."
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


def _eval_line(step: int, results: Mapping[str, float]) -> str:
    return (
        f"eval at step {step}: top-1 {100 * results['top1']:.2f}%  top-5 "
        f"{100 * results['top5']:.2f}%  ({results['count']} images)"
    )
