"""The `ray` backend: every node a Ray Core actor, on one machine or a Ray cluster.

Connect to a cluster with ``address`` (``ray start --head --port=6379`` on one
machine, ``ray start --address=HEAD:6379`` on the others), or start a private
local Ray instance when no address is given. Each node becomes an actor with the
node's resource request; the launcher (the Ray driver) polls it for metrics, logs
and published values (JSON strings) and writes them to the run directory, so the
progress line and metrics.csv work the same as with the local backend.

Servers advertise the IP of the Ray node they run on; node groups (a multi-worker
learner) reserve one port per member on the member's own Ray node before it runs;
cluster-wide checks (addresses, placement) and the shipped code are in
`launch.runtime.ray_cluster`.

Checkpoints and TensorBoard files are written by the nodes themselves at the run
directory's path: on a multi-machine cluster that path must be shared storage
(NFS or similar) mounted at the same place on every machine.

A killed launcher: on a cluster given by ``address`` the node actors are detached
and watch the launcher's heartbeat, so they save and end their actors
(`launch.runtime.ray_heartbeat`); a private local instance ends with the launcher,
its nodes too, without a final save (`RayBackend.startup_note` says so).

A lost Ray head (its GCS): Ray ends every process of the cluster a minute later, so
the launcher and every node watch the GCS (`launch.runtime.ray_head_watch`); once it
is lost, the nodes stop and save, and the launcher restarts nothing and says so
(`RayBackend.fatal_condition`).
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from launch.runtime import ray_head_watch
from launch.runtime.context import FileSink
from launch.runtime.errors import LaunchError, is_deterministic
from launch.runtime.program import Node, Program
from launch.runtime.ray_cluster import check_cluster, check_dependencies, code_runtime_env
from launch.runtime.ray_head_watch import (
    STOPPED_FOR_HEAD_LOSS,
    HeadWatch,
    current_gcs_address,
    head_lost_message,
    tcp_connect_error,
)
from launch.runtime.ray_heartbeat import GRACE_S, NAMESPACE, Heartbeat
from launch.runtime.ray_node import RayNode
from launch.runtime.run_dir import RunDir, tail_lines
from launch.runtime.supervisor import Exit


def import_ray(loopback: bool = False):
    """Imports Ray; `loopback` keeps a private local instance on 127.0.0.1.

    Ray reads that setting when it is imported, so this must be the first `import ray`.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if loopback:
        # Ray would otherwise pick the machine's IP for a local instance.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray  # pylint: disable=import-outside-toplevel
    except ImportError:
        raise LaunchError(
            "the ray backend needs Ray, which is not installed in this environment. Install it "
            "with `pip install 'tf-replicator[ray]'` (or `pip install 'ray[default]>=2.9,<3'`), "
            "or use --backend local."
        ) from None
    return ray


def _check_reachable(address: str) -> None:
    """Fails fast with a clear message instead of Ray's long connection retries."""
    if address == "auto":
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise LaunchError(
            f"--ray-address {address!r} should look like HOST:PORT "
            "(e.g. 127.0.0.1:6379, as printed by `ray start --head`)."
        )
    error = tcp_connect_error(address, timeout=5)
    if error is not None:
        raise LaunchError(
            f"cannot reach a Ray cluster at {address} ({error.strerror or error}). Start one "
            f"with `ray start --head --port={port}` on that machine, check the address, or "
            "omit --ray-address to start a local Ray instance.",
            exit_code=1,
        )


