"""Runs an actor in an environment, episode by episode, and reports what happened."""

from __future__ import annotations

import time
from collections.abc import Callable

import dm_env
import numpy as np
import tree

from agents import core

Logger = Callable[[dict], None]

_SCALARS = (float, np.floating)


def _sum_reward(reward) -> float:
    """The reward as one float: scalars directly (every step of an actor pays this), nested
    or array rewards summed over all their entries."""
    if isinstance(reward, _SCALARS):
        return float(reward)
    if reward is None:
        return 0.0
    return float(sum(np.sum(r) for r in tree.flatten(reward)))


class EnvironmentLoop:
    """Plays episodes with `actor` in `environment` and reports each one to `logger`.

    Each report is a dict with `episode_return`, `episode_length`, `steps_per_second`
    (of that episode, acting + learning hooks included), `total_steps`, `total_episodes`.

    Example:
      loop = EnvironmentLoop(env, actor, logger=print)
      loop.run(num_steps=10_000)
    """

    def __init__(
        self,
        environment: dm_env.Environment,
        actor: core.Actor,
        logger: Logger | None = None,
        should_update: bool = True,
        label: str = "actor",
    ):
        self._env = environment
        self._actor = actor
        self._logger = logger
        self._should_update = should_update
        self._label = label
        self.total_steps = 0
        self.total_episodes = 0

    def run_episode(self, max_steps: int | None = None) -> dict:
        """Plays one episode (or `max_steps` steps of it) and returns its report."""
        start = time.perf_counter()
        timestep = self._env.reset()
        self._actor.observe_first(timestep)
        episode_return = 0.0
        length = 0
        while not timestep.last():
            action = self._actor.select_action(timestep.observation)
            timestep = self._env.step(action)
            self._actor.observe(action, timestep)
            if self._should_update:
                self._actor.update()
            length += 1
            episode_return += _sum_reward(timestep.reward)
            if max_steps is not None and length >= max_steps:
                break
        self.total_steps += length
        self.total_episodes += 1
        elapsed = max(time.perf_counter() - start, 1e-9)
        result = {
            "label": self._label,
            "episode_return": episode_return,
            "episode_length": length,
            "steps_per_second": length / elapsed,
            "total_steps": self.total_steps,
            "total_episodes": self.total_episodes,
        }
        if self._logger is not None:
            self._logger(result)
        return result

    def run(self, num_episodes: int | None = None, num_steps: int | None = None) -> list[dict]:
        """Plays whole episodes until `num_episodes` episodes or `num_steps` steps are done."""
        if num_episodes is None and num_steps is None:
            raise ValueError("EnvironmentLoop.run needs num_episodes or num_steps (or both).")
        results = []
        start_steps = self.total_steps
        while True:
            if num_episodes is not None and len(results) >= num_episodes:
                break
            if num_steps is not None and self.total_steps - start_steps >= num_steps:
                break
            results.append(self.run_episode())
        return results


class BatchedEnvironmentLoop:
    """Steps K environments in lockstep with one `core.BatchedActor` call per step.

    An environment whose episode ended is reset at the next step, so all K keep stepping;
    only those are reset (`resets` counts the calls). The observations given to
    `select_actions` are one [K, ...] array the loop reuses: an actor copies what it keeps.
    Each finished episode is reported like `EnvironmentLoop` does (one dict per episode,
    with `env_index`); its `steps_per_second` is the loop's rate over all K environments
    during that episode (K times the episode's own length per second).

    Example:
      loop = BatchedEnvironmentLoop([make_env(seed=s) for s in seeds], batched_actor)
      reports = loop.run(num_episodes=10)
    """

    def __init__(
        self,
        environments: list[dm_env.Environment],
        actor: core.BatchedActor,
        logger: Logger | None = None,
        should_update: bool = True,
        label: str = "actor",
    ):
        if len(environments) != actor.num_envs:
            raise ValueError(
                f"{len(environments)} environments for an actor of {actor.num_envs}: "
                "give the actor num_envs=len(environments)."
            )
        self._envs = list(environments)
        self._actor = actor
        self._logger = logger
        self._should_update = should_update
        self._label = label
        self._timesteps: list[dm_env.TimeStep | None] = [None] * len(self._envs)
        self._returns = [0.0] * len(self._envs)
        self._lengths = [0] * len(self._envs)
        self._starts = [0.0] * len(self._envs)
        # Environments to reset before the next step: those whose episode ended (all at
        # first). The others are not looked at, so a step costs nothing per running one.
        self._to_reset = list(range(len(self._envs)))
        # The K current observations, stacked: rows are overwritten in place as the
        # environments step (the actor reads them in `select_actions` and keeps no copy).
        self._observations: np.ndarray | None = None
        self.total_steps = 0
        self.total_episodes = 0
        self.resets = 0  # Calls of `reset()` on any environment, for tests and reports.

    def step(self) -> list[dict]:
        """One step of every environment; returns the reports of episodes that ended."""
        timesteps = self._timesteps
        if self._to_reset:
            for i in self._to_reset:
                timestep = timesteps[i] = self._envs[i].reset()
                self._actor.observe_first(i, timestep)
                self._returns[i], self._lengths[i] = 0.0, 0
                self._starts[i] = time.perf_counter()
                if self._observations is None:
                    first = np.asarray(timestep.observation)
                    self._observations = np.empty((len(self._envs),) + first.shape, first.dtype)
                self._observations[i] = timestep.observation
            self.resets += len(self._to_reset)
            self._to_reset = []
        observations = self._observations
        actions = self._actor.select_actions(observations)
        observe, returns, lengths = self._actor.observe, self._returns, self._lengths
        reports = []
        for i, (env, action) in enumerate(zip(self._envs, actions)):
            timestep = timesteps[i] = env.step(action)
            observe(i, action, timestep)
            observations[i] = timestep.observation
            lengths[i] += 1
            reward = timestep.reward
            returns[i] += float(reward) if isinstance(reward, _SCALARS) else _sum_reward(reward)
            if timestep.last():
                reports.append(self._finish(i))
                self._to_reset.append(i)
        if self._should_update:
            self._actor.update()
        return reports

    def _finish(self, i: int) -> dict:
        self.total_steps += self._lengths[i]
        self.total_episodes += 1
        elapsed = max(time.perf_counter() - self._starts[i], 1e-9)
        result = {
            "label": self._label,
            "env_index": i,
            "episode_return": self._returns[i],
            "episode_length": self._lengths[i],
            "steps_per_second": self._lengths[i] * len(self._envs) / elapsed,
            "total_steps": self.total_steps,
            "total_episodes": self.total_episodes,
        }
        if self._logger is not None:
            self._logger(result)
        return result

    def run_until_episode(self) -> list[dict]:
        """Steps until at least one episode ends; returns the reports of those that did."""
        while True:
            reports = self.step()
            if reports:
                return reports

    def run(self, num_episodes: int | None = None, num_steps: int | None = None) -> list[dict]:
        """Steps until `num_episodes` episodes or `num_steps` steps (of finished episodes)."""
        if num_episodes is None and num_steps is None:
            raise ValueError("BatchedEnvironmentLoop.run needs num_episodes or num_steps.")
        results: list[dict] = []
        start_steps = self.total_steps
        while not (
            (num_episodes is not None and len(results) >= num_episodes)
            or (num_steps is not None and self.total_steps - start_steps >= num_steps)
        ):
            results.extend(self.step())
        return results
