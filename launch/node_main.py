"""Entry point of one node process of the local backend: ``python -m launch.node_main SPEC``.

SPEC is a JSON file the launcher wrote (never a pickle). The process dies with
its launcher: Linux's PR_SET_PDEATHSIG delivers SIGKILL if the launcher dies, even
by ``kill -9``, and a watch thread covers other systems. SIGTERM/SIGINT ask the
node body to return (``ctx.should_stop()``).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
import traceback

from launch.context import FileSink, NodeContext
from launch.program import load_entry_point

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Makes this process end when `parent_pid` (the launcher) ends."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # The launcher died before prctl took effect.
        os._exit(1)

    def watch():
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(1.0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _forward_signals(stop: threading.Event) -> None:
    """Sets `stop` as soon as SIGTERM/SIGINT arrive, even while the main thread is in C code.

    Python runs signal handlers only when the main thread returns to the interpreter;
    the wakeup fd is written by the C-level handler immediately, so a thread reading
    it can flag the stop at once.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: stop.set())
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def reader():
        while True:
            data = os.read(read_fd, 16)
            if any(b in (signal.SIGTERM, signal.SIGINT) for b in data):
                stop.set()

    threading.Thread(target=reader, name="signal-reader", daemon=True).start()


def _publish_to(path: str):
    lock = threading.Lock()
    values: dict = {}

    def publish(key, value):
        with lock:
            values[key] = value
            tmp = f"{path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(values, f)
            os.replace(tmp, path)

    return publish


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    die_with_parent(spec["parent_pid"])
    stop = threading.Event()
    _forward_signals(stop)
    ctx = NodeContext(
        spec["name"],
        spec["run_dir"],
        attempt=spec["attempt"],
        advertise_host=spec["advertise_host"],
        stop_event=stop,
        metrics_sink=FileSink(spec["metrics_path"]),
        publish_sink=_publish_to(spec["publish_path"]),
    )
    code = 0
    try:
        fn = load_entry_point(spec["entry_point"])
        fn(ctx, **spec["kwargs"])
    except BaseException:  # pylint: disable=broad-except
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: library threads (gRPC, TF) can hang it for minutes.
    os._exit(code)


if __name__ == "__main__":
    main()
