"""The environment loop reports episode return, length, steps/s and totals."""

import numpy as np
import pytest

import environments
from agents.d4pg import networks
from agents.d4pg.acting import D4PGActor
from agents.d4pg.config import D4PGConfig
from agents.d4pg.numpy_policy import NumpyPolicy
from agents.environment_loop import EnvironmentLoop

pytestmark = pytest.mark.timeout(120)


def test_loop_reports_each_episode():
    config = D4PGConfig.from_overrides({"policy_layers": "8"})
    env = environments.make("cartpole:balance", seed=0, action_repeat=10)  # 100-step episodes.
    spec = environments.make_environment_spec(env)
    nets = networks.make_networks(config, spec)
    policy = NumpyPolicy(config, pixels=False, action_low=-1.0, action_high=1.0)
    policy.set_weights([v.numpy() for v in nets.acting_variables()])
    actor = D4PGActor(policy, spec.actions, variable_client=None, sigma=0.3, seed=0)
    reports = []
    loop = EnvironmentLoop(env, actor, logger=reports.append, label="test")
    results = loop.run(num_episodes=2)
    assert results == reports and len(reports) == 2
    for i, report in enumerate(reports):
        assert report["label"] == "test" and report["episode_length"] == 100
        assert 0.0 < report["episode_return"] <= 1000.0 and np.isfinite(report["episode_return"])
        assert report["steps_per_second"] > 0
        assert report["total_steps"] == 100 * (i + 1) and report["total_episodes"] == i + 1
    assert len(loop.run(num_steps=150)) == 2  # Whole episodes until at least 150 steps.
