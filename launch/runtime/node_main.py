"""Entry point of one node process of the local backend:
``python -m launch.runtime.node_main SPEC``.

SPEC is a JSON file the launcher wrote (never a pickle). SIGTERM, SIGINT and SIGHUP
ask the node body to return (``ctx.should_stop()``), so it can save its state.

The process ends with its launcher, and saves first: Linux's PR_SET_PDEATHSIG delivers
SIGTERM when the launcher dies, even by ``kill -9``, and a watch thread (which also
covers other systems) then gives the body the node's stop timeout to return before
it ends the process itself, so no node outlives its launcher by more than that.

Exit status: 0 the body returned, 1 it raised, 3 it raised an error a restart cannot
cure (`launch.runtime.errors.is_deterministic`: import errors, bad arguments or config).
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
from collections.abc import Callable

from launch.runtime.context import FileSink, NodeContext
from launch.runtime.errors import EXIT_NODE_STARTUP_ERROR, is_deterministic
from launch.runtime.program import check_arguments, load_entry_point
from launch.runtime.run_dir import hold_nodes_lock, write_json_atomic

_PR_SET_PDEATHSIG = 1
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def die_with_parent(
    parent_pid: int, stop: threading.Event, stop_timeout: Callable[[], float]
) -> None:
    """Stops this node when `parent_pid` (the launcher) ends, and exits `stop_timeout()`
    seconds later (read then: the node may have asked for more since it started).

    The stop request lets the body save (a learner checkpoint, the replay tables); the
    deadline guarantees that no node is left running without a launcher.
    """
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # The launcher died before prctl took effect.
        os._exit(1)

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        seconds = stop_timeout()
        print(
            f"[node] the launcher (pid {parent_pid}) is gone: stopping, "
            f"{seconds:g}s to save and exit",
            file=sys.stderr,
            flush=True,
        )
        stop.set()
        time.sleep(seconds)
        print("[node] still running at the stop deadline; exiting", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _forward_signals(stop: threading.Event) -> None:
    """Sets `stop` as soon as SIGTERM/SIGINT/SIGHUP arrive, even while the main thread is in C code.

    Python runs signal handlers only when the main thread returns to the interpreter;
    the wakeup fd is written by the C-level handler immediately, so a thread reading
    it can flag the stop at once.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for s in _STOP_SIGNALS:
        signal.signal(s, lambda *_: stop.set())
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def reader():
        while True:
            data = os.read(read_fd, 16)
            for number in data:
                if number in _STOP_SIGNALS and not stop.is_set():
                    stop.set()
                    name = signal.Signals(number).name
                    os.write(2, f"[node] {name} received: stopping\n".encode())

    threading.Thread(target=reader, name="signal-reader", daemon=True).start()


def returned_marker(publish_path: str) -> str:
    """The file a node process writes once its body returned normally."""
    return publish_path + ".returned"


def _publish_to(path: str):
    lock = threading.Lock()
    values: dict = {}

    def publish(key, value):
        with lock:
            values[key] = value
            write_json_atomic(path, values, indent=None)

    return publish


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    # First: a new launch on this run directory waits until this process has exited.
    nodes_lock = hold_nodes_lock(spec["run_dir"])  # noqa: F841 (held until os._exit)
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
    timeout = float(spec.get("stop_timeout", 10.0))
    die_with_parent(spec["parent_pid"], stop, lambda: max(timeout, ctx.stop_time_needed))
    code = 0
    try:
        fn = load_entry_point(spec["entry_point"])
        check_arguments(fn, ctx, spec["kwargs"])
        fn(ctx, **spec["kwargs"])
    except BaseException as e:  # pylint: disable=broad-except
        traceback.print_exc()
        code = EXIT_NODE_STARTUP_ERROR if is_deterministic(e) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0:
        # Tells the launcher the body really returned: a native library that calls
        # exit(0) mid-run (seen with OpenBLAS when threads run out) must count as a crash.
        with open(returned_marker(spec["publish_path"]), "w", encoding="utf-8") as f:
            f.write("returned\n")
    # Skip interpreter teardown: library threads (gRPC, TF) can hang it for minutes.
    os._exit(code)


if __name__ == "__main__":
    main()
