"""Value support rule and its warning; random-shift augmentation against numpy and in the
learner's update."""

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


def _offsets_of(shifted, originals, pad):
    """Per image, the one crop offset that shifts its original onto it (None: no offset)."""
    found = []
    for image, original in zip(shifted, originals):
        matches = [
            (row, col)
            for row in range(2 * pad + 1)
            for col in range(2 * pad + 1)
            if np.array_equal(_numpy_shift(original[None], [(row, col)], pad)[0], image)
        ]
        found.append(matches[0] if len(matches) == 1 else None)
    return found


@pytest.mark.parametrize("random_shift", [True, False])
def test_the_learner_computes_its_losses_on_shifted_copies_of_the_batch(random_shift):
    """The images the update's losses see (XLA, as users run it), recorded inside the step."""
    pad, rows = 2, 16
    spec = EnvironmentSpec(
        observations=specs.Array((12, 12, 3), np.uint8),
        actions=specs.BoundedArray((1,), np.float32, -1.0, 1.0),
        rewards=specs.BoundedArray((), np.float32, 0.0, 1.0),
        discounts=specs.BoundedArray((), np.float32, 0.0, 1.0),
    )
    config = _small(
        from_pixels=True,
        random_shift=random_shift,
        random_shift_pad=pad,
        conv_channels="4",
        conv_kernels="3",
        conv_strides="2",
        torso_output_size=6,
        jit_compile=True,
    )
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, rows, 12, 12, 3)).astype(np.uint8)
    data = Transition(
        frames[0],
        rng.uniform(-1, 1, (rows, 1)).astype(np.float32),
        np.ones(rows, np.float32),
        np.full(rows, 0.95, np.float32),
        frames[1],
    )
    learner = D4PGLearner(
        config,
        spec,
        replication.make("cpu"),
        lambda ctx: tf.data.Dataset.from_tensors(data).repeat(),
    )
    seen = [tf.Variable(tf.zeros_like(frames[0])), tf.Variable(tf.zeros_like(frames[1]))]
    compute = learner._compute  # Losses and gradients of the (augmented) batch.

    def recording_compute(batch):
        seen[0].assign(batch.observation)
        seen[1].assign(batch.next_observation)
        return compute(batch)

    learner._compute = recording_compute  # Before the first step() traces the update.
    offsets = []  # o_t and o_{t+m} of update 0, then of update 1.
    for _ in range(2):
        learner.step()
        for recorded, original in zip(seen, (data.observation, data.next_observation)):
            offsets.append(_offsets_of(recorded.numpy(), original, pad))
    assert all(o is not None for update in offsets for o in update)  # Each is a shifted copy.
    if not random_shift:
        assert all(o == (pad, pad) for update in offsets for o in update)  # Unshifted.
        return
    obs_0, next_0, obs_1, _ = offsets
    assert sum(o != (pad, pad) for o in obs_0) >= rows // 2  # Most images moved.
    assert obs_0 != next_0  # o_t and o_{t+m} are shifted independently,
    assert obs_0 != obs_1  # and anew at every update.


def test_random_shift_defaults_on_for_pixels_only():
    assert D4PGConfig(from_pixels=True).resolved_random_shift()
    assert not D4PGConfig().resolved_random_shift()
    assert not D4PGConfig(from_pixels=True, random_shift=False).resolved_random_shift()
    with pytest.raises(ValueError, match="random_shift"):
        D4PGConfig(random_shift=True)
