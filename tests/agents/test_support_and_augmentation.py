"""Value support rule and its warning; random-shift augmentation against numpy."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from dm_env import specs

import environments
import replication
from agents.d4pg import augmentation, networks
from agents.d4pg.config import D4PGConfig
from agents.d4pg.learning import D4PGLearner, Transition
from environments import EnvironmentSpec

pytestmark = pytest.mark.timeout(180)


def _spec(reward_spec) -> EnvironmentSpec:
    return EnvironmentSpec(
        observations=specs.Array((3,), np.float32),
        actions=specs.BoundedArray((1,), np.float32, -1.0, 1.0),
        rewards=reward_spec,
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )


@pytest.mark.parametrize(
    "task, repeat, discount, expected",
    [
        ("cartpole:swingup", 1, 0.99, (-10.0, 110.0)),  # Returns in [0, 100].
        ("cartpole:swingup", 8, 0.99, (-80.0, 880.0)),  # Rewards up to 8 per agent step.
        ("walker:walk", 2, 0.9, (-2.0, 22.0)),
    ],
)
def test_default_support_follows_rewards_repeat_and_discount(task, repeat, discount, expected):
    env = environments.make(task, action_repeat=repeat)
    spec = environments.make_environment_spec(env)
    assert (spec.rewards.minimum, spec.rewards.maximum) == (0.0, float(repeat))
    config = D4PGConfig(discount=discount)
    assert networks.value_support(config, spec) == pytest.approx(expected)
    # The n-step target of a return at the bound stays inside the support.
    _, vmax = networks.value_support(config, spec)
    n = config.n_step
    best_r = repeat * (1 - discount**n) / (1 - discount)
    assert best_r + discount**n * vmax <= vmax + 1e-9
    # Explicit values win.
    explicit = D4PGConfig(discount=discount, vmin=-1.0, vmax=3.0)
    assert networks.value_support(explicit, spec) == (-1.0, 3.0)


def test_support_without_reward_bounds_is_acmes_and_discount_one_needs_values():
    unbounded = _spec(specs.Array((), np.float32))
    assert networks.value_support(D4PGConfig(), unbounded) == (-150.0, 150.0)
    bounded = _spec(specs.BoundedArray((), np.float32, 0.0, 1.0))
    with pytest.raises(ValueError, match="--config.vmin"):
        networks.value_support(D4PGConfig(discount=1.0), bounded)


def test_lqr_declares_no_reward_bounds():
    assert environments.reward_bounds("lqr") is None
    assert environments.reward_bounds("cheetah") == (0.0, 1.0)


def _fixed(reward: float):
    rng = np.random.default_rng(0)
    data = Transition(
        rng.normal(size=(16, 3)).astype(np.float32),
        rng.uniform(-1, 1, (16, 1)).astype(np.float32),
        np.full(16, reward, np.float32),
        np.full(16, 0.95, np.float32),
        rng.normal(size=(16, 3)).astype(np.float32),
    )
    return lambda ctx: tf.data.Dataset.from_tensors(data).repeat()


def _small(**overrides):
    base = {"policy_layers": "8", "critic_layers": "8", "batch_size": 16, "jit_compile": False}
    return D4PGConfig.from_overrides({**base, **overrides})


def test_too_small_support_warns_once_with_what_to_set(caplog):
    """n-step returns of 40 against a support of [-10, 10]: a warning naming vmax."""
    spec = _spec(specs.BoundedArray((), np.float32, 0.0, 1.0))
    learner = D4PGLearner(_small(vmin=-10, vmax=10), spec, replication.make("cpu"), _fixed(40.0))
    learner._support_monitor._warmup = 5  # The default waits 200 updates.
    with caplog.at_level(logging.WARNING):
        for _ in range(12):
            metrics = learner.step()
    assert metrics["beyond_support_mass"] > 0.9
    assert metrics["edge_mass"] > 0.9
    warning = learner.support_warning
    assert warning and "--config.vmax=" in warning
    suggested_vmax = float(warning.split("--config.vmax=")[1].rstrip(")."))
    # R = 40 per 5 steps at gamma 0.99 -> ~8.1 per step -> returns up to ~810.
    assert 800 <= suggested_vmax <= 1000
    assert sum("value support" in r.getMessage() for r in caplog.records) == 1


def test_adequate_support_puts_no_mass_beyond_it():
    spec = _spec(specs.BoundedArray((), np.float32, 0.0, 1.0))
    learner = D4PGLearner(_small(), spec, replication.make("cpu"), _fixed(4.9))
    for _ in range(5):
        metrics = learner.step()
    assert metrics["beyond_support_mass"] == 0.0
    assert learner.support_warning is None


def _numpy_shift(images, offsets, pad):
    padded = np.pad(images, ((0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge")
    h, w = images.shape[1:3]
    return np.stack([padded[i, oy : oy + h, ox : ox + w] for i, (oy, ox) in enumerate(offsets)])


def test_random_shift_equals_pad_then_crop():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (6, 9, 7, 4)).astype(np.uint8)
    offsets = shift_offsets = augmentation.shift_offsets(tf.constant([3, 4]), 6, pad=3).numpy()
    assert shift_offsets.min() >= 0 and shift_offsets.max() <= 6
    shifted = augmentation.random_shift(tf.constant(images), tf.constant(offsets), pad=3)
    assert shifted.dtype == tf.uint8
    np.testing.assert_array_equal(shifted.numpy(), _numpy_shift(images, offsets, 3))
    centred = augmentation.random_shift(tf.constant(images), tf.fill([6, 2], 3), pad=3)
    np.testing.assert_array_equal(centred.numpy(), images)  # Offset pad = no shift.


def test_random_shift_defaults_on_for_pixels_only():
    assert D4PGConfig(from_pixels=True).resolved_random_shift()
    assert not D4PGConfig().resolved_random_shift()
    assert not D4PGConfig(from_pixels=True, random_shift=False).resolved_random_shift()
    with pytest.raises(ValueError, match="random_shift"):
        D4PGConfig(random_shift=True)
