"""Offline evaluation of a run's latest learner checkpoint: returns and an optional video.

The learner is rebuilt in this process (one replica) next to a private in-process
Reverb server, restored from ``RUN_DIR/checkpoints/learner`` and asked to publish
its weights; a noise-free evaluator pulls them exactly as in training. Only the
public `agents.d4pg.builder` API is used.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from launch.errors import LaunchError
from launch.run_dir import RunDir

VIDEO_SIZE = (240, 320)  # height, width


def _load_run(run_dir: RunDir, task: str | None):
    identity = run_dir.read_identity()
    if identity is None or identity.get("program") != "d4pg":
        raise LaunchError(
            f"{run_dir.root} is not a D4PG run directory (no run.json from "
            "`replicator launch d4pg`); pass the --run-dir of a D4PG run."
        )
    checkpoints = run_dir.path("checkpoints", "learner")
    if not os.path.exists(os.path.join(checkpoints, "checkpoint")):
        raise LaunchError(
            f"{run_dir.root} has no learner checkpoint yet ({checkpoints}); let the "
            "run train longer (the learner saves every few minutes and on stop).",
            exit_code=1,
        )
    return identity, task or identity["task"], checkpoints


def _writer_for(path: str):
    import imageio.v2 as imageio  # pylint: disable=import-outside-toplevel

    ext = os.path.splitext(path)[1].lower()
    if ext not in (".mp4", ".gif"):
        raise LaunchError(f"--video {path}: use a .mp4 or .gif file name.")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        if ext == ".mp4":
            return imageio.get_writer(path, fps=30, macro_block_size=8)
        return imageio.get_writer(path, mode="I", duration=1 / 30)
    except Exception as e:  # pylint: disable=broad-except
        raise LaunchError(
            f"cannot write {path} ({e}). For .mp4, install imageio-ffmpeg "
            "(`pip install 'tf-replicator[video]'`), or write a .gif.",
            exit_code=1,
        ) from None


def evaluate(
    run_dir: str,
    *,
    task: str | None = None,
    episodes: int = 10,
    video: str | None = None,
    seed: int = 12345,
) -> dict[str, Any]:
    """Evaluates the latest checkpoint of `run_dir` without exploration noise.

    Args:
      run_dir: A run directory of `replicator launch d4pg`.
      task: Task to evaluate on (default: the run's own).
      episodes: Number of episodes.
      video: Optional .mp4/.gif path; the first episode is rendered into it.
      seed: Seed of the evaluation environment.

    Returns:
      ``{"mean": ..., "std": ..., "returns": [...], "learner_steps": ..., "task": ...}``.
    """
    rd = RunDir(run_dir)
    identity, task, checkpoints = _load_run(rd, task)
    writer = _writer_for(video) if video else None
    import numpy as np  # pylint: disable=import-outside-toplevel

    import replication  # pylint: disable=import-outside-toplevel

    repl = replication.make("cpu")
    import environments  # pylint: disable=import-outside-toplevel
    from agents.d4pg import builder  # pylint: disable=import-outside-toplevel
    from agents.d4pg.config import D4PGConfig  # pylint: disable=import-outside-toplevel

    config = D4PGConfig.from_dict(identity["config"])
    try:
        env = builder.make_environment(config, task, seed=seed)
    except environments.UnknownTaskError as e:
        raise LaunchError(str(e)) from None
    spec = environments.make_environment_spec(env)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    tf.get_logger().setLevel("ERROR")  # Optimiser slots are not needed to act: no warnings.
    scratch = tempfile.mkdtemp(prefix="replicator-evaluate-")
    server = builder.make_replay_server(config, spec, checkpoint_dir=scratch)
    address = f"localhost:{server.port}"
    try:
        learner = builder.make_learner(config, spec, address, repl, checkpoints)
        try:
            learner.restore()
        except (AssertionError, ValueError) as e:
            raise LaunchError(
                f"the checkpoint in {checkpoints} does not fit {task} (it was trained "
                f"on {identity['task']}): {str(e).splitlines()[0]}"
            ) from None
        agent = builder.make_evaluator(config, spec, address, seed=seed)
        agent.update(wait=True)
        returns = []
        for episode in range(episodes):
            timestep = env.reset()
            agent.observe_first(timestep)
            total = 0.0
            record = writer is not None and episode == 0
            if record:
                writer.append_data(_render(env))
            while not timestep.last():
                action = agent.select_action(timestep.observation)
                timestep = env.step(action)
                total += float(np.sum(timestep.reward))
                if record:
                    writer.append_data(_render(env))
            returns.append(total)
    finally:
        if writer is not None:
            writer.close()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "task": task,
        "episodes": episodes,
        "returns": returns,
        "mean": float(np.mean(returns)),
        "std": float(np.std(returns)),
        "learner_steps": learner.num_steps,
        "checkpoint": checkpoints,
    }


def _render(env):
    import environments  # pylint: disable=import-outside-toplevel

    try:
        return env.physics.render(height=VIDEO_SIZE[0], width=VIDEO_SIZE[1], camera_id=0)
    except Exception as e:  # pylint: disable=broad-except
        raise LaunchError(
            f"cannot render frames for --video: {environments.wrappers.rendering_help(e)}",
            exit_code=1,
        ) from None
