"""`make(spec)`: from a deployment spec to a ready `Replicator`.

This is the only module that knows which `tf.distribute` strategy backs which
spec; everything above it (agents, vision) sees a `Replicator`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import sonnet as snt
import tensorflow as tf
from sonnet.src.optimizers import optimizer_utils
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context as tf_context
from tensorflow.tsl.protobuf import coordination_config_pb2

from replication import deployments
from replication.deployments import Deployment
from replication.devices import ensure_logical_cpus
from replication.replicator import Replicator


def make(
    spec: str = "cpu",
    *,
    workers: Sequence[str] | None = None,
    task_index: int | None = None,
    cluster: Mapping[str, Sequence[str]] | None = None,
    collective_timeout: float | None = None,
    heartbeat_timeout: float = 60.0,
) -> Replicator:
    """Builds a Replicator for `spec` (see `replication.deployments` for the forms).

    Args:
      spec: "cpu", "cpu:N", "cpu:NxM", "gpu", "gpu:N", "multiworker", "tpu",
        "tpu:ADDRESS" or "ps".
      workers: for "multiworker" without TF_CONFIG: every worker's "host:port",
        identical on all workers.
      task_index: for "multiworker" with `workers`: this process's index in it.
      cluster: for "ps" without TF_CONFIG: {"chief": [...], "worker": [...],
        "ps": [...]}; this process is the chief (coordinator).
      collective_timeout: seconds after which a multi-worker collective that
        cannot complete fails instead of waiting. None (the default): no timeout.
        In TensorFlow 2.15 every collective with a timeout starts an OS thread that
        sleeps for the whole timeout, so a long run with a timeout piles up thousands
        of threads and aborts; a dead peer still surfaces through its failed gRPC
        connection, and process supervision (`launch`) restarts the group. Set it for
        short jobs that must never wait on a peer.
      heartbeat_timeout: for "multiworker": seconds a worker may go without a
        heartbeat to TensorFlow's coordination service before the service declares it
        failed and aborts every collective of the group. TensorFlow's own default is
        10 s, which a worker that is merely slow can miss: on 2 loaded cores a group
        just restarted from its checkpoint was aborted that way, and a worker paused
        for 20 s (SIGSTOP) is declared failed, while with 60 s the group finishes
        (tests/replication/test_multiworker.py). A killed peer is still seen at once,
        by its closed connections; only a peer that stops answering (a frozen process,
        a lost machine) takes this long to be noticed.

    Raises:
      DeploymentSpecError: unknown spec (the message lists the valid forms).
      DevicesAlreadyInitializedError: logical devices requested too late.
      RuntimeError: the hardware or cluster the spec names is not available.
    """
    deployment = deployments.parse(spec)
    if deployment.kind == "cpu":
        return _make_cpu(deployment)
    if deployment.kind == "gpu":
        return _make_gpu(deployment)
    if deployment.kind == "multiworker":
        return _make_multiworker(
            deployment, workers, task_index, collective_timeout, heartbeat_timeout
        )
    if deployment.kind == "tpu":
        return _make_tpu(deployment)
    return _make_parameter_server(deployment, cluster)


class _LocalReplicator(snt.distribute.Replicator):
    """Sonnet's Replicator with collective keys of its own.

    Each MirroredStrategy numbers its collective groups from the same class-wide
    base, and TensorFlow's collective executor remembers a group's size by key for
    the life of the process. A second strategy of another size in the same
    process (`cpu:2`, then `cpu:4`) would then join "group 1" with the wrong size
    and abort. TensorFlow's own tests give each strategy a distinct key base; we
    do the same, so any number of Replicators can share a process.
    """

    _next_key_base = 0
    _KEY_SPACE = 100_000  # group keys one strategy may use before overlapping

    def __init__(self, devices: Sequence[str]):
        _LocalReplicator._next_key_base += self._KEY_SPACE
        self._collective_key_base = _LocalReplicator._next_key_base
        super().__init__(devices=devices)


def _make_cpu(deployment: Deployment) -> Replicator:
    replicas, per_replica = deployment.replicas or 1, deployment.devices_per_replica
    devices = ensure_logical_cpus(replicas * per_replica)
    groups = [devices[i * per_replica : (i + 1) * per_replica] for i in range(replicas)]
    strategy = _LocalReplicator(devices=[group[0] for group in groups])
    return Replicator(strategy, deployment, device_groups=groups)


def _make_gpu(deployment: Deployment) -> Replicator:
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        raise RuntimeError(
            "The 'gpu' replication spec found no GPU visible to TensorFlow. Check "
            "`nvidia-smi` and that a CUDA build of TensorFlow is installed, or use "
            "'cpu' / 'cpu:N'."
        )
    count = deployment.replicas or len(gpus)
    if count > len(gpus):
        raise RuntimeError(f"'gpu:{count}' asks for {count} GPUs but only {len(gpus)} are visible.")
    devices = [gpu.name for gpu in gpus[:count]]
    strategy = _LocalReplicator(devices=devices)
    return Replicator(strategy, deployment, device_groups=[[d] for d in devices])


def _allow_sonnet_optimizers(strategy_type: type) -> None:
    """Lets Sonnet optimizers run under a strategy Sonnet's allow-list predates.

    Sonnet 2 optimizers refuse strategies outside a fixed tuple to stop users from
    forgetting the gradient all-reduce. Our `ReplicatedOptimizer` performs that
    all-reduce (or, for `ps`, deliberately none), so the guard's purpose is met.
    Sonnet offers no public hook, so the strategy type is added to its tuple.
    """
    if not issubclass(strategy_type, optimizer_utils._SUPPORTED_STRATEGIES):  # pylint: disable=protected-access
        optimizer_utils._SUPPORTED_STRATEGIES += (strategy_type,)  # pylint: disable=protected-access


def _tf_config_resolver(missing_message: str):
    """The cluster named by TF_CONFIG; `missing_message` when it names none."""
    config = json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")
    if not config.get("cluster"):
        raise RuntimeError(missing_message)
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def _make_multiworker(
    deployment: Deployment,
    workers: Sequence[str] | None,
    task_index: int | None,
    timeout: float | None,
    heartbeat_timeout: float,
) -> Replicator:
    if heartbeat_timeout <= 0:
        raise ValueError(f"heartbeat_timeout must be positive seconds, got {heartbeat_timeout!r}.")
    if workers is not None:
        if task_index is None or not 0 <= task_index < len(workers):
            raise ValueError(
                f"'multiworker' with workers={list(workers)} needs task_index in "
                f"[0, {len(workers)}) naming this process."
            )
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec({"worker": list(workers)}),
            task_type="worker",
            task_id=task_index,
            rpc_layer="grpc",
        )
    else:
        resolver = _tf_config_resolver(
            "The 'multiworker' spec needs a cluster: set TF_CONFIG (JSON with "
            "'cluster' and 'task') in every worker, or call "
            "replication.make('multiworker', workers=['host:port', ...], task_index=i)."
        )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING,
        timeout_seconds=timeout,
    )
    _configure_coordination_service(resolver, heartbeat_timeout)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=resolver, communication_options=options
    )
    _allow_sonnet_optimizers(type(strategy))
    return Replicator(strategy, deployment)


def _configure_coordination_service(resolver, heartbeat_timeout: float) -> None:
    """What `MultiWorkerMirroredStrategy` configures for its coordination service, with
    our heartbeat timeout: the strategy keeps a service configured before it, and
    TensorFlow 2.15 offers no public option for the timeout.

    Only chief and worker tasks are coordinated (the strategy's own rule); the leader
    is the one the strategy would pick.
    """
    cluster_spec = resolver.cluster_spec()
    coordinated = ("chief", "worker")
    if (
        resolver.task_type not in coordinated
        or tf_context.context().coordination_service is not None
    ):
        return
    tf_context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster_spec),
        heartbeat_timeout_in_ms=int(heartbeat_timeout * 1000),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster_spec.num_tasks(job))
            for job in coordinated
            if job in cluster_spec.jobs
        ],
    )


def _make_tpu(deployment: Deployment) -> Replicator:
    # Untested here: the project's machines have no TPU.
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=deployment.address or "")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = snt.distribute.TpuReplicator(resolver)
    return Replicator(strategy, deployment)


def _make_parameter_server(
    deployment: Deployment, cluster: Mapping[str, Sequence[str]] | None
) -> Replicator:
    if cluster is not None:
        missing = [job for job in ("worker", "ps") if not cluster.get(job)]
        if missing:
            raise ValueError(
                f"'ps' cluster needs at least one {' and one '.join(missing)} address."
            )
        spec = {job: list(addresses) for job, addresses in cluster.items()}
        if "chief" in spec:
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc"
            )
        else:  # the coordinator needs no server of its own
            resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
                tf.train.ClusterSpec(spec), rpc_layer="grpc"
            )
    else:
        resolver = _tf_config_resolver(
            "The 'ps' spec needs a cluster: set TF_CONFIG with 'chief', 'worker' "
            "and 'ps' jobs on the coordinator, or call replication.make('ps', "
            "cluster={'chief': [...], 'worker': [...], 'ps': [...]})."
        )
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    _allow_sonnet_optimizers(type(strategy))
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    return Replicator(strategy, deployment, coordinator=coordinator)
