"""D4PG actor: numpy policy + clipped Gaussian exploration + n-step adder + weight pulls."""

from __future__ import annotations

from collections.abc import Callable

import dm_env
import numpy as np

from agents import core
from agents.d4pg.exploration import ExplorationNoise
from agents.d4pg.numpy_policy import NumpyPolicy
from agents.d4pg.variables import VariableClient

try:  # Small matrix-vector products are slower with a multi-threaded BLAS.
    import threadpoolctl
except ImportError:  # pragma: no cover - optional speed-up only.
    threadpoolctl = None

_BLAS_LIMIT = None


def _single_threaded_blas() -> None:
    """Limits numpy's BLAS to one thread in this process (once; acting is latency bound)."""
    global _BLAS_LIMIT
    if _BLAS_LIMIT is None and threadpoolctl is not None:
        _BLAS_LIMIT = threadpoolctl.threadpool_limits(limits=1, user_api="blas")


class _ExploringPolicy:
    """What both actors share: the numpy policy and the weights pulled into it, the
    exploration noise added to its actions and the clip to the action bounds, and the
    sigma that follows the pulled weights' learner step (`sigma_schedule`)."""

    def __init__(
        self,
        policy: NumpyPolicy,
        action_spec,
        variable_client: VariableClient | None,
        num_envs: int,
        sigma: float,
        seed: int,
        noise_beta: float,
        sigma_schedule: Callable[[int], float] | None,
    ):
        _single_threaded_blas()
        self.policy = policy
        shape = tuple(action_spec.shape)
        self._low = np.broadcast_to(np.asarray(action_spec.minimum, np.float32), shape)
        self._high = np.broadcast_to(np.asarray(action_spec.maximum, np.float32), shape)
        self._variables = variable_client
        rng = np.random.default_rng(seed)
        self._noise = ExplorationNoise(num_envs, shape, sigma, noise_beta, rng)
        self._sigma_schedule = sigma_schedule if sigma > 0 else None

    @property
    def weights_version(self) -> int:
        return self._variables.version if self._variables is not None else -1

    @property
    def sigma(self) -> float:
        return self._noise.sigma

    def start_episode(self, index: int) -> None:
        self._noise.start_episode(index)

    def explore(self, actions: np.ndarray) -> np.ndarray:
        """Adds this step's noise to `actions` (one environment's, or [K, ...]) in place
        and clips them to the bounds; unchanged without noise."""
        if self._noise.sigma > 0:
            actions += self._noise.sample().reshape(actions.shape)
            np.minimum(actions, self._high, out=actions)
            np.maximum(actions, self._low, out=actions)
        return actions

    def pull(self, wait: bool) -> None:
        """Applies the source's newer weights, if any (`wait`: block until there are
        some), and the sigma scheduled for their step."""
        if self._variables is None:
            if wait and not self.policy.has_weights:
                raise RuntimeError(
                    "This actor has no variable source and no weights: "
                    "call policy.set_weights() first."
                )
            return
        if self._variables.update(wait=wait):
            self.policy.set_weights(self._variables.weights)
            if self._sigma_schedule is not None:
                self._noise.set_sigma(self._sigma_schedule(max(self._variables.version, 0)))


class _ReportsActing:
    """The two read-outs both actors give of their `_ExploringPolicy`."""

    _acting: _ExploringPolicy

    @property
    def weights_version(self) -> int:
        """The learner step of the weights in use (-1: none yet)."""
        return self._acting.weights_version

    @property
    def sigma(self) -> float:
        """The exploration noise's standard deviation now (scheduled: `sigma_schedule`)."""
        return self._acting.sigma


