"""Replicas that span several devices: `cpu:2x2` with `logical_device`."""

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import replication


def two_stage_forward(repl, model_parallel: bool):
    with repl.scope():
        first = snt.Linear(8, w_init=snt.initializers.Constant(0.1))
        second = snt.Linear(2, w_init=snt.initializers.Constant(-0.2))
        first(tf.zeros([1, 4])), second(tf.zeros([1, 8]))

    def step(x):
        with repl.logical_device(0):
            hidden = tf.nn.relu(first(x))
        with repl.logical_device(1 if model_parallel else 0):
            out = second(hidden)
            placed = tf.identity(out)
        return replication.all_reduce(tf.reduce_sum(placed), "sum"), placed.device

    x = tf.reshape(tf.range(8 * 4, dtype=tf.float32), [8, 4]) / 10.0
    data = repl.distribute_dataset(tf.data.Dataset.from_tensors(x))
    results, devices = [], []
    for batch in data:
        per_replica = tf.function(lambda b: repl.run(step, b))(batch)
        results = [v.numpy() for v in repl.local_results(per_replica[0])]
        devices = [d for d in repl.local_results(per_replica[1])]
    return results, devices


def test_second_stage_runs_on_each_replicas_second_device():
    repl = replication.make("cpu:2x2")
    assert repl.num_replicas == 2 and repl.devices_per_replica == 2
    results, devices = two_stage_forward(repl, model_parallel=True)
    devices = [
        tf.DeviceSpec.from_string(d.numpy().decode() if hasattr(d, "numpy") else d) for d in devices
    ]
    # Replica 0 spans CPU:0-1 and replica 1 spans CPU:2-3.
    assert [d.device_index for d in devices] == [1, 3]
    reference, _ = two_stage_forward(replication.make("cpu:2"), model_parallel=False)
    np.testing.assert_allclose(results, reference, rtol=1e-6)


def test_logical_device_out_of_range_is_a_clear_error():
    repl = replication.make("cpu:2")

    def step():
        with repl.logical_device(1):
            return tf.constant(1.0)

    with pytest.raises(ValueError, match="spans 1 device"):
        repl.run(step)
