"""Published learning curves of other agents on the control suite, shipped with the project.

The file `data/dmc_proprio_baselines.json` holds the mean (and min, max over seeds)
evaluation return of D4PG, DDPG, MPO, DMPO (10 seeds each) and DreamerV3 (5 seeds),
learned from **state features**, at 50k-500k environment steps on the six suite tasks:
the baseline curves published with DreamerV3 (Hafner et al. 2023, repository
danijar/dreamerv3, `scores/dmc_proprio-METHOD.json.gz`), linearly interpolated between
their stored evaluation points. Compare a run with them at equal environment steps and
with the same observation type only: pixel runs and longer budgets are other problems.

Used by `replicator plot --reference` and `benchmarks/agents_learning_suite.py`.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

PATH = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "data", "dmc_proprio_baselines.json"
)
SOURCE = (
    "State-feature baselines published with DreamerV3 (Hafner et al. 2023; repository "
    "danijar/dreamerv3, scores/dmc_proprio-METHOD.json.gz): mean return over seeds "
    "(D4PG, DDPG, MPO, DMPO: 10; DreamerV3: 5), interpolated at the listed steps."
)
# SOURCE in one line, for a figure's footnote.
SOURCE_SHORT = (
    "state-feature baselines published with DreamerV3 (Hafner et al. 2023, danijar/dreamerv3)"
)
# Display names, in the order tables list them.
METHOD_NAMES = {
    "d4pg": "D4PG",
    "ddpg": "DDPG",
    "mpo": "MPO",
    "dmpo": "DMPO",
    "dreamerv3": "DreamerV3",
}


@functools.cache
def _load() -> dict[str, Any]:
    with open(PATH, encoding="utf-8") as f:
        return json.load(f)


def methods() -> list[str]:
    """The reference methods, e.g. ["d4pg", "ddpg", "mpo", "dmpo", "dreamerv3"]."""
    return [m for m in METHOD_NAMES if m in _load()["methods"]]


def steps() -> list[int]:
    """The environment steps at which every curve has a value."""
    return [int(s) for s in _load()["steps"]]


def tasks() -> list[str]:
    """The tasks that have reference curves (the learning suite's six)."""
    return sorted(_load()["methods"]["d4pg"])


def curve(method: str, task: str) -> list[tuple[int, float, float, float]]:
    """(steps, mean, min, max) of `method` on `task`, by increasing steps; [] if none.

    A step the method's published curve does not reach (null in the file) is left out.
    """
    points = _load()["methods"].get(method, {}).get(task, {})
    return sorted(
        (int(s), float(p["mean"]), float(p["min"]), float(p["max"]))
        for s, p in points.items()
        if p is not None
    )


def mean_at(method: str, task: str, at_steps: int) -> float | None:
    """The reference mean return of `method` on `task` at exactly `at_steps`, or None."""
    for s, mean, _, _ in curve(method, task):
        if s == at_steps:
            return mean
    return None


def best_at(task: str, at_steps: int) -> tuple[str, float] | None:
    """(method, mean) of the best reference method on `task` at `at_steps`, or None."""
    candidates = [(m, v) for m in methods() for v in [mean_at(m, task, at_steps)] if v is not None]
    return max(candidates, key=lambda mv: mv[1]) if candidates else None
