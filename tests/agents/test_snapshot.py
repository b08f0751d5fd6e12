"""Policy snapshots: a fresh process with only TensorFlow acts like the learner's policy."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from dm_env import specs

import replication
from agents.d4pg import snapshot
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner
from agents.d4pg.numpy_policy import NumpyPolicy
from environments import EnvironmentSpec
from environments.suite import task_statistics
from tests.agents.fixed_data import fixed_batches, observations

pytestmark = pytest.mark.timeout(300)

CONFIG = D4PGConfig.from_overrides(
    {
        "policy_layers": "16,8",
        "critic_layers": "16",
        "num_atoms": 11,
        "batch_size": 8,
        "conv_channels": "4,4",
        "conv_kernels": "3,3",
        "conv_strides": "2,1",
        "torso_output_size": 8,
        "policy_lr": 1e-2,
        "critic_lr": 1e-2,
        "jit_compile": False,
        "updates_per_call": 1,
    }
)


def _spec(obs_shape, obs_dtype, low, high, num_actions):
    return EnvironmentSpec(
        observations=specs.Array(obs_shape, obs_dtype),
        actions=specs.BoundedArray((num_actions,), np.float32, low, high),
        rewards=specs.Array((), np.float32),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )


FEATURES = _spec((6,), np.float32, -2.0, 0.5, 2)
PIXELS = _spec((20, 16, 3), np.uint8, -1.0, 1.0, 3)


def _trained_learner(spec):
    """A learner after a few real updates (weights away from their initialisation)."""

    input_fn = fixed_batches(CONFIG.batch_size, spec)
    learner = D4PGLearner(CONFIG, spec, replication.make("cpu"), input_fn)
    for _ in range(5):
        learner.step()
    return learner


# Runs with no project directory on its path and checks that nothing of the project was
# imported: only TensorFlow (and numpy to read and write arrays).
_FRESH = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf
    policy = tf.saved_model.load(sys.argv[1])
    obs = np.load(sys.argv[2], allow_pickle=False)
    np.save(sys.argv[3], policy.act(obs).numpy(), allow_pickle=False)
    served = policy.signatures["serving_default"](observation=tf.constant(obs))["action"]
    np.save(sys.argv[4], served.numpy(), allow_pickle=False)
    ours = {"agents", "launch", "replication", "environments", "vision"}
    print(json.dumps({
        "metadata": json.loads(policy.metadata().numpy()),
        "project_modules": sorted(m for m in sys.modules if m.split(".")[0] in ours),
    }))
    """
)


@pytest.mark.parametrize("spec", [FEATURES, PIXELS], ids=["features", "pixels"])
def test_snapshot_acts_like_the_learner_in_a_fresh_process(tmp_path, spec):
    learner = _trained_learner(spec)
    (weights,) = learner.get_variables(["policy"])
    directory = str(tmp_path / "snapshot")
    snapshot.write(
        directory,
        config=CONFIG,
        env_spec=spec,
        weights=weights,
        task="fake:task",
        learner_step=learner.num_steps,
    )
    obs = observations(spec, 7, seed=3)
    expected = learner.networks.policy(learner.networks.torso(obs)).numpy()
    assert np.std(expected) > 1e-3  # The weights moved: actions differ between inputs.

    script = tmp_path / "load.py"
    script.write_text(_FRESH)
    np.save(tmp_path / "obs.npy", obs)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, str(script), directory, "obs.npy", "act.npy", "served.npy"],
        cwd=tmp_path,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["project_modules"] == []
    assert report["metadata"]["task"] == "fake:task"
    assert report["metadata"]["learner_step"] == learner.num_steps == 5
    assert report["metadata"]["config"] == CONFIG.to_dict()
    np.testing.assert_allclose(np.load(tmp_path / "act.npy"), expected, atol=1e-5)
    np.testing.assert_allclose(np.load(tmp_path / "served.npy"), expected, atol=1e-5)

    # Evaluation acts with numpy on the snapshot's weights: the same actions.
    metadata, loaded = snapshot.load_weights(directory)
    assert metadata == report["metadata"]
    policy = NumpyPolicy(
        CONFIG,
        pixels=spec is PIXELS,
        action_low=metadata["action"]["minimum"],
        action_high=metadata["action"]["maximum"],
    )
    policy.set_weights(loaded)
    np.testing.assert_allclose(np.stack([policy(o) for o in obs]), expected, atol=1e-5)


