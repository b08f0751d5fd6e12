"""The Acme-matching options: `network_init="acme"` and `act_with_target_policy`.

(`short_transitions_from_first_state`: its items are tested in test_adders.py, its wiring here.)
"""

import dataclasses

import dm_env
import numpy as np
import pytest
import reverb
import tensorflow as tf
from dm_env import specs

import environments
import replication
from agents.d4pg import builder, networks, replay, snapshot
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner
from environments import EnvironmentSpec
from launch.d4pg import snapshots
from tests.agents.fixed_data import fixed_batches, observations

pytestmark = pytest.mark.timeout(300)


def _spec(obs_shape, obs_dtype, num_actions):
    return EnvironmentSpec(
        observations=specs.Array(obs_shape, obs_dtype),
        actions=specs.BoundedArray((num_actions,), np.float32, -1.0, 1.0),
        rewards=specs.Array((), np.float32),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )


FEATURES = _spec((7,), np.float32, num_actions=6)
PIXELS = _spec((20, 16, 3), np.uint8, num_actions=2)
SMALL = {
    "policy_layers": "16,8",
    "critic_layers": "16",
    "num_atoms": 11,
    "batch_size": 4,
    "conv_channels": "4,4",
    "conv_kernels": "3,3",
    "conv_strides": "2,1",
    "torso_output_size": 8,
    "min_replay_size": 1,
    "samples_per_insert": 0,
}


# ------------------------------------------------------------------ network_init


def _nets(init: str):
    config = D4PGConfig(policy_layers=(256, 128), critic_layers=(300, 200), network_init=init)
    tf.random.set_seed(0)
    return networks.make_networks(config, FEATURES)


def _mlp_linears(nets):
    return [
        layer
        for mlp in (nets.policy.mlp, nets.critic.mlp)
        for layer in [mlp.first, *mlp.rest]  # The first (LayerNorm) layer included.
    ]


def test_acme_init_is_variance_scaling_0333_fan_out_uniform():
    for layer in _mlp_linears(_nets("acme")):
        w = layer.w.numpy()
        limit = np.sqrt(3 * 0.333 / w.shape[1])  # U(+-sqrt(3 scale / fan_out)).
        assert np.abs(w).max() <= limit * (1 + 1e-6), layer.name
        assert np.abs(w).max() >= 0.98 * limit, layer.name  # Uniform: reaches the bound.
        assert np.std(w) == pytest.approx(limit / np.sqrt(3), rel=0.05), layer.name
        np.testing.assert_array_equal(layer.b.numpy(), 0.0)


def test_default_init_is_lecun_uniform_and_differs_from_acme():
    ours, acme = _nets("lecun_uniform"), _nets("acme")
    for layer in _mlp_linears(ours):
        w = layer.w.numpy()
        limit = np.sqrt(3.0 / w.shape[0])  # U(+-sqrt(3 / fan_in)).
        assert limit * 0.98 <= np.abs(w).max() <= limit * (1 + 1e-6), layer.name
    for a, b in zip(_mlp_linears(ours), _mlp_linears(acme)):
        # fan_in 7 -> 256: 0.65 against 0.062; 256 -> 128: 0.108 against 0.088.
        ratio = np.abs(a.w.numpy()).max() / np.abs(b.w.numpy()).max()
        assert ratio > 1.15 or ratio < 0.87, (a.name, ratio)


def test_policy_head_near_zero_truncated_normal_for_acme_uniform_for_ours():
    for init, truncated in (("acme", True), ("lecun_uniform", False)):
        w = _nets(init).policy.head.w.numpy()  # 128 x 6.
        std = np.sqrt(1e-4 / w.shape[0])  # VarianceScaling(1e-4, fan_in): the same spread.
        assert np.std(w) == pytest.approx(std, rel=0.1), init
        # A uniform sample never exceeds sqrt(3) std; a normal truncated at 2 (corrected)
        # standard deviations reaches 2 / 0.8796 = 2.27 std.
        peak = np.abs(w).max() / np.std(w)
        assert (peak > 1.95) if truncated else (peak < 1.8), (init, peak)


