"""Telling, on a Ray cluster, that its head (the GCS) is gone while there is time to save.

Without GCS fault tolerance (an external Redis), Ray ends every raylet, worker and
driver that cannot reach the GCS for ``gcs_rpc_server_reconnect_timeout_s`` (60 s by
default): the nodes of a run would die mid-step, without a final save, and the
launcher with Ray's own fatal log. Calls between a driver and its actors go straight
from process to process, so in that minute the launcher can still ask every node to
stop, and a node can still stop and save by itself (when the launcher was on the lost
head machine, it is gone too).

`HeadWatch` checks the GCS's TCP port each second. A connection is answered by the
kernel of the GCS's machine, not by the GCS's threads, so a loaded machine does not
look like a lost head: the port is refused once the GCS process is gone, and the
connection times out once its machine is gone.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

# Seconds without an answer from the GCS after which the head counts as lost: long
# enough to ride out a brief network loss, short next to the 60 s Ray leaves everything.
HEAD_GRACE_S = 5.0
PROBE_INTERVAL_S = 1.0
PROBE_TIMEOUT_S = 2.0
# Ray's default `gcs_rpc_server_reconnect_timeout_s`: what the messages promise.
RAY_GCS_RECONNECT_TIMEOUT_S = 60
# What a node actor's `run` returns when it stopped because the head was lost: the
# launcher may hear it before its own watch fires, and must not restart the node.
STOPPED_FOR_HEAD_LOSS = "stopped: the Ray head is lost"


def tcp_connect_error(address: str, timeout: float) -> OSError | None:
    """Why nothing accepts a TCP connection at `address` (``HOST:PORT``); None if it does."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except OSError as e:
        return e
    except ValueError as e:  # Not a port number.
        return OSError(str(e))


def gcs_answers(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """Whether something accepts a TCP connection at `address` (``HOST:PORT``)."""
    return tcp_connect_error(address, timeout) is None


def current_gcs_address() -> str | None:
    """The GCS address of the Ray cluster this process is connected to (None if unknown)."""
    import ray  # pylint: disable=import-outside-toplevel

    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # pylint: disable=broad-except
        return None


class HeadWatch:
    """A thread that calls `on_lost(silence)` once, when the GCS has not answered for `grace` s.

    Args:
      address: The GCS's ``HOST:PORT``.
      on_lost: Called once (in the watch thread) with the seconds since the last answer.
      grace: Seconds without an answer before the head counts as lost.
      interval: Seconds between two checks.
    """

    def __init__(
        self,
        address: str,
        on_lost: Callable[[float], None],
        *,
        grace: float = HEAD_GRACE_S,
        interval: float = PROBE_INTERVAL_S,
    ):
        self.address = address
        self._on_lost = on_lost
        self._grace = grace
        self._interval = interval
        self._closed = threading.Event()
        threading.Thread(target=self._run, name="ray-head-watch", daemon=True).start()

    def _run(self) -> None:
        last_answer = time.monotonic()
        while not self._closed.wait(self._interval):
            if gcs_answers(self.address):
                last_answer = time.monotonic()
                continue
            silence = time.monotonic() - last_answer
            if silence >= self._grace:
                self._on_lost(silence)
                return

    def close(self) -> None:
        self._closed.set()


def head_lost_message(address: str, silence: float) -> str:
    """One line for the launcher's console and the nodes' logs."""
    return (
        f"the Ray head is unreachable (its GCS at {address} has not answered for "
        f"{silence:.0f}s); Ray ends every process of the cluster "
        f"{RAY_GCS_RECONNECT_TIMEOUT_S}s after losing it, so every node stops now and saves"
    )
