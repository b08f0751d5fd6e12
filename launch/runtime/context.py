"""What a node body sees of the launcher: stop requests, metrics, logs, publication.

Every backend hands a node body the same `NodeContext`; only the sinks behind it
differ (a file in the run directory, an in-memory buffer a Ray actor drains, ...).
Node bodies therefore run unchanged in a thread, a process or a Ray actor.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

Sink = Callable[[str], None]

# Published under this key + the node's name: the seconds the node needs to stop (see
# `NodeContext.need_stop_time`). No node's arguments refer to it.
STOP_TIME_KEY = "stop_time_needed/"
# Published under this key + the node's name: the wall time of the node's latest
# `heartbeat` (see `Node.stall_timeout`). No node's arguments refer to it.
HEARTBEAT_KEY = "heartbeat/"
# A heartbeat is published at most this often: the watchdog's timeouts are minutes, and
# every publication rewrites the node's published values.
HEARTBEAT_PERIOD_S = 2.0


class NodeContext:
    """The launcher-facing side of a running node.

    Attributes:
      name: The node's name in its program.
      run_dir: The run directory (absolute path).
      attempt: 0 for the first start, then 1, 2, ... for restarts.
      advertise_host: The host name other nodes should use to reach servers this
        node starts (``localhost`` on one machine; the node's IP on a Ray cluster).
    """

    def __init__(
        self,
        name: str,
        run_dir: str,
        *,
        attempt: int = 0,
        advertise_host: str = "localhost",
        stop_event: threading.Event | None = None,
        metrics_sink: Sink | None = None,
        log_sink: Sink | None = None,
        publish_sink: Callable[[str, Any], None] | None = None,
    ):
        self.name = name
        self.run_dir = run_dir
        self.attempt = attempt
        self.advertise_host = advertise_host
        self._stop = stop_event or threading.Event()
        self._metrics_sink = metrics_sink or (lambda line: None)
        self._log_sink = log_sink or (lambda line: print(line, file=sys.stderr, flush=True))
        self._publish_sink = publish_sink or (lambda key, value: None)
        # Every record carries (src, seq): unique per context, increasing, so the launcher
        # can drop a record it has seen already (once and only once across relaunches).
        self._source = uuid.uuid4().hex[:12]
        self._seq = itertools.count(1)
        self.stop_time_needed = 0.0  # Seconds asked for by `need_stop_time` (0: none).
        self._last_heartbeat = float("-inf")

    # Stopping.
    def should_stop(self) -> bool:
        """True once the launcher asked this node to stop; loops should check it."""
        return self._stop.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleeps up to `seconds`; returns True early if a stop was requested."""
        return self._stop.wait(seconds)

    def request_stop(self) -> None:
        self._stop.set()

    # Reporting.
    def record(self, kind: str, **fields: Any) -> None:
        """Sends one metrics record (JSON) to the launcher.

        Counters are sent as *increments* (e.g. ``steps=1000`` since the last record)
        so totals survive node restarts: the launcher just adds them up.
        """
        record = {
            "t": time.time(),
            "node": self.name,
            "kind": kind,
            "src": self._source,
            "seq": next(self._seq),
            **fields,
        }
        self._metrics_sink(json.dumps(record, default=_jsonable))

    def count(self, **increments: float) -> None:
        """Adds to run-wide counters, e.g. ``ctx.count(actor_steps=1000, episodes=1)``."""
        self.record("count", **increments)

    def gauge(self, **values: Any) -> None:
        """Sets run-wide values, e.g. ``ctx.gauge(learner_steps=500)``."""
        self.record("gauge", **values)

    def log(self, message: str) -> None:
        """A human-readable line for this node's log."""
        stamp = time.strftime("%H:%M:%S")
        self._log_sink(f"{stamp} [{self.name}] {message}")

    def publish(self, key: str, value: Any) -> None:
        """Makes `value` (JSON data) available to nodes whose kwargs hold `Ref(key)`."""
        json.dumps(value)
        self._publish_sink(key, value)

    def need_stop_time(self, seconds: float) -> None:
        """Asks for `seconds` between a stop request and a kill, when more than the node's
        `stop_timeout` (e.g. a replay whose checkpoint grew with its tables): the
        supervisor and a node whose launcher died both wait that long."""
        self.stop_time_needed = float(seconds)
        self.publish(STOP_TIME_KEY + self.name, self.stop_time_needed)

    def heartbeat(self) -> None:
        """Says the body is making progress (e.g. after each update of a learner worker).

        A node with a `stall_timeout` that sends no heartbeat for that long, after its
        first one, is taken for stuck (e.g. in a collective that lost a peer) and is
        killed and restarted. Cheap to call often: published at most every
        `HEARTBEAT_PERIOD_S` seconds.
        """
        now = time.monotonic()
        if now - self._last_heartbeat >= HEARTBEAT_PERIOD_S:
            self._last_heartbeat = now
            self.publish(HEARTBEAT_KEY + self.name, time.time())

    def path(self, *parts: str) -> str:
        """A path inside the run directory, its parent directories created."""
        p = os.path.join(self.run_dir, *parts)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        return p


def _jsonable(value: Any) -> Any:
    # numpy scalars and arrays: turn into plain numbers/lists without importing numpy.
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class FileSink:
    """Appends lines to a file, one write per line (safe for one writer at a time).

    A previous writer killed mid-line leaves a torn last line; the first write of a new
    sink ends it first, so the torn line stays a line of its own (which readers skip)
    instead of swallowing the next record.
    """

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._path = path
        self._lock = threading.Lock()
        self._checked = False

    def __call__(self, line: str) -> None:
        with self._lock, open(self._path, "a+b") as f:
            if not self._checked:
                self._checked = True
                if f.tell() > 0:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        f.write(b"\n")
            f.write((line.rstrip("\n") + "\n").encode("utf-8"))
