"""Run directories shared by the vision trainers: config, metrics, summaries, checkpoints.

A run directory holds everything one training run writes, and rerunning with the
same directory resumes it:

    RUN/config.json          effective config of the run (written once, never rewritten)
    RUN/invocations.jsonl    one line per start or resume: time, step, config overrides
    RUN/metrics.csv          long format: step,name,value,wall_time (appended)
    RUN/tensorboard/         tf.summary event files
    RUN/checkpoints/         tf.train.CheckpointManager checkpoints (ckpt-<step>)
    RUN/.lock                pid of the process training in RUN

With several workers (`--workers K`) only the chief (worker 0) writes; the others
open the directory with `chief=False`, read the saved config and restore the
chief's checkpoints, and write nothing.

Typical use::

    run = RunDir(path, config_dict, kind="resnet50", mutable=("steps",))
    with run:                                         # holds the lock, closes writers
        start = run.attach(tf.train.Checkpoint(model=model, step=step))  # 0 on a fresh run
        run.log(step, {"loss": 0.3}, prefix="train")
        run.save(step)
"""

from __future__ import annotations

import csv
import datetime
import json
import os
import sys
import time
from collections.abc import Collection, Mapping
from typing import Any

import tensorflow as tf

from launch.runtime.run_dir import write_json_atomic  # One fsyncing write-then-rename.

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.csv"
INVOCATIONS_FILE = "invocations.jsonl"
LOCK_FILE = ".lock"
CHECKPOINTS = "checkpoints"
TENSORBOARD = "tensorboard"
# Config keys every trainer lets a resume change: how long to train, on which hardware,
# how often to report. Trainers add their own (e.g. "classifier").
RESUMABLE_KEYS = (
    "steps",
    "replicas",
    "workers",
    "log_every",
    "eval_every",
    "checkpoint_every",
    "keep_checkpoints",
)


class RunDirError(ValueError):
    """A run directory that cannot be used as asked; the message says what to do."""


