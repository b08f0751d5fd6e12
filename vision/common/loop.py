"""The training loop both vision trainers share, with progress lines and a graceful stop.

`train_loop` runs a trainer's step function from `start` to `end` and owns the
cadence every trainer needs:

    every step          train_step(); a first SIGTERM/SIGINT ends the loop at the next
                        step boundary, with a checkpoint (a second one stops at once)
    every log_every     fetch the metrics, stop with FloatingPointError if one is not
                        finite, print a progress line with images/s, log to the run
    every checkpoint_every, at the end and on a stop: save a checkpoint
    every eval_every (0: only at the end of the run): evaluate() and log its results

The first step traces and compiles the step functions, so the throughput clock
starts after it.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

import numpy as np
import tensorflow as tf

from vision.common.run_dir import RunDir
from vision.data.pipeline import DataError


class GracefulStop:
    """Turns the first SIGTERM/SIGINT into a request to stop at the next step boundary.

    A trainer checks `requested` after each step and, if set, checkpoints and
    returns, so a preempted or Ctrl-C'ed run loses no work. A second signal
    behaves as usual (KeyboardInterrupt / termination). Outside the main thread
    (where Python cannot install handlers) it does nothing.

        with GracefulStop() as stop:
            while step < steps and not stop.requested:
                ...
    """

    _SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.requested = False
        self._previous = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in self._SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.requested:  # second signal: give up on a clean stop
            previous = self._previous.get(signum)
            self.__exit__()
            if callable(previous):
                previous(signum, frame)
            raise KeyboardInterrupt
        self.requested = True
        print(
            f"Received {signal.Signals(signum).name}: stopping after this step "
            "(send it again to stop now).",
            file=sys.stderr,
            flush=True,
        )


class Progress:
    """Formats progress lines with throughput: "step 120/1000 (12%)  245.3 images/s  loss 0.41".

    Throughput is measured between consecutive calls of `line`, so call it at
    the same points (e.g. every `log_every` steps) after the step's results are
    fetched.
    """

    def __init__(
        self,
        total_steps: int,
        start_step: int,
        items_per_step: int,
        unit: str = "images",
        stream: TextIO | None = None,
    ):
        self.total_steps = total_steps
        self.items_per_step = items_per_step
        self.unit = unit
        self.stream = stream or sys.stdout
        self._last_step = start_step
        self._last_time = time.perf_counter()

    def reset_clock(self, step: int) -> None:
        """Restarts the throughput clock (e.g. after compiling or evaluating)."""
        self._last_step, self._last_time = step, time.perf_counter()

    def throughput(self, step: int) -> float:
        """Items per second since the previous call (or `reset_clock`)."""
        now = time.perf_counter()
        rate = (step - self._last_step) * self.items_per_step / max(now - self._last_time, 1e-9)
        self._last_step, self._last_time = step, now
        return rate

    def line(self, step: int, metrics: Mapping[str, float], rate: float | None = None) -> str:
        """Returns and prints one progress line for `step`."""
        rate = self.throughput(step) if rate is None else rate
        percent = 100.0 * step / max(self.total_steps, 1)
        parts = [f"step {step}/{self.total_steps} ({percent:3.0f}%)", f"{rate:8.1f} {self.unit}/s"]
        parts += [f"{name} {_format(value)}" for name, value in metrics.items()]
        text = "  ".join(parts)
        print(text, file=self.stream, flush=True)
        return text


def _format(value: float) -> str:
    value = float(value)
    return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.3e}"


@dataclasses.dataclass
class Cadence:
    """How long a run is and how often it reports, checkpoints and evaluates (in steps)."""

    steps: int  # the run's length: schedules span it, the final evaluation happens there
    log_every: int
    checkpoint_every: int
    eval_every: int = 0  # 0: evaluate at the end of the run only
    evaluate: bool = True  # False: never evaluate

    def evaluates_at(self, step: int) -> bool:
        if not self.evaluate:
            return False
        return bool(self.eval_every and step % self.eval_every == 0) or step == self.steps


@dataclasses.dataclass
class LoopResult:
    step: int  # the step reached
    metrics: dict[str, float]  # the last logged training metrics
    results: dict[str, float]  # the last evaluation results


def train_loop(
    *,
    cadence: Cadence,
    start: int,
    train_step: Callable[[], Mapping[str, Any]],
    evaluate: Callable[[int], Mapping[str, float]] | None,
    run: RunDir | None,
    items_per_step: int,
    print_fn: Callable[[str], None] = print,
    stop_at: int | None = None,
    baseline: bool = False,
    diverged_hint: str = "lower the learning rate or check the data",
    stream: TextIO | None = None,
) -> LoopResult:
    """Trains from step `start` (restored) to `cadence.steps` (or `stop_at`, as if preempted).

    Args:
      cadence: length and cadence of the run.
      start: the step the model is at.
      train_step: runs one step; returns scalar metrics (tensors are fine).
      evaluate: `evaluate(step)` returns metrics to log as "eval/..." (it prints
        what it wants to); None: no evaluation.
      run: the run directory to log and checkpoint into (None: neither).
      items_per_step: images one step consumes, for the throughput.
      stop_at: end this invocation at this step, with a checkpoint.
      baseline: evaluate before the first step of a fresh run too.
      diverged_hint: what to do when a metric becomes NaN or infinite.
      stream: where progress lines go (default stdout).

    Raises:
      FloatingPointError: a logged metric is not finite.
      DataError: an image of the data cannot be decoded.
    """
    results: dict[str, float] = {}

    def evaluate_and_log(step: int) -> dict[str, float]:
        if evaluate is None:
            return {}
        values = {k: float(v) for k, v in evaluate(step).items()}
        if run is not None and values:
            run.log(step, values, prefix="eval")
        return values

    if start >= cadence.steps:
        print_fn(
            f"Already trained {start} of {cadence.steps} steps; pass a larger --steps to "
            "train further."
        )
        if cadence.evaluate:
            results = evaluate_and_log(start)
        return LoopResult(start, {}, results)
    if start and run is not None:
        print_fn(f"Resuming from step {start} ({run.path}).")
    if baseline and start == 0 and cadence.evaluate:
        results = evaluate_and_log(0)
    progress = Progress(cadence.steps, start, items_per_step, "images", stream=stream)
    end = min(cadence.steps, stop_at) if stop_at else cadence.steps
    metrics: dict[str, float] = {}
    step = start
    with GracefulStop() as stop:
        while step < end and not stop.requested:
            try:
                values = train_step()
                step += 1
                if step == start + 1:  # tracing and compiling: not throughput
                    values = {k: float(v) for k, v in values.items()}
                    progress.reset_clock(step)
            except tf.errors.InvalidArgumentError as error:
                message = error.message.lower()
                if "decode" in message or "image" in message:
                    raise DataError(
                        f"cannot read a training image: {error.message.splitlines()[0]}. "
                        "Remove or replace the file."
                    ) from None
                raise
            if step % cadence.log_every == 0 or step == end or stop.requested:
                metrics = {k: float(v) for k, v in values.items()}
                bad = {k: v for k, v in metrics.items() if not np.isfinite(v)}
                if bad:
                    raise FloatingPointError(
                        f"{', '.join(f'{k} became {v}' for k, v in bad.items())} at step "
                        f"{step}; {diverged_hint}."
                    )
                rate = progress.throughput(step) if step > start + 1 else float("nan")
                progress.line(step, metrics, rate)
                if run is not None:
                    logged = dict(metrics)
                    if np.isfinite(rate):
                        logged["images_per_second"] = rate
                    run.log(step, logged, prefix="train")
            if run is not None and (
                step % cadence.checkpoint_every == 0 or step == end or stop.requested
            ):
                run.save(step)
            if cadence.evaluates_at(step):
                results = evaluate_and_log(step)
                progress.reset_clock(step)
    if step < cadence.steps:
        where = f"rerun with --run-dir {run.path}" if run is not None else "use a run directory"
        print_fn(f"Stopped at step {step} of {cadence.steps}; {where} to continue.")
    return LoopResult(step, metrics, results)
