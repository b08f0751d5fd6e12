"""The Ray actor that hosts one node body for the `ray` backend (`launch.runtime.ray_backend`).

A threaded actor: one thread runs the body (`run`), the others answer the launcher
(`stop`, and `drain` of the buffered metrics, logs and published values).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from typing import Any

from launch.runtime.context import NodeContext
from launch.runtime.learner_group import reserve_ports
from launch.runtime.program import GROUP_ADDRESSES, check_arguments, load_entry_point


class RayNode:
    """The Ray actor that hosts one node body (a threaded actor: run + stop/drain)."""

    def __init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._metrics: list[str] = []
        self._logs: list[str] = []
        self._published: dict[str, Any] = {}

    def _append(self, buffer: str) -> Callable[[str], None]:
        # By attribute name: `drain` swaps the lists, so a captured list would go stale.
        def sink(line: str) -> None:
            with self._lock:
                getattr(self, buffer).append(line)

        return sink

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
        ctx.log(f"running on {host} (Ray node {node_id}, pid {os.getpid()})")
        fn = load_entry_point(spec["entry_point"])
        check_arguments(fn, ctx, spec["kwargs"])
        fn(ctx, **spec["kwargs"])
        return "ok"

    def stop(self) -> None:
        self._stop.set()

    def drain(self) -> str:
        with self._lock:
            out = {"metrics": self._metrics, "logs": self._logs, "published": dict(self._published)}
            self._metrics, self._logs = [], []
        return json.dumps(out)

    def pid(self) -> int:
        return os.getpid()
