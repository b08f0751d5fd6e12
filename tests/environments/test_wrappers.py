"""The wrappers `environments.make` stacks, checked against raw dm-control envs."""

import dm_env
import numpy as np
import pytest
from dm_control import suite as dm_suite
from dm_env import specs

import environments
from environments import wrappers


def _raw(name, seed, **task_kwargs):
    domain, task = name.split(":")
    return dm_suite.load(domain, task, task_kwargs={"random": seed, **task_kwargs})


def _concat(observation):
    return np.concatenate([np.ravel(v) for v in observation.values()]).astype(np.float32)


def _random_actions(spec, n, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (n,) + spec.shape).astype(np.float32)


# Features -------------------------------------------------------------------------------


def test_features_shape_dtype_and_timestep_types():
    env = environments.make("walker:walk")  # orientations (14,), height (), velocity (9,)
    assert env.observation_spec() == specs.Array((24,), np.float32)
    first = env.reset()
    assert first.first() and first.reward is None and first.discount is None
    assert first.observation.dtype == np.float32 and first.observation.shape == (24,)
    timestep = env.step(np.zeros(6, np.float32))
    assert timestep.mid()
    assert type(timestep.reward) is np.float32 and type(timestep.discount) is np.float32
    assert timestep.discount == 1.0


@pytest.mark.parametrize("name", ["walker:walk", "manipulator:bring_ball"])
def test_flattening_equals_concatenated_raw_observation(name):
    # manipulator has a (8, 2) feature: matrices are flattened row-major.
    raw, env = _raw(name, seed=3), environments.make(name, seed=3)
    np.testing.assert_array_equal(env.reset().observation, _concat(raw.reset().observation))
    for action in _random_actions(env.action_spec(), 5):
        # These tasks' bounds are [-1, 1]: the canonical action is the raw action.
        raw_step, step = raw.step(action.astype(np.float64)), env.step(action)
        np.testing.assert_array_equal(step.observation, _concat(raw_step.observation))
        assert step.reward == np.float32(raw_step.reward)
    slices = env.environment.feature_slices
    assert list(slices) == list(raw.observation_spec())
    assert slices.get("arm_pos", slice(0, 16)) == slice(0, 16)
    assert sum(s.stop - s.start for s in slices.values()) == env.observation_spec().shape[0]


def test_observations_are_fresh_arrays():
    env = environments.make("cartpole:swingup")
    first = env.reset().observation
    kept = first.copy()
    env.step(np.ones(1, np.float32))
    np.testing.assert_array_equal(first, kept)


def _rollout(env, actions):
    timesteps = [env.reset()]
    timesteps += [env.step(a) for a in actions]
    return (
        np.stack([t.observation for t in timesteps]),
        np.array([t.reward for t in timesteps[1:]]),
    )


def test_same_seed_same_trajectory_different_seed_differs():
    actions = _random_actions(environments.make("cheetah:run").action_spec(), 15)
    obs_a, rew_a = _rollout(environments.make("cheetah:run", seed=7), actions)
    obs_b, rew_b = _rollout(environments.make("cheetah:run", seed=7), actions)
    np.testing.assert_array_equal(obs_a, obs_b)
    np.testing.assert_array_equal(rew_a, rew_b)
    obs_c, _ = _rollout(environments.make("cheetah:run", seed=8), actions)
    assert not np.array_equal(obs_a[0], obs_c[0])  # Different initial state.
    assert not np.array_equal(obs_a[-1], obs_c[-1])


# Canonical actions ----------------------------------------------------------------------


