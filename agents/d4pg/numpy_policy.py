"""The D4PG policy (and pixel torso) as a numpy forward pass, for fast acting.

A tf.function call costs ~0.5 ms on a small CPU while a cartpole physics step costs
~0.13 ms, so actors evaluate the policy with numpy on weights pulled from the learner.
The weight order is `D4PGNetworks.acting_variables()`; `tests/agents` checks that this
forward pass equals the Sonnet modules to 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agents.d4pg.config import D4PGConfig

_LN_EPS = 1e-5  # snt.LayerNorm's default.


def _layer_norm(h: np.ndarray, scale: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """LayerNorm over the last axis (any batch shape); used by the pixel torso."""
    mean = h.mean(axis=-1, keepdims=True)
    centred = h - mean
    var = np.square(centred).mean(axis=-1, keepdims=True)
    return centred * (scale / np.sqrt(var + _LN_EPS)) + offset


def _elu_(h: np.ndarray) -> np.ndarray:
    """In-place elu: max(h, exp(min(h, 0)) - 1) equals h for h > 0 and e^h - 1 otherwise."""
    negative = np.minimum(h, 0)
    np.exp(negative, out=negative)
    negative -= 1
    return np.maximum(h, negative, out=h)


def _conv_valid(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    """VALID 2-D convolution of one HxWxC image with kernel [k, k, C, C_out] (as in Sonnet)."""
    k = w.shape[0]
    windows = np.lib.stride_tricks.sliding_window_view(x, (k, k), axis=(0, 1))
    windows = windows[::stride, ::stride]  # [Ho, Wo, C, k, k]
    ho, wo = windows.shape[:2]
    patches = windows.transpose(0, 1, 3, 4, 2).reshape(ho * wo, -1)  # [(Ho Wo), (k k C)]
    out = patches @ w.reshape(-1, w.shape[-1]) + b
    return out.reshape(ho, wo, -1)


class NumpyPolicy:
    """Deterministic policy on numpy weights: `policy(observation) -> action`.

    Args:
      config: network sizes (must match the learner's).
      pixels: whether observations are uint8 images (conv torso) or feature vectors.
      action_low, action_high: the action bounds the tanh output is rescaled to.

    Example:
      policy = NumpyPolicy(config, pixels=False, action_low=-1, action_high=1)
      policy.set_weights([v.numpy() for v in networks.acting_variables()])
      action = policy(observation)
    """

    def __init__(self, config: D4PGConfig, pixels: bool, action_low, action_high):
        self._config = config
        self._pixels = pixels
        self._low = np.asarray(action_low, np.float32)
        self._high = np.asarray(action_high, np.float32)
        self._half_range = (self._high - self._low) * np.float32(0.5)
        # The usual canonical [-1, 1] actions need no rescaling of tanh's output.
        self._identity_scale = bool(np.all(self._low == -1.0) and np.all(self._high == 1.0))
        self._weights: list[np.ndarray] | None = None

    @property
    def has_weights(self) -> bool:
        return self._weights is not None

    def set_weights(self, weights: Sequence[np.ndarray]) -> None:
        """Sets weights in `D4PGNetworks.acting_variables()` order."""
        n_torso = 4 + 2 * len(self._config.conv_channels) if self._pixels else 0
        n_policy = 4 + 2 * (len(self._config.policy_layers) - 1) + 2
        if len(weights) != n_torso + n_policy:
            raise ValueError(
                f"NumpyPolicy expected {n_torso + n_policy} arrays, got {len(weights)}: "
                "do the actor's and the learner's configs (layers, pixels) match?"
            )
        ws = [np.ascontiguousarray(w, dtype=np.float32) for w in weights]
        self._torso, self._mlp_first, rest = (
            ws[:n_torso],
            ws[n_torso : n_torso + 4],
            ws[n_torso + 4 :],
        )
        self._mlp_rest = [(rest[i], rest[i + 1]) for i in range(0, len(rest) - 2, 2)]
        self._head = (rest[-2], rest[-1])
        # LayerNorm subtracts the mean over units of x @ w0 + b0, which is linear in x: fold
        # the centring into the weights (columns minus their row mean) to save numpy calls.
        w0, b0, scale, offset = self._mlp_first
        self._first_centred = (w0 - w0.mean(axis=1, keepdims=True), b0 - b0.mean(), scale, offset)
        self._weights = ws

    def embed(self, observation: np.ndarray) -> np.ndarray:
        """The torso: a flat float32 vector for one unbatched observation."""
        if not self._pixels:
            return np.asarray(observation, np.float32).reshape(-1)
        h = np.asarray(observation, np.float32) * np.float32(1.0 / 255.0)
        t = self._torso
        for i, stride in enumerate(self._config.conv_strides):
            h = np.maximum(_conv_valid(h, t[2 * i], t[2 * i + 1], stride), 0)
        w, b, scale, offset = t[-4:]
        return np.tanh(_layer_norm(h.reshape(-1) @ w + b, scale, offset))

    def __call__(self, observation: np.ndarray) -> np.ndarray:
        """Action for one unbatched observation (float32, within the action bounds)."""
        if self._weights is None:
            raise RuntimeError(
                "NumpyPolicy has no weights yet: call set_weights() (actors: update())."
            )
        # Acting is latency bound (one small observation per call): every numpy call costs
        # ~1 us of overhead, so the layers are computed in place with few calls.
        w0, b0, scale, offset = self._first_centred
        if self._pixels or observation.ndim != 1 or observation.dtype != np.float32:
            observation = self.embed(observation)
        h = np.dot(observation, w0)  # Already centred: LayerNorm only scales and shifts.
        h += b0
        h *= scale * (1.0 / math.sqrt(float(np.dot(h, h)) / h.shape[0] + _LN_EPS))
        h += offset
        np.tanh(h, out=h)
        for w, b in self._mlp_rest:
            h = np.dot(h, w)
            h += b
            _elu_(h)
        w, b = self._head
        a = np.dot(h, w)
        a += b
        np.tanh(a, out=a)
        if not self._identity_scale:
            a += 1.0
            a *= self._half_range
            a += self._low
        return a

    def batch(self, observations: np.ndarray) -> np.ndarray:
        """Actions [K, action_dim] for K observations stacked on a leading axis.

        One matrix-matrix product per layer for all K: a batched actor pays the per-call
        numpy overhead once per step instead of K times. Row i equals `self(observations[i])`.
        """
        if self._weights is None:
            raise RuntimeError(
                "NumpyPolicy has no weights yet: call set_weights() (actors: update())."
            )
        if self._pixels:
            h = np.stack([self.embed(o) for o in observations])
        else:
            h = np.asarray(observations, np.float32).reshape(len(observations), -1)
        w0, b0, scale, offset = self._first_centred
        h = h @ w0  # Already centred per row: LayerNorm only scales and shifts.
        h += b0
        h *= scale / np.sqrt(np.einsum("ij,ij->i", h, h)[:, None] / h.shape[1] + _LN_EPS)
        h += offset
        np.tanh(h, out=h)
        for w, b in self._mlp_rest:
            h = h @ w
            h += b
            _elu_(h)
        w, b = self._head
        a = h @ w
        a += b
        np.tanh(a, out=a)
        if not self._identity_scale:
            a += 1.0
            a *= self._half_range
            a += self._low
        return a
