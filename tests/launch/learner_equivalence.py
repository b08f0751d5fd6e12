"""A D4PG learner on fixed batches, for comparing a learner group with one process."""

import numpy as np
import tensorflow as tf

from agents.d4pg import builder
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, Transition
from tests.launch import d4pg_support as s

STEPS = 2


def env_spec(config):
    import environments

    return environments.make_environment_spec(builder.make_environment(config, s.TASK, seed=0))


def batches(config, spec):
    """`STEPS` global batches of random transitions (fixed seed)."""
    rng = np.random.RandomState(7)
    obs_shape = spec.observations.shape
    act_shape = spec.actions.shape
    b = config.batch_size
    out = []
    for _ in range(STEPS):
        out.append(
            Transition(
                observation=rng.randn(b, *obs_shape).astype(np.float32),
                action=rng.uniform(-1, 1, (b, *act_shape)).astype(np.float32),
                reward=rng.randn(b).astype(np.float32),
                discount=rng.uniform(0.5, 1.0, b).astype(np.float32),
                next_observation=rng.randn(b, *obs_shape).astype(np.float32),
            )
        )
    return out


def build_learner(repl, checkpoint_dir=None):
    # One update per call: the test compares exactly one update of each learner.
    config = D4PGConfig.from_dict({**s.tiny_config(), "updates_per_call": 1})
    spec = env_spec(config)
    data = batches(config, spec)

    def input_fn(ctx):
        # Pipeline i reads rows [i*b, (i+1)*b) of every global batch.
        per_replica = ctx.get_per_replica_batch_size(config.batch_size)
        start = ctx.input_pipeline_id * per_replica
        rows = [tf.nest.map_structure(lambda x: x[start : start + per_replica], t) for t in data]
        stacked = tf.nest.map_structure(lambda *xs: np.stack(xs), *rows)
        return tf.data.Dataset.from_tensor_slices(Transition(*stacked)).repeat()

    return D4PGLearner(config, spec, repl, input_fn, checkpoint_dir=checkpoint_dir)


def weights(learner):
    (online,) = learner.get_variables(["all"])
    return online
