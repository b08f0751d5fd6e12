"""Interfaces of the agent components: actors, learners, variable sources, adders.

Only abstract interfaces live here (no TensorFlow, no Reverb) so that every agent, the
environment loop and `launch/` can depend on them without pulling in an implementation.

Vocabulary:
  * An *actor* turns observations into actions and hands experience to an *adder*.
  * An *adder* writes experience into replay (for D4PG: n-step transitions in Reverb).
  * A *learner* consumes replay and updates parameters; it is a *variable source* for actors.
  * A *saveable* component can write its state to disk and read it back (resume).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import dm_env
import numpy as np

NestedArray = Any


class Actor(abc.ABC):
    """Interacts with an environment: acts, observes, and refreshes its weights.

    The environment loop calls, per episode:
    `observe_first(t0)`, then repeatedly `a = select_action(obs)`, `observe(a, t_next)`,
    `update()`.
    """

    @abc.abstractmethod
    def select_action(self, observation: NestedArray) -> np.ndarray:
        """Returns the action to take for `observation` (one unbatched observation)."""

    @abc.abstractmethod
    def observe_first(self, timestep: dm_env.TimeStep) -> None:
        """Records the first timestep of an episode (no action led to it)."""

    @abc.abstractmethod
    def observe(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        """Records that `action` led to `next_timestep`."""

    @abc.abstractmethod
    def update(self, wait: bool = False) -> None:
        """Refreshes the actor's weights from its variable source.

        Args:
          wait: if True, block until weights are available; otherwise keep the current
            weights when none are available yet.
        """


class BatchedActor(abc.ABC):
    """An actor for K environments stepped in lockstep: one policy call per step for all K.

    The batched environment loop calls `observe_first(i, t0)` when environment i starts an
    episode, then per step `actions = select_actions(observations)` (stacked, [K, ...]),
    `observe(i, actions[i], t_next)` for each environment, and `update()` once.
    """

    @property
    @abc.abstractmethod
    def num_envs(self) -> int:
        """K, the number of environments (rows of `select_actions`)."""

    @abc.abstractmethod
    def select_actions(self, observations: NestedArray) -> np.ndarray:
        """Returns K actions for K observations stacked on a leading axis.

        The batched loop reuses `observations` for the next step: copy what you keep.
        """

    @abc.abstractmethod
    def observe_first(self, index: int, timestep: dm_env.TimeStep) -> None:
        """Records the first timestep of an episode of environment `index`."""

    @abc.abstractmethod
    def observe(self, index: int, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        """Records that `action` led environment `index` to `next_timestep`."""

    @abc.abstractmethod
    def update(self, wait: bool = False) -> None:
        """Called once per step of all K environments: refreshes weights when due."""


class VariableSource(abc.ABC):
    """Something that can hand out the current values of named groups of variables."""

    @abc.abstractmethod
    def get_variables(self, names: Sequence[str]) -> list[list[np.ndarray]]:
        """Returns, for each name in `names`, the list of that group's arrays (numpy)."""


class Saveable(abc.ABC):
    """A component whose state can be written to disk and read back."""

    @abc.abstractmethod
    def save(self) -> str | None:
        """Writes the state; returns where it was written (None if nowhere configured)."""

    @abc.abstractmethod
    def restore(self) -> bool:
        """Reads the latest saved state if any; returns whether something was restored."""


class Learner(VariableSource, Saveable):
    """Updates parameters from replayed experience, one `step()` at a time."""

    @abc.abstractmethod
    def step(self) -> dict[str, float]:
        """Performs one update and returns its (already reduced) metrics."""


class Adder(abc.ABC):
    """Writes the experience of one actor into replay, episode by episode."""

    @abc.abstractmethod
    def add_first(self, timestep: dm_env.TimeStep) -> None:
        """Starts an episode with its first timestep."""

    @abc.abstractmethod
    def add(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        """Records a transition; on `next_timestep.last()` finishes the episode."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Drops the episode in progress (nothing partial is written)."""
