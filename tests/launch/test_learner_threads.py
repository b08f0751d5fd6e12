"""The learner's op threads: one for a one-process, one-replica CPU learner of features (its
fused XLA update then runs no loop split over threads), TensorFlow's default elsewhere."""

import glob
import os
import subprocess
import sys
import textwrap

import pytest

from tests.launch import d4pg_support as s

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _learner_threads(**kwargs) -> int:
    program = s.tiny_program(**kwargs)
    return next(n for n in program.nodes if n.name == "learner").kwargs["intra_op_threads"]


def test_one_thread_by_default_for_one_cpu_replica_on_features_only():
    assert _learner_threads() == 1
    assert _learner_threads(replicas="cpu:1") == 1  # The same single replica.
    assert _learner_threads(replicas="cpu:2", config={"batch_size": 64}) == 0
    assert _learner_threads(config={"from_pixels": True}) == 0
    assert _learner_threads(learner_workers=2, config={"batch_size": 64}) == 0
    assert _learner_threads(learner_intra_op_threads=0) == 0  # TensorFlow's default.
    assert _learner_threads(replicas="cpu:2", learner_intra_op_threads=2) == 2


# Builds the quick preset's learner sizes on a fixed batch, runs one fused call and dumps XLA's
# optimised computations; with `limit`, first what the learner node does.
_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    if {limit}:
        from launch.d4pg import nodes

        class Ctx:
            def log(self, message):
                print(message)

        nodes.limit_intra_op_threads(Ctx(), 1)
    import numpy as np
    import tensorflow as tf

    import environments, replication
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.learning import D4PGLearner, Transition

    repl = replication.make("cpu")
    spec = environments.make_environment_spec(environments.make("cartpole:swingup", seed=0))
    config = D4PGConfig.from_overrides({{
        "policy_layers": "64,64", "critic_layers": "128,128", "batch_size": 64,
        "updates_per_call": 2, "samples_per_insert": 0,
    }})
    obs, act = spec.observations.shape[0], spec.actions.shape[0]
    batch = Transition(
        np.ones((64, obs), np.float32), np.zeros((64, act), np.float32),
        np.ones(64, np.float32), np.full(64, 0.9, np.float32), np.ones((64, obs), np.float32),
    )
    learner = D4PGLearner(
        config, spec, repl, lambda ctx: tf.data.Dataset.from_tensors(batch).repeat()
    )
    learner.step()
    """
)


def _partitioned_loops(tmp_path, limit: bool) -> int:
    dump = tmp_path / ("limited" if limit else "default")
    script = _SCRIPT.format(root=ROOT, limit=limit)
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={dump}", "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=240)
    (update,) = glob.glob(str(dump / "*fused_updates*cpu_after_optimizations.txt"))
    with open(update, encoding="utf-8") as f:
        return f.read().count("outer_dimension_partitions")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="XLA splits loops over 2+ cores only")
def test_the_limited_learner_update_splits_no_loop_over_threads(tmp_path):
    # TensorFlow's default lets XLA split the update's largest loops over the cores (the
    # learner then waits for a thread that actors may hold); one thread splits none.
    assert _partitioned_loops(tmp_path, limit=False) > 0
    assert _partitioned_loops(tmp_path, limit=True) == 0
