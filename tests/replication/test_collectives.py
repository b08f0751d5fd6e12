"""Each collective against a numpy reference, on real logical-device replicas."""

import numpy as np
import pytest
import tensorflow as tf

import replication

REPLICAS = 4


@pytest.fixture(scope="module")
def repl():
    return replication.make(f"cpu:{REPLICAS}")


def per_replica_values(shape=(2, 3)):
    """Distinct, replica-dependent values and their numpy counterparts."""
    rng = np.random.RandomState(7)
    arrays = [rng.randn(*shape).astype(np.float32) for _ in range(REPLICAS)]
    return arrays, tf.constant(np.stack(arrays))


def run(repl, fn, stacked):
    """Runs fn(x) where replica r sees stacked[r]; returns each replica's result."""

    @tf.function
    def go():
        def step():
            return fn(tf.gather(stacked, replication.replica_id()))

        return repl.run(step)

    return [tf.nest.map_structure(lambda t: t.numpy(), r) for r in repl.local_results(go())]


@pytest.mark.parametrize(
    "op, reference",
    [
        ("sum", lambda a: np.sum(a, 0)),
        ("mean", lambda a: np.mean(a, 0)),
        ("max", lambda a: np.max(a, 0)),
        ("min", lambda a: np.min(a, 0)),
    ],
)
def test_all_reduce_matches_numpy_on_every_replica(repl, op, reference):
    arrays, stacked = per_replica_values()
    results = run(repl, lambda x: replication.all_reduce(x, op), stacked)
    for result in results:
        np.testing.assert_allclose(result, reference(np.stack(arrays)), rtol=1e-6)


def test_all_reduce_accepts_nests_and_integer_means(repl):
    arrays, stacked = per_replica_values()
    results = run(
        repl,
        lambda x: replication.all_reduce(
            {"a": x, "n": tf.cast(replication.replica_id(), tf.int32)}, "mean"
        ),
        stacked,
    )
    for result in results:
        np.testing.assert_allclose(result["a"], np.mean(arrays, 0), rtol=1e-6)
        assert result["n"].dtype == np.float32 and result["n"] == pytest.approx(1.5)


def test_all_gather_concatenates_in_replica_order(repl):
    arrays, stacked = per_replica_values()
    for axis in (0, 1):
        results = run(repl, lambda x, axis=axis: replication.all_gather(x, axis), stacked)
        for result in results:
            np.testing.assert_array_equal(result, np.concatenate(arrays, axis))


def test_all_gather_allows_uneven_sizes_along_the_axis(repl):
    # Replica r contributes r+1 rows: an uneven last batch.
    values = tf.constant(
        np.arange(REPLICAS * REPLICAS * 2, dtype=np.float32).reshape(REPLICAS, REPLICAS, 2)
    )

    @tf.function
    def go():
        def step():
            r = replication.replica_id()
            return replication.all_gather(tf.gather(values, r)[: r + 1], axis=0)

        return repl.run(step)

    expected = np.concatenate([values.numpy()[r][: r + 1] for r in range(REPLICAS)])
    for result in repl.local_results(go()):
        np.testing.assert_array_equal(result.numpy(), expected)


def test_all_gather_of_a_scalar_is_a_clear_error(repl):
    with pytest.raises(ValueError, match="rank >= 1"):
        run(repl, lambda x: replication.all_gather(tf.reduce_sum(x)), per_replica_values()[1])


def test_all_gather_with_an_out_of_range_axis_is_a_clear_error(repl):
    with pytest.raises(ValueError, match="out of range"):
        run(repl, lambda x: replication.all_gather(x, axis=5), per_replica_values()[1])


@pytest.mark.parametrize("source", [0, 2, REPLICAS - 1])
def test_broadcast_sends_one_replicas_value_to_all(repl, source):
    arrays, stacked = per_replica_values()
    results = run(repl, lambda x: replication.broadcast((x, x > 0), source=source), stacked)
    for values, mask in results:
        np.testing.assert_array_equal(values, arrays[source])
        np.testing.assert_array_equal(mask, arrays[source] > 0)


