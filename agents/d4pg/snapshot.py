"""Policy snapshots: a self-contained TF SavedModel mapping observations to actions.

A snapshot is what leaves the learner for evaluation, video and export. It needs nothing
from this project to be used:

    import tensorflow as tf
    policy = tf.saved_model.load("RUN/snapshots/step_5000")
    actions = policy.act(observations)        # [B, *obs_shape] -> [B, *action_shape]
    info = json.loads(policy.metadata().numpy())  # task, config, learner step, specs

Layout of a snapshot directory:
  saved_model.pb, variables/   the SavedModel: `act` (also the "serving_default" signature,
                               input "observation", output "action"), `metadata()`, and
                               `acting_variables` (the weights in `NumpyPolicy` order)
  assets.extra/snapshot.json   the same metadata, readable without TensorFlow

The metadata holds the task, the full `D4PGConfig`, the learner step and the observation
and action specs, so a reader can check that an environment fits the snapshot before acting.
A run with `normalize_observations` acts on standardised features; its metadata's
`observation_standardization` ({"mean", "scale", "clip"}, per feature of the flat vector)
says how: clip((features - mean) * scale, -clip, clip).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from agents.d4pg import networks
from agents.d4pg.config import D4PGConfig

METADATA_FILE = os.path.join("assets.extra", "snapshot.json")
FORMAT_VERSION = 1
_STEP_PREFIX = "step_"
_STAGING_PREFIX = ".snapshot-"  # A save being written.
_REPLACED_PREFIX = ".replaced-"  # The snapshot a save is replacing, until it is done.


class SnapshotError(ValueError):
    """A snapshot is missing, unreadable, or does not fit the environment it is used with."""


def spec_metadata(env_spec) -> dict[str, Any]:
    """The observation and action specs as JSON data (what a snapshot must fit)."""
    obs, act = env_spec.observations, env_spec.actions
    return {
        "observation": {"shape": list(obs.shape), "dtype": np.dtype(obs.dtype).name},
        "action": {
            "shape": list(act.shape),
            "dtype": np.dtype(act.dtype).name,
            "minimum": np.broadcast_to(act.minimum, act.shape).astype(float).tolist(),
            "maximum": np.broadcast_to(act.maximum, act.shape).astype(float).tolist(),
        },
    }


class _SnapshotModule(tf.Module):
    """The exported object: the policy's torso and head, and a batched `act`."""

    def __init__(self, torso: networks.Torso, policy: networks.Policy, obs_spec, metadata: str):
        super().__init__(name="d4pg_policy")
        self.torso = torso
        self.policy = policy
        self.acting_variables = torso.ordered_variables() + policy.ordered_variables()
        self._metadata = metadata
        signature = tf.TensorSpec(
            [None, *obs_spec.shape], tf.dtypes.as_dtype(obs_spec.dtype), name="observation"
        )
        self.act = tf.function(self._act, input_signature=[signature])
        self.serve = tf.function(self._serve, input_signature=[signature])
        self.metadata = tf.function(self._get_metadata, input_signature=[])

    def _act(self, observation: tf.Tensor) -> tf.Tensor:
        return self.policy(self.torso(observation))

    def _serve(self, observation: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"action": self._act(observation)}

    def _get_metadata(self) -> tf.Tensor:
        return tf.constant(self._metadata)


def build_policy(config: D4PGConfig, env_spec) -> tuple[networks.Torso, networks.Policy]:
    """Fresh torso and policy modules for `env_spec` (variables created, no critic)."""
    obs_spec, act_spec = env_spec.observations, env_spec.actions
    torso = networks.Torso(config, networks.is_pixels(obs_spec))
    policy = networks.Policy(
        config,
        act_spec.minimum * np.ones(act_spec.shape),
        act_spec.maximum * np.ones(act_spec.shape),
    )
    dummy = tf.zeros((1, *obs_spec.shape), tf.dtypes.as_dtype(obs_spec.dtype))
    policy(torso(dummy))
    return torso, policy


def standardization_metadata(config: D4PGConfig, task: str) -> dict[str, Any]:
    """How a `normalize_observations` run standardised `task`'s features, as JSON data."""
    from environments import suite  # pylint: disable=import-outside-toplevel

    domain, name = suite.parse_task_name(task)
    stats = suite.task_statistics(domain, name, config.resolved_action_repeat(task))
    return {"mean": stats.mean.tolist(), "scale": stats.scale.tolist(), "clip": stats.clip}


