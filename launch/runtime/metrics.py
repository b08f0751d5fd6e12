"""Metrics that flow from nodes to the launcher: counters, gauges, evaluations.

Nodes append JSON lines to ``RUN_DIR/metrics/NODE.jsonl`` (directly with the local
and threads backends; through the launcher with Ray). Three record kinds matter here:

- ``count``: increments, e.g. ``{"actor_steps": 1000, "episodes": 1}``; summed, so
  totals survive node restarts and relaunches.
- ``gauge``: latest values, e.g. ``{"learner_steps": 5300}``.
- ``eval``: an evaluation, ``{"return": mean, "return_std": std, "episodes": n}``;
  each one becomes a row of ``metrics.csv`` with the totals at that moment.

Once and only once: every record carries ``src`` (one id per node process) and
``seq`` (increasing), so a record seen twice is counted once; a torn line (a node
killed mid-write) is skipped alone (`launch.runtime.context.FileSink` ends it on the next
write). Each metrics.csv row carries its record's id (``record_id``), so a relaunch
writes exactly the evaluations whose row is missing (e.g. one that arrived just
before the launcher died), ordered by time with the totals of that moment.

Files are read as text and parsed as JSON; nothing is unpickled.
"""

from __future__ import annotations

import collections
import csv
import glob
import heapq
import json
import os
import time
from collections.abc import Iterator
from typing import Any

from launch.runtime.context import FileSink
from launch.runtime.run_dir import RunDir

CSV_COLUMNS = (
    "wall_time_s",
    "unix_time",
    "actor_steps",
    "learner_steps",
    "episodes",
    "eval_return",
    "eval_return_std",
    "eval_episodes",
    "eval_learner_steps",
    # The learner's latest losses and the bottleneck report at the time of the evaluation.
    "critic_loss",
    "policy_loss",
    "q_mean",
    "actors_blocked",
    "learner_blocked",
    "bottleneck",
    # Learner steps minus the mean weights version the actors hold (see `weights_staleness`).
    "actor_weights_staleness",
    "record_id",
)
_LEARNER_COLUMNS = ("critic_loss", "policy_loss", "q_mean")
_GAUGE_COLUMNS = ("actors_blocked", "learner_blocked", "bottleneck")
LAUNCHER = "launcher"


class MetricsTail:
    """Reads the new complete lines of every metrics file, remembering offsets."""

    def __init__(self, directory: str):
        self._directory = directory
        self._offsets: dict[str, int] = {}

    def read(self) -> Iterator[dict[str, Any]]:
        for path in sorted(glob.glob(os.path.join(self._directory, "*.jsonl"))):
            yield from self._read_file(path)

    def read_in_time_order(self) -> Iterator[dict[str, Any]]:
        """All new records of all files, merged by time (each file is in time order)."""
        files = sorted(glob.glob(os.path.join(self._directory, "*.jsonl")))
        # Lazy per file: only one parsed record per file is held at a time.
        return heapq.merge(*map(self._read_file, files), key=lambda r: r.get("t", 0.0))

    def _read_file(self, path: str) -> Iterator[dict[str, Any]]:
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return  # Nothing complete yet (or a torn line the next writer will end).
        self._offsets[path] = offset + end + 1
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # A torn line from a node killed mid-write: skipped alone.
            if isinstance(record, dict):
                yield record