class RayHandle:
    """One node actor and its `run` call."""

    def __init__(
        self,
        ray,
        actor,
        run_ref,
        node: Node,
        run_dir: RunDir,
        on_head_lost: Callable[[], None] = lambda: None,
    ):
        self._ray = ray
        self._on_head_lost = on_head_lost
        self.actor = actor
        self._run_ref = run_ref
        self._node = node
        self._log_path = run_dir.log_path(node.name)
        self._metrics_sink = FileSink(run_dir.metrics_path(node.name))
        self._log_sink = FileSink(self._log_path)
        self._published: dict[str, Any] = {}
        self._pending_drain = None
        self._exit: Exit | None = None
        self._started = time.monotonic()
        self._warned_pending = False

    def _consume(self, payload: str) -> None:
        data = json.loads(payload)
        for line in data["metrics"]:
            self._metrics_sink(line)
        for line in data["logs"]:
            self._log_sink(line)
        self._published.update(data["published"])

    def poll(self) -> Exit | None:
        if self._exit is not None:
            return self._exit
        ready, _ = self._ray.wait([self._run_ref], timeout=0)
        if not ready:
            return None
        try:
            if self._ray.get(self._run_ref) == STOPPED_FOR_HEAD_LOSS:
                self._on_head_lost()  # Before the supervisor judges this exit.
            exit_ = Exit(True)
        except self._ray.exceptions.RayActorError as e:
            exit_ = Exit(False, f"its Ray actor died: {str(e).splitlines()[0]}")
        except self._ray.exceptions.RayTaskError as e:
            self._log_sink(str(e))
            cause = e.cause if getattr(e, "cause", None) is not None else e
            exit_ = Exit(
                False,
                f"{type(cause).__name__}: {str(cause).splitlines()[-1][:200]}",
                deterministic=is_deterministic(cause),
            )
        self._final_drain()
        self._exit = exit_
        return exit_

    def _final_drain(self) -> None:
        # The drain in flight holds lines the actor already handed over: consumed first,
        # then what the body wrote since (every record once, in order).
        pending, self._pending_drain = self._pending_drain, None
        for ref in ([pending] if pending is not None else []) + [self.actor.drain.remote()]:
            try:
                self._consume(self._ray.get(ref, timeout=10))
            except Exception:  # pylint: disable=broad-except
                pass  # A dead actor's buffered lines are lost; its failure is reported anyway.
        try:
            self._ray.get(self.actor.ack_drained.remote(), timeout=10)
        except Exception:  # pylint: disable=broad-except
            pass  # A dead actor writes nothing again.
        self._ray.kill(self.actor)  # Frees its resources; a no-op if it is already dead.

    def request_stop(self) -> None:
        if self._exit is None:
            self.actor.stop.remote()

    def kill(self) -> None:
        self._ray.kill(self.actor)
        self._exit = self._exit or Exit(False, "killed")

    def published(self) -> dict[str, Any]:
        return dict(self._published)

    def alive(self) -> bool:
        """Whether its actor may still run (not yet seen to end, nor killed)."""
        return self._exit is None

    def drain(self) -> None:
        if self._exit is not None:
            return
        if self._pending_drain is not None:
            ready, _ = self._ray.wait([self._pending_drain], timeout=0)
            if not ready:
                if not self._warned_pending and time.monotonic() - self._started > 60:
                    self._warned_pending = True
                    self._log_sink(
                        f"still waiting for Ray to place {self._node.name} "
                        f"(requested {self._node.resources}); check `ray status`."
                    )
                return
            try:
                self._consume(self._ray.get(self._pending_drain))
            except Exception:  # pylint: disable=broad-except
                pass  # The actor died; poll() reports it.
        self._pending_drain = self.actor.drain.remote()

    def log_hint(self) -> str:
        return f"Its output: {self._log_path}"

    def log_tail(self, lines: int) -> str:
        return tail_lines(self._log_path, lines)