class D4PGActor(_ReportsActing, core.Actor):
    """Acts with the latest published policy; optionally explores and writes replay.

    Args:
      policy: the numpy policy (its weights are replaced on each pull).
      action_spec: bounds that noisy actions are clipped to.
      variable_client: source of weights (None: weights must be set on `policy` directly).
      adder: n-step adder into replay (None: evaluator, nothing is written).
      sigma: standard deviation of the Gaussian exploration noise (0: deterministic).
      seed: seed of the exploration noise.
      noise_beta: its power-spectrum exponent, 0 white (Acme), 1 pink, 2 red: coloured
        noise is correlated over time and restarts with each episode (`exploration`).
      sigma_schedule: the sigma for weights of a given learner step, applied at each pull
        (`D4PGConfig.sigma_at`); None: `sigma` throughout.

    An evaluator is the same actor with `sigma=0` and no adder.

    Constructing an actor limits numpy's BLAS to one thread in this process (matrix-vector
    products of one observation are slower multi-threaded); TensorFlow is unaffected.
    """

    def __init__(
        self,
        policy: NumpyPolicy,
        action_spec,
        variable_client: VariableClient | None,
        adder: core.Adder | None = None,
        sigma: float = 0.0,
        seed: int = 0,
        noise_beta: float = 0.0,
        sigma_schedule: Callable[[int], float] | None = None,
    ):
        self._acting = _ExploringPolicy(
            policy, action_spec, variable_client, 1, sigma, seed, noise_beta, sigma_schedule
        )
        self._adder = adder

    def select_action(self, observation) -> np.ndarray:
        if not self._acting.policy.has_weights:
            self.update(wait=True)
        return self._acting.explore(self._acting.policy(observation))

    def observe_first(self, timestep: dm_env.TimeStep) -> None:
        self._acting.start_episode(0)
        if self._adder is not None:
            self._adder.add_first(timestep)

    def observe(self, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        if self._adder is not None:
            self._adder.add(action, next_timestep)

    def update(self, wait: bool = False) -> None:
        self._acting.pull(wait)


class BatchedD4PGActor(_ReportsActing, core.BatchedActor):
    """A D4PG actor for K environments: one policy call and one noise draw per step.

    Each environment has its own n-step adder, so the transitions written are exactly
    those of K single actors (with one transition per item, each adder has its own
    trajectory writer; with G per item they share one `group_adder` pool and writer). Weights are pulled when the steps of
    all K environments together reach `variable_update_period` (as K single actors
    would pull, in total), or at once with `update(wait=True)`.

    Args:
      policy: the numpy policy (its weights are replaced on each pull).
      action_spec: bounds that noisy actions are clipped to.
      variable_client: source of weights; called on every due pull (give it period 1).
      adders: one n-step adder per environment (empty or None: nothing is written).
      num_envs: K.
      sigma: standard deviation of the Gaussian exploration noise (0: deterministic).
      seed: seed of the exploration noise.
      noise_beta: its power-spectrum exponent (0 white, 1 pink): each environment's
        coloured noise restarts with that environment's episodes.
      variable_update_period: environment steps (over all K) between weight pulls.
      sigma_schedule: as `D4PGActor`'s.
    """

    def __init__(
        self,
        policy: NumpyPolicy,
        action_spec,
        variable_client: VariableClient | None,
        adders: list[core.Adder] | None,
        num_envs: int,
        sigma: float = 0.0,
        seed: int = 0,
        variable_update_period: int = 1000,
        noise_beta: float = 0.0,
        sigma_schedule: Callable[[int], float] | None = None,
    ):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if adders and len(adders) != num_envs:
            raise ValueError(f"Need one adder per environment: {len(adders)} for {num_envs}.")
        self._acting = _ExploringPolicy(
            policy,
            action_spec,
            variable_client,
            num_envs,
            sigma,
            seed,
            noise_beta,
            sigma_schedule,
        )
        self._adders = list(adders or [])
        self._num_envs = num_envs
        self._period = max(1, int(variable_update_period))
        self._steps_since_pull = 0

    @property
    def num_envs(self) -> int:
        return self._num_envs

    def select_actions(self, observations) -> np.ndarray:
        if not self._acting.policy.has_weights:
            self.update(wait=True)
        return self._acting.explore(self._acting.policy.batch(observations))

    def observe_first(self, index: int, timestep: dm_env.TimeStep) -> None:
        self._acting.start_episode(index)
        if self._adders:
            self._adders[index].add_first(timestep)

    def observe(self, index: int, action: np.ndarray, next_timestep: dm_env.TimeStep) -> None:
        if self._adders:
            self._adders[index].add(action, next_timestep)

    def update(self, wait: bool = False) -> None:
        if not wait:
            self._steps_since_pull += self._num_envs
            if self._steps_since_pull < self._period:
                return
        self._steps_since_pull = 0
        self._acting.pull(wait)
