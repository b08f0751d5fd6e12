"""Standardised features (`make(..., normalize=True)`): statistics, and what agents see."""

import dm_env
import numpy as np
from dm_control import suite as dm_suite
from dm_env import specs

import environments
from environments import feature_stats
from environments.suite import task_statistics


def _random_episode_features(name, seed, normalize):
    env = environments.make(name, seed=seed, normalize=normalize)
    rng = np.random.default_rng(seed)
    rows = [env.reset().observation]
    timestep = None
    while timestep is None or not timestep.last():
        timestep = env.step(rng.uniform(-1, 1, env.action_spec().shape).astype(np.float32))
        rows.append(timestep.observation)
    return np.stack(rows)


class _CountingTask(dm_env.Environment):
    """Episodes of 4 steps observing {"t": t, "pair": (2t, 5)} at t = 0..4."""

    def __init__(self):
        self._t = 0

    def _observation(self):
        return {"t": np.float64(self._t), "pair": np.array([2.0 * self._t, 5.0])}

    def reset(self):
        self._t = 0
        return dm_env.restart(self._observation())

    def step(self, action):
        self._t += 1
        if self._t == 4:
            return dm_env.termination(0.0, self._observation())
        return dm_env.transition(0.0, self._observation())

    def observation_spec(self):
        return {"t": specs.Array((), np.float64), "pair": specs.Array((2,), np.float64)}

    def action_spec(self):
        return specs.BoundedArray((1,), np.float64, -1.0, 1.0)


def test_statistics_are_the_mean_and_inverse_std_of_every_observation():
    # Each episode observes t = 0..4, its first observation included: mean 2, std sqrt(2).
    stats = feature_stats.random_action_statistics(_CountingTask(), episodes=2)
    np.testing.assert_allclose(stats.mean, [2.0, 4.0, 5.0], rtol=1e-6)
    # The constant feature's std (0) is floored: scale 1 / MIN_STD, not infinity.
    np.testing.assert_allclose(
        stats.scale, [1 / np.sqrt(2.0), 1 / np.sqrt(8.0), 1 / feature_stats.MIN_STD], rtol=1e-6
    )


def test_task_statistics_come_from_random_actions_in_the_seeded_task():
    stats = task_statistics("reacher", "easy")
    again = feature_stats.random_action_statistics(
        dm_suite.load("reacher", "easy", task_kwargs={"random": feature_stats.SEED})
    )
    np.testing.assert_array_equal(stats.mean, again.mean)
    np.testing.assert_array_equal(stats.scale, again.scale)
    # reacher's to_target is ~10x smaller than its joint angles: the reason for all this.
    assert stats.scale[2:4].min() > 5 * stats.scale[0:2].max()


def test_normalized_features_have_unit_scale_under_random_actions():
    # Another seed than the statistics': each feature has mean ~0 and std ~1.
    features = _random_episode_features("cheetah:run", seed=7, normalize=True)
    assert np.abs(features.mean(axis=0)).max() < 0.5
    np.testing.assert_allclose(features.std(axis=0), 1.0, atol=0.35)


def test_normalized_observation_is_the_raw_one_standardized_and_clipped():
    # The same trajectory (seed, actions) with and without: x -> clip((x - mean) * scale).
    raw = _random_episode_features("finger:spin", seed=3, normalize=False)
    standardized = _random_episode_features("finger:spin", seed=3, normalize=True)
    stats = task_statistics("finger", "spin")
    expected = np.clip((raw - stats.mean) * stats.scale, -feature_stats.CLIP, feature_stats.CLIP)
    np.testing.assert_allclose(standardized, expected, rtol=1e-6, atol=1e-6)
    assert not np.allclose(standardized, raw)


def test_standardized_values_are_clipped():
    # E.g. a feature floored at MIN_STD (scale 100) that later moves by 0.5: 50 -> 10.
    stats = feature_stats.FeatureStandardization(
        mean=np.zeros(2, np.float32), scale=np.array([1.0, 1 / feature_stats.MIN_STD], np.float32)
    )
    out = stats.apply_(np.array([[3.0, 0.5], [-2.0, -0.001]], np.float32))
    np.testing.assert_array_equal(out, np.array([[3.0, 10.0], [-2.0, -0.1]], np.float32))


def test_statistics_follow_the_action_repeat():
    # Held random actions move the bodies further between observations than fresh ones.
    once, held = task_statistics("cheetah", "run", 1), task_statistics("cheetah", "run", 4)
    assert not np.allclose(once.scale, held.scale)
