"""Task names, `make` arguments, errors and specs (real dm-control physics)."""

import os
import subprocess
import sys
import textwrap

import dm_env
import numpy as np
import pytest
from dm_control import suite as dm_suite
from dm_env import specs

import environments


def test_list_tasks_is_sorted_and_complete():
    tasks = environments.list_tasks()
    assert tasks == sorted(tasks)
    assert len(tasks) == len(dm_suite.ALL_TASKS) == len(set(tasks))
    for name in ("cartpole:swingup", "walker:walk", "cheetah:run", "quadruped:walk"):
        assert name in tasks
    assert all(name.count(":") == 1 for name in tasks)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cartpol:swingup", "cartpole:swingup"),  # typo in the domain
        ("walker:wlak", "walker:walk"),  # typo in the task
        ("walker-walk", "walker:walk"),  # malformed: no colon
        ("cheetah", "cheetah:run"),  # malformed: domain only
    ],
)
def test_unknown_or_malformed_name_suggests_close_matches(name, expected):
    with pytest.raises(environments.UnknownTaskError) as info:
        environments.make(name)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert repr(name) in message
    assert expected in message
    assert "replicator list-tasks" in message and "environments.list_tasks()" in message


def test_malformed_name_says_expected_format():
    with pytest.raises(environments.UnknownTaskError, match="expected 'domain:task'"):
        environments.make("walker-walk")


def test_parse_task_name():
    assert environments.parse_task_name("ball_in_cup:catch") == ("ball_in_cup", "catch")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(action_repeat=0), "action_repeat"),
        (dict(frame_stack=3), "from_pixels=True"),
        (dict(time_limit=0.0), "time_limit"),
        (dict(normalize=True, from_pixels=True), "normalize"),
    ],
)
def test_make_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        environments.make("cartpole:swingup", **kwargs)


def _episode_length(env) -> int:
    env.reset()
    action = np.zeros(env.action_spec().shape, np.float32)
    steps = 1
    while not env.step(action).last():
        steps += 1
    return steps


def test_time_limit_is_in_seconds_of_simulation():
    # cartpole's control timestep is 0.01 s; action_repeat does not change the limit.
    raw = dm_suite.load("cartpole", "swingup", task_kwargs={"random": 0, "time_limit": 0.2})
    assert raw.control_timestep() == pytest.approx(0.01)
    assert _episode_length(environments.make("cartpole:swingup", time_limit=0.2)) == 20
    assert (
        _episode_length(environments.make("cartpole:swingup", time_limit=0.2, action_repeat=4)) == 5
    )
    default = environments.make("cartpole:swingup")  # Task default: 1000 steps.
    default.reset()
    assert not any(default.step(np.zeros(1, np.float32)).last() for _ in range(25))


def test_environment_spec_matches_env():
    env = environments.make("cheetah:run")
    spec = environments.make_environment_spec(env)
    assert isinstance(spec, environments.EnvironmentSpec)
    assert spec.observations == env.observation_spec() == spec.observation
    assert spec.observations == specs.Array((17,), np.float32)
    assert spec.actions == env.action_spec() == spec.action
    assert spec.actions.shape == (6,) and spec.actions.dtype == np.float32
    assert spec.rewards == env.reward_spec() == spec.reward
    assert spec.rewards.dtype == np.float32 and spec.rewards.shape == ()
    assert spec.discounts == env.discount_spec() == spec.discount
    assert spec.discounts.dtype == np.float32
    env.reset()
    timestep = env.step(spec.actions.generate_value())
    spec.observations.validate(timestep.observation)
    spec.rewards.validate(timestep.reward)
    spec.discounts.validate(timestep.discount)


def test_physics_is_reachable_through_wrappers():
    env = environments.make("cartpole:swingup", action_repeat=2)
    assert isinstance(env, dm_env.Environment)
    assert env.physics.model.nu == 1


_RENDERING_PROBE = textwrap.dedent("""
    import os
    import environments
    env = environments.make("cartpole:swingup")  # Features need no renderer.
    assert env.reset().observation.shape == (5,)
    try:
        environments.make("cartpole:swingup", from_pixels=True)
    except environments.RenderingUnavailableError as e:
        assert isinstance(e, RuntimeError)
        print(e)
    print("ENV", os.environ.get("MUJOCO_GL"), os.environ.get("PYOPENGL_PLATFORM"))
""")


def test_broken_renderer_gives_one_clear_error():
    # dm-control picks its backend once per process, hence subprocesses:
    # "disable" fails when rendering, "egl" with a conflicting PYOPENGL_PLATFORM fails
    # when dm-control is imported. Both run at once to keep the test short.
    cases = {
        "render time": {"MUJOCO_GL": "disable"},
        "import time": {"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "osmesa"},
    }
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs, outputs = {}, {}
    for case, extra in cases.items():
        env = {**os.environ, **extra, "PYTHONPATH": root}
        if "PYOPENGL_PLATFORM" not in extra:
            env.pop("PYOPENGL_PLATFORM", None)
        procs[case] = subprocess.Popen(
            [sys.executable, "-c", _RENDERING_PROBE],
            env=env,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    for case, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"{case}: {err}"
        outputs[case] = out
        for needle in ("MUJOCO_GL=egl", "libegl1 libegl-mesa0", "MUJOCO_GL=osmesa", "libosmesa6"):
            assert needle in out, f"{case}: {needle!r} missing from {out!r}"
    # The import-time fallback must not leak its temporary settings to child processes.
    assert "ENV egl osmesa" in outputs["import time"]


def test_reward_spec_declares_per_agent_step_bounds():
    spec = environments.make("walker:walk", action_repeat=3).reward_spec()
    assert (spec.minimum, spec.maximum, spec.dtype) == (0.0, 3.0, np.float32)
    env = environments.make("cartpole:balance", action_repeat=3, seed=0)
    env.reset()
    rewards = [env.step(np.zeros(1, np.float32)).reward for _ in range(20)]
    assert max(rewards) <= 3.0 and max(rewards) > 1.0  # Summed over 3 raw steps.
    lqr = environments.make("lqr:lqr_2_1").reward_spec()
    assert not hasattr(lqr, "maximum")  # Unbounded below: no bounds declared.
