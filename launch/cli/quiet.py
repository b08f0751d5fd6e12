"""A quiet console: C++ log lines (TensorFlow, XLA, CUDA plugins, Reverb) go to a log file.

TensorFlow, XLA and Reverb log from C++ straight to file descriptor 2, whatever Python's
`sys.stderr` is, and some of their lines (the CUDA plugin registrations, Reverb's
"[reverb/cc/...]" lines) ignore TF_CPP_MIN_LOG_LEVEL. So `replicator` points descriptor 2
at a log file and gives Python's `sys.stderr` a duplicate of the real terminal: the CLI's
own messages still reach the console, the C++ lines do not. `replicator --verbose` skips
all this (and lowers TF_CPP_MIN_LOG_LEVEL to 0) so everything is shown.

Node processes of the local backend already write to RUN/logs/NODE.log; the launcher's
own C++ lines go to RUN/logs/launcher.log once the run directory is known (`move_to`),
other commands' to ``$TMPDIR/replicator-UID/COMMAND.log`` (`default_log_path`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator

_state: dict[str, object] = {}


def default_log_path(command: str) -> str:
    """``$TMPDIR/replicator-UID/COMMAND.log``, in a folder only this user can enter.

    The system temp folder is shared: a fixed file name there would let another local
    user pre-create it (and make every launch fail, or read its lines). A folder that is
    not this user's own, private one is never used; a new private one is made instead.
    """
    folder = os.path.join(tempfile.gettempdir(), f"replicator-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError:
        folder = tempfile.mkdtemp(prefix="replicator-")
    info = os.lstat(folder)
    if not (stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()) or (
        stat.S_IMODE(info.st_mode) & 0o077
    ):
        folder = tempfile.mkdtemp(prefix="replicator-")  # Private (0700), never shared.
    return os.path.join(folder, f"{command or 'cli'}.log")


@contextlib.contextmanager
def console(verbose: bool, command: str) -> Iterator[None]:
    """Within the block, C++ logging goes to a file unless `verbose`.

    Does nothing when `sys.stderr` is not descriptor 2 (e.g. under pytest's capture),
    because then Python's stream and the C++ stream are already apart.
    """
    if verbose:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        yield
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Python-side TensorFlow and absl warnings are for the node logs too.
    for name in ("tensorflow", "absl", "jax"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        on_fd2 = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):
        on_fd2 = False
    if not on_fd2:
        yield
        return
    sys.stderr.flush()
    terminal = os.dup(2)
    path = default_log_path(command)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.dup2(log, 2)
    os.close(log)
    saved_stderr = sys.stderr
    sys.stderr = os.fdopen(os.dup(terminal), "w", buffering=1, encoding="utf-8", errors="replace")
    _state.update(path=path)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr.close()
        sys.stderr = saved_stderr
        os.dup2(terminal, 2)
        os.close(terminal)
        _state.clear()


def move_to(path: str) -> None:
    """Sends further C++ log lines to `path` (appending what was logged so far)."""
    current = _state.get("path")
    if current is None:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "ab") as dest, open(str(current), "rb") as src:
        shutil.copyfileobj(src, dest)
    log = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 2)
    os.close(log)
    _state["path"] = path


def log_path() -> str | None:
    """Where C++ log lines currently go (None: the console)."""
    path = _state.get("path")
    return str(path) if path else None