def test_canonical_actions_map_onto_non_symmetric_bounds():
    # quadruped's actuators: [-1, 1], [-1, 1.1] (non-symmetric), [-0.8, 0.8] (non-unit).
    env = environments.make("quadruped:walk")
    bounds = env.environment.action_spec()
    assert bounds.maximum[1] == pytest.approx(1.1) and bounds.minimum[2] == pytest.approx(-0.8)
    assert env.action_spec() == specs.BoundedArray((12,), np.float32, -1.0, 1.0, "action")
    ones = np.ones(12, np.float32)
    np.testing.assert_allclose(env.to_task_action(-ones), bounds.minimum, atol=1e-7)
    np.testing.assert_allclose(env.to_task_action(ones), bounds.maximum, atol=1e-7)
    np.testing.assert_allclose(
        env.to_task_action(0 * ones), (bounds.minimum + bounds.maximum) / 2, atol=1e-7
    )
    # Out of range is clipped to [-1, 1] first, so it lands on the bounds.
    np.testing.assert_allclose(env.to_task_action(5 * ones), bounds.maximum, atol=1e-7)
    np.testing.assert_allclose(env.to_task_action(-5 * ones), bounds.minimum, atol=1e-7)
    # And the physics receives the mapped control.
    # And the physics receives the mapped control: task = (max-min)/2 * a + (max+min)/2.
    env.reset()
    action = np.tile(np.array([0.5, 0.5, -0.25], np.float32), 4)
    action[:3] = [2.0, -3.0, 0.5]  # Clipped to 1 and -1.
    env.step(action)
    expected = np.tile([1.0 * 0.5, 1.05 * 0.5 + 0.05, 0.8 * -0.25], 4)
    expected[:3] = [1.0, -1.0, 0.8 * 0.5]
    np.testing.assert_allclose(env.physics.data.ctrl, expected, rtol=1e-6)


