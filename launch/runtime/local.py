"""The `local` backend: one OS process per node on this machine.

Each node runs ``python -m launch.runtime.node_main SPEC`` in its own session (process
group), started with fork+exec by `subprocess`, so no process ever forks after
TensorFlow has started. Output goes to ``RUN_DIR/logs/NODE.log``; metrics to
``RUN_DIR/metrics/NODE.jsonl``. Children stop with the launcher (PR_SET_PDEATHSIG
delivers SIGTERM, so they save; each exits by itself at its stop timeout), and
`kill` signals the whole process group.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from launch.runtime.errors import EXIT_NODE_STARTUP_ERROR
from launch.runtime.learner_group import reserve_ports
from launch.runtime.node_main import returned_marker
from launch.runtime.program import GROUP_ADDRESSES, Node
from launch.runtime.resources import GpuAllocator, local_gpu_ids
from launch.runtime.run_dir import RunDir, tail_lines
from launch.runtime.supervisor import Exit


class LocalHandle:
    """One node process."""

    def __init__(self, proc: subprocess.Popen, log_path: str, publish_path: str):
        self.proc = proc
        self._log_path = log_path
        self._publish_path = publish_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> Exit | None:
        code = self.proc.poll()
        if code is None:
            return None
        if code == 0:
            if os.path.exists(returned_marker(self._publish_path)):
                return Exit(True)
            return Exit(False, "exit status 0 without its body returning (native code exited)")
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return Exit(False, f"killed by {name}")
        if code == EXIT_NODE_STARTUP_ERROR:
            return Exit(False, "a start-up error (exit code 3)", deterministic=True)
        return Exit(False, f"exit code {code}")

    def request_stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def published(self) -> dict[str, Any]:
        try:
            with open(self._publish_path, encoding="utf-8") as f:
                return json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def drain(self) -> None:
        pass  # The node writes its metrics and logs to the run directory itself.

    def log_hint(self) -> str:
        return f"Its output: {self._log_path}"

    def log_tail(self, lines: int) -> str:
        return tail_lines(self._log_path, lines)


class LocalBackend:
    """Runs each node as a supervised child process.

    Args:
      run_dir: The run directory.
      advertise_host: Host name other nodes use to reach servers a node starts.
      env: Extra environment variables for the node processes.
    """

    name = "local"

    def __init__(
        self,
        run_dir: RunDir,
        *,
        advertise_host: str = "localhost",
        env: dict[str, str] | None = None,
    ):
        self._run_dir = run_dir
        self._advertise_host = advertise_host
        self._env = {**os.environ, **(env or {})}
        self._gpus: GpuAllocator | None = None  # Created at the first node asking for GPUs.
        # Spec and publication files are launcher-private: keep them out of the run dir.
        self._session = tempfile.mkdtemp(prefix="replicator-launch-")
        self._handles: list[LocalHandle] = []

    def node_env(self, node: Node) -> dict[str, str]:
        """The environment of `node`'s process: GPUs of its own, or none
        (`launch.runtime.resources`)."""
        if node.resources.gpus > 0 and self._gpus is None:
            self._gpus = GpuAllocator(local_gpu_ids())
        gpus = self._gpus or GpuAllocator([])
        return {**self._env, **gpus.env(node.name, node.resources.gpus)}

    def start_group(
        self, nodes: list[Node], kwargs: list[dict], attempts: list[int]
    ) -> list[LocalHandle]:
        """Starts the members of a node group, each told every member's address.

        All members run on this machine: the ports are reserved on the advertised host.
        """
        for node in nodes:  # Hand out GPUs to all members before starting any.
            self.node_env(node)
        addresses = reserve_ports(self._advertise_host, len(nodes))
        return [
            self.start(node, {**kw, GROUP_ADDRESSES: addresses}, attempt)
            for node, kw, attempt in zip(nodes, kwargs, attempts)
        ]

    def start(self, node: Node, kwargs: dict, attempt: int) -> LocalHandle:
        tag = f"{node.name}-{attempt}"
        spec_path = os.path.join(self._session, f"{tag}.spec.json")
        publish_path = os.path.join(self._session, f"{tag}.published.json")
        log_path = self._run_dir.log_path(node.name)
        spec = {
            "name": node.name,
            "entry_point": node.entry_point,
            "kwargs": kwargs,
            "run_dir": self._run_dir.root,
            "attempt": attempt,
            "advertise_host": self._advertise_host,
            "metrics_path": self._run_dir.metrics_path(node.name),
            "publish_path": publish_path,
            "parent_pid": os.getpid(),
            "stop_timeout": node.stop_timeout,
        }
        env = self.node_env(node)
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        with open(log_path, "ab") as log:
            log.write(
                f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} start #{attempt} of "
                f"{node.name}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                [sys.executable, "-m", "launch.runtime.node_main", spec_path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        handle = LocalHandle(proc, log_path, publish_path)
        self._handles.append(handle)
        return handle

    def pids(self) -> list[int]:
        """Pids of the node processes still running (for tests and tools)."""
        return [h.pid for h in self._handles if h.proc.poll() is None]

    def close(self) -> None:
        for h in self._handles:
            if h.proc.poll() is None:
                h.kill()
        shutil.rmtree(self._session, ignore_errors=True)
