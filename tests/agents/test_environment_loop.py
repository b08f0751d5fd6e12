"""The environment loops report episode return, length, steps/s and totals; the batched
loop plays exactly the episodes of one loop per environment."""

import numpy as np
import pytest

import environments
import environments.wrappers
from agents import core
from agents.d4pg import networks
from agents.d4pg.acting import D4PGActor
from agents.d4pg.config import D4PGConfig
from agents.d4pg.numpy_policy import NumpyPolicy
from agents.environment_loop import BatchedEnvironmentLoop, EnvironmentLoop

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


# Episodes of 50, 80 and 110 steps (cartpole's control step is 0.01 s): the environments
# of one batched loop end at different steps, so resets are staggered.
TIME_LIMITS = (0.5, 0.8, 1.1)


def _policy(observations: np.ndarray) -> np.ndarray:
    """Deterministic actions from the observation, elementwise only, so one row of a batch
    equals the same observation alone bit for bit."""
    return np.tanh(3.0 * observations[..., 1:2] - observations[..., 0:1]).astype(np.float32)


class _SingleActor(core.Actor):
    def select_action(self, observation):
        return _policy(observation)

    def observe_first(self, timestep):
        pass

    def observe(self, action, next_timestep):
        pass

    def update(self, wait=False):
        pass


class _BatchedActor(core.BatchedActor):
    """Records, per environment, the episode starts and every (action, reward) seen."""

    def __init__(self, num_envs):
        self._num_envs = num_envs
        self.firsts = [0] * num_envs
        self.seen = [[] for _ in range(num_envs)]

    @property
    def num_envs(self):
        return self._num_envs

    def select_actions(self, observations):
        return _policy(observations)

    def observe_first(self, index, timestep):
        self.firsts[index] += 1

    def observe(self, index, action, next_timestep):
        self.seen[index].append((action.tolist(), float(next_timestep.reward)))

    def update(self, wait=False):
        pass


class _CountingResets(environments.wrappers.Wrapper):
    def __init__(self, environment):
        super().__init__(environment)
        self.resets = 0

    def reset(self):
        self.resets += 1
        return super().reset()


def _env(j: int):
    return environments.make("cartpole:swingup", seed=100 + j, time_limit=TIME_LIMITS[j])


def test_batched_loop_returns_equal_a_loop_per_environment():
    """Real dm-control tasks, fixed seeds, staggered episode ends: each environment's
    episodes (returns to the last bit, lengths, order) are those of its own plain loop."""
    want = {}
    for j in range(len(TIME_LIMITS)):  # 4 episodes each: >= 200 steps.
        reports = EnvironmentLoop(_env(j), _SingleActor()).run(num_episodes=4)
        want[j] = [(r["episode_return"], r["episode_length"]) for r in reports]
    assert len({tuple(episodes) for episodes in want.values()}) == 3  # The envs differ.
    assert all(ret > 0 for episodes in want.values() for ret, _ in episodes)

    actor = _BatchedActor(len(TIME_LIMITS))
    loop = BatchedEnvironmentLoop([_env(j) for j in range(len(TIME_LIMITS))], actor)
    have = {j: [] for j in want}
    while min(len(v) for v in have.values()) < 4:
        for r in loop.step():
            have[r["env_index"]].append((r["episode_return"], r["episode_length"]))
    for j, episodes in want.items():
        assert have[j][:4] == episodes, j  # Exact float equality of the returns.
        assert [length for _, length in episodes] == [round(100 * TIME_LIMITS[j])] * 4
    assert loop.total_episodes == sum(len(v) for v in have.values())
    assert loop.total_steps == sum(length for v in have.values() for _, length in v)


def test_batched_loop_resets_only_the_environments_whose_episode_ended():
    envs = [_CountingResets(_env(j)) for j in range(len(TIME_LIMITS))]
    actor = _BatchedActor(len(envs))
    loop = BatchedEnvironmentLoop(envs, actor)
    for _ in range(245):  # 245 steps: 4, 3 and 2 episodes ended.
        loop.step()
    ended = [245 // round(100 * limit) for limit in TIME_LIMITS]
    assert ended == [4, 3, 2]
    # One reset per started episode: the first, then one after each end, at the next step.
    assert [env.resets for env in envs] == [e + 1 for e in ended]
    assert actor.firsts == [env.resets for env in envs]
    assert loop.resets == sum(env.resets for env in envs) and loop.total_episodes == sum(ended)
    assert [len(seen) for seen in actor.seen] == [245] * 3  # Every environment stepped each time.