def test_init_leaves_the_critic_head_and_layer_norms_alone():
    ours, acme = _nets("lecun_uniform"), _nets("acme")
    # Sonnet's default, as Acme's DiscreteValuedHead: the same draw under the same seed.
    np.testing.assert_array_equal(ours.critic.head.w.numpy(), acme.critic.head.w.numpy())
    for nets in (ours, acme):
        for mlp in (nets.policy.mlp, nets.critic.mlp):
            np.testing.assert_array_equal(mlp.norm.scale.numpy(), 1.0)
            np.testing.assert_array_equal(mlp.norm.offset.numpy(), 0.0)


def test_init_leaves_the_pixel_torso_alone():
    torsos = []
    for init in ("lecun_uniform", "acme"):
        tf.random.set_seed(0)
        nets = networks.make_networks(
            D4PGConfig.from_overrides({**SMALL, "network_init": init}), PIXELS
        )
        torsos.append([v.numpy() for v in nets.torso.ordered_variables()])
    for a, b in zip(*torsos):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------ act_with_target_policy


def _randomise(variables, seed):
    rng = np.random.default_rng(seed)
    for v in variables:  # Far from the near-zero head init, so every layer matters.
        v.assign(rng.normal(0.0, 0.5, v.shape).astype(np.float32))


def _policy_actions(nets, obs):
    return nets.policy(nets.torso(tf.constant(obs))).numpy()


@pytest.mark.parametrize("spec", [FEATURES, PIXELS], ids=["features", "pixels"])
@pytest.mark.parametrize("target", [True, False], ids=["target", "online"])
def test_actors_and_evaluator_act_with_the_configured_policy(spec, target):
    config = D4PGConfig.from_overrides({**SMALL, "act_with_target_policy": target})
    server = builder.make_replay_server(config, spec)
    try:
        address = f"localhost:{server.port}"
        learner = builder.make_learner(config, spec, address, replication.make("cpu"), None)
        # Online and target differ (as between target copies), torso included for pixels.
        _randomise(learner.networks.acting_variables(), seed=1)
        _randomise(learner.target_networks.acting_variables(), seed=2)
        learner.publish_variables()
        obs = observations(spec, 5, seed=3)
        online = _policy_actions(learner.networks, obs)
        offline = _policy_actions(learner.target_networks, obs)
        assert not np.allclose(online, offline, atol=1e-2)
        want = offline if target else online

        actor = builder.make_actor(config, spec, address, seed=0, with_noise=False)
        evaluator = builder.make_evaluator(config, spec, address)
        noiseless = dataclasses.replace(config, sigma=0.0)
        batched = builder.make_batched_actor(noiseless, spec, address, seed=0, num_envs=5)
        for agent in (actor, evaluator, batched):
            agent.update(wait=True)
        for agent in (actor, evaluator):
            got = np.stack([agent.select_action(o) for o in obs])
            np.testing.assert_allclose(got, want, atol=1e-5)
        np.testing.assert_allclose(batched.select_actions(obs), want, atol=1e-5)
    finally:
        server.stop()


def test_target_policy_follows_the_target_copies():
    """What actors see changes when the target is copied, not on every publish."""
    config = D4PGConfig.from_overrides(
        {
            **SMALL,
            "act_with_target_policy": True,
            "target_update_period": 3,
            "jit_compile": False,
            "updates_per_call": 1,
            "policy_lr": 1e-2,
            "critic_lr": 1e-2,
        }
    )
    learner = D4PGLearner(
        config, FEATURES, replication.make("cpu"), fixed_batches(config.batch_size, FEATURES)
    )
    published = []
    for _ in range(7):  # Copies at updates 0, 3, 6 (before each of them).
        learner.step()
        published.append(learner.acting_weights())
    same = [
        all(np.array_equal(a, b) for a, b in zip(published[i], published[i + 1])) for i in range(6)
    ]
    # After update k (1-based) the target is the online of update 3 * floor((k - 1) / 3).
    assert same == [True, True, False, True, True, False]


