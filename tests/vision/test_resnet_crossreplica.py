"""Cross-replica batch norm: 2 replicas of batch B train exactly like 1 replica of batch 2B.

Each replication spec runs in a fresh interpreter (logical devices are fixed when
TensorFlow starts) and saves its results with np.savez; the test compares them.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support import run_python

STEPS, PER_REPLICA = 3, 4

SCRIPT = r"""
import sys
import numpy as np
import replication
spec, out, steps, global_batch = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
repl = replication.make(spec)  # before any other TensorFlow op
import sonnet as snt
import tensorflow as tf
from vision.resnet import networks as resnet

rng = np.random.RandomState(0)
images = rng.normal(1.0, 2.0, size=(steps * global_batch, 8, 8, 3)).astype(np.float32)
labels = rng.randint(0, 5, size=steps * global_batch).astype(np.int32)

with repl.scope():
    model = resnet.ResNet((1, 1), (16, 32), num_classes=5, stem="small", stem_channels=8,
                          zero_init_last_bn=False)
    model(tf.zeros([1, 8, 8, 3]), is_training=False)
    optimizer = repl.wrap_optimizer(snt.optimizers.Momentum(0.1, 0.9))
# Identical initial parameters whatever the spec (and on every replica).
init = np.random.RandomState(1)
for v in model.trainable_variables:
    v.assign(init.normal(0.0, 0.2, size=v.shape).astype(np.float32) + ("scale" in v.name))

def input_fn(ctx):
    per_replica = ctx.get_per_replica_batch_size(global_batch)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(per_replica)

def step(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, is_training=True)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply(grads, model.trainable_variables)
    return logits

@tf.function
def train(iterator):
    return repl.gather(repl.run(step, *next(iterator)), axis=0)

iterator = iter(repl.distribute(input_fn))
results = {f"logits_{i}": train(iterator).numpy() for i in range(steps)}
results["eval_logits"] = model(images[:8], is_training=False).numpy()  # moving statistics
for index, v in enumerate(model.variables):
    copies = [c.numpy() for c in repl.local_results(v)]
    for other in copies[1:]:  # every replica holds the same state
        np.testing.assert_allclose(other, copies[0], rtol=1e-6, atol=1e-6, err_msg=v.name)
    results[f"var{index:03d}:{v.name}"] = copies[0]
np.savez(out, **results)
"""


@pytest.mark.timeout(600)
def test_two_replicas_of_batch_b_match_one_replica_of_batch_2b(tmp_path):
    outputs = {}
    for spec in ("cpu", "cpu:2"):
        path = tmp_path / f"{spec.replace(':', '_')}.npz"
        run_python(SCRIPT, spec, str(path), str(STEPS), str(2 * PER_REPLICA), timeout=500)
        outputs[spec] = dict(np.load(path))
    one, two = outputs["cpu"], outputs["cpu:2"]
    assert one.keys() == two.keys()
    moving = [k for k in one if "moving_mean/average" in k or "moving_variance/average" in k]
    assert len(moving) >= 2 * 7  # stem + 2 blocks of 3 + one projection
    for key in sorted(one):
        np.testing.assert_allclose(two[key], one[key], rtol=1e-5, atol=1e-5, err_msg=key)
    # The statistics really are of the global batch: the moving means moved.
    assert any(np.abs(one[k]).max() > 1e-3 for k in moving if "moving_mean" in k)
