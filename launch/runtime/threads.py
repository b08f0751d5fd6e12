"""The `threads` backend: every node in a thread of the launcher process.

For tests and debugging (one process to attach a debugger to, breakpoints in any
node). A node body that raises is restarted like a crashed process; a node that
does not return when asked cannot be killed, only abandoned (its thread is a
daemon, so it does not keep the process alive).
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from launch.runtime.context import FileSink, NodeContext
from launch.runtime.errors import is_deterministic
from launch.runtime.program import Node, Program, check_arguments, load_entry_point
from launch.runtime.run_dir import RunDir, tail_lines
from launch.runtime.supervisor import Exit


class ThreadHandle:
    """One node thread."""

    def __init__(
        self, node: Node, kwargs: dict, attempt: int, run_dir: RunDir, advertise_host: str
    ):
        self._lock = threading.Lock()
        self._published: dict[str, Any] = {}
        self._error: str | None = None
        self._deterministic = False
        self._abandoned = False
        self._log_path = run_dir.log_path(node.name)
        log = FileSink(self._log_path)
        self._log = log
        self.ctx = NodeContext(
            node.name,
            run_dir.root,
            attempt=attempt,
            advertise_host=advertise_host,
            metrics_sink=FileSink(run_dir.metrics_path(node.name)),
            log_sink=log,
            publish_sink=self._publish,
        )
        log(f"==== start #{attempt} of {node.name} (thread)")
        self._thread = threading.Thread(
            target=self._run, args=(node.entry_point, kwargs), name=f"node-{node.name}", daemon=True
        )
        self._thread.start()

    def _publish(self, key: str, value: Any) -> None:
        with self._lock:
            self._published[key] = value

    def _run(self, entry_point: str, kwargs: dict) -> None:
        try:
            fn = load_entry_point(entry_point)
            check_arguments(fn, self.ctx, kwargs)
            fn(self.ctx, **kwargs)
        except BaseException as e:  # pylint: disable=broad-except
            self._log(traceback.format_exc())
            self._error = f"{type(e).__name__}: {e}"
            self._deterministic = is_deterministic(e)

    def poll(self) -> Exit | None:
        if self._abandoned:
            return Exit(False, "abandoned (did not stop when asked)")
        if self._thread.is_alive():
            return None
        if self._error is None:
            return Exit(True)
        return Exit(False, self._error, deterministic=self._deterministic)

    def request_stop(self) -> None:
        self.ctx.request_stop()

    def kill(self) -> None:
        self.ctx.request_stop()
        self._abandoned = True

    def published(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._published)

    def drain(self) -> None:
        pass

    def log_hint(self) -> str:
        return f"Its output: {self._log_path}"

    def log_tail(self, lines: int) -> str:
        return tail_lines(self._log_path, lines)


class ThreadsBackend:
    """Runs each node in a thread of this process."""

    name = "threads"

    def __init__(
        self, run_dir: RunDir, program: Program | None = None, *, advertise_host: str = "localhost"
    ):
        self._run_dir = run_dir
        self._advertise_host = advertise_host
        if program is not None and program.setup is not None:
            entry_point, kwargs = program.setup
            load_entry_point(entry_point)(**kwargs)

    def start(self, node: Node, kwargs: dict, attempt: int) -> ThreadHandle:
        return ThreadHandle(node, kwargs, attempt, self._run_dir, self._advertise_host)

    def close(self) -> None:
        pass