def test_snapshots_hold_the_acting_policy(tmp_path):
    obs = observations(FEATURES, 5, seed=3)
    for target in (True, False):
        config = D4PGConfig.from_overrides({**SMALL, "act_with_target_policy": target})
        learner = D4PGLearner(
            config, FEATURES, replication.make("cpu"), fixed_batches(config.batch_size, FEATURES)
        )
        _randomise(learner.networks.acting_variables(), seed=1)
        _randomise(learner.target_networks.acting_variables(), seed=2)
        run_dir = str(tmp_path / f"run_{target}")
        path = snapshots.save_for_run(
            run_dir, learner=learner, config=config, env_spec=FEATURES, task="fake:task", keep=1
        )
        loaded = tf.saved_model.load(path)  # Kept: its variables live as long as it does.
        acted = loaded.act(obs).numpy()
        nets = learner.target_networks if target else learner.networks
        np.testing.assert_allclose(acted, _policy_actions(nets, obs), atol=1e-5)
        _, weights = snapshot.load_weights(path)
        assert len(weights) == len(learner.acting_weights())


@pytest.mark.parametrize("target", [True, False], ids=["target", "online"])
def test_export_from_a_checkpoint_reads_the_acting_policy(tmp_path, target):
    task = "cartpole:balance"
    config = D4PGConfig.from_overrides({**SMALL, "act_with_target_policy": target})
    env = builder.make_environment(config, task, seed=0)
    spec = environments.make_environment_spec(env)
    env.close()
    server = builder.make_replay_server(config, spec)
    try:
        learner = builder.make_learner(
            config,
            spec,
            f"localhost:{server.port}",
            replication.make("cpu"),
            str(tmp_path / "checkpoints"),
            publish=False,
        )
        _randomise(learner.networks.acting_variables(), seed=1)
        _randomise(learner.target_networks.acting_variables(), seed=2)
        checkpoint = learner.save()
    finally:
        server.stop()
    identity = {"program": "d4pg", "task": task, "config": config.to_dict()}
    out = snapshots.export_from_checkpoint(identity, checkpoint, str(tmp_path / "out"), step=0)
    _, weights = snapshot.load_weights(out)
    want = learner.get_variables(["target_policy" if target else "policy"])[0]
    other = learner.get_variables(["policy" if target else "target_policy"])[0]
    for got, expected in zip(weights, want):
        np.testing.assert_array_equal(got, expected)
    assert not all(np.array_equal(a, b) for a, b in zip(weights, other))


# ------------------------------------------- short_transitions_from_first_state: wiring


@pytest.mark.parametrize("short", [True, False], ids=["acme_short_first", "ours"])
def test_actors_write_the_short_first_transitions_when_configured(short):
    """Through `builder`: T + n - 1 items per episode with the option, T without."""
    config = D4PGConfig.from_overrides(
        {
            **SMALL,
            "n_step": 3,
            "short_transitions_from_first_state": short,
            "transitions_per_item": 1,  # Counts items of one transition.
        }
    )
    server = builder.make_replay_server(config, FEATURES)
    try:
        address = f"localhost:{server.port}"
        actor = builder.make_actor(config, FEATURES, address, seed=0)
        batched = builder.make_batched_actor(config, FEATURES, address, seed=0, num_envs=2)
        obs, action = np.zeros(7, np.float32), np.zeros(6, np.float32)
        steps = [dm_env.transition(1.0, obs)] * 3 + [dm_env.termination(1.0, obs)]
        actor.observe_first(dm_env.restart(obs))
        for step in steps:
            actor.observe(action, step)
        for index in range(2):
            batched.observe_first(index, dm_env.restart(obs))
            for step in steps:
                batched.observe(index, action, step)
        per_episode = 4 + (2 if short else 0)
        assert replay.table_size(reverb.Client(address)) == 3 * per_episode
    finally:
        server.stop()