def test_snapshot_checks_specs_and_keeps_the_newest(tmp_path):
    learner = _trained_learner(FEATURES)
    (weights,) = learner.get_variables(["policy"])
    root = str(tmp_path / "snapshots")
    for step in (10, 30, 20):
        snapshot.write(
            snapshot.step_directory(root, step),
            config=CONFIG,
            env_spec=FEATURES,
            weights=weights,
            task="fake:task",
            learner_step=step,
        )
    os.makedirs(os.path.join(root, "step_40"))  # Incomplete (no metadata): not listed.
    assert snapshot.list_steps(root) == [10, 20, 30]
    assert snapshot.prune(root, keep=2) == [10]
    assert snapshot.list_steps(root) == [20, 30]

    metadata = snapshot.read_metadata(snapshot.step_directory(root, 30))
    snapshot.check_fits(metadata, FEATURES)
    other = _spec((7,), np.float32, -2.0, 0.5, 2)
    with pytest.raises(snapshot.SnapshotError, match=r"observation shape \[6\].*has \[7\]"):
        snapshot.check_fits(metadata, other, where="other:task")
    bounds = _spec((6,), np.float32, -1.0, 1.0, 2)
    with pytest.raises(snapshot.SnapshotError, match="action minimum"):
        snapshot.check_fits(metadata, bounds)
    with pytest.raises(snapshot.SnapshotError, match="not a policy snapshot"):
        snapshot.read_metadata(str(tmp_path))


def test_a_save_replaces_a_snapshot_whole_and_clears_what_killed_saves_left(tmp_path):
    # Issue 18, item 13: replacing was delete-then-rename (a crash between lost the
    # snapshot) and a save killed midway left its staging folder for ever.
    learner = _trained_learner(FEATURES)
    (weights,) = learner.get_variables(["policy"])
    root = str(tmp_path / "snapshots")
    os.makedirs(os.path.join(root, ".snapshot-killed"))  # Left by a save killed midway.
    os.makedirs(os.path.join(root, ".replaced-killed"))
    directory = snapshot.step_directory(root, 10)
    for step in (10, 11):  # The second save replaces the first at the same place.
        snapshot.write(
            directory,
            config=CONFIG,
            env_spec=FEATURES,
            weights=weights,
            task="fake:task",
            learner_step=step,
        )
    assert sorted(os.listdir(root)) == ["step_10"]
    assert snapshot.read_metadata(directory)["learner_step"] == 11


def test_a_normalized_run_s_snapshot_says_how_its_features_were_standardized(tmp_path):
    config = D4PGConfig.from_overrides({"normalize_observations": "true"}, base=CONFIG)
    torso, policy = snapshot.build_policy(config, FEATURES)
    weights = [v.numpy() for v in torso.ordered_variables() + policy.ordered_variables()]
    for normalize, name in ((config, "normalized"), (CONFIG, "plain")):
        snapshot.write(
            str(tmp_path / name),
            config=normalize,
            env_spec=FEATURES,
            weights=weights,
            task="reacher:easy",
            learner_step=0,
        )
    stats = task_statistics("reacher", "easy")
    written = snapshot.read_metadata(str(tmp_path / "normalized"))["observation_standardization"]
    np.testing.assert_array_equal(np.float32(written["mean"]), stats.mean)
    np.testing.assert_array_equal(np.float32(written["scale"]), stats.scale)
    assert written["clip"] == stats.clip
    assert "observation_standardization" not in snapshot.read_metadata(str(tmp_path / "plain"))
