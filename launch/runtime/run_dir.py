"""The run directory: one folder per training run, resumable.

Layout::

  RUN_DIR/
    run.json              what was run: program, task, effective config (identity)
    config.json           the effective config alone, for people and tools
    metrics.csv           evaluation return vs actor steps and wall time
    metrics/NODE.jsonl    every node's metrics records (JSON lines)
    logs/NODE.log         every node's output
    tensorboard/NODE/     tf.summary event files
    checkpoints/learner/  tf.train.CheckpointManager checkpoints
    checkpoints/replay/   Reverb checkpoints
    snapshots/step_N/     policy snapshots (TF SavedModels), written with learner checkpoints

Launching again with the same directory resumes. A directory made by a different
program, task or incompatible config is refused before anything in it is written.
A lock file keeps two launchers out of one directory, and a second one, held shared by
every node process of the local backend, keeps a new launch out until the nodes of the
previous one have exited: nodes outlive a killed launcher while they save (up to their
stop timeout), and two generations of learners and replays must never share a directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

from launch.runtime.errors import LaunchError

IDENTITY_FILE = "run.json"
_LOCK_FILE = ".launch.lock"
_NODES_LOCK_FILE = ".nodes.lock"  # Shared by the running node processes.
_NODES_POLL_S = 0.5
LOCK_FILES = frozenset({_LOCK_FILE, _NODES_LOCK_FILE})


class RunDirError(LaunchError):
    """The directory cannot be used for this run; the message says why and what to do."""


class RunDir:
    """Paths and identity of one run directory."""

    def __init__(self, root: str):
        self.root = os.path.abspath(os.path.expanduser(root))
        self._lock_fd: int | None = None

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def metrics_path(self, node: str) -> str:
        """``metrics/NODE.jsonl``, its folder created."""
        os.makedirs(self.path("metrics"), exist_ok=True)
        return self.path("metrics", f"{node}.jsonl")

    def log_path(self, node: str) -> str:
        """``logs/NODE.log``, its folder created."""
        os.makedirs(self.path("logs"), exist_ok=True)
        return self.path("logs", f"{node}.log")

    @property
    def csv_path(self) -> str:
        return self.path("metrics.csv")

    def read_identity(self) -> dict[str, Any] | None:
        try:
            with open(self.path(IDENTITY_FILE), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as e:
            raise RunDirError(
                f"{self.path(IDENTITY_FILE)} is unreadable ({e}); use another --run-dir."
            ) from None

    def check_compatible(
        self,
        identity: dict[str, Any],
        ignore: frozenset[str] = frozenset(),
        fallbacks: Mapping[str, Any] | None = None,
    ) -> bool:
        """Checks that this directory is new, empty, or made by the same run.

        Args:
          identity: ``{"program": ..., "task": ..., "config": {...}}`` of this launch.
          ignore: Config keys allowed to differ between launches (e.g. log intervals).
          fallbacks: Values of config keys that the saved run predates (its config lacks
            them): what that run did, compared as if it had been saved.

        Returns:
          True when resuming an existing run, False for a new run.

        Raises:
          RunDirError: if the directory belongs to something else. Nothing is written.
        """
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise RunDirError(f"--run-dir {self.root} is a file, not a directory.")
        existing = self.read_identity()
        if existing is None:
            if os.path.isdir(self.root) and set(os.listdir(self.root)) - LOCK_FILES:
                raise RunDirError(
                    f"{self.root} is not empty and is not a run directory (no {IDENTITY_FILE}); "
                    "refusing to write into it. Pass a new or empty --run-dir."
                )
            return False
        problems = []
        for key in ("program", "task"):
            if existing.get(key) != identity.get(key):
                problems.append(
                    f"{key}: the run has {existing.get(key)!r}, this launch asks for "
                    f"{identity.get(key)!r}"
                )
        old = {**(fallbacks or {}), **existing.get("config", {})}
        new = identity.get("config", {})
        for key in sorted(set(old) | set(new)):
            if key in ignore:
                continue
            if old.get(key) != new.get(key):
                problems.append(
                    f"config.{key}: the run has {old.get(key)!r}, this launch asks for "
                    f"{new.get(key)!r}"
                )
        if problems:
            raise RunDirError(
                f"{self.root} holds a different run, so it cannot be resumed with these settings:\n  "
                + "\n  ".join(problems)
                + "\nResume it without those flags (its own settings are reused), or pass a new --run-dir."
            )
        return True

    def lock(
        self, wait_for_nodes_s: float = 0.0, notify: Callable[[str], None] | None = None
    ) -> None:
        """Takes the directory's lock, creating the directory; refuses a second launcher.

        Nodes of an earlier launch still running here (its launcher was killed and they
        are saving) are waited for, up to `wait_for_nodes_s` seconds (`notify` is told
        once); if they are still there, the lock is refused.
        """
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(self.path(_LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES):
                raise RunDirError(
                    f"another launcher is using {self.root}; stop it first or pass a "
                    "different --run-dir."
                ) from None
            raise
        previous = os.pread(fd, 32, 0).decode(errors="replace").strip()
        try:
            self._wait_for_previous_nodes(previous, wait_for_nodes_s, notify)
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _wait_for_previous_nodes(
        self, launcher_pid: str, wait_s: float, notify: Callable[[str], None] | None
    ) -> None:
        fd = os.open(self.path(_NODES_LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait_s
        told = False
        try:
            while True:
                try:
                    # Free: no node of an earlier launch runs. Released at once; each node
                    # of this launch takes it shared (`hold_nodes_lock`).
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    return
                except OSError as e:
                    if e.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                if time.monotonic() >= deadline:
                    raise RunDirError(
                        f"nodes of an earlier launch (launcher pid {launcher_pid or '?'}) are "
                        f"still running in {self.root}; wait for them to finish saving, or "
                        "stop them, then launch again."
                    )
                if not told and notify is not None:
                    notify(
                        f"nodes of the previous launch (launcher pid {launcher_pid or '?'}, "
                        f"gone) are still saving in {self.root}; waiting up to "
                        f"{wait_s:.0f}s for them to exit"
                    )
                    told = True
                time.sleep(_NODES_POLL_S)
        finally:
            os.close(fd)

    def unlock(self) -> None:
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def write_identity(self, identity: dict[str, Any]) -> None:
        """Writes run.json (keeping the first launch time) and config.json."""
        existing = self.read_identity() or {}
        record = dict(identity)
        record["created"] = existing.get("created", time.strftime("%Y-%m-%dT%H:%M:%S"))
        record["launches"] = existing.get("launches", 0) + 1
        for name, data in ((IDENTITY_FILE, record), ("config.json", identity.get("config", {}))):
            write_json_atomic(self.path(name), data)


def write_atomic(path: str, text: str) -> None:
    """Replaces `path` with `text` so that a crash at any moment leaves the old or the new
    file, whole: a temporary file beside it, flushed to disk, renamed over it, and the
    folder entry flushed too (without the fsyncs a power loss can leave an empty file)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_json_atomic(path: str, value: Any, indent: int | None = 2) -> None:
    """`write_atomic` of `value` as JSON (sorted keys, a final newline)."""
    write_atomic(path, json.dumps(value, indent=indent, sort_keys=True) + "\n")


def hold_nodes_lock(root: str) -> int:
    """Called by each node process first: holds the run directory's nodes lock (shared)
    until the process exits, so that a new launch waits for it (`RunDir.lock`). Returns
    the descriptor, which must stay open."""
    fd = os.open(os.path.join(root, _NODES_LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def tail_lines(path: str, lines: int = 20, max_bytes: int = 64 * 1024) -> str:
    """The last `lines` lines of a text file (a node's log), or "" if it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])