class RayBackend:
    """Runs each node as a Ray actor.

    Args:
      run_dir: The run directory (shared storage on a multi-machine cluster).
      program: The program, used to size a private local Ray instance.
      address: A Ray cluster address (``HOST:PORT`` or ``auto``); None starts a local
        instance, bound to the loopback interface.
      advertise_host: Host other nodes use to reach servers a node starts; None means
        the IP of the Ray node the server runs on (needed on a multi-machine cluster).
    """

    name = "ray"

    def __init__(
        self,
        run_dir: RunDir,
        program: Program,
        *,
        address: str | None = None,
        advertise_host: str | None = "127.0.0.1",
    ):
        address = address or os.environ.get("RAY_ADDRESS") or None
        ray = import_ray(loopback=address is None and advertise_host is not None)
        self._ray = ray
        self._run_dir = run_dir
        self._advertise_host = advertise_host
        self._owns_instance = address is None
        # Nodes outlive a killed launcher (to save) only on a cluster that outlives it:
        # one this backend connects to, not an instance the launcher started.
        self._detached = False
        if ray.is_initialized():
            self._owns_instance = False
        elif address is None:
            wanted = math.ceil(sum(n.resources.cpus for n in program.nodes))
            ray.init(
                num_cpus=max(os.cpu_count() or 1, wanted),
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            _check_reachable(address)
            self._detached = True
            try:
                ray.init(
                    address=address,
                    log_to_driver=False,
                    configure_logging=False,
                    runtime_env=code_runtime_env(),
                )
            except Exception as e:  # pylint: disable=broad-except
                raise LaunchError(
                    f"cannot connect to the Ray cluster at {address}: {e}. Check that "
                    "`ray status` works there and that its Ray and Python versions "
                    "match this machine's.",
                    exit_code=1,
                ) from None
        self._handles: list[RayHandle] = []
        self._run_tag = uuid.uuid4().hex[:8]  # Names this launch's actors in NAMESPACE.
        self._heartbeat: Heartbeat | None = None
        self._head_watch: HeadWatch | None = None
        self._head_lost: str | None = None
        self.startup_note = (
            ""
            if not self._owns_instance
            else "Ray: the nodes end with this launcher's Ray instance, so a killed launcher "
            "(kill -9, OOM) loses what they did since their last checkpoints; stop it with "
            "Ctrl-C, or pass --ray-address of a `ray start --head` cluster to let nodes save."
        )
        try:
            self._advertise_host = check_cluster(ray, program, advertise_host)
            if address is not None:  # Other machines: do they have what the nodes import?
                check_dependencies(ray)
        except LaunchError:
            self.close()
            raise
        gcs = current_gcs_address()
        if gcs:  # The grace is read now, not at import: a test driver slows this watch alone.
            self._head_watch = HeadWatch(gcs, self._on_head_lost, grace=ray_head_watch.HEAD_GRACE_S)
        self._actor_class = ray.remote(RayNode)
        if self._detached:
            self._heartbeat = Heartbeat(lambda: [h.actor for h in list(self._handles) if h.alive()])

    def _on_head_lost(self, silence: float | None = None) -> None:
        """From the launcher's own watch, or from a node that stopped for the head's loss
        first (its `run` said so; `silence` unknown, so the watch's grace is quoted)."""
        if self._head_lost is not None:
            return
        if silence is None:
            silence = ray_head_watch.HEAD_GRACE_S
        address = self._head_watch.address if self._head_watch else "?"
        relaunch = f"relaunch with --run-dir {self._run_dir.root}"
        if self._owns_instance:  # The launcher's own Ray instance: a relaunch starts another.
            how = f"{relaunch[0].upper()}{relaunch[1:]} to resume from those saves."
        else:
            how = (
                f"Once a head is back (`ray start --head`), {relaunch} (and RAY_ADDRESS of "
                "the new head if it moved) to resume from those saves."
            )
        self._head_lost = f"{head_lost_message(address, silence)}. {how}"

    def fatal_condition(self) -> str | None:
        """The lost Ray head, once this launcher's `HeadWatch` or a node has seen it
        (`Supervisor` then stops the run)."""
        return self._head_lost

    def _actor(self, node: Node, attempt: int):
        res = node.resources
        options: dict[str, Any] = {}
        if self._detached:
            # Outlives the launcher (`launch.runtime.ray_heartbeat`); named so that
            # `ray list actors` shows whose it is.
            options = {
                "lifetime": "detached",
                "name": f"{self._run_tag}-{node.name}-{attempt}",
                "namespace": NAMESPACE,
            }
        return self._actor_class.options(
            num_cpus=res.cpus,
            num_gpus=res.gpus,
            resources=dict(res.custom) or None,
            scheduling_strategy="SPREAD" if res.spread else "DEFAULT",
            max_concurrency=4,
            max_restarts=0,
            **options,
        ).remote(GRACE_S if self._detached else 0.0)

    def start_group(self, nodes: list[Node], kwargs: list[dict], attempts: list[int]):
        """Starts a node group: each member reserves a port on the Ray node it was placed on.

        The members' `run` calls take the other members' reservations as arguments, so
        Ray starts them once every member is placed and has its port; the launcher
        never blocks on placement.
        """
        actors = [self._actor(node, attempt) for node, attempt in zip(nodes, attempts)]
        addresses = [a.reserve_port.remote(self._advertise_host) for a in actors]
        return [
            self.start(node, kw, attempt, actor=actor, group_addresses=addresses)
            for node, kw, attempt, actor in zip(nodes, kwargs, attempts, actors)
        ]

    def start(
        self, node: Node, kwargs: dict, attempt: int, *, actor=None, group_addresses=()
    ) -> RayHandle:
        actor = actor or self._actor(node, attempt)
        spec = {
            "name": node.name,
            "entry_point": node.entry_point,
            "kwargs": kwargs,
            "run_dir": self._run_dir.root,
            "attempt": attempt,
            "advertise_host": self._advertise_host,
            "gpus": node.resources.gpus,
            "stop_timeout": node.stop_timeout,
        }
        FileSink(self._run_dir.log_path(node.name))(
            f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} start #{attempt} of {node.name} (ray)"
        )
        handle = RayHandle(
            self._ray,
            actor,
            actor.run.remote(json.dumps(spec), *group_addresses),
            node,
            self._run_dir,
            on_head_lost=self._on_head_lost,
        )
        self._handles.append(handle)
        return handle

    def close(self) -> None:
        if self._head_watch is not None:
            self._head_watch.close()
        if self._heartbeat is not None:
            self._heartbeat.close()
        for h in self._handles:
            try:
                self._ray.kill(h.actor)
            except Exception:  # pylint: disable=broad-except
                pass
        if self._owns_instance:
            self._ray.shutdown()