class Progress:
    """Aggregates node metrics into totals, a progress line and metrics.csv.

    Args:
      run_dir: The run directory.
      program_name: Shown at the start of the progress line.
    """

    def __init__(self, run_dir: RunDir, program_name: str):
        self._run_dir = run_dir
        self._name = program_name
        self._tail = MetricsTail(run_dir.path("metrics"))
        self.totals: collections.Counter = collections.Counter()
        self.gauges: dict[str, Any] = {}
        self.last_eval: dict[str, Any] | None = None
        self.last_learner: dict[str, Any] = {}
        self.num_evals = 0
        self._wall_offset = 0.0
        self._start = time.monotonic()
        self._history: collections.deque = collections.deque(maxlen=120)
        self._last_saved = 0.0
        self._launcher_sink = FileSink(run_dir.metrics_path(LAUNCHER))
        self._last_seq: dict[str, int] = {}
        self._csv_ids = _csv_record_ids(run_dir.csv_path)
        self._replay_clock: tuple[float, float] | None = None  # (t, wall_time_s) while replaying.
        self._tensorboard: Any = None
        # Earlier launches of this run: rebuild the totals in time order, and write the CSV
        # rows that are missing (evaluations that arrived as the launcher died).
        self._replay_clock = (0.0, 0.0)
        for record in self._tail.read_in_time_order():
            self._apply(record, write_csv=True)
        self._replay_clock = None
        self._wall_offset = float(self.gauges.pop("wall_time_s", 0.0))

    @property
    def wall_time(self) -> float:
        """Seconds the run has been running, summed over launches."""
        return self._wall_offset + time.monotonic() - self._start

    def update(self) -> None:
        """Reads new records; appends a CSV row per new evaluation.

        Records are merged by time across nodes, so a row gets the totals and gauges of
        the moment of its evaluation, not of whichever node's file was read first.
        """
        for record in self._tail.read_in_time_order():
            self._apply(record, write_csv=True)
        self._history.append(
            (time.monotonic(), self.totals["actor_steps"], self.gauges.get("learner_steps", 0))
        )
        if time.monotonic() - self._last_saved >= 5.0:
            self._last_saved = time.monotonic()
            self._write_tensorboard()
            self._launcher_sink(
                json.dumps(
                    {
                        "t": time.time(),
                        "node": LAUNCHER,
                        "kind": "progress",
                        "wall_time_s": round(self.wall_time, 3),
                    }
                )
            )

    def weights_staleness(self) -> float | None:
        """Learner steps minus the mean weights version of the actors, or None.

        Actors gauge ``weights_version_<node>`` (the learner step of the weights they act
        with, -1 before their first pull); the learner gauges ``learner_steps``. How far
        behind the behaviour policy is tells whether `variable_update_period` or the
        publish period lets actors run on old weights.
        """
        if "learner_steps" not in self.gauges:
            return None
        versions = [
            float(v)
            for k, v in self.gauges.items()
            if k.startswith("weights_version_") and isinstance(v, (int, float)) and v >= 0
        ]
        if not versions:
            return None
        return float(self.gauges["learner_steps"]) - sum(versions) / len(versions)

    def _write_tensorboard(self) -> None:
        """Run-wide figures no single node knows, at step = actor steps (launcher process)."""
        staleness = self.weights_staleness()
        if staleness is None:
            return
        if self._tensorboard is None:
            # TensorBoard's numpy-only writer: the launcher does not import TensorFlow.
            from tensorboard.summary import Writer  # pylint: disable=import-outside-toplevel

            self._tensorboard = Writer(self._run_dir.path("tensorboard", LAUNCHER))
        self._tensorboard.add_scalar(
            "actors/weights_staleness", staleness, int(self.totals["actor_steps"])
        )
        self._tensorboard.flush()

    def _apply(self, record: dict[str, Any], write_csv: bool) -> None:
        source, seq = record.get("src"), record.get("seq")
        if isinstance(source, str) and isinstance(seq, int):
            if seq <= self._last_seq.get(source, 0):
                return  # Seen already (a record is counted once).
            self._last_seq[source] = seq
        kind = record.get("kind")
        fields = {k: v for k, v in record.items() if k not in ("t", "node", "kind", "src", "seq")}
        if kind == "count":
            for k, v in fields.items():
                if isinstance(v, (int, float)):
                    self.totals[k] += v
        elif kind == "gauge":
            self.gauges.update(fields)
        elif kind == "progress":
            self.gauges["wall_time_s"] = fields.get("wall_time_s", 0.0)
            if self._replay_clock is not None:
                self._replay_clock = (record.get("t", 0.0), float(fields.get("wall_time_s", 0.0)))
        elif kind == "learner":
            self.last_learner = fields
        elif kind == "eval":
            self.num_evals += 1
            self.last_eval = dict(fields, actor_steps=self.totals["actor_steps"])
            record_id = f"{source}:{seq}" if source is not None else ""
            if write_csv and self._csv_ids is not None and record_id not in self._csv_ids:
                if self._replay_clock is not None and not record_id:
                    return  # An old record without an id: its row cannot be checked.
                self._csv_ids.add(record_id)
                self._write_csv_row(record, record_id)

    def _row_wall_time(self, record: dict[str, Any]) -> float:
        if self._replay_clock is None:
            return self.wall_time
        t, wall = self._replay_clock  # The last launcher progress record before this one.
        return wall + max(0.0, record.get("t", t) - t) if t else 0.0

    def _write_csv_row(self, record: dict[str, Any], record_id: str) -> None:
        path = self._run_dir.csv_path
        values = {
            "wall_time_s": round(self._row_wall_time(record), 2),
            "unix_time": round(record.get("t", time.time()), 3),
            "actor_steps": int(self.totals["actor_steps"]),
            "learner_steps": int(self.gauges.get("learner_steps", 0)),
            "episodes": int(self.totals["episodes"]),
            "eval_return": record.get("return"),
            "eval_return_std": record.get("return_std"),
            "eval_episodes": record.get("episodes"),
            "eval_learner_steps": record.get("learner_steps"),
            **{k: self.last_learner.get(k) for k in _LEARNER_COLUMNS},
            **{k: self.gauges.get(k) for k in _GAUGE_COLUMNS},
            "actor_weights_staleness": self.weights_staleness(),
            "record_id": record_id,
        }
        columns = CSV_COLUMNS
        if os.path.exists(path):  # A run started by an older version keeps its header.
            with open(path, newline="", encoding="utf-8") as f:
                columns = tuple(next(csv.reader(f), CSV_COLUMNS))
        new = not os.path.exists(path)
        with open(path, "a", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(columns)
            writer.writerow([values.get(c) for c in columns])

    def rates(self) -> tuple[float, float]:
        """Actor and learner steps per second over the last ~30 seconds."""
        if len(self._history) < 2:
            return 0.0, 0.0
        now = self._history[-1]
        old = next((h for h in self._history if now[0] - h[0] <= 30.0), self._history[0])
        dt = now[0] - old[0]
        if dt <= 0:
            return 0.0, 0.0
        return (now[1] - old[1]) / dt, (now[2] - old[2]) / dt

    def line(self, restarts: dict[str, int] | None = None) -> str:
        actor_rate, learner_rate = self.rates()
        elapsed = int(self.wall_time)
        stamp = f"[{self._name} {elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}]"
        parts = [
            f"actor steps {int(self.totals['actor_steps']):,} ({actor_rate:,.0f}/s)",
            f"learner steps {int(self.gauges.get('learner_steps', 0)):,} ({learner_rate:,.1f}/s)",
            f"episodes {int(self.totals['episodes']):,}",
        ]
        if self.last_eval is not None:
            parts.append(
                f"eval return {self.last_eval.get('return', float('nan')):.1f} "
                f"@ {int(self.last_eval['actor_steps']):,} steps"
            )
        else:
            parts.append("eval return -")
        if self.gauges.get("bottleneck"):
            parts.append(str(self.gauges["bottleneck"]))
        restarted = {k: v for k, v in (restarts or {}).items() if v}
        if restarted:
            parts.append("restarts " + ",".join(f"{k}={v}" for k, v in sorted(restarted.items())))
        return stamp + " " + " | ".join(parts)


def read_csv(path: str) -> list[dict[str, float]]:
    """Rows of a metrics.csv as dicts of floats (empty and text cells are skipped)."""
    rows = []
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            rows.append({k: x for k, v in row.items() if (x := _number(v)) is not None})
    return rows


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text not in ("", None) else None
    except (TypeError, ValueError):  # text cells (e.g. record ids) and stray fields
        return None


def _csv_record_ids(path: str) -> set[str] | None:
    """Record ids of the rows already in metrics.csv (None: a CSV without ids; no rows added).

    A torn last row (the launcher killed mid-write) counts as missing; it is cut off so
    the row written again starts on a line of its own.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return set()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        with open(path, "r+b") as f:
            f.truncate(len(data))
    lines = data.decode("utf-8", "replace").splitlines()
    if not lines or "record_id" not in lines[0].split(","):
        return None if lines else set()
    rows = list(csv.DictReader(lines))
    return {row["record_id"] for row in rows if row.get("record_id")}