def write(
    directory: str,
    *,
    config: D4PGConfig,
    env_spec,
    weights: Sequence[np.ndarray],
    task: str,
    learner_step: int,
) -> str:
    """Writes a snapshot of the acting `weights` into `directory` (replaced atomically).

    Args:
      directory: The snapshot directory to create (an existing one is replaced).
      config: The run's config (network shapes; stored in the metadata).
      env_spec: The specs the policy was trained on.
      weights: The acting variables in `D4PGNetworks.acting_variables()` order, e.g.
        `learner.acting_weights()` (the policy the run's actors act with).
      task: The task name, stored in the metadata.
      learner_step: The learner update the weights come from.

    Returns:
      `directory`.
    """
    metadata = {
        "format": FORMAT_VERSION,
        "agent": "d4pg",
        "task": task,
        "learner_step": int(learner_step),
        "config": config.to_dict(),
        **spec_metadata(env_spec),
    }
    if config.normalize_observations:
        metadata["observation_standardization"] = standardization_metadata(config, task)
    text = json.dumps(metadata, indent=2, sort_keys=True)
    # Fresh variables outside any distribution strategy: the snapshot does not depend on
    # how the learner was replicated, and the learner's own variables are left alone.
    with tf.init_scope():
        torso, policy = build_policy(config, env_spec)
        module = _SnapshotModule(torso, policy, env_spec.observations, text)
        if len(weights) != len(module.acting_variables):
            raise SnapshotError(
                f"{len(weights)} weight arrays for a policy with {len(module.acting_variables)}"
                " variables: pass learner.acting_weights() of the same config."
            )
        for variable, value in zip(module.acting_variables, weights):
            variable.assign(np.asarray(value, np.float32))
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    # Folders of saves that a kill interrupted (one process saves snapshots of a run).
    for name in os.listdir(parent):
        if name.startswith((_STAGING_PREFIX, _REPLACED_PREFIX)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=_STAGING_PREFIX, dir=parent)
    try:
        tf.saved_model.save(
            module, staging, signatures={"serving_default": module.serve.get_concrete_function()}
        )
        os.makedirs(os.path.join(staging, "assets.extra"), exist_ok=True)
        with open(os.path.join(staging, METADATA_FILE), "w", encoding="utf-8") as f:
            f.write(text + "\n")
        # Renames, not a delete then a rename: a crash in between leaves the old snapshot
        # whole under another name (and the next save removes it), never half of one.
        replaced = None
        if os.path.exists(directory):
            replaced = tempfile.mkdtemp(prefix=_REPLACED_PREFIX, dir=parent)
            os.replace(directory, replaced)
        os.replace(staging, directory)
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return directory


def read_metadata(directory: str) -> dict[str, Any]:
    """The metadata of the snapshot in `directory`, without loading TensorFlow objects."""
    path = os.path.join(directory, METADATA_FILE)
    if not os.path.exists(path) or not os.path.exists(os.path.join(directory, "saved_model.pb")):
        raise SnapshotError(
            f"{directory} is not a policy snapshot (no saved_model.pb and {METADATA_FILE}); "
            "pass a directory written by `replicator export` or RUN/snapshots/step_N."
        )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load_weights(directory: str) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The metadata and the acting weights (numpy, `NumpyPolicy` order) of a snapshot."""
    metadata = read_metadata(directory)
    loaded = tf.saved_model.load(directory)
    return metadata, [np.asarray(v.numpy()) for v in loaded.acting_variables]


def check_fits(metadata: dict[str, Any], env_spec, where: str = "the environment") -> None:
    """Raises `SnapshotError` naming the difference if `env_spec` does not fit the snapshot."""
    have = spec_metadata(env_spec)
    for part in ("observation", "action"):
        for key in ("shape", "dtype", "minimum", "maximum"):
            want, got = metadata[part].get(key), have[part].get(key)
            if want is not None and want != got:
                raise SnapshotError(
                    f"the snapshot (trained on {metadata['task']}) expects {part} {key} "
                    f"{want}, but {where} has {got}; evaluate on a task with the same specs."
                )


# ----------------------------------------------------------------- snapshots of a run


def step_directory(root: str, step: int) -> str:
    """RUN/snapshots/step_N for learner step N."""
    return os.path.join(root, f"{_STEP_PREFIX}{int(step)}")


def list_steps(root: str) -> list[int]:
    """Learner steps of the complete snapshots under `root`, ascending."""
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        number = name[len(_STEP_PREFIX) :]
        complete = os.path.exists(os.path.join(root, name, METADATA_FILE))
        if name.startswith(_STEP_PREFIX) and number.isdigit() and complete:
            steps.append(int(number))
    return sorted(steps)


def prune(root: str, keep: int) -> list[int]:
    """Deletes all but the `keep` newest snapshots under `root`; returns the deleted steps."""
    steps = list_steps(root)
    doomed = steps[: max(0, len(steps) - keep)]
    for step in doomed:
        shutil.rmtree(step_directory(root, step), ignore_errors=True)
    return doomed
