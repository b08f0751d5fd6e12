"""Resume: learner state identical after restore; a checkpointed replay restores its items."""

import dm_env
import numpy as np
import pytest
import reverb
import tensorflow as tf
from dm_env import specs

import replication
from agents.d4pg import variables
from agents.d4pg.adders import NStepTransitionAdder
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, ReplayTimeoutError, Transition
from agents.d4pg.replay import PARAMS_TABLE, REPLAY_TABLE, make_replay_server
from environments import EnvironmentSpec

pytestmark = pytest.mark.timeout(300)

SPEC = EnvironmentSpec(
    observations=specs.Array((4,), np.float32),
    actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0),
    rewards=specs.Array((), np.float32),
    discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
)
CONFIG = D4PGConfig.from_overrides(
    {
        "policy_layers": "16,16",
        "critic_layers": "16,16",
        "batch_size": 8,
        "target_update_period": 2,
        "policy_lr": 1e-3,
        "critic_lr": 1e-3,
    }
)


def _input_fn(ctx):
    rng = np.random.default_rng(0)
    b = ctx.get_per_replica_batch_size(CONFIG.batch_size)
    data = Transition(
        rng.normal(size=(b, 4)).astype(np.float32),
        rng.uniform(-1, 1, (b, 2)).astype(np.float32),
        rng.normal(size=b).astype(np.float32),
        np.full(b, 0.9, np.float32),
        rng.normal(size=(b, 4)).astype(np.float32),
    )
    return tf.data.Dataset.from_tensors(data).repeat()


def _state(learner):
    online, target = learner.get_variables(["all", "target"])
    return online + target + learner.optimizer_state()


def test_learner_restore_gives_identical_weights_optimiser_state_and_step(tmp_path):
    repl = replication.make("cpu")
    first = D4PGLearner(CONFIG, SPEC, repl, _input_fn, checkpoint_dir=str(tmp_path))
    assert first.restore() is False  # Nothing saved yet.
    for _ in range(3):
        first.step()
    path = first.save()
    steps = 3 * CONFIG.updates_per_call  # Each step() runs updates_per_call updates.
    assert path and first.num_steps == steps
    saved = _state(first)

    second = D4PGLearner(CONFIG, SPEC, repl, _input_fn, checkpoint_dir=str(tmp_path))
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(second.get_variables(["all"])[0], first.get_variables(["all"])[0])
    )
    assert second.restore() is True
    assert second.num_steps == steps
    # Optimiser slots are created on the first update; they must come back all the same.
    restored = _state(second)
    assert len(restored) == len(saved) and len(second.optimizer_state()) > 0
    for a, b in zip(saved, restored):
        np.testing.assert_array_equal(a, b)

    # The next update is the same too (Adam moments and step counts were restored).
    first.step()
    second.step()
    for a, b in zip(_state(first), _state(second)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_restoring_a_learner_that_stepped_on_counts_from_the_checkpoint(tmp_path):
    """`num_steps` after a restore is the checkpoint's, also when the learner had stepped
    past it (the count a step returned is not kept across the restore)."""
    learner = D4PGLearner(
        CONFIG, SPEC, replication.make("cpu"), _input_fn, checkpoint_dir=str(tmp_path)
    )
    learner.step()
    assert learner.save().endswith(f"ckpt-{CONFIG.updates_per_call}")
    learner.step()
    learner.step()
    assert learner.num_steps == 3 * CONFIG.updates_per_call
    assert learner.restore()
    assert learner.num_steps == CONFIG.updates_per_call
    learner.step()
    assert learner.num_steps == 2 * CONFIG.updates_per_call


def test_a_call_cut_short_by_its_input_counts_the_updates_it_did():
    """Without fused updates a call whose input ends after j of its K batches keeps those
    j updates (`step` raises `ReplayTimeoutError`), and `num_steps` counts them."""
    config = CONFIG.from_overrides(
        {"updates_per_call": 4, "fuse_updates_per_call": False}, base=CONFIG
    )

    def five_batches(ctx):
        return _input_fn(ctx).take(5)

    learner = D4PGLearner(config, SPEC, replication.make("cpu"), five_batches)
    learner.step()
    assert learner.num_steps == 4
    with pytest.raises(ReplayTimeoutError):
        learner.step()
    assert learner.num_steps == 5


def test_replay_checkpoint_restores_into_a_new_server(tmp_path):
    config = CONFIG.from_overrides(
        {"min_replay_size": 1, "samples_per_insert": 0, "n_step": 3, "transitions_per_item": 1},
        base=CONFIG,
    )
    server = make_replay_server(config, SPEC, checkpoint_dir=str(tmp_path))
    client = reverb.Client(f"localhost:{server.port}")
    adder = NStepTransitionAdder(client, n_step=3, action_shape=(2,))
    rng = np.random.default_rng(1)
    for _ in range(3):
        adder.add_first(dm_env.restart(rng.normal(size=4).astype(np.float32)))
        for t in range(10):
            obs = rng.normal(size=4).astype(np.float32)
            step = dm_env.truncation(1.0, obs) if t == 9 else dm_env.transition(1.0, obs)
            adder.add(np.zeros(2, np.float32), step)
    adder.flush()
    variables.publish(client, 42, [np.zeros(s, np.float32) for s in _acting_shapes(config)])
    sizes = {t: info.current_size for t, info in client.server_info().items()}
    assert sizes[REPLAY_TABLE] == 30 and sizes[PARAMS_TABLE] == 1
    client.checkpoint()
    server.stop()

    restored = make_replay_server(config, SPEC, checkpoint_dir=str(tmp_path))
    try:
        client = reverb.Client(f"localhost:{restored.port}")
        assert {t: i.current_size for t, i in client.server_info().items()} == sizes
        pulled = variables.VariableClient(client)
        assert pulled.update(wait=True) and pulled.version == 42
    finally:
        restored.stop()


def _acting_shapes(config):
    from agents.d4pg import networks

    return networks.acting_variable_shapes(config, SPEC)


@pytest.mark.parametrize("publish_initial", [False, True], ids=["to-restore", "fresh-first"])
def test_a_learner_built_to_restore_lets_actors_pull_no_fresh_weights(tmp_path, publish_initial):
    """Built with `publish_initial=False` (as the launch's learner node builds it), a
    learner with a checkpoint leaves the params table to the weights it already holds
    until `restore()` publishes the restored ones; built the other way, actors can pull
    the fresh initialisation (version 0) in between."""
    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel

    config = D4PGConfig.from_overrides({**CONFIG.to_dict(), "transitions_per_item": "1"})
    server = make_replay_server(config, SPEC)
    try:
        address = f"localhost:{server.port}"
        repl = replication.make("cpu")
        first = builder.make_learner(config, SPEC, address, repl, str(tmp_path))
        first._num_steps.assign(5)  # pylint: disable=protected-access
        assert first.save()
        first.publish_variables()
        pulled = variables.VariableClient(reverb.Client(address))

        second = builder.make_learner(
            config, SPEC, address, repl, str(tmp_path), publish_initial=publish_initial
        )
        pulled.update(wait=True)
        assert pulled.version == (5 if not publish_initial else 0)
        assert second.restore()
        pulled.update(wait=True)
        assert pulled.version == 5
        for got, want in zip(pulled.weights, first.acting_weights()):
            np.testing.assert_array_equal(got, want)
    finally:
        server.stop()
