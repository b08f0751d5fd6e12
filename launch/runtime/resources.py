"""What each node asks of the machine: GPUs on this machine, per-role Ray resources.

Every node asks its backend for exactly the devices it uses, so that processes never
fight over one GPU's memory:

- `local`: a node with ``Resources.gpus == 0`` runs with ``CUDA_VISIBLE_DEVICES=""``
  (TensorFlow then sees no GPU and reserves none of its memory); a node with
  ``gpus = n`` gets n GPU ids of its own (`GpuAllocator`), kept across its restarts.
- `ray`: the request becomes the actor's ``num_gpus``; Ray sets the actor's
  ``CUDA_VISIBLE_DEVICES`` to the GPUs it assigned (none for ``num_gpus=0``).

The GPUs of this machine are those in ``CUDA_VISIBLE_DEVICES`` when it is set (so a
user can hand a run a subset), else those `nvidia-smi` lists.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess

from launch.runtime.errors import LaunchError

ROLES = ("replay", "learner", "actor", "evaluator")


def local_gpu_ids() -> list[str]:
    """The GPU ids a process started from here may use (empty: no GPU)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = []
        for part in visible.split(","):
            part = part.strip()
            if not part or part.startswith("-"):
                break  # CUDA ignores everything from the first invalid id on.
            ids.append(part)
        return ids
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


class GpuAllocator:
    """Hands this machine's GPUs to local nodes so that no two nodes share one.

    Example:
      >>> alloc = GpuAllocator(["0", "1", "2", "3"])
      >>> alloc.env("learner", 2), alloc.env("learner_1", 2), alloc.env("actor_0", 0)
      ({'CUDA_VISIBLE_DEVICES': '0,1'}, {'CUDA_VISIBLE_DEVICES': '2,3'}, {'CUDA_VISIBLE_DEVICES': ''})
    """

    def __init__(self, gpu_ids: list[str]):
        self._free = list(gpu_ids)
        self._held: dict[str, list[str]] = {}

    def env(self, node_name: str, gpus: float) -> dict[str, str]:
        """The environment variables of node `node_name` asking for `gpus` GPUs."""
        if gpus <= 0:
            return {"CUDA_VISIBLE_DEVICES": ""}
        if node_name not in self._held:
            count = math.ceil(gpus)
            if count > len(self._free):
                raise RuntimeError(
                    f"node {node_name!r} asks for {count} GPU(s) but only {len(self._free)} of "
                    "this machine's GPUs are not held by other nodes; ask for fewer GPUs per "
                    "learner worker or fewer workers."
                )
            self._held[node_name], self._free = self._free[:count], self._free[count:]
        return {"CUDA_VISIBLE_DEVICES": ",".join(self._held[node_name])}


def learner_gpus(spec: str, workers: int, backend: str, gpu_ids: list[str] | None) -> float:
    """GPUs each learner worker asks for, for learner spec `spec` (0 for cpu specs).

    Args:
      spec: "cpu...", "gpu" (all GPUs a worker is given) or "gpu:N".
      workers: learner workers sharing this machine's GPUs on `local`.
      backend: "local", "threads" or "ray".
      gpu_ids: this machine's GPUs (None on a Ray cluster, whose GPUs Ray counts).

    Raises:
      LaunchError: a GPU spec that the GPUs available cannot satisfy.
    """
    if not spec.startswith("gpu"):
        return 0.0
    wanted = int(spec[4:]) if spec.startswith("gpu:") else None
    if gpu_ids is None:  # A Ray cluster: one GPU per worker unless a count is given.
        return float(wanted or 1)
    if not gpu_ids:
        raise LaunchError(
            f"--learner-replicas {spec}: this machine has no GPU (nvidia-smi lists none, or "
            "CUDA_VISIBLE_DEVICES hides them); use --learner-replicas cpu or cpu:N."
        )
    per_worker = len(gpu_ids) // workers if backend != "threads" else len(gpu_ids)
    if wanted is None:
        wanted = per_worker
    if wanted < 1 or wanted > per_worker:
        raise LaunchError(
            f"--learner-replicas {spec} with {workers} learner worker(s) needs "
            f"{max(wanted, 1) * workers} GPUs but this machine has {len(gpu_ids)} "
            f"(CUDA_VISIBLE_DEVICES / nvidia-smi); use fewer workers or gpu:N with a smaller N."
        )
    return float(wanted)


def parse_ray_resources(values: list[str]) -> dict[str, dict[str, float]]:
    """``ROLE=NAME:AMOUNT[,NAME:AMOUNT...]`` flags -> {role: {name: amount}}.

    Example:
      >>> parse_ray_resources(["learner=learner_host:1", "actor=actor_slot:1,mem:0.5"])
      {'learner': {'learner_host': 1.0}, 'actor': {'actor_slot': 1.0, 'mem': 0.5}}
    """
    out: dict[str, dict[str, float]] = {}
    for value in values:
        role, eq, rest = value.partition("=")
        role = role.strip()
        if not eq or role not in ROLES or not rest.strip():
            raise LaunchError(
                f"--ray-resources {value!r} should look like ROLE=NAME:AMOUNT[,NAME:AMOUNT] "
                f"with ROLE one of {', '.join(ROLES)} (e.g. learner=learner_host:1)."
            )
        for item in rest.split(","):
            name, colon, amount = item.strip().rpartition(":")
            try:
                number = float(amount)
            except ValueError:
                number = -1.0
            if not colon or not name or number <= 0:
                raise LaunchError(
                    f"--ray-resources {value!r}: {item.strip()!r} should be NAME:AMOUNT with "
                    "a positive AMOUNT (e.g. learner_host:1)."
                )
            out.setdefault(role, {})[name] = number
    return out
