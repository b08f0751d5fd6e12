"""Networks: numpy policy == Sonnet policy; shapes for the params table; actor noise."""

import numpy as np
import pytest
import reverb
import tensorflow as tf
from dm_env import specs

import replication
from agents.d4pg import builder, networks, variables
from agents.d4pg.acting import D4PGActor
from agents.d4pg.config import D4PGConfig
from agents.d4pg.numpy_policy import NumpyPolicy
from environments import EnvironmentSpec

pytestmark = pytest.mark.timeout(180)


def _spec(obs_shape, obs_dtype, num_actions=2, low=-1.0, high=1.0):
    return EnvironmentSpec(
        observations=specs.Array(obs_shape, obs_dtype),
        actions=specs.BoundedArray((num_actions,), np.float32, low, high),
        rewards=specs.Array((), np.float32),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )


FEATURES = _spec((7,), np.float32)
PIXELS = _spec((24, 20, 6), np.uint8, num_actions=3)
CONFIG = D4PGConfig.from_overrides(
    {
        "policy_layers": "32,16,8",
        "critic_layers": "16,16",
        "conv_channels": "8,4",
        "conv_kernels": "3,3",
        "conv_strides": "2,1",
        "torso_output_size": 10,
    }
)


def _randomise(variables, seed):
    rng = np.random.default_rng(seed)
    for v in variables:  # Far from the near-zero init, so every layer matters.
        v.assign(rng.normal(0.0, 0.5, v.shape).astype(np.float32))


@pytest.mark.parametrize(
    "spec, low, high",
    [(FEATURES, -1.0, 1.0), (PIXELS, -1.0, 1.0), (_spec((4,), np.float32), -2.0, 0.5)],
)
def test_numpy_policy_equals_sonnet(spec, low, high):
    spec = EnvironmentSpec(
        spec.observations,
        specs.BoundedArray(spec.actions.shape, np.float32, low, high),
        spec.rewards,
        spec.discounts,
    )
    nets = networks.make_networks(CONFIG, spec)
    _randomise(nets.acting_variables(), seed=1)
    policy = NumpyPolicy(
        CONFIG, pixels=networks.is_pixels(spec.observations), action_low=low, action_high=high
    )
    policy.set_weights([v.numpy() for v in nets.acting_variables()])
    rng = np.random.default_rng(2)
    if spec.observations.dtype == np.uint8:
        obs = rng.integers(0, 256, (5,) + spec.observations.shape).astype(np.uint8)
    else:
        obs = rng.normal(0, 2, (5,) + spec.observations.shape).astype(np.float32)
    expected = nets.policy(nets.torso(tf.constant(obs))).numpy()
    got = np.stack([policy(o) for o in obs])
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert got.dtype == np.float32
    assert np.all(got >= low) and np.all(got <= high)


@pytest.mark.parametrize("spec", [FEATURES, PIXELS])
def test_acting_variable_shapes_match_the_networks(spec):
    nets = networks.make_networks(CONFIG, spec)
    assert networks.acting_variable_shapes(CONFIG, spec) == [
        tuple(v.shape) for v in nets.acting_variables()
    ]


def test_noise_stays_inside_the_action_spec():
    spec = _spec((3,), np.float32, num_actions=4, low=-1.0, high=1.0)
    nets = networks.make_networks(CONFIG, spec)
    _randomise(nets.acting_variables(), seed=3)  # Actions near the bounds.
    policy = NumpyPolicy(CONFIG, pixels=False, action_low=-1.0, action_high=1.0)
    policy.set_weights([v.numpy() for v in nets.acting_variables()])
    actor = D4PGActor(policy, spec.actions, variable_client=None, adder=None, sigma=2.0, seed=0)
    rng = np.random.default_rng(0)
    actions = np.stack(
        [actor.select_action(rng.normal(0, 3, 3).astype(np.float32)) for _ in range(500)]
    )
    assert actions.dtype == np.float32 and actions.shape == (500, 4)
    assert actions.min() >= -1.0 and actions.max() <= 1.0
    assert (actions == 1.0).any() and (actions == -1.0).any()  # Noise was clipped, not absent.
    evaluator = D4PGActor(policy, spec.actions, variable_client=None, sigma=0.0)
    obs = np.ones(3, np.float32)
    np.testing.assert_array_equal(evaluator.select_action(obs), policy(obs))


