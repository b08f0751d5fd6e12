"""Which side limits a D4PG run: actors (too little data) or the learner (too slow updates).

Reverb's rate limiter keeps ``diff = inserts * samples_per_insert - samples`` within
``[min_diff, max_diff]``: an insert waits while ``diff + samples_per_insert > max_diff``
(the learner has not consumed enough: actors are blocked) and a sample waits while
``diff - 1 < min_diff`` or the table holds fewer than ``min_size_to_sample`` items (the
learner is starved). Reverb 0.14 reports the limiter's counters (``rate_limiter_info``:
inserts and samples completed, the bounds) but no waiting times, so `LimiterMonitor`
polls the counters a few times a second and measures the fraction of time each side
would be blocked; the counters also give insert and sample rates over the same window.

`diagnose` turns those fractions into the verdict shown in the progress line, metrics.csv
and TensorBoard, e.g. "learner-bound: actors blocked 62% of the time: a faster learner (a
GPU, more learner workers) or lower samples_per_insert". Not "more learner replicas": on a
CPU-only machine splitting the update over CPU replicas slows it (docs/throughput.md).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

# A side is called the bottleneck when the other one waits at least this fraction of the time.
BLOCKED_THRESHOLD = 0.2


@dataclasses.dataclass(frozen=True)
class LimiterState:
    """The counters of one rate limiter at one moment (from `TableInfo`)."""

    inserts: int
    samples: int
    size: int
    samples_per_insert: float
    min_diff: float
    max_diff: float
    min_size_to_sample: int

    @classmethod
    def from_table_info(cls, info) -> LimiterState:
        limiter = info.rate_limiter_info
        return cls(
            inserts=int(limiter.insert_stats.completed),
            samples=int(limiter.sample_stats.completed),
            size=int(info.current_size),
            samples_per_insert=float(limiter.samples_per_insert),
            min_diff=float(limiter.min_diff),
            max_diff=float(limiter.max_diff),
            min_size_to_sample=int(limiter.min_size_to_sample),
        )

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples

    @property
    def inserts_blocked(self) -> bool:
        """The next insert would wait for samples (the same test as Reverb's CanInsert)."""
        return self.diff + self.samples_per_insert > self.max_diff

    @property
    def samples_blocked(self) -> bool:
        """The next sample would wait for inserts (Reverb's CanSample), or replay is filling."""
        return self.size < self.min_size_to_sample or self.diff - 1.0 < self.min_diff


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    kind: str  # "learner-bound", "actor-bound", "balanced", "filling replay", "unknown"
    message: str


def diagnose(
    actors_blocked: float | None,
    learner_blocked: float | None,
    *,
    filling: bool = False,
    threshold: float = BLOCKED_THRESHOLD,
) -> Diagnosis:
    """The verdict from the fractions of time inserts and samples were blocked."""
    if actors_blocked is None or learner_blocked is None:
        return Diagnosis("unknown", "bottleneck: no rate limiter statistics yet")
    if filling:
        return Diagnosis(
            "filling replay",
            "filling replay: the learner waits for min_replay_size transitions",
        )
    if actors_blocked >= threshold and actors_blocked >= learner_blocked:
        return Diagnosis(
            "learner-bound",
            f"learner-bound: actors blocked {actors_blocked:.0%} of the time: a faster "
            "learner (a GPU, more learner workers) or lower samples_per_insert",
        )
    if learner_blocked >= threshold:
        return Diagnosis(
            "actor-bound",
            f"actor-bound: learner waits for data {learner_blocked:.0%} of the time: add actors",
        )
    return Diagnosis(
        "balanced",
        f"balanced: actors blocked {actors_blocked:.0%}, learner waiting {learner_blocked:.0%}",
    )


class LimiterMonitor:
    """Polls a table's rate limiter; `report()` summarises the time since the last report.

    Args:
      info_fn: Returns the table's `TableInfo`, e.g.
        ``lambda: client.server_info()["replay"]``.
      period: Seconds between polls (a poll is one small RPC).
      transitions_per_item: transitions each item holds; the reported insert and sample
        counts and rates are in transitions (the blocked fractions do not depend on it).
    """

    def __init__(self, info_fn, period: float = 0.25, transitions_per_item: int = 1):
        self._info_fn = info_fn
        self._period = period
        self._scale = transitions_per_item
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reset(None)

    def _reset(self, state: LimiterState | None) -> None:
        self._polls = 0
        self._inserts_blocked = 0
        self._samples_blocked = 0
        self._first = state
        self._first_time = time.monotonic()
        self._last = state

    def poll(self) -> LimiterState:
        """Reads the limiter once and counts which side would wait now."""
        state = LimiterState.from_table_info(self._info_fn())
        with self._lock:
            if self._first is None:
                self._first, self._first_time = state, time.monotonic()
            self._polls += 1
            self._inserts_blocked += state.inserts_blocked
            self._samples_blocked += state.samples_blocked
            self._last = state
        return state

    def report(self) -> dict[str, Any]:
        """Blocked fractions, rates and the verdict since the previous report (then resets)."""
        with self._lock:
            polls, last, first = self._polls, self._last, self._first
            elapsed = time.monotonic() - self._first_time
            out: dict[str, Any] = {}
            if polls and last is not None:
                actors = self._inserts_blocked / polls
                learner = self._samples_blocked / polls
                verdict = diagnose(actors, learner, filling=last.size < last.min_size_to_sample)
                out = {
                    "actors_blocked": round(actors, 3),
                    "learner_blocked": round(learner, 3),
                    "bottleneck": verdict.message,
                    "bottleneck_kind": verdict.kind,
                    "replay_inserts": last.inserts * self._scale,
                }
                if first is not None and elapsed > 0:
                    per_s = self._scale / elapsed
                    out["replay_inserts_per_s"] = round((last.inserts - first.inserts) * per_s, 1)
                    out["replay_samples_per_s"] = round((last.samples - first.samples) * per_s, 1)
            self._reset(last)
        return out

    def start(self) -> LimiterMonitor:
        """Polls in a daemon thread until `stop()`; poll errors (a stopping server) end it."""

        def loop():
            while not self._stop.wait(self._period):
                try:
                    self.poll()
                except Exception:  # pylint: disable=broad-except
                    return

        self._thread = threading.Thread(target=loop, name="limiter-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


class SummaryWriter:
    """Writes reports to TensorBoard at step = inserts so far (= actor steps)."""

    _SCALARS = ("actors_blocked", "learner_blocked", "replay_inserts_per_s", "replay_samples_per_s")

    def __init__(self, logdir: str):
        self._logdir = logdir
        self._writer = None  # Made at the first report: TensorFlow initialises no earlier.

    def write(self, report: dict[str, Any]) -> None:
        if not report:
            return
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self._logdir)
        with self._writer.as_default(step=int(report.get("replay_inserts", 0))):
            for name in self._SCALARS:
                if name in report:
                    tf.summary.scalar(f"bottleneck/{name}", report[name])
            tf.summary.text("bottleneck/verdict", report["bottleneck"])
        self._writer.flush()
