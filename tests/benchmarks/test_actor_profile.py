"""The actor profile's part timers: they reach dm-control's own step under the agent's
wrappers, and record nothing while disabled (the uninstrumented blocks)."""

import pytest

from agents.d4pg import acting, networks
from agents.d4pg.config import D4PGConfig
from agents.d4pg.numpy_policy import NumpyPolicy
from agents.environment_loop import BatchedEnvironmentLoop
from benchmarks import agents_actor_profile as profile
from launch.d4pg.program import PRESETS

pytestmark = pytest.mark.timeout(120)


def test_parts_nest_down_to_dm_control_and_are_timed_only_while_enabled():
    import environments

    config = D4PGConfig.from_overrides(PRESETS["quick"])
    envs = [environments.make(profile.TASK, seed=i) for i in range(2)]
    spec = environments.make_environment_spec(envs[0])
    policy = NumpyPolicy(
        config, pixels=False, action_low=spec.actions.minimum, action_high=spec.actions.maximum
    )
    policy.set_weights([v.numpy() for v in networks.make_networks(config, spec).acting_variables()])
    actor = acting.BatchedD4PGActor(policy, spec.actions, None, None, 2, sigma=0.3)
    timer = profile.PartTimer()
    profile.instrument(envs, actor, timer)
    run = profile.loop_runner(BatchedEnvironmentLoop(envs, actor), 2)

    run(20)
    assert sum(timer.nanoseconds.values()) == 0

    timer.enabled = True
    assert run(400) == 400
    parts = timer.nanoseconds
    assert parts["dm_control_step"] > 0
    assert parts["select_actions"] > 0
    assert parts["wrapped_step"] > parts["dm_control_step"]
    # dm-control's step is timed on dm-control's own environment, under all our wrappers.
    for env in envs:
        inner = env
        while hasattr(inner, "environment"):
            inner = inner.environment
        assert type(inner).__module__.startswith("dm_control.")
        assert "step" in vars(inner)
