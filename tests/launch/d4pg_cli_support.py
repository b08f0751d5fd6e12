"""Running `replicator launch d4pg` as a real launcher process, and finding its nodes."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import psutil

from tests.launch import d4pg_support as s


def start_cli(run_dir, *args, actors=1, steps=None, extra=()):
    """Starts the CLI in its own process (output in RUN_DIR/../cli.out); returns the Popen."""
    cmd = [sys.executable, "-m", "launch.cli", "launch", "d4pg", "--run-dir", run_dir, *args]
    if steps is not None:
        cmd += [
            "--env",
            s.TASK,
            "--actors",
            str(actors),
            "--steps",
            str(steps),
            "--eval-every",
            "3",
            "--eval-episodes",
            "1",
            "--checkpoint-every",
            "50",
            "--progress-every",
            "2",
            *s.TINY_FLAGS,
        ]
    cmd += list(extra)
    out = open(run_dir.rstrip("/") + ".cli.out", "ab")
    return subprocess.Popen(
        cmd,
        cwd=s.REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": s.REPO},
    )


@contextlib.contextmanager
def running_cli(run_dir, *args, **kwargs):
    """`start_cli` whose process is killed on the way out if the test left it running."""
    proc = start_cli(run_dir, *args, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def cli_output(run_dir):
    with open(run_dir.rstrip("/") + ".cli.out", errors="replace") as f:
        return f.read()


def node_pid(proc, node):
    """Pid of the live process of `node` started by the launcher `proc` (None: none)."""
    pattern = re.compile(rf"/{re.escape(node)}-(\d+)\.spec\.json$")
    found = []
    try:
        children = psutil.Process(proc.pid).children()
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            cmd = child.cmdline()
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
        except psutil.NoSuchProcess:
            continue
        match = pattern.search(cmd[-1]) if cmd else None
        if match:
            found.append((int(match.group(1)), child.pid))
    return max(found)[1] if found else None


def all_node_pids(proc):
    try:
        return [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def actor_steps(run_dir):
    return sum(r.get("actor_steps", 0) for r in s.records(run_dir, kind="count"))


def finish(proc, timeout):
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        time.sleep(20)
        proc.kill()
        raise


def checkpoint_lines(run_dir, start=0, end=None):
    """(before, after) sizes of the replay checkpoints logged in [start, end) of its log."""
    text = s.log_text(run_dir, "replay")[start:end]
    return [
        (int(a), int(b))
        for a, b in re.findall(r"replay checkpoint \((\d+)\.\.(\d+) transitions", text)
    ]


def restored_sizes(run_dir, start=0):
    return [
        int(n)
        for n in re.findall(r"(\d+) transitions restored", s.log_text(run_dir, "replay")[start:])
    ]
