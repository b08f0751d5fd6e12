"""SN-GAN on `cpu:2` with per-replica batch B updates exactly like `cpu` with batch 2B.

Each spec runs in a fresh interpreter (logical CPU devices are fixed when TensorFlow starts)
and saves every learner variable with np.savez: D/G weights, conditional batch-norm parameters
and moving statistics, spectral-norm u vectors, EMA generator, Adam moments, step counters.
"""

import subprocess
import sys

import numpy as np
import pytest

from tests import support

PER_REPLICA_BATCH = 4
STEPS = 3

_TRAIN = """
import sys
import numpy as np
import tensorflow as tf
import replication

spec, global_batch, steps, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
repl = replication.make(spec)  # first: logical devices must precede any other TF op
from vision import data
from vision.sngan import learning as sngan_learner, training

tf.random.set_seed(0)
config = sngan_learner.SNGANConfig(
    image_size=16, channels=1, g_base_channels=8, d_base_channels=8, latent_dim=16,
    global_batch_size=global_batch, disc_steps=2, g_learning_rate=1e-3, d_learning_rate=1e-3,
    ema_start=1, ema_decay=0.9, bn_decay=0.9)
learner = sngan_learner.SNGANLearner(config, repl)
initial_vars = list(learner.variables)  # before the optimisers' lazily created slots
initial = [v.numpy() for v in initial_vars]
dataset = data.open_dataset("digits")
data = iter(repl.distribute(training.learner_input_fn(dataset, config)))
losses = [learner.train_step(data) for _ in range(steps)]
final_vars = list(learner.variables)
final = [v.numpy() for v in final_vars]
names = [v.name for v in final_vars]
position = {id(v): i for i, v in enumerate(final_vars)}
initial_position = [position[id(v)] for v in initial_vars]
np.savez(out, names=np.array(names), initial_position=np.array(initial_position),
         num_replicas=repl.num_replicas,
         losses=np.array([[float(l[k]) for k in sorted(l)] for l in losses]),
         **{f"initial_{i}": v for i, v in enumerate(initial)},
         **{f"final_{i}": v for i, v in enumerate(final)})
"""


def _train_all(tmp_path, runs):
    """Trains each (spec, global batch) in its own interpreter, all in parallel."""
    outs, procs = [], []
    for spec, global_batch in runs:
        outs.append(str(tmp_path / f"{spec.replace(':', '_')}.npz"))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _TRAIN, spec, str(global_batch), str(STEPS), outs[-1]],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=support.python_env(),
                cwd=support.REPO_ROOT,
            )
        )
    results = []
    for (spec, _), proc, out in zip(runs, procs, outs):
        try:
            log, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, f"{spec} run failed:\n{log[-4000:]}"
        with np.load(out, allow_pickle=False) as f:
            results.append({k: f[k] for k in f.files})
    return results


@pytest.mark.timeout(900)
def test_two_replicas_match_one_replica_with_twice_the_batch(tmp_path):
    # The same global batch 2B: one replica, or two replicas of B each.
    one, two = _train_all(
        tmp_path, [("cpu", 2 * PER_REPLICA_BATCH), ("cpu:2", 2 * PER_REPLICA_BATCH)]
    )
    assert int(one["num_replicas"]) == 1 and int(two["num_replicas"]) == 2
    names = list(one["names"])
    assert names == list(two["names"])
    # What the comparison must cover.
    for part in (
        "discriminator",
        "generator/",
        "generator_ema",
        "/u:0",
        "/sigma:0",
        "moving_mean",
        "moving_variance",
        "gamma",
        "beta",
    ):
        assert any(part in n for n in names), part
    positions = list(one["initial_position"])
    assert positions == list(two["initial_position"])
    for i, p in enumerate(positions):
        np.testing.assert_array_equal(one[f"initial_{i}"], two[f"initial_{i}"], err_msg=names[p])
    np.testing.assert_allclose(one["losses"], two["losses"], rtol=1e-5, atol=1e-5)
    for i, name in enumerate(names):
        np.testing.assert_allclose(
            one[f"final_{i}"], two[f"final_{i}"], rtol=1e-5, atol=1e-5, err_msg=name
        )
    changed = sum(
        not np.array_equal(one[f"final_{p}"], one[f"initial_{i}"]) for i, p in enumerate(positions)
    )
    assert changed > len(positions) // 2  # the steps did train