def test_canonical_action_mapping_on_constructed_spec():
    spec = specs.BoundedArray(
        (4,), np.float64, minimum=[0.0, -2.0, -1e10, -np.inf], maximum=[10.0, 4.0, 1e10, np.inf]
    )
    scale, offset = wrappers.canonical_action_mapping(spec)
    # Unlimited dimensions (dm-control reports +-1e10) pass through unscaled.
    np.testing.assert_array_equal(scale, [5.0, 3.0, 1.0, 1.0])
    np.testing.assert_array_equal(offset, [5.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(scale * -1 + offset, [0.0, -2.0, -1.0, -1.0])
    np.testing.assert_array_equal(scale * 1 + offset, [10.0, 4.0, 1.0, 1.0])
    np.testing.assert_array_equal(scale * 0 + offset, [5.0, 1.0, 0.0, 0.0])


def test_unit_bounds_clip_without_rescaling():
    env = environments.make("cheetah:run")
    action = np.array([-3.0, -1.0, -0.25, 0.0, 0.5, 2.0], np.float32)
    np.testing.assert_array_equal(env.to_task_action(action), [-1, -1, -0.25, 0, 0.5, 1])
    env.reset()
    env.step(action)
    np.testing.assert_array_equal(env.physics.data.ctrl, [-1, -1, -0.25, 0, 0.5, 1])


def test_wrong_action_shape_is_rejected():
    env = environments.make("cheetah:run")
    env.reset()
    with pytest.raises(ValueError, match=r"shape \(5,\); this environment expects \(6,\)"):
        env.step(np.zeros(5, np.float32))
    with pytest.raises(ValueError, match=r"shape \(2, 6\)"):
        env.step(np.zeros((2, 6), np.float32))


# Action repeat --------------------------------------------------------------------------


def test_action_repeat_sums_rewards_of_raw_steps():
    k = 3
    raw = _raw("walker:walk", seed=5)
    env = environments.make("walker:walk", seed=5, action_repeat=k)
    np.testing.assert_array_equal(env.reset().observation, _concat(raw.reset().observation))
    for action in _random_actions(env.action_spec(), 10, seed=1):
        raw_steps = [raw.step(action.astype(np.float64)) for _ in range(k)]
        step = env.step(action)
        expected = sum(t.reward for t in raw_steps)
        assert expected > raw_steps[0].reward > 0  # Several non-zero terms were summed.
        np.testing.assert_allclose(step.reward, expected, rtol=1e-6)
        assert step.discount == np.prod([t.discount for t in raw_steps])
        np.testing.assert_array_equal(step.observation, _concat(raw_steps[-1].observation))


def test_action_repeat_stops_at_episode_end_and_auto_resets():
    # 0.1 s of cartpole is 10 raw steps: with k=4 the agent steps are 4 + 4 + 2.
    raw = _raw("cartpole:swingup", seed=2, time_limit=0.1)
    env = environments.make("cartpole:swingup", seed=2, action_repeat=4, time_limit=0.1)
    raw.reset(), env.reset()
    action = np.array([0.7], np.float32)
    raw_rewards = []
    timestep = None
    while timestep is None or not timestep.last():
        timestep = raw.step(action.astype(np.float64))
        raw_rewards.append(timestep.reward)
    assert len(raw_rewards) == 10
    agent_steps = [env.step(action) for _ in range(3)]
    assert [t.step_type for t in agent_steps] == [dm_env.StepType.MID] * 2 + [dm_env.StepType.LAST]
    np.testing.assert_allclose(
        [t.reward for t in agent_steps],
        [sum(raw_rewards[:4]), sum(raw_rewards[4:8]), sum(raw_rewards[8:])],
        rtol=1e-6,
    )
    # Time-limit ends truncate, they do not terminate: the discount stays 1.
    assert agent_steps[-1].discount == 1.0
    restart = env.step(action)
    assert restart.first() and restart.reward is None


# Pixels ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pixel_env_factory():
    def make(**kwargs):
        try:
            return environments.make("cartpole:swingup", from_pixels=True, **kwargs)
        except environments.RenderingUnavailableError as e:
            pytest.skip(f"no OpenGL renderer: {e}")

    return make


def _render(env, height, width):
    return env.physics.render(height, width, camera_id=0)


def test_pixels_shape_dtype_and_stacking(pixel_env_factory):
    # With shadows and reflections the frames are exactly what physics.render draws.
    env = pixel_env_factory(height=48, width=64, frame_stack=3, shadows_and_reflections=True)
    assert env.observation_spec() == specs.BoundedArray((48, 64, 9), np.uint8, 0, 255, "pixels")
    first = env.reset().observation
    assert first.dtype == np.uint8 and first.shape == (48, 64, 9)
    # After reset all three frames are the first render.
    for i in range(3):
        np.testing.assert_array_equal(first[..., 3 * i : 3 * i + 3], _render(env, 48, 64))
    assert first.std() > 0  # Not a blank image.

    push = np.ones(1, np.float32)
    second = env.step(push).observation
    np.testing.assert_array_equal(second[..., 6:9], _render(env, 48, 64))  # Newest last.
    np.testing.assert_array_equal(second[..., 0:6], first[..., 3:9])  # Older shift.
    third = env.step(push).observation
    np.testing.assert_array_equal(third[..., 0:3], first[..., 6:9])
    np.testing.assert_array_equal(third[..., 3:6], second[..., 6:9])
    for _ in range(3):
        last = env.step(push).observation
    assert not np.array_equal(last[..., 6:9], first[..., 0:3])  # The cart moved.


def test_pixels_single_frame_and_episode_restart(pixel_env_factory):
    env = pixel_env_factory(height=32, width=40, frame_stack=2, time_limit=0.03)
    env.reset()
    zero = np.zeros(1, np.float32)
    steps = [env.step(zero) for _ in range(3)]
    assert steps[-1].last()
    restart = env.step(zero)  # A new episode: the stack must not mix the two.
    assert restart.first()
    np.testing.assert_array_equal(restart.observation[..., :3], restart.observation[..., 3:])

    single = pixel_env_factory(height=32, width=40, shadows_and_reflections=True)
    observation = single.reset().observation
    assert observation.shape == (32, 40, 3) and observation.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(observation, _render(single, 32, 40))


def test_pixels_skip_shadows_and_reflections_by_default(pixel_env_factory):
    plain = pixel_env_factory(height=64, width=64)
    full = pixel_env_factory(height=64, width=64, shadows_and_reflections=True)
    fast, exact = plain.reset().observation, full.reset().observation
    np.testing.assert_array_equal(exact, _render(full, 64, 64))
    difference = np.abs(fast.astype(np.int32) - exact.astype(np.int32))
    assert difference.max() > 0  # The passes were skipped: the floor's shadow changed.
    assert difference.mean() < 2.0  # The picture itself is the same.
    # Each frame is its own array: the camera's buffer is reused by the next render.
    step = plain.step(np.ones(1, np.float32)).observation
    assert not np.shares_memory(step, fast) and not np.array_equal(step, fast)


def test_pixels_bad_camera_id(pixel_env_factory):
    with pytest.raises(ValueError, match="camera_id=7"):
        pixel_env_factory(height=32, width=32, camera_id=7)
