"""The specs an agent needs to build networks for an environment.

Example:

>>> env = environments.make("cartpole:swingup")
>>> spec = make_environment_spec(env)
>>> spec.observations.shape, spec.actions.shape
((5,), (1,))
"""

from __future__ import annotations

import dataclasses

import dm_env
from dm_env import specs


@dataclasses.dataclass(frozen=True)
class EnvironmentSpec:
    """Observation, action, reward and discount specs of one environment.

    Field names follow Acme (`observations`, `actions`, `rewards`, `discounts`);
    the singular spellings (`observation`, `action`, `reward`, `discount`) are
    read-only aliases, so code written against either convention works.
    """

    observations: specs.Array
    actions: specs.BoundedArray
    rewards: specs.Array
    discounts: specs.BoundedArray

    @property
    def observation(self) -> specs.Array:
        return self.observations

    @property
    def action(self) -> specs.BoundedArray:
        return self.actions

    @property
    def reward(self) -> specs.Array:
        return self.rewards

    @property
    def discount(self) -> specs.BoundedArray:
        return self.discounts


def make_environment_spec(environment: dm_env.Environment) -> EnvironmentSpec:
    """Returns the `EnvironmentSpec` of `environment` (calls each spec method once).

    Args:
        environment: any `dm_env.Environment`, typically one from `environments.make`.

    Returns:
        An `EnvironmentSpec` holding the environment's four specs.
    """
    return EnvironmentSpec(
        observations=environment.observation_spec(),
        actions=environment.action_spec(),
        rewards=environment.reward_spec(),
        discounts=environment.discount_spec(),
    )