@pytest.mark.parametrize("publisher", ["insert", "learner_writer"])
def test_actor_pulls_published_weights_every_k_steps(publisher):
    """Weights published by `variables.publish` or the learner's writer read the same."""
    config = D4PGConfig.from_overrides(
        {
            "policy_layers": "8",
            "variable_update_period": 3,
            "min_replay_size": 1,
            "samples_per_insert": 0,
        }
    )
    server = builder.make_replay_server(config, FEATURES)
    try:
        address = f"localhost:{server.port}"
        client = reverb.Client(address)
        actor = builder.make_actor(
            config, FEATURES, address, seed=0, with_noise=False, with_adder=False
        )
        actor.update()  # Nothing published yet: returns without blocking.
        assert actor.weights_version == -1
        nets = networks.make_networks(config, FEATURES)
        versions = {}
        for version, seed in ((7, 1), (8, 2)):  # Two different weight sets.
            _randomise(nets.acting_variables(), seed=seed)
            versions[version] = [v.numpy() for v in nets.acting_variables()]
        obs = np.random.default_rng(0).normal(0, 1, (4, 7)).astype(np.float32)

        def expected(version):
            policy = NumpyPolicy(config, pixels=False, action_low=-1.0, action_high=1.0)
            policy.set_weights(versions[version])
            return np.stack([policy(o) for o in obs])

        def acted():
            return np.stack([actor.select_action(o) for o in obs])

        assert not np.allclose(expected(7), expected(8), atol=1e-3)
        publish = variables.publish
        if publisher == "learner_writer":
            writer = variables.WeightsPublisher(client)
            publish = lambda _, version, arrays: writer.publish(version, arrays)  # noqa: E731
        publish(client, 7, versions[7])
        actor.update(wait=True)
        assert actor.weights_version == 7
        np.testing.assert_array_equal(acted(), expected(7))
        publish(client, 8, versions[8])
        actor.update()  # Calls 2, 3 of this period: not due yet.
        actor.update()
        assert actor.weights_version == 7
        np.testing.assert_array_equal(acted(), expected(7))  # Still the old weights.
        actor.update()  # Due.
        assert actor.weights_version == 8
        np.testing.assert_array_equal(acted(), expected(8))  # The new ones, applied.
    finally:
        server.stop()


def test_learner_to_reverb_to_actor_acts_as_the_learners_policy():
    """The weights an actor pulls through the "params" table give the learner's actions."""
    config = D4PGConfig.from_overrides(
        {**CONFIG.to_dict(), "batch_size": 4, "min_replay_size": 1, "samples_per_insert": 0}
    )
    for spec in (FEATURES, PIXELS):
        server = builder.make_replay_server(config, spec)
        try:
            address = f"localhost:{server.port}"
            learner = builder.make_learner(config, spec, address, replication.make("cpu"), None)
            actor = builder.make_actor(config, spec, address, seed=0, with_noise=False)
            rng = np.random.default_rng(3)
            shape = (6,) + spec.observations.shape
            if spec.observations.dtype == np.uint8:
                obs = rng.integers(0, 256, shape).astype(np.uint8)
            else:
                obs = rng.normal(0, 2, shape).astype(np.float32)
            nets = learner.networks
            previous = None
            for version in range(3):
                if version:  # New weights, published as the learner does.
                    _randomise(nets.acting_variables(), seed=10 + version)
                    learner.publish_variables()
                actor.update(wait=True)
                want = nets.policy(nets.torso(tf.constant(obs))).numpy()
                got = np.stack([actor.select_action(o) for o in obs])
                np.testing.assert_allclose(got, want, atol=1e-5)
                if previous is not None:
                    assert not np.allclose(got, previous, atol=1e-3)
                previous = got
        finally:
            server.stop()
