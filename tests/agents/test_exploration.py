"""Exploration noise: white or coloured, restarted per episode and environment, wired from
the config through `builder` into single and batched actors."""

import contextlib

import numpy as np
import pytest
import reverb

import environments
from agents.d4pg import builder, networks, variables
from agents.d4pg.config import D4PGConfig
from agents.d4pg.exploration import SEQUENCE_LENGTH, ExplorationNoise

pytestmark = pytest.mark.timeout(120)

SIGMA = 0.3


def _lag1_correlation(samples: np.ndarray) -> float:
    """Mean over series of the correlation of step t with step t + 1 ([T, ...] samples)."""
    series = samples.reshape(len(samples), -1)
    return float(np.mean([np.corrcoef(s[:-1], s[1:])[0, 1] for s in series.T]))


@pytest.mark.parametrize("beta, low, high", [(0.0, -0.05, 0.05), (1.0, 0.5, 0.95)])
def test_noise_has_sigma_per_step_and_the_colour_its_beta_sets(beta, low, high):
    """White noise: independent steps; pink: successive steps correlated. Both N(0, sigma^2)."""
    noise = ExplorationNoise(2, (3,), SIGMA, beta, np.random.default_rng(0))
    samples = np.stack([noise.sample() for _ in range(4 * SEQUENCE_LENGTH)])
    assert samples.shape == (4 * SEQUENCE_LENGTH, 2, 3) and samples.dtype == np.float32
    assert abs(samples.std() / SIGMA - 1) < 0.1
    assert low < _lag1_correlation(samples) < high


def test_an_episode_start_restarts_that_environments_noise_only():
    """Two environments, same seed: an episode start in environment 0 after 10 steps gives
    it a new sequence there and leaves environment 1's noise as it was."""
    steady = ExplorationNoise(2, (2,), SIGMA, 1.0, np.random.default_rng(5))
    restarted = ExplorationNoise(2, (2,), SIGMA, 1.0, np.random.default_rng(5))
    a = np.stack([steady.sample() for _ in range(20)])
    b = [restarted.sample() for _ in range(10)]
    restarted.start_episode(0)
    b = np.stack(b + [restarted.sample() for _ in range(10)])
    np.testing.assert_array_equal(a[:, 1], b[:, 1])
    np.testing.assert_array_equal(a[:10, 0], b[:10, 0])
    assert not np.any(np.isclose(a[10:, 0], b[10:, 0]))


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_a_new_sigma_scales_every_later_sample(beta):
    """Same seed, sigma 0.3 against 0.3 then 0.1: the samples drawn before the change
    are rescaled and the later draws use the new sigma (over two blocks or sequences)."""
    steady = ExplorationNoise(2, (2,), SIGMA, beta, np.random.default_rng(3))
    lowered = ExplorationNoise(2, (2,), SIGMA, beta, np.random.default_rng(3))
    for _ in range(5):
        np.testing.assert_array_equal(steady.sample(), lowered.sample())
    lowered.set_sigma(SIGMA / 3)
    later = 2 * SEQUENCE_LENGTH + 100
    a = np.stack([steady.sample() for _ in range(later)])
    b = np.stack([lowered.sample() for _ in range(later)])
    np.testing.assert_allclose(b, a / 3, rtol=1e-5, atol=1e-7)


FEATURES = environments.make_environment_spec(environments.make("cartpole:balance", seed=0))


@contextlib.contextmanager
def _single_and_batched_actors(config: D4PGConfig, num_envs: int):
    """A single and a batched actor of `config` from `builder` (acting only, no adders) on
    a fresh replay server, its client, and zero policy weights (the policy acts 0, so an
    action is its noise)."""
    shapes = networks.acting_variable_shapes(config, FEATURES)
    weights = [np.zeros(shape, np.float32) for shape in shapes]
    server = builder.make_replay_server(config, FEATURES)
    try:
        address = f"localhost:{server.port}"
        single = builder.make_actor(config, FEATURES, address, seed=0, with_adder=False)
        batched = builder.make_batched_actor(config, FEATURES, address, seed=0, num_envs=num_envs)
        batched._adders = []  # pylint: disable=protected-access  # Acting only.
        yield single, batched, reverb.Client(address), weights
    finally:
        server.stop()


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_the_config_colours_the_noise_of_single_and_batched_actors(beta):
    """Through `builder`: `noise_beta` reaches both actors, and each restarts its noise
    sequence when an episode starts (`observe_first`)."""
    config = D4PGConfig.from_overrides(
        {"policy_layers": "8", "critic_layers": "8", "sigma": SIGMA, "noise_beta": beta}
    )
    with _single_and_batched_actors(config, num_envs=2) as (single, batched, _, weights):
        for actor in (single, batched):
            actor._acting.policy.set_weights(weights)  # pylint: disable=protected-access
        obs = np.zeros(FEATURES.observations.shape, np.float32)
        single_actions, batched_actions = [], []
        for _ in range(3):  # Episodes of 200 steps.
            single.observe_first(None)
            for index in range(2):
                batched.observe_first(index, None)
            for _ in range(200):
                single_actions.append(single.select_action(obs))
                batched_actions.append(batched.select_actions(np.stack([obs, obs])))
        single_actions, batched_actions = np.stack(single_actions), np.stack(batched_actions)
    for actions in (single_actions, batched_actions):
        correlation = _lag1_correlation(actions)
        assert (correlation > 0.5) if beta else (abs(correlation) < 0.1)
        if beta:
            # A pink sequence drifts within an episode; a restart leaves the drift behind:
            # successive steps across an episode boundary differ more than within one.
            jumps = np.abs(np.diff(actions, axis=0))
            at_starts = jumps[[199, 399]].mean()
            assert at_starts > 2 * jumps.mean()


def test_actors_take_the_scheduled_sigma_of_the_weights_they_pull():
    """`sigma_final_scale`: the noise of weights from learner update u has the config's
    `sigma_at(u)` (held to half the decay span, then linear), in single and batched actors."""
    config = D4PGConfig.from_overrides(
        {
            "policy_layers": "8",
            "critic_layers": "8",
            "sigma": SIGMA,
            "sigma_final_scale": 1 / 3,
            "lr_decay_updates": 1000,
            "lr_decay_start_fraction": 0.5,
        }
    )
    with _single_and_batched_actors(config, num_envs=16) as (single, batched, client, weights):
        obs = np.zeros(FEATURES.observations.shape, np.float32)
        for update, sigma in ((0, SIGMA), (500, SIGMA), (750, 2 * SIGMA / 3), (1000, SIGMA / 3)):
            variables.publish(client, update, weights)
            single.update(wait=True)
            batched.update(wait=True)
            actions = np.stack([single.select_action(obs) for _ in range(1600)])
            assert abs(actions.std() / sigma - 1) < 0.08, (update, actions.std())
            actions = np.stack([batched.select_actions(np.stack([obs] * 16)) for _ in range(100)])
            assert abs(actions.std() / sigma - 1) < 0.08, (update, actions.std())
