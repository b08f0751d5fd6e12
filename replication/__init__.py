"""TF-Replicator: write the computation of one replica, run it on any deployment.

    repl = replication.make("cpu:4")       # or "cpu", "gpu", "multiworker", "tpu", "ps"
    with repl.scope():
        model = MyModel(); opt = repl.wrap_optimizer(snt.optimizers.Adam(1e-3))
    losses = repl.run(step, batch)

See `replicator.py` for the Replicator and `collectives.py` for what a step may call.
"""

from replication.collectives import (
    NotInReplicaContextError,
    all_gather,
    all_reduce,
    broadcast,
    num_replicas,
    replica_id,
)
from replication.deployments import VALID_FORMS, Deployment, DeploymentSpecError, parse
from replication.devices import DevicesAlreadyInitializedError, ensure_logical_cpus
from replication.factory import make
from replication.normalization import CrossReplicaBatchNorm, SpectralNorm
from replication.optimizers import ReplicatedOptimizer
from replication.replicator import BatchSplitError, Replicator

__all__ = [
    "VALID_FORMS",
    "BatchSplitError",
    "CrossReplicaBatchNorm",
    "Deployment",
    "DeploymentSpecError",
    "DevicesAlreadyInitializedError",
    "NotInReplicaContextError",
    "ReplicatedOptimizer",
    "Replicator",
    "SpectralNorm",
    "all_gather",
    "all_reduce",
    "broadcast",
    "ensure_logical_cpus",
    "make",
    "num_replicas",
    "parse",
    "replica_id",
]
