"""The fused momentum optimizer: Sonnet's maths, one kernel per variable on one replica."""

from __future__ import annotations

import numpy as np
import pytest
import sonnet as snt
import tensorflow as tf

import replication
from vision.common.momentum import Momentum

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("nesterov", [False, True])
def test_fused_update_equals_sonnets_momentum_and_runs_as_one_kernel(nesterov):
    repl = replication.make("cpu")
    rng = np.random.RandomState(0)
    initial = [rng.normal(size=s).astype(np.float32) for s in ([3, 3, 2, 4], [4])]
    gradients = [[rng.normal(size=w.shape).astype(np.float32) for w in initial] for _ in range(3)]
    results, graphs = {}, {}
    for name, cls in (("fused", Momentum), ("sonnet", snt.optimizers.Momentum)):
        with repl.scope():
            params = [tf.Variable(w) for w in initial]
            optimizer = repl.wrap_optimizer(cls(0.1, 0.9, use_nesterov=nesterov))
            optimizer.create_state(params)

        def replica_step(*grads, params=params, optimizer=optimizer):
            optimizer.apply(list(grads), params)

        @tf.function
        def step(grads, replica_step=replica_step):
            repl.run(replica_step, *grads)

        for grads in gradients:
            step([tf.constant(g) for g in grads])
        results[name] = [p.numpy() for p in params]
        graph = step.get_concrete_function([tf.constant(g) for g in gradients[0]]).graph
        graph_def = graph.as_graph_def()
        nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
        graphs[name] = [n.op for n in nodes]
    for fused, reference in zip(results["fused"], results["sonnet"]):
        np.testing.assert_allclose(fused, reference, rtol=1e-6, atol=1e-7)
    assert not np.allclose(results["fused"][0], initial[0])  # the weights did move
    assert graphs["fused"].count("ResourceApplyMomentum") == 2
    assert graphs["sonnet"].count("ResourceApplyMomentum") == 0
