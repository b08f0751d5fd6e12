"""Collectives used inside a step function (replica context).

Vocabulary, as in `tf.distribute`:
  * replica: one copy of the step function, running on its own device(s).
  * replica context: code running inside `Replicator.run(step_fn, ...)`. Every
    function in this module must be called there.
  * cross-replica context: code outside `run` (the training loop). There, use
    `Replicator.reduce` / `Replicator.gather` instead.

Every collective is a synchronisation point: all replicas must call the same
collectives, in the same order, with the same dtypes (and the same shapes except
where noted). A replica that skips one (e.g. behind a data-dependent Python `if`)
makes the others wait forever on multi-worker deployments, so keep collectives
out of branches that differ between replicas.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

_REDUCE_OPS = {"sum": tf.distribute.ReduceOp.SUM, "mean": tf.distribute.ReduceOp.MEAN}
REDUCTIONS = ("sum", "mean", "max", "min")


class NotInReplicaContextError(RuntimeError):
    """A collective called outside `Replicator.run`."""


def _replica_context(name: str) -> tf.distribute.ReplicaContext:
    context = tf.distribute.get_replica_context()
    # With no strategy in force TensorFlow returns a default replica context of one
    # replica, where every collective would quietly return its input: that is code
    # outside any `Replicator.run`, so it gets the same error as cross-replica code.
    if context is None or not tf.distribute.has_strategy():
        raise NotInReplicaContextError(
            f"replication.{name} must be called inside a step function run by "
            "Replicator.run(step_fn, ...). Outside a step (cross-replica "
            "context) use Replicator.reduce(...) or Replicator.gather(...)."
        )
    return context


def _check_op(op: str) -> str:
    if op not in REDUCTIONS:
        raise ValueError(f"Unknown reduction {op!r}; use one of {', '.join(REDUCTIONS)}.")
    return op


def _reduce_grouped(context: tf.distribute.ReplicaContext, reduce_op, value: Any) -> Any:
    """All-reduces a nest, batching leaves that live in the same memory.

    TensorFlow keeps int32 tensors in host memory and refuses to batch them with
    device tensors in one all-reduce, so the two kinds go in separate batches.
    """
    leaves = tf.nest.flatten(value)
    host = [i for i, leaf in enumerate(leaves) if leaf.dtype == tf.int32]
    device = [i for i, leaf in enumerate(leaves) if leaf.dtype != tf.int32]
    reduced = list(leaves)
    for group in (host, device):
        if group:
            results = context.all_reduce(reduce_op, [leaves[i] for i in group])
            for i, result in zip(group, results):
                reduced[i] = result
    return tf.nest.pack_sequence_as(value, reduced)


def all_reduce(value: Any, op: str = "mean") -> Any:
    """Reduces `value` (a nest of tensors) across replicas; every replica gets the result.

    `op` is "sum", "mean", "max" or "min". All replicas must pass tensors of the
    same shape and dtype. "mean" of an integer tensor is computed in float32 and
    returned as float32, since an integer mean silently truncates.

    Context: replica (inside `Replicator.run`); outside a step use `Replicator.reduce`.
    """
    _check_op(op)
    context = _replica_context("all_reduce")
    if op in _REDUCE_OPS:

        def reduce_one(x):
            x = tf.convert_to_tensor(x)
            if op == "mean" and not x.dtype.is_floating:
                x = tf.cast(x, tf.float32)
            return x

        value = tf.nest.map_structure(reduce_one, value)
        return _reduce_grouped(context, _REDUCE_OPS[op], value)
    # max/min: tf.distribute has no such ReduceOp; gather one slice per replica
    # and reduce locally. The gathered tensor is small (num_replicas x value).
    reducer = tf.reduce_max if op == "max" else tf.reduce_min
    stacked = context.all_gather(
        tf.nest.map_structure(lambda x: tf.expand_dims(tf.convert_to_tensor(x), 0), value),
        axis=0,
    )
    return tf.nest.map_structure(lambda x: reducer(x, axis=0), stacked)


def all_gather(value: Any, axis: int = 0) -> Any:
    """Concatenates `value` from all replicas along `axis`, in replica order.

    Shapes may differ along `axis` between replicas (e.g. an uneven last batch);
    all other dimensions and the rank must match, otherwise TensorFlow cannot
    concatenate and this raises ValueError naming the shapes.

    Context: replica (inside `Replicator.run`); outside a step use `Replicator.gather`.
    """
    context = _replica_context("all_gather")
    value = tf.nest.map_structure(tf.convert_to_tensor, value)
    for tensor in tf.nest.flatten(value):
        rank = tensor.shape.rank
        if rank is not None and not -rank <= axis < max(rank, 1):
            raise ValueError(
                f"all_gather axis {axis} is out of range for a tensor of shape "
                f"{tensor.shape}; pass an axis in [-{rank}, {rank})."
            )
        if rank == 0:
            raise ValueError(
                "all_gather needs tensors of rank >= 1 to concatenate; wrap a "
                "scalar as x[None] (or tf.expand_dims(x, 0))."
            )
    return context.all_gather(value, axis=axis)


def broadcast(value: Any, source: int = 0) -> Any:
    """Returns replica `source`'s `value` on every replica.

    Implemented as a sum in which every replica but `source` contributes zeros,
    which is exact (x + 0 == x) and uses the all-reduce every backend has.

    Context: replica (inside `Replicator.run`).
    """
    context = _replica_context("broadcast")
    replicas = context.num_replicas_in_sync
    if not 0 <= source < replicas:
        raise ValueError(f"broadcast source {source} is not a replica id in [0, {replicas}).")
    is_source = tf.equal(context.replica_id_in_sync_group, source)

    def masked(x):
        x = tf.convert_to_tensor(x)
        if x.dtype == tf.bool:
            return tf.cast(tf.logical_and(x, is_source), tf.int32)
        return tf.where(is_source, x, tf.zeros_like(x))

    summed = _reduce_grouped(
        context, tf.distribute.ReduceOp.SUM, tf.nest.map_structure(masked, value)
    )
    return tf.nest.map_structure(
        lambda original, result: (
            tf.cast(result, tf.bool) if tf.convert_to_tensor(original).dtype == tf.bool else result
        ),
        value,
        summed,
    )


def replica_id() -> tf.Tensor:
    """This replica's index in [0, num_replicas()), as an int32 scalar tensor.

    Context: replica (inside `Replicator.run`).
    """
    return tf.convert_to_tensor(_replica_context("replica_id").replica_id_in_sync_group)


def num_replicas() -> int:
    """The number of replicas taking part in collectives (a Python int).

    Context: any. In replica context, the replicas in sync; in cross-replica context,
    those of the strategy in force (1 outside any).
    """
    context = tf.distribute.get_replica_context()
    if context is None:
        return tf.distribute.get_strategy().num_replicas_in_sync
    return context.num_replicas_in_sync