class RunDir:
    """A training run's directory: created on the first run, resumed afterwards.

    Args:
      path: the run directory. It may not exist yet, or be empty, or be a run
        directory of the same `kind`; anything else is refused so nothing
        unrelated is overwritten.
      config: the run's effective config (JSON-serialisable values).
      kind: what trains here ("resnet50", "sngan", ...); a run directory of
        another kind is refused.
      mutable: config keys that may differ when resuming (e.g. "steps" to
        train longer, "replicas" to move to other hardware). Any other
        difference is an error naming the key, old and new value; a value of
        None counts as "not specified" and takes the saved value.
      chief: False for the non-chief workers of a multi-worker run: they read
        the saved config and checkpoints and never write.

    Attributes:
      path, kind, chief, resumed (bool), config (dict: the saved config, updated
      with the mutable keys of this invocation).

    Raises:
      RunDirError: see above.
    """

    def __init__(
        self,
        path: str,
        config: Mapping[str, Any],
        *,
        kind: str,
        mutable: Collection[str] = (),
        chief: bool = True,
    ):
        self.path = os.path.abspath(path)
        self.kind = kind
        self.chief = chief
        config = json.loads(json.dumps(dict(config)))  # normalise tuples -> lists
        config_path = os.path.join(self.path, CONFIG_FILE)
        if os.path.exists(config_path):
            with open(config_path) as f:
                saved = json.load(f)
            if saved.get("kind") != kind:
                raise RunDirError(
                    f"{self.path} is a run directory of kind {saved.get('kind')!r}, not "
                    f"{kind!r}; choose another --run-dir."
                )
            saved_config = saved.get("config", {})
            # None means "not specified": the saved value stands.
            config = {
                k: saved_config[k] if v is None and k in saved_config else v
                for k, v in config.items()
            }
            # Keys only one side has (options added or removed since the run began)
            # are not differences: the run keeps its saved values.
            differences = [
                f"{key}: {saved_config[key]!r} in the run, {config[key]!r} now"
                for key in sorted(set(saved_config) & set(config))
                if key not in mutable and saved_config[key] != config[key]
            ]
            if differences:
                raise RunDirError(
                    f"{self.path} holds a run with a different config ("
                    + "; ".join(differences)
                    + "). Resume with the same settings, or use "
                    "a new --run-dir for a new run."
                )
            self.config = {
                **config,
                **saved_config,
                **{k: config[k] for k in mutable if k in config},
            }
            self.resumed = True
        else:
            if os.path.isdir(self.path) and os.listdir(self.path) and chief:
                raise RunDirError(
                    f"{self.path} exists, is not empty and holds no {CONFIG_FILE}: it is not "
                    "a run directory. Choose a new or empty --run-dir."
                )
            if chief:
                os.makedirs(self.path, exist_ok=True)
                write_json_atomic(config_path, {"kind": kind, "config": config, "created": _now()})
            self.config = config
            self.resumed = False
        self._summary_writer = None
        self._locked = False
        self._checkpoint: tf.train.Checkpoint | None = None
        self._manager: tf.train.CheckpointManager | None = None

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> RunDir:
        self.lock()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def lock(self) -> None:
        """Marks the directory as in use; refuses if another live process holds it."""
        if not self.chief:
            return
        lock_path = os.path.join(self.path, LOCK_FILE)
        if os.path.exists(lock_path):
            try:
                with open(lock_path) as f:
                    pid = int(f.read().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and _alive(pid):
                raise RunDirError(
                    f"{self.path} is in use by process {pid}; wait for it to finish or "
                    "use another --run-dir."
                )
        with open(lock_path, "w") as f:
            f.write(str(os.getpid()))
        self._locked = True

    def close(self) -> None:
        """Flushes summaries and releases the lock."""
        if self._summary_writer is not None:
            self._summary_writer.flush()
            self._summary_writer.close()
            self._summary_writer = None
        if self._locked:
            try:
                os.remove(os.path.join(self.path, LOCK_FILE))
            except FileNotFoundError:
                pass
            self._locked = False

    # ------------------------------------------------------------ checkpoints
    def attach(self, checkpoint: tf.train.Checkpoint, max_to_keep: int = 3) -> int:
        """Makes `checkpoint` the run's checkpoint and restores its latest save.

        Returns the step of the restored checkpoint (0 on a fresh run). The step
        is the number in the checkpoint's name (`save(step)` writes `ckpt-<step>`).
        Every saved object must match an object of `checkpoint`, so a changed
        model fails loudly.
        """
        self._checkpoint = checkpoint
        if self.chief:
            self._manager = tf.train.CheckpointManager(
                checkpoint, os.path.join(self.path, CHECKPOINTS), max_to_keep=max_to_keep
            )
            latest = self._manager.latest_checkpoint
        else:
            directory = os.path.join(self.path, CHECKPOINTS)
            latest = tf.train.latest_checkpoint(directory) if os.path.isdir(directory) else None
        if latest is None:
            return 0
        status = checkpoint.restore(latest)
        try:
            status.assert_existing_objects_matched()
        except AssertionError as error:
            raise RunDirError(
                f"Checkpoint {latest} does not match the model being trained ({error}). "
                "Use a new --run-dir."
            ) from None
        return int(latest.rsplit("-", 1)[-1])

    def save(self, step: int) -> None:
        """Writes checkpoint `ckpt-<step>` (the chief only; other workers write nothing)."""
        if self._manager is not None:
            self._manager.save(checkpoint_number=step)

    # ---------------------------------------------------------------- metrics
    @property
    def summary_writer(self) -> tf.summary.SummaryWriter:
        if self._summary_writer is None:
            if not self.chief:
                self._summary_writer = tf.summary.create_noop_writer()
            else:
                self._summary_writer = tf.summary.create_file_writer(
                    os.path.join(self.path, TENSORBOARD)
                )
        return self._summary_writer

    def log(self, step: int, metrics: Mapping[str, float], prefix: str = "") -> None:
        """Appends `metrics` at `step` to metrics.csv and TensorBoard ("prefix/name")."""
        if not self.chief:
            return
        names = {f"{prefix}/{k}" if prefix else k: float(v) for k, v in metrics.items()}
        path = os.path.join(self.path, METRICS_FILE)
        new = not os.path.exists(path)
        wall_time = time.time()
        with open(path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "name", "value", "wall_time"])
            for name, value in names.items():
                writer.writerow([step, name, repr(value), f"{wall_time:.3f}"])
        with self.summary_writer.as_default():
            for name, value in names.items():
                tf.summary.scalar(name, value, step=step)

    def record_invocation(self, start_step: int, argv: list[str] | None = None) -> None:
        """Appends who resumed or started the run, when, from which step."""
        if not self.chief:
            return
        entry = {
            "time": _now(),
            "start_step": start_step,
            "resumed": self.resumed,
            "argv": list(sys.argv if argv is None else argv),
            "pid": os.getpid(),
            "config": self.config,
        }
        with open(os.path.join(self.path, INVOCATIONS_FILE), "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")


def is_run_dir(path: str) -> bool:
    """Whether `path` already holds a run (a config.json written by `RunDir`)."""
    return os.path.exists(os.path.join(path, CONFIG_FILE))


def saved_config(path: str) -> dict | None:
    """The config saved in run directory `path`, or None if it holds no run yet.

    Raises:
      RunDirError: the config file exists but cannot be read.
    """
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(config_path):
        return None
    try:
        with open(config_path) as f:
            return json.load(f).get("config", {})
    except (OSError, ValueError, AttributeError) as error:
        raise RunDirError(f"cannot read {config_path} ({error}); use another --run-dir.") from None


def read_metrics(path: str) -> list[dict]:
    """Rows of RUN/metrics.csv as dicts with int step and float value.

    After a crash, steps logged after the last checkpoint are logged again on
    resume; later rows supersede earlier ones for the same (step, name).
    """
    with open(os.path.join(path, METRICS_FILE), newline="") as f:
        return [
            {
                "step": int(row["step"]),
                "name": row["name"],
                "value": float(row["value"]),
                "wall_time": float(row["wall_time"]),
            }
            for row in csv.DictReader(f)
        ]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
