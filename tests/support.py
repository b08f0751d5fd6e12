"""Helpers shared by tests: free loopback ports and bounded subprocesses."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def python_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python: repo importable, quiet TensorFlow."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.update(extra)
    return env


def run_python(
    code: str, *args: str, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (fresh TensorFlow devices); raises on failure."""
    result = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=python_env(**env),
        cwd=REPO_ROOT,
    )
    if result.returncode != 0:
        raise AssertionError(
            f"child exited {result.returncode}\nstdout:\n{result.stdout[-4000:]}\n"
            f"stderr:\n{result.stderr[-4000:]}"
        )
    return result
