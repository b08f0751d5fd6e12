"""A learner that spans K processes: one `MultiWorkerMirroredStrategy` over a node group.

The launcher starts the K learner nodes of a program as one *group* (see
`launch.runtime.program.Node.group`): together, restarted together, and each told every
member's address (``group_addresses``: one ``host:port`` per member, reserved by the
backend on the host that member runs on). Worker 0 is the chief.

What this module adds on top of `replication.make("multiworker", ...)`:

- `make_replicator`: a worker's Replicator from its local spec (``cpu``, ``gpu``,
  ``gpu:N``) and the group addresses. TensorFlow 2.15's MultiWorkerMirroredStrategy
  uses ALL local GPUs of a worker, or exactly one CPU device when there is none
  (logical CPU devices are ignored), so the local spec only says which; the backend
  decides which GPUs a worker sees (``CUDA_VISIBLE_DEVICES`` / Ray ``num_gpus``).
- `GroupStop`: workers run their updates in lockstep, so they must also stop at the
  same update: a worker leaving while a peer waits in an all-reduce leaves the peer
  hanging. Every `every` updates the workers all-reduce their stop flags.

Nothing here knows D4PG: `launch.d4pg.nodes` uses it for the D4PG learner.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Sequence

# No per-collective timeout: in TensorFlow 2.15 a collective with a timeout schedules its
# timeout check on a new OS thread that sleeps for the whole timeout, so a learner doing
# tens of all-reduces a second piles up thousands of threads and aborts
# (std::system_error in CollectiveExecutor::CompleteParamsAsync) within minutes. A dead
# peer still surfaces: its gRPC connection fails (or the coordination service's
# heartbeat does), and the supervisor restarts the whole group anyway.
COLLECTIVE_TIMEOUT_S = None

# Updates between two stop agreements of a group (one scalar all-reduce each).
STOP_CHECK_EVERY = 10


def reserve_ports(host: str, count: int) -> list[str]:
    """`count` distinct ``host:port`` addresses whose ports were free on `host` a moment ago.

    The sockets are held until all ports are chosen (so they are distinct), then closed
    for TensorFlow's gRPC servers to bind; a port taken in between fails the worker's
    start, and the supervisor restarts the group on fresh ports.
    """
    bind = "127.0.0.1" if host == "localhost" else host
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET6 if ":" in bind else socket.AF_INET)
            sock.bind((bind, 0))
            sockets.append(sock)
        return [f"{_url_host(host)}:{s.getsockname()[1]}" for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def check_local_spec(spec: str, workers: int) -> str | None:
    """Why `spec` cannot be each worker's local spec in a group of `workers` (None: it can)."""
    if workers <= 1:
        return None
    if spec in ("cpu", "gpu") or (spec.startswith("gpu:") and spec[4:].isdigit()):
        return None
    if spec.startswith("cpu:"):
        return (
            f"--learner-replicas {spec} cannot be used with --learner-workers {workers}: "
            "TensorFlow's multi-worker strategy uses one CPU device per worker (logical CPU "
            f"devices are ignored). Use --learner-replicas cpu ({workers} workers x 1 replica) "
            f"or gpu, or --learner-workers 1 with {spec}."
        )
    return (
        f"--learner-replicas {spec} cannot be used with --learner-workers {workers}; "
        "each learner worker takes cpu, gpu or gpu:N."
    )


def make_replicator(
    spec: str,
    group_addresses: Sequence[str] | None = None,
    index: int = 0,
    collective_timeout: float | None = COLLECTIVE_TIMEOUT_S,
):
    """This worker's Replicator: `spec` alone, or one multi-worker strategy over the group.

    Must be called before any other TensorFlow operation in the process (`cpu:N`
    creates logical devices, and the multi-worker strategy configures the runtime).
    """
    import replication  # pylint: disable=import-outside-toplevel

    if not group_addresses or len(group_addresses) == 1:
        return replication.make(spec)
    reason = check_local_spec(spec, len(group_addresses))
    if reason:
        raise ValueError(reason)
    saved = _python_signal_handlers()
    repl = replication.make(
        "multiworker",
        workers=list(group_addresses),
        task_index=index,
        collective_timeout=collective_timeout,
    )
    _reinstall(saved)
    return repl


def _python_signal_handlers() -> dict:
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}


def _reinstall(handlers: dict) -> None:
    """Gives SIGTERM/SIGINT back to the process's own (Python) handlers.

    TensorFlow's multi-worker runtime installs a C-level SIGTERM handler (its
    preemption notifier) that replaces Python's, so a stop request would no longer
    reach the node: the launcher would have to kill the learner, losing its final
    checkpoint. Python can only set handlers from the main thread (node processes
    run their body there; a Ray actor is stopped through a method call instead).
    """
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, handler in handlers.items():
        if handler is not None:
            signal.signal(signum, handler)


class GroupStop:
    """Makes the workers of a group agree to stop at the same update.

    Call `should_stop(flag, step)` before every learner call; at every `every`-th call
    (the same calls on every worker, since they update in lockstep) the workers all-reduce
    their flags and all get True if any wants to stop. With one worker it is `flag`.
    """

    def __init__(self, replicator, every: int = STOP_CHECK_EVERY):
        self._every = every
        self._calls = 0
        self._multi = replicator.num_replicas > 1 and replicator.deployment.kind == "multiworker"
        self._any = None
        if self._multi:
            import tensorflow as tf  # pylint: disable=import-outside-toplevel

            import replication  # pylint: disable=import-outside-toplevel

            @tf.function
            def any_flag(flag):
                per_replica = replicator.run(lambda f: replication.all_reduce(f, "max"), flag)
                return replicator.local_results(per_replica)[0]

            self._any = any_flag
            self._tf = tf

    def should_stop(self, flag: bool, step: int) -> bool:
        if not self._multi:
            return flag
        # Counted in calls, not in `step`: a learner call may run several updates
        # (`updates_per_call`), so the step need not pass through multiples of `every`.
        del step
        self._calls += 1
        if (self._calls - 1) % self._every:
            return False
        # A tensor argument: a Python float would trace a second function (new collective
        # keys) when the flag changes on one worker only, and the workers would not meet.
        return bool(self._any(self._tf.constant(1.0 if flag else 0.0)) > 0.5)
