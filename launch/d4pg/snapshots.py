"""Policy snapshots of a run: written beside learner checkpoints, found, exported.

RUN/snapshots/step_N holds the SavedModel of the policy at learner step N (see
`agents.d4pg.snapshot`). The learner node calls `save_for_run` after each checkpoint;
`replicator export` and `replicator evaluate` find snapshots with `resolve`, and
`export_from_checkpoint` turns any kept learner checkpoint into a snapshot without a
learner or a replay server (only the policy's variables are read from the checkpoint).
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from launch.runtime.errors import LaunchError
from launch.runtime.run_dir import RunDir

SNAPSHOTS = "snapshots"
LEARNER_CHECKPOINTS = ("checkpoints", "learner")


def snapshot_root(run_dir: str) -> str:
    return os.path.join(run_dir, SNAPSHOTS)


def save_for_run(run_dir: str, *, learner, config, env_spec, task: str, keep: int) -> str:
    """Writes RUN/snapshots/step_N of the learner's acting policy; keeps the `keep` newest.

    The policy is the one actors and the evaluator act with (`learner.acting_weights()`:
    the target policy with `act_with_target_policy`), so evaluating a snapshot evaluates
    what the run's evaluator saw. Call it where the learner checkpoints, after
    `learner.save()` (and, with several learner workers, on the chief only: it writes
    into the run directory).
    """
    from agents.d4pg import snapshot  # pylint: disable=import-outside-toplevel

    root = snapshot_root(run_dir)
    weights = learner.acting_weights()
    path = snapshot.write(
        snapshot.step_directory(root, learner.num_steps),
        config=config,
        env_spec=env_spec,
        weights=weights,
        task=task,
        learner_step=learner.num_steps,
    )
    snapshot.prune(root, keep)
    return path


def _identity(run_dir: RunDir) -> dict[str, Any]:
    identity = run_dir.read_identity()
    if identity is None or identity.get("program") != "d4pg":
        raise LaunchError(
            f"{run_dir.root} is not a D4PG run directory (no run.json from "
            "`replicator launch d4pg`); pass the --run-dir of a D4PG run."
        )
    return identity


def kept_steps(run_dir: str) -> list[int]:
    from agents.d4pg import snapshot  # pylint: disable=import-outside-toplevel

    return snapshot.list_steps(snapshot_root(run_dir))


def checkpoint_steps(run_dir: str) -> dict[int, str]:
    """Learner step -> checkpoint prefix, for the learner checkpoints the run keeps."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    directory = os.path.join(run_dir, *LEARNER_CHECKPOINTS)
    state = tf.train.get_checkpoint_state(directory) if os.path.isdir(directory) else None
    out = {}
    for path in state.all_model_checkpoint_paths if state else []:
        suffix = path.rsplit("-", 1)[-1]
        if suffix.isdigit():
            out[int(suffix)] = path if os.path.isabs(path) else os.path.join(directory, path)
    return out


def resolve(run_dir: str | None, step: int | None, directory: str | None) -> str:
    """The snapshot directory named by --snapshot, or a run's [--step N] (default: latest)."""
    if directory is not None:
        if run_dir is not None or step is not None:
            raise LaunchError("--snapshot names one snapshot: drop the run directory and --step.")
        from agents.d4pg import snapshot  # pylint: disable=import-outside-toplevel

        try:
            snapshot.read_metadata(directory)
        except snapshot.SnapshotError as e:
            raise LaunchError(str(e)) from None
        return directory
    if run_dir is None:
        raise LaunchError("name a policy: RUN_DIR [--step N], or --snapshot DIR.")
    rd = RunDir(run_dir)
    if not os.path.isdir(rd.root):
        raise LaunchError(f"run directory {run_dir} does not exist.")
    _identity(rd)
    steps = kept_steps(rd.root)
    if not steps:
        raise LaunchError(
            f"{rd.root} has no policy snapshot yet ({snapshot_root(rd.root)}); let the run "
            "train until the learner checkpoints, or write one from a learner checkpoint with "
            f"`replicator export {rd.root} --out DIR`.",
            exit_code=1,
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise LaunchError(
            f"--step {step}: no snapshot of learner step {step} is kept in {rd.root}; "
            f"kept steps: {', '.join(map(str, steps))}."
        )
    from agents.d4pg import snapshot  # pylint: disable=import-outside-toplevel

    return snapshot.step_directory(snapshot_root(rd.root), step)


def export(run_dir: str, out: str, step: int | None = None) -> tuple[str, int]:
    """Writes a snapshot of `run_dir` (latest, or learner step `step`) to `out`.

    A kept snapshot of that step is copied; otherwise the policy is read from the learner
    checkpoint of that step. Returns the directory written and the learner step.
    """
    rd = RunDir(run_dir)
    if not os.path.isdir(rd.root):
        raise LaunchError(f"run directory {run_dir} does not exist.")
    identity = _identity(rd)
    if os.path.exists(out) and os.listdir(out):
        raise LaunchError(f"--out {out} exists and is not empty; name a new directory.")
    checkpoints = checkpoint_steps(rd.root)
    snapshots = kept_steps(rd.root)
    available = sorted(set(checkpoints) | set(snapshots))
    if not available:
        raise LaunchError(
            f"{rd.root} has no learner checkpoint or snapshot yet; let the run train longer.",
            exit_code=1,
        )
    step = available[-1] if step is None else step
    if step not in available:
        raise LaunchError(
            f"--step {step}: the run keeps no checkpoint or snapshot of learner step {step}; "
            f"available steps: {', '.join(map(str, available))}."
        )
    if step in snapshots:
        from agents.d4pg import snapshot  # pylint: disable=import-outside-toplevel

        if os.path.exists(out):
            os.rmdir(out)
        shutil.copytree(snapshot.step_directory(snapshot_root(rd.root), step), out)
        return out, step
    return export_from_checkpoint(identity, checkpoints[step], out, step), step


def export_from_checkpoint(identity: dict[str, Any], checkpoint: str, out: str, step: int) -> str:
    """Restores only the policy's variables of a learner checkpoint and writes a snapshot.

    The policy is the one the run acts with, as in `save_for_run`: the checkpoint's target
    torso and policy with `act_with_target_policy`, else the online ones.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    import environments  # pylint: disable=import-outside-toplevel
    from agents.d4pg import builder, snapshot  # pylint: disable=import-outside-toplevel
    from agents.d4pg.config import D4PGConfig  # pylint: disable=import-outside-toplevel

    config = D4PGConfig.from_saved(identity["config"])
    env = builder.make_environment(config, identity["task"], seed=0)
    spec = environments.make_environment_spec(env)
    env.close()
    torso, policy = snapshot.build_policy(config, spec)
    acting = tf.Module()
    acting.torso, acting.policy = torso, policy
    # The learner checkpoints its network sets as "online" and "target" (`D4PGLearner`).
    networks = "target" if config.act_with_target_policy else "online"
    status = tf.train.Checkpoint(**{networks: acting}).restore(checkpoint)
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise LaunchError(
            f"the checkpoint {checkpoint} does not match the run's config: {str(e)[:200]}",
            exit_code=1,
        ) from None
    status.expect_partial()  # Critics, the other network set and optimisers: not to act.
    weights = [v.numpy() for v in torso.ordered_variables() + policy.ordered_variables()]
    return snapshot.write(
        out,
        config=config,
        env_spec=spec,
        weights=weights,
        task=identity["task"],
        learner_step=step,
    )
