"""Checks and settings for running a program on a Ray cluster of one or several machines.

- Addresses: every server (the replay, each learner worker) is advertised on the IP
  of the Ray node it runs on (``ray.util.get_node_ip_address()`` inside the actor),
  never on one IP for all. The default ``--bind-host 127.0.0.1`` is kept only when
  every Ray node has that one IP (one machine); a specific ``--bind-host IP`` must be
  the IP of a Ray node, and the program pins its servers there (``node:IP``).
- Placement: a node that no Ray node could ever host (a GPU request on a cluster
  without GPUs, a custom resource nobody offers) is refused before anything starts,
  instead of waiting forever in Ray's queue.
- Code: the project's packages travel to the Ray workers with the job
  (``runtime_env`` ``py_modules``), so every node runs the launcher's code; the
  third-party dependencies (TensorFlow, Reverb, dm-control, Sonnet) must be
  installed on every machine, as `ray start` itself must be.
"""

from __future__ import annotations

import os
from typing import Any

from launch.runtime.errors import LaunchError
from launch.runtime.program import Program

# The project's top-level packages a node may import.
PACKAGES = ("agents", "environments", "launch", "replication", "vision")
_ENV_VARS = ("MUJOCO_GL", "TF_CPP_MIN_LOG_LEVEL")


_LOOPBACK_DEFAULTS = ("127.0.0.1", "localhost", "::1")


def pins_servers(advertise_host: str | None) -> bool:
    """Whether `advertise_host` names one Ray node that the servers must run on.

    The loopback default means "this machine" (one machine only); 0.0.0.0 (None) means
    "wherever each server runs"; any other address names the node to run servers on.
    """
    return advertise_host is not None and advertise_host not in _LOOPBACK_DEFAULTS


def code_runtime_env() -> dict[str, Any]:
    """The job's runtime_env: the project's packages and the few variables nodes read."""
    # The repository root: this file is launch/runtime/ray_cluster.py.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    modules = [os.path.join(root, p) for p in PACKAGES if os.path.isdir(os.path.join(root, p))]
    env = {k: os.environ[k] for k in _ENV_VARS if k in os.environ}
    return {"py_modules": modules, "env_vars": env}


# Third-party packages every node imports; they must be installed on every Ray node.
DEPENDENCIES = ("tensorflow", "reverb", "dm_control", "sonnet")


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """The modules of `names` this Python cannot import (runs on each Ray node)."""
    import importlib.util  # pylint: disable=import-outside-toplevel

    return [n for n in names if importlib.util.find_spec(n) is None]


def check_dependencies(ray, modules: tuple[str, ...] = DEPENDENCIES, timeout: float = 120) -> None:
    """Refuses a cluster where some Ray node lacks a package the nodes import.

    One zero-CPU task per alive Ray node (pinned there) looks the packages up without
    importing them. A node that cannot answer in `timeout` seconds is not held against
    the launch (it may just be busy).

    Raises:
      LaunchError: naming each node and what it lacks.
    """
    from ray.util.scheduling_strategies import (  # pylint: disable=import-outside-toplevel
        NodeAffinitySchedulingStrategy,
    )

    remote = ray.remote(num_cpus=0)(missing_modules)
    refs = {
        n["NodeManagerAddress"]: remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(tuple(modules))
        for n in ray.nodes()
        if n.get("Alive")
    }
    problems = []
    for ip, ref in refs.items():
        try:
            missing = ray.get(ref, timeout=timeout)
        except Exception:  # pylint: disable=broad-except
            continue
        if missing:
            problems.append(f"{ip} lacks {', '.join(missing)}")
    if problems:
        raise LaunchError(
            f"Ray node(s) cannot run this program: {'; '.join(sorted(problems))}. Install the "
            "project's dependencies (same versions as here) on every machine of the cluster."
        )


def pin_to_ip(ip: str) -> dict[str, float]:
    """The custom resource that places a node on the Ray node with IP `ip`."""
    return {f"node:{ip}": 0.001}


def check_cluster(ray, program: Program, advertise_host: str | None) -> str | None:
    """Checks addresses and placement; returns the host actors should advertise.

    Returns:
      `advertise_host` when it is a loopback host on a one-IP cluster; None (each
      server advertises its own Ray node's IP) otherwise.

    Raises:
      LaunchError: with what to do, when the cluster cannot run `program` as asked.
    """
    alive = [n for n in ray.nodes() if n.get("Alive")]
    ips = sorted({n["NodeManagerAddress"] for n in alive})
    host: str | None = None
    if advertise_host is not None and not pins_servers(advertise_host):
        if len(ips) > 1:
            raise LaunchError(
                f"the Ray cluster has nodes on {len(ips)} IPs ({', '.join(ips)}) but servers "
                f"would be advertised on {advertise_host}, which other machines cannot reach. "
                "Pass --bind-host 0.0.0.0 to advertise each server on its Ray node's IP."
            )
        host = advertise_host
    elif advertise_host is not None and advertise_host not in ips:
        raise LaunchError(
            f"--bind-host {advertise_host} is not the IP of any node of the Ray cluster "
            f"({', '.join(ips)}); pass one of those to run the servers there, or 0.0.0.0 to "
            "advertise each server on the IP of the Ray node it runs on."
        )
    for node in program.nodes:
        res = node.resources
        need = {"CPU": res.cpus, "GPU": res.gpus, **res.custom}
        need = {k: v for k, v in need.items() if v > 0}
        if not any(all(n["Resources"].get(k, 0) >= v for k, v in need.items()) for n in alive):
            offers = "; ".join(
                f"{n['NodeManagerAddress']}: "
                + ", ".join(
                    f"{k}={v:g}"
                    for k, v in sorted(n["Resources"].items())
                    if k in need or k in ("CPU", "GPU")
                )
                for n in alive
            )
            raise LaunchError(
                f"no node of the Ray cluster can host node {node.name!r}, which asks for "
                f"{', '.join(f'{k}={v:g}' for k, v in need.items())} (nodes offer: {offers}). "
                "Add such a node (`ray start --num-gpus N --resources '{\"NAME\": N}'`), or "
                "change --learner-replicas / --ray-resources."
            )
    return host
