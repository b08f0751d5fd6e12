"""Per-feature statistics of a task under random actions, for standardising observations.

A control-suite task's features differ in scale by one or two orders of magnitude:
reacher:easy's `to_target` (std ~0.08) sits beside joint angles (~0.8) and velocities
(~1-2). An MLP whose first layer is Linear -> LayerNorm normalises the pre-activations as
a whole, not each input, so a small-scale feature keeps its small share of the first
layer's output, and the fine distinctions a task may need in it (is the finger 0.05 or
0.07 from the target?) are left to small weights. Standardising each feature first
(subtract its mean, divide by its standard deviation) gives every feature the same scale.

The statistics are fixed per task, not running: they come from `EPISODES` episodes of
uniformly random actions in a copy of the task seeded with `SEED`, so every process of a
run (actors, evaluator, learner, a later `replicator evaluate`) computes the same numbers
without exchanging them, the replay holds observations of one scale for the whole run, and
a resumed run sees what it saw before. A feature's standard deviation is floored at
`MIN_STD` (a feature constant under random actions is not blown up), and the standardised
values are clipped to +-`CLIP` (a state far from the random policy's, e.g. a running
cheetah's speeds, stays a bounded input).
"""

from __future__ import annotations

import dataclasses

import dm_env
import numpy as np

SEED = 12345  # Task seed of the episodes the statistics come from.
ACTION_SEED = 0  # Seed of their random actions.
EPISODES = 2
MIN_STD = 1e-2
CLIP = 10.0


@dataclasses.dataclass(frozen=True)
class FeatureStandardization:
    """x -> clip((x - mean) * scale, -clip, clip), per feature of a flat float32 vector.

    Attributes:
      mean: the features' means, float32 [num_features].
      scale: 1 / max(std, MIN_STD) per feature, float32 [num_features].
      clip: bound of the standardised values.
    """

    mean: np.ndarray
    scale: np.ndarray
    clip: float = CLIP

    def apply_(self, features: np.ndarray) -> np.ndarray:
        """Standardises a float32 vector (or [B, num_features] batch) in place; returns it."""
        features -= self.mean
        features *= self.scale
        return np.clip(features, -self.clip, self.clip, out=features)


def flat_features(observation) -> np.ndarray:
    """A dm-control observation dict as one float32 vector, in the dict's order."""
    # One C-level call: axis=None ravels each value (0-d included) while concatenating,
    # and dtype= writes float32 directly instead of concatenating and then casting.
    return np.concatenate(list(observation.values()), axis=None, dtype=np.float32)


def random_action_statistics(
    environment: dm_env.Environment, episodes: int = EPISODES, seed: int = ACTION_SEED
) -> FeatureStandardization:
    """Mean and scale of the flat features over `episodes` episodes of random actions.

    `environment` is a dm-control task (observation dicts, raw action bounds), stepped
    with actions drawn uniformly within its action spec; every observation counts, the
    first of each episode included.
    """
    spec = environment.action_spec()
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(episodes):
        timestep = environment.reset()
        rows.append(flat_features(timestep.observation))
        while not timestep.last():
            timestep = environment.step(rng.uniform(spec.minimum, spec.maximum, spec.shape))
            rows.append(flat_features(timestep.observation))
    features = np.stack(rows)
    return FeatureStandardization(
        mean=features.mean(axis=0).astype(np.float32),
        scale=(1.0 / np.maximum(features.std(axis=0), MIN_STD)).astype(np.float32),
    )
