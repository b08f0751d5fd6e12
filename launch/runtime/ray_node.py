"""The Ray actor that hosts one node body for the `ray` backend (`launch.runtime.ray_backend`).

A threaded actor: one thread runs the body (`run`), the others answer the launcher
(`stop`, `drain` of the buffered metrics, logs and published values, `heartbeat`).
A detached actor also watches its launcher (`launch.runtime.ray_heartbeat`) and, once
the launcher is gone, stops, saves and ends itself. Every node actor watches the Ray
head (`launch.runtime.ray_head_watch`) and, once it is lost, stops and saves before Ray
ends its process.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from launch.runtime.context import FileSink, NodeContext
from launch.runtime.learner_group import reserve_ports
from launch.runtime.program import GROUP_ADDRESSES, check_arguments, load_entry_point
from launch.runtime.ray_head_watch import (
    STOPPED_FOR_HEAD_LOSS,
    HeadWatch,
    current_gcs_address,
    head_lost_message,
)
from launch.runtime.ray_heartbeat import LauncherWatch, launcher_job_alive
from launch.runtime.run_dir import RunDir, hold_nodes_lock


class RayNode:
    """The Ray actor that hosts one node body (a threaded actor: run + stop/drain).

    Args:
      grace: When positive (a detached actor), the seconds without a heartbeat from the
        launcher after which the node takes it for dead, stops, saves and ends its
        actor (`launch.runtime.ray_heartbeat`).
    """

    def __init__(self, grace: float = 0.0):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._metrics: list[str] = []
        self._logs: list[str] = []
        self._published: dict[str, Any] = {}
        # The last payload `drain` handed over: the launcher writes it at its next tick,
        # so a launcher killed in between never wrote it (see `_launcher_gone`).
        self._unacked: dict[str, list[str]] = {"metrics": [], "logs": []}
        self._files: dict[str, FileSink] | None = None  # Set once the launcher is gone.
        self._spec: dict[str, Any] | None = None
        self._ctx: NodeContext | None = None
        self._body_done = threading.Event()
        self._nodes_lock: int | None = None
        self._head_watch: HeadWatch | None = None
        self._stopped_for_head_loss = threading.Event()
        self._watch = (
            LauncherWatch(grace, self._launcher_gone, launcher_job_alive) if grace > 0 else None
        )

    def _append(self, buffer: str) -> Callable[[str], None]:
        # By attribute name: `drain` swaps the lists, so a captured list would go stale.
        def sink(line: str) -> None:
            with self._lock:
                if self._files is not None:
                    self._files[buffer](line)
                else:
                    getattr(self, buffer).append(line)

        return sink

    def heartbeat(self) -> None:
        """The launcher is alive (`launch.runtime.ray_heartbeat.Heartbeat`)."""
        if self._watch is not None:
            self._watch.beat()

    def _launcher_gone(self, silence: float) -> None:
        """What a local node does when its launcher dies: stop, save, exit by the deadline.

        From then on the node writes its metrics and logs to the run directory itself
        (shared storage on a cluster, as for checkpoints), starting with what the dead
        launcher had not written: its last drain and what was buffered since. Records
        the launcher did write come again; readers count each (src, seq) once.
        """
        with self._lock:
            spec = self._spec
            if spec is not None:
                run_dir = RunDir(spec["run_dir"])
                self._files = {
                    "_metrics": FileSink(run_dir.metrics_path(spec["name"])),
                    "_logs": FileSink(run_dir.log_path(spec["name"])),
                }
                for key, buffer in (("metrics", "_metrics"), ("logs", "_logs")):
                    for line in self._unacked[key] + getattr(self, buffer):
                        self._files[buffer](line)
                    setattr(self, buffer, [])
        if spec is not None and not self._body_done.is_set():
            ctx = self._ctx
            timeout = max(float(spec["stop_timeout"]), ctx.stop_time_needed if ctx else 0.0)
            self._files["_logs"](
                f"{time.strftime('%H:%M:%S')} [{spec['name']}] the launcher is gone (no heartbeat "
                f"for {silence:.0f}s, and Ray does not report its job alive): stopping, "
                f"{timeout:g}s to save and exit"
            )
            self._stop.set()
            if not self._body_done.wait(timeout):
                self._files["_logs"](
                    f"{time.strftime('%H:%M:%S')} [{spec['name']}] still running at the stop "
                    "deadline; exiting"
                )
        self._end_actor()

    @staticmethod
    def _end_actor() -> None:
        """Ends this (detached) actor for good: Ray would otherwise keep it for ever."""
        import ray  # pylint: disable=import-outside-toplevel

        try:
            ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
        except Exception:  # pylint: disable=broad-except
            pass
        time.sleep(10)  # The kill ends this process; if Ray could not, exit by hand.
        os._exit(1)

    def _publish(self, key: str, value: Any) -> None:
        with self._lock:
            self._published[key] = value

    def reserve_port(self, advertise_host: str | None) -> str:
        """A ``host:port`` free on the Ray node this actor runs on (for a node group)."""
        import ray  # pylint: disable=import-outside-toplevel

        host = advertise_host or ray.util.get_node_ip_address()
        return reserve_ports(host, 1)[0]

    def node_id(self) -> str:
        """The id of the Ray node this actor runs on."""
        import ray  # pylint: disable=import-outside-toplevel

        return ray.get_runtime_context().get_node_id()

    def run(self, spec_json: str, *group_addresses: str) -> str:
        import ray  # pylint: disable=import-outside-toplevel

        spec = json.loads(spec_json)
        with self._lock:
            self._spec = spec
        try:
            # Like a local node process: a new launch on this run directory waits until
            # this node has exited (`RunDir.lock`); released when the actor's process ends.
            self._nodes_lock = hold_nodes_lock(spec["run_dir"])
        except OSError as e:  # A shared file system without locks: the relaunch won't wait.
            self._append("_logs")(f"cannot hold the run directory's nodes lock ({e})")
        if not spec.get("gpus"):
            # Ray 2.x leaves CUDA_VISIBLE_DEVICES alone for an actor that asked for no GPU:
            # TensorFlow would then take every GPU of the machine (set before TF loads).
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
        if group_addresses:
            spec["kwargs"][GROUP_ADDRESSES] = list(group_addresses)
        host = spec["advertise_host"] or ray.util.get_node_ip_address()
        ctx = NodeContext(
            spec["name"],
            spec["run_dir"],
            attempt=spec["attempt"],
            advertise_host=host,
            stop_event=self._stop,
            metrics_sink=self._append("_metrics"),
            log_sink=self._append("_logs"),
            publish_sink=self._publish,
        )
        node_id = ray.get_runtime_context().get_node_id()
        self._ctx = ctx
        ctx.log(f"running on {host} (Ray node {node_id}, pid {os.getpid()})")
        gcs = current_gcs_address()
        if gcs:
            self._head_watch = HeadWatch(gcs, self._head_lost)
        try:
            fn = load_entry_point(spec["entry_point"])
            check_arguments(fn, ctx, spec["kwargs"])
            fn(ctx, **spec["kwargs"])
        finally:
            self._body_done.set()
            if self._head_watch is not None:
                self._head_watch.close()
        return STOPPED_FOR_HEAD_LOSS if self._stopped_for_head_loss.is_set() else "ok"

    def _head_lost(self, silence: float) -> None:
        """The Ray head is gone: Ray will end this process within a minute, so stop and save.

        The body returns as after a stop request (learner and replay write their final
        checkpoints), and `run` says why (`STOPPED_FOR_HEAD_LOSS`), so that a launcher
        whose own watch has not fired yet restarts nothing. Nothing here calls the GCS,
        which would block.
        """
        if self._ctx is not None and self._head_watch is not None:
            self._ctx.log(head_lost_message(self._head_watch.address, silence))
        self._stopped_for_head_loss.set()
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()

    def drain(self) -> str:
        with self._lock:
            out = {"metrics": self._metrics, "logs": self._logs, "published": dict(self._published)}
            self._unacked = {"metrics": self._metrics, "logs": self._logs}
            self._metrics, self._logs = [], []
        return json.dumps(out)

    def ack_drained(self) -> None:
        """The launcher wrote what the last `drain` handed over: a later `_launcher_gone`
        must not write it again (after a stop, its detached actor may outlive the launcher
        when Ray cannot kill it, e.g. with the head lost)."""
        with self._lock:
            self._unacked = {"metrics": [], "logs": []}

    def pid(self) -> int:
        return os.getpid()
