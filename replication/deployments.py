"""Deployment specs: the one string that says where a computation runs.

A spec is parsed once into a `Deployment`, and `make_strategy` turns it into a
`tf.distribute.Strategy`. Keeping the parsing apart from strategy creation lets
the CLI validate a spec (and print the valid forms) without touching TensorFlow's
devices, which can be configured only once per process.

Valid specs:

  cpu                one replica on the host CPU.
  cpu:N              N replicas on N logical CPU devices carved out of the host
                     CPU. Real replication without accelerators: how tests and
                     laptops run multi-replica code.
  cpu:NxM            N replicas, each spanning M logical CPU devices (model
                     parallelism inside a replica, see `logical_device`).
  gpu                one replica per local GPU, NCCL all-reduce.
  gpu:N              the first N local GPUs.
  multiworker        synchronous training across processes/hosts; the cluster
                     comes from TF_CONFIG or from `make(..., workers=[...],
                     task_index=i)`. gRPC collectives between workers.
  tpu / tpu:ADDRESS  TPUStrategy (local TPU or a TPU address). Untested here:
                     this project's machines have no TPU.
  ps                 asynchronous parameter-server training (ParameterServer-
                     Strategy driven by a ClusterCoordinator); cluster from
                     TF_CONFIG or `make("ps", cluster=...)`.
"""

from __future__ import annotations

import dataclasses
import re

VALID_FORMS = (
    "cpu",
    "cpu:N (N logical CPU replicas, e.g. cpu:2)",
    "cpu:NxM (N replicas of M logical CPU devices each, e.g. cpu:2x2)",
    "gpu",
    "gpu:N",
    "multiworker",
    "tpu",
    "tpu:ADDRESS",
    "ps",
)


class DeploymentSpecError(ValueError):
    """A replication spec that is not one of the valid forms."""


@dataclasses.dataclass(frozen=True)
class Deployment:
    """A parsed deployment spec.

    Attributes:
      kind: one of "cpu", "gpu", "multiworker", "tpu", "ps".
      replicas: number of local replicas requested (None: all available).
      devices_per_replica: devices one replica spans (model parallelism).
      address: TPU address for "tpu:ADDRESS".
    """

    kind: str
    replicas: int | None = None
    devices_per_replica: int = 1
    address: str | None = None

    @property
    def spec(self) -> str:
        if self.kind == "cpu" and (self.replicas or 1) == 1 and self.devices_per_replica == 1:
            return "cpu"
        if self.kind == "cpu":
            suffix = f"x{self.devices_per_replica}" if self.devices_per_replica > 1 else ""
            return f"cpu:{self.replicas}{suffix}"
        if self.kind == "gpu" and self.replicas:
            return f"gpu:{self.replicas}"
        if self.kind == "tpu" and self.address:
            return f"tpu:{self.address}"
        return self.kind


_CPU = re.compile(r"^cpu(?::(\d+)(?:x(\d+))?)?$")
_GPU = re.compile(r"^gpu(?::(\d+))?$")


def parse(spec: str) -> Deployment:
    """Parses a deployment spec, raising one error that lists the valid forms."""
    if not isinstance(spec, str):
        raise DeploymentSpecError(_message(repr(spec)))
    text = spec.strip().lower()
    match = _CPU.match(text)
    if match:
        replicas = int(match.group(1)) if match.group(1) else 1
        per_replica = int(match.group(2)) if match.group(2) else 1
        if replicas < 1 or per_replica < 1:
            raise DeploymentSpecError(_message(spec, "replica and device counts must be >= 1"))
        return Deployment("cpu", replicas, per_replica)
    match = _GPU.match(text)
    if match:
        gpus = int(match.group(1)) if match.group(1) else None
        if gpus is not None and gpus < 1:
            raise DeploymentSpecError(_message(spec, "the GPU count must be >= 1"))
        return Deployment("gpu", gpus)
    if text == "multiworker":
        return Deployment("multiworker")
    if text == "ps":
        return Deployment("ps")
    if text == "tpu":
        return Deployment("tpu")
    if text.startswith("tpu:") and len(spec.strip()) > 4:
        return Deployment("tpu", address=spec.strip()[4:])
    raise DeploymentSpecError(_message(spec))


def _message(spec: str, detail: str | None = None) -> str:
    why = f" ({detail})" if detail else ""
    return f"Unknown replication spec {spec!r}{why}. Valid forms: " + ", ".join(VALID_FORMS) + "."
