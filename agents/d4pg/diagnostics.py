"""Learner-side checks that turn metrics into advice: value support, replay ratio.

Both run in Python after each update on the (already reduced) metrics; neither adds
work to the replicated step.
"""

from __future__ import annotations

import collections
import logging
import math

from agents.d4pg.config import D4PGConfig
from agents.d4pg.replay import REPLAY_TABLE, table_info

_log = logging.getLogger(__name__)


class SupportMonitor:
    """Warns once when the critic's support [vmin, vmax] is clearly too small.

    "Clearly": after `warmup` updates, the target mass beyond the support (clipped onto
    the edge atoms before projection) averaged over the last `window` updates exceeds
    `threshold`. With the derived default support (`networks.value_support`) that mass
    is exactly zero while rewards stay within the reward spec, so the warning means the
    returns are larger than the support allows (an explicit vmin/vmax too small, or
    rewards outside the declared bounds).

    The warning says what to set: the per-step reward implied by the largest n-step
    return seen, r ~ R_max (1 - gamma) / (1 - gamma^n), gives the bound r / (1 - gamma),
    widened by 10% (as the derived default is).
    """

    def __init__(
        self,
        config: D4PGConfig,
        vmin: float,
        vmax: float,
        warmup: int = 200,
        window: int = 100,
        threshold: float = 0.05,
    ):
        self._config = config
        self._vmin, self._vmax = vmin, vmax
        self._warmup, self._threshold = warmup, threshold
        self._beyond: collections.deque[float] = collections.deque(maxlen=window)
        self._updates = 0
        self._return_max = -math.inf
        self._return_min = math.inf
        self.warning: str | None = None

    def observe(self, metrics: dict[str, float]) -> None:
        if "beyond_support_mass" not in metrics:
            return
        self._updates += 1
        self._beyond.append(metrics["beyond_support_mass"])
        self._return_max = max(self._return_max, metrics.get("n_step_return_max", -math.inf))
        self._return_min = min(self._return_min, metrics.get("n_step_return_min", math.inf))
        if self.warning is not None or self._updates < self._warmup:
            return
        mean = sum(self._beyond) / len(self._beyond)
        if mean > self._threshold:
            vmin, vmax = self.suggestion()
            self.warning = (
                f"D4PG value support [{self._vmin:g}, {self._vmax:g}] is too small: "
                f"{100 * mean:.0f}% of the target distribution's mass falls outside it "
                f"(n-step returns seen: {self._return_min:.3g} to {self._return_max:.3g}). "
                f"Set vmin={vmin:g} and vmax={vmax:g} in the config "
                f"(e.g. --config.vmin={vmin:g} --config.vmax={vmax:g})."
            )
            _log.warning(self.warning)

    def suggestion(self) -> tuple[float, float]:
        """(vmin, vmax) that would hold the returns seen so far."""
        gamma, n = self._config.discount, self._config.n_step
        if gamma < 1.0:
            per_step_scale = (1.0 - gamma) / (1.0 - gamma**n)
            horizon = 1.0 / (1.0 - gamma)
        else:  # No discount: the horizon is unknown, take 10x the n-step window.
            per_step_scale, horizon = 1.0 / n, 10.0 * n
        hi = max(self._return_max, 0.0) * per_step_scale * horizon
        lo = min(self._return_min, 0.0) * per_step_scale * horizon
        margin = 0.1 * max(hi - lo, 1e-6)
        vmax = max(_round_up(hi + margin), self._vmax)
        vmin = min(-_round_up(-(lo - margin)), self._vmin)
        return vmin, vmax


def _round_up(x: float) -> float:
    """Rounds x up to two significant figures (readable suggestions)."""
    if x <= 0:
        return 0.0 if x > -1e-12 else -_round_down(-x)
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / scale) * scale


def _round_down(x: float) -> float:
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return math.floor(x / scale) * scale


class ReplayRatio:
    """Achieved samples per insert of the "replay" table, read from Reverb every K updates.

    Sampled and inserted item counts come from the table's rate-limiter statistics
    (one `replay.table_info` call); the ratio is over the interval since the last reading, so
    it tracks the current regime (and compares with `samples_per_insert`). Prefetched
    samples count as sampled. Returns None between readings, without a client, or when
    the server cannot be reached (the learner must not fail for a metric).
    """

    def __init__(self, client, every: int = 100, table: str = REPLAY_TABLE):
        self._client = client
        self._every = every
        self._table = table
        self._last: tuple[int, int] | None = None
        self._last_step = -every

    def update(self, step: int) -> float | None:
        if self._client is None or step - self._last_step < self._every:
            return None
        self._last_step = step
        try:
            info = table_info(self._client, self._table, timeout=1).rate_limiter_info
        except Exception:  # pylint: disable=broad-except  # A metric, never a failure.
            return None
        current = (int(info.sample_stats.completed), int(info.insert_stats.completed))
        last, self._last = self._last, current
        if last is None or current[1] <= last[1]:
            return None
        return (current[0] - last[0]) / (current[1] - last[1])
