"""Ray node actors that outlive their launcher just long enough to save.

A Ray actor dies with the driver that owns it, so a killed launcher (``kill -9``, the
OOM killer) would take every node with it, without a final save. When the launcher
connects to an existing cluster, the backend therefore makes each node actor
*detached* (it outlives its driver) and keeps it on a leash instead: the launcher
sends every live node actor a heartbeat each second (`Heartbeat`), and a node that
hears none for `GRACE_S` seconds (`LauncherWatch`) does what a node of the local
backend does when its launcher dies (`launch.runtime.node_main.die_with_parent`):
it stops its body, which saves, gives it the node's stop timeout, then ends its own
actor, so that no detached actor is ever left behind. A silence alone is not enough:
the node also asks the cluster whether the launcher's Ray job is still alive
(`launcher_job_alive`), so heartbeats delayed by a loaded machine stop nothing.

A private Ray instance that the launcher starts itself (no ``--ray-address``) ends
with the launcher (Ray ties its raylet and GCS to the driver's life), so detached
actors could not help there: those nodes still end at once with a killed launcher.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

from launch.runtime.ray_head_watch import current_gcs_address, gcs_answers

# Silence after which a node asks whether its launcher is dead (`LauncherWatch`):
# longer than most delays on a loaded machine (each costs one look-up in the cluster's
# job table), short next to the stop timeouts that follow it.
GRACE_S = 10.0
INTERVAL_S = 1.0
# Ray namespace of the detached node actors (`ray list actors` shows their names).
NAMESPACE = "tf-replicator"


class Heartbeat:
    """A launcher thread that calls ``heartbeat()`` on every live node actor each second.

    A thread of its own, not the supervisor's loop: that loop may spend a long time
    in one phase of a shutdown while the nodes of later phases wait, and those must
    not take the wait for the launcher's death.

    Args:
      actors: Returns the node actors to keep alive (called each beat).
      interval: Seconds between beats.
    """

    def __init__(self, actors: Callable[[], Iterable], interval: float = INTERVAL_S):
        self._actors = actors
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ray-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            for actor in self._actors():
                try:
                    actor.heartbeat.remote()  # Fire and forget: nothing waits on it.
                except Exception:  # pylint: disable=broad-except
                    pass  # A dead actor: the supervisor hears of it through its run call.

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class LauncherWatch:
    """In a node actor: calls `on_gone(silence)` once the launcher is gone.

    Gone means no heartbeat for `grace` seconds and `launcher_alive()` not True. The
    second check keeps a node running when its heartbeats are merely late: on a
    loaded machine a node can hear none for longer than the grace (14 s once, while it
    was loading TensorFlow under a load average of 23 on 2 cores) though its launcher
    lives. The clock starts when the actor is created, so an actor whose
    launcher died before its first beat goes too.

    Args:
      grace: Seconds without a heartbeat before `launcher_alive` is asked.
      on_gone: What to do once the launcher is gone (called once, in the watch thread).
      launcher_alive: True while the launcher is known to live (False or None: dead,
        or unknown); asked only after a silence.
    """

    def __init__(
        self,
        grace: float,
        on_gone: Callable[[float], None],
        launcher_alive: Callable[[], bool | None] = lambda: None,
    ):
        self._grace = grace
        self._on_gone = on_gone
        self._launcher_alive = launcher_alive
        self._last = time.monotonic()
        threading.Thread(target=self._run, name="launcher-watch", daemon=True).start()

    def beat(self) -> None:
        self._last = time.monotonic()

    def _run(self) -> None:
        while True:
            silence = time.monotonic() - self._last
            if silence < self._grace:
                time.sleep(min(0.5, self._grace - silence))
            elif self._launcher_alive() is True:
                self._last = time.monotonic()  # Late, not gone: a full grace again.
            else:
                break
        self._on_gone(silence)


def launcher_job_alive() -> bool | None:
    """In a node actor: whether the Ray job of the driver that created it (the launcher)
    is alive, as the cluster's GCS says; None when that cannot be told.

    The GCS marks a driver's job dead as soon as the driver's process ends (its raylet
    sees the connection close), so this tells a late heartbeat from a dead launcher.
    `ray._private.state.jobs` is Ray's job table (private API, present in Ray 2.x);
    on any error the answer is None and the silence alone decides. With the head lost,
    that look-up would block on Ray's reconnection, so an unreachable GCS answers None
    at once (`launch.runtime.ray_head_watch`).
    """
    import ray  # pylint: disable=import-outside-toplevel

    gcs = current_gcs_address()
    if gcs is None or not gcs_answers(gcs):
        return None
    try:
        job = ray.get_runtime_context().get_job_id()
        for entry in ray._private.state.jobs():  # pylint: disable=protected-access
            if entry["JobID"] == job:
                return not entry["IsDead"]
    except Exception:  # pylint: disable=broad-except
        return None
    return None
