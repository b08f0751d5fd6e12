"""Gaussian exploration noise for K environments: white, or coloured and reset per episode.

White noise (beta 0, Acme's D4PG) draws every step's N(0, sigma^2) independently, so its
pushes cancel within a few steps: an arm at rest against a joint limit, or a body that
must swing several times, gets no sustained push from it. Coloured noise with a power
spectrum ~ 1/f^beta (Eberhard et al., "Pink Noise Is All You Need", ICLR 2023) keeps the
same per-step N(0, sigma^2) marginal but correlates successive steps: beta 1 (pink) mixes
slow drifts with fast jitter, beta 2 (red) is close to a random walk.

Each environment draws a sequence of `SEQUENCE_LENGTH` steps per action dimension
(`colorednoise.powerlaw_psd_gaussian`, unit variance) at the start of every episode, and
a new one if an episode outlasts it, so the slowest component spans one dm-control
episode (1000 control steps) and no correlation leaks from one episode into the next.
"""

from __future__ import annotations

import colorednoise
import numpy as np

# dm-control's episode length in control steps (every suite task: 1000).
SEQUENCE_LENGTH = 1000
# Steps of white noise drawn per generator call: one call per step costs more than the
# rest of the noise handling.
_WHITE_BLOCK = 1024


class ExplorationNoise:
    """Noise of shape `(num_envs,) + action_shape` per step, standard deviation `sigma`.

    Args:
      num_envs: K environments, each with its own sequence (and episode starts).
      action_shape: shape of one environment's action.
      sigma: standard deviation of every sample (the marginal is N(0, sigma^2) for any beta).
      beta: exponent of the power spectrum: 0 white, 1 pink, 2 red.
      rng: source of randomness (seeded by the actor).
    """

    def __init__(
        self,
        num_envs: int,
        action_shape: tuple[int, ...],
        sigma: float,
        beta: float,
        rng: np.random.Generator,
    ):
        self._num_envs = int(num_envs)
        self._action_shape = tuple(action_shape)
        self._sigma = np.float32(sigma)
        self._beta = float(beta)
        self._rng = rng
        if self._beta == 0:
            self._block = np.empty((0, self._num_envs) + self._action_shape, np.float32)
            self._index = 0
        else:
            # [K, SEQUENCE_LENGTH, *action_shape]: each environment's sequence, and the
            # step each has reached (at the end: a new sequence is drawn on use).
            self._sequences = np.zeros(
                (self._num_envs, SEQUENCE_LENGTH) + self._action_shape, np.float32
            )
            self._positions = np.full(self._num_envs, SEQUENCE_LENGTH)
            self._envs = np.arange(self._num_envs)
            # Steps before some environment needs a new sequence (checked only then).
            self._steps_left = 0

    @property
    def sigma(self) -> float:
        """The standard deviation of the samples to come (`set_sigma` changes it)."""
        return float(self._sigma)

    def set_sigma(self, sigma: float) -> None:
        """From the next sample on, noise of standard deviation `sigma` (the draws already
        made are rescaled; from 0, new ones are drawn)."""
        sigma = np.float32(sigma)
        if sigma == self._sigma:
            return
        old, self._sigma = self._sigma, sigma
        if self._beta == 0:
            if old > 0:
                self._block[self._index :] *= sigma / old
            else:
                self._index = len(self._block)  # Drawn afresh at the next sample.
        elif old > 0:
            self._sequences *= sigma / old
        else:
            self._positions[:] = SEQUENCE_LENGTH
            self._steps_left = 0

    def start_episode(self, index: int) -> None:
        """Environment `index` begins an episode: coloured noise starts a new sequence."""
        if self._beta != 0:
            self._positions[index] = SEQUENCE_LENGTH
            self._steps_left = 0

    def sample(self) -> np.ndarray:
        """The next step's noise for every environment, [K, *action_shape] float32."""
        if self._beta == 0:
            if self._index == len(self._block):
                shape = (_WHITE_BLOCK, self._num_envs) + self._action_shape
                self._block = self._sigma * self._rng.standard_normal(shape, np.float32)
                self._index = 0
            self._index += 1
            return self._block[self._index - 1]
        if self._steps_left == 0:
            for index in np.flatnonzero(self._positions >= SEQUENCE_LENGTH):
                self._sequences[index] = self._sigma * self._draw_sequence()
                self._positions[index] = 0
            self._steps_left = SEQUENCE_LENGTH - int(self._positions.max())
        noise = self._sequences[self._envs, self._positions]
        self._positions += 1
        self._steps_left -= 1
        return noise

    def _draw_sequence(self) -> np.ndarray:
        """[SEQUENCE_LENGTH, *action_shape] of unit-variance 1/f^beta noise."""
        size = self._action_shape + (SEQUENCE_LENGTH,)  # Time last, as the library wants.
        series = colorednoise.powerlaw_psd_gaussian(self._beta, size, random_state=self._rng)
        return np.moveaxis(series, -1, 0).astype(np.float32)
