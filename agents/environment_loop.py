"""Runs an actor in an environment, episode by episode, and reports what happened."""

from __future__ import annotations

import time
from collections.abc import Callable

import dm_env
import numpy as np
import tree

from agents import core

Logger = Callable[[dict], None]


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


def _sum_reward(reward) -> float:
    if reward is None:
        return 0.0
    return float(sum(np.sum(r) for r in tree.flatten(reward)))