def test_broadcast_from_a_missing_replica_is_a_clear_error(repl):
    with pytest.raises(ValueError, match="not a replica id"):
        run(repl, lambda x: replication.broadcast(x, source=REPLICAS), per_replica_values()[1])


def test_replica_id_and_num_replicas(repl):
    results = run(
        repl,
        lambda x: (replication.replica_id(), replication.num_replicas() + 0 * x[0, 0]),
        per_replica_values()[1],
    )
    assert [int(r[0]) for r in results] == list(range(REPLICAS))
    assert all(float(r[1]) == REPLICAS for r in results)


def test_collectives_outside_a_step_say_what_to_use_instead(repl):
    with (
        repl.scope(),
        pytest.raises(replication.NotInReplicaContextError, match="Replicator.reduce"),
    ):
        replication.all_reduce(tf.ones([2]), "sum")


def test_unknown_reduction_is_refused(repl):
    with pytest.raises(ValueError, match="sum, mean, max, min"):
        run(repl, lambda x: replication.all_reduce(x, "median"), per_replica_values()[1])


@pytest.mark.parametrize(
    "op, reference", [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min)]
)
def test_reduce_and_gather_in_cross_replica_context(repl, op, reference):
    arrays, stacked = per_replica_values()
    per_replica = repl.run(lambda: tf.gather(stacked, replication.replica_id()))
    np.testing.assert_allclose(
        repl.reduce(per_replica, op).numpy(), reference(np.stack(arrays), 0), rtol=1e-6
    )
    np.testing.assert_array_equal(
        repl.gather(per_replica, axis=0).numpy(), np.concatenate(arrays, 0)
    )


def test_global_batch_must_split_evenly(repl):
    assert repl.per_replica_batch_size(8) == 2
    with pytest.raises(replication.BatchSplitError, match="not divisible by the 4 replicas"):
        repl.per_replica_batch_size(6)
    with pytest.raises(replication.BatchSplitError):
        repl.distribute_dataset(tf.data.Dataset.range(12).batch(6, drop_remainder=True))


def test_distribute_gives_each_replica_its_share_of_the_global_batch(repl):
    def input_fn(ctx):
        batch = ctx.get_per_replica_batch_size(8)
        return tf.data.Dataset.range(16).batch(batch)

    first = next(iter(repl.distribute(input_fn)))
    shares = [t.numpy().tolist() for t in repl.local_results(first)]
    assert sorted(v for s in shares for v in s) == list(range(8)) and all(
        len(s) == 2 for s in shares
    )


def test_one_cpu_replica_reads_its_pipeline_in_order_without_a_device_relay():
    repl = replication.make("cpu")
    contexts = []

    def input_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return tf.data.Dataset.range(3).batch(1)

    iterator = iter(repl.distribute(input_fn))

    @tf.function
    def pull(it):
        return repl.run(lambda x: x * 10, next(it))

    assert [pull(iterator).numpy().tolist() for _ in range(3)] == [[0], [10], [20]]
    assert contexts == [(1, 0, 1)]
    with pytest.raises(tf.errors.OutOfRangeError):  # The end of the data still surfaces.
        pull(iterator)
    # Elements come straight from the pipeline's own iterator, not through tf.distribute's
    # MultiDeviceIterator relay (a remote call and a prefetch thread per batch, ~0.3 ms of
    # CPU). Only TensorFlow's private attributes show which (TF is pinned to 2.15).
    kinds = [type(worker._iterator).__name__ for worker in iterator._iterators]
    assert kinds == ["OwnedIterator"], kinds


@pytest.mark.parametrize(
    "name, call",
    [
        ("all_reduce", lambda: replication.all_reduce(tf.ones([2]), "sum")),
        ("all_gather", lambda: replication.all_gather(tf.ones([2]))),
        ("broadcast", lambda: replication.broadcast(tf.ones([2]))),
        ("replica_id", replication.replica_id),
    ],
)
def test_collectives_with_no_replicator_at_all_raise_instead_of_returning_input(name, call):
    # Without any strategy TensorFlow offers a default one-replica context, in which
    # all_reduce and broadcast used to hand back their input unchanged.
    assert not tf.distribute.has_strategy()
    with pytest.raises(replication.NotInReplicaContextError, match=name):
        call()
