"""Offline evaluation of policy snapshots: returns per seed, a video, a curve over snapshots.

A snapshot (`agents.d4pg.snapshot`) is the only source of the weights: no learner and no
replay server are built. The weights are read from the SavedModel once and the episodes
are acted with the numpy forward pass (`NumpyPolicy`), because a TensorFlow call per step
costs several times a physics step; `tests/launch/test_evaluate.py` checks that both give
the same actions.
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Sequence
from typing import Any

from launch.d4pg import snapshots
from launch.runtime.errors import LaunchError

VIDEO_SIZE = (240, 320)  # height, width
CURVE_COLUMNS = ("learner_step", "mean", "std", "episodes", "seeds", "snapshot")


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


class SnapshotPolicy:
    """A loaded snapshot: its metadata, config and a numpy policy on its weights."""

    def __init__(self, directory: str):
        from agents.d4pg import networks, snapshot  # pylint: disable=import-outside-toplevel
        from agents.d4pg.config import D4PGConfig  # pylint: disable=import-outside-toplevel
        from agents.d4pg.numpy_policy import NumpyPolicy  # pylint: disable=import-outside-toplevel

        try:
            self.metadata, weights = snapshot.load_weights(directory)
        except snapshot.SnapshotError as e:
            raise LaunchError(str(e)) from None
        self.directory = directory
        self.config = D4PGConfig.from_dict(self.metadata["config"])
        obs = self.metadata["observation"]
        action = self.metadata["action"]
        pixels = networks.is_pixels(_Spec(obs["shape"], obs["dtype"]))
        self.policy = NumpyPolicy(
            self.config, pixels, action_low=action["minimum"], action_high=action["maximum"]
        )
        self.policy.set_weights(weights)

    @property
    def learner_step(self) -> int:
        return int(self.metadata["learner_step"])

    def make_environment(self, task: str, seed: int):
        """The environment of `task` as this snapshot's config sees it; checked to fit."""
        import environments  # pylint: disable=import-outside-toplevel
        from agents.d4pg import builder, snapshot  # pylint: disable=import-outside-toplevel

        try:
            env = builder.make_environment(self.config, task, seed=seed)
        except environments.UnknownTaskError as e:
            raise LaunchError(str(e)) from None
        spec = environments.make_environment_spec(env)
        try:
            snapshot.check_fits(self.metadata, spec, where=task)
        except snapshot.SnapshotError as e:
            env.close()
            raise LaunchError(str(e)) from None
        return env, spec


class _Spec:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype


def run_episodes(
    loaded: SnapshotPolicy,
    task: str,
    seeds: Sequence[int],
    episodes: int,
    video: str | None = None,
) -> dict[str, Any]:
    """Plays `episodes` noise-free episodes per seed; the first one optionally into `video`."""
    import numpy as np  # pylint: disable=import-outside-toplevel

    from agents.d4pg.acting import D4PGActor  # pylint: disable=import-outside-toplevel

    writer = _writer_for(video) if video else None
    per_seed: dict[str, list[float]] = {}
    steps = 0
    env_seconds = 0.0
    start = time.perf_counter()
    try:
        for seed in seeds:
            t0 = time.perf_counter()
            env, spec = loaded.make_environment(task, seed)
            env_seconds += time.perf_counter() - t0
            actor = D4PGActor(loaded.policy, spec.actions, variable_client=None, sigma=0.0)
            returns = []
            for episode in range(episodes):
                record = writer is not None and not per_seed and episode == 0
                t0 = time.perf_counter()
                timestep = env.reset()
                env_seconds += time.perf_counter() - t0
                total = 0.0
                if record:
                    writer.append_data(_frame(env, total))
                while not timestep.last():
                    action = actor.select_action(timestep.observation)
                    t0 = time.perf_counter()
                    timestep = env.step(action)
                    env_seconds += time.perf_counter() - t0
                    steps += 1
                    total += float(np.sum(timestep.reward))
                    if record:
                        writer.append_data(_frame(env, total))
                returns.append(total)
            per_seed[str(seed)] = returns
            env.close()
    finally:
        if writer is not None:
            writer.close()
    wall = time.perf_counter() - start
    flat = [r for rs in per_seed.values() for r in rs]
    return {
        "task": task,
        "trained_on": loaded.metadata["task"],
        "learner_step": loaded.learner_step,
        "snapshot": os.path.abspath(loaded.directory),
        "episodes": len(flat),
        "seeds": [int(s) for s in seeds],
        "returns_per_seed": per_seed,
        "mean": float(np.mean(flat)),
        "std": float(np.std(flat)),
        "seed_means_std": float(np.std([np.mean(v) for v in per_seed.values()])),
        "steps": steps,
        "wall_s": round(wall, 3),
        "env_step_fraction": round(env_seconds / wall, 3) if wall > 0 else None,
    }


def evaluate(
    run_dir: str | None = None,
    *,
    snapshot: str | None = None,
    step: int | None = None,
    task: str | None = None,
    episodes: int = 10,
    seeds: Sequence[int] = (12345,),
    video: str | None = None,
) -> dict[str, Any]:
    """Evaluates one snapshot (latest of `run_dir`, its `step`, or the `snapshot` directory).

    Returns:
      ``{"mean", "std", "returns_per_seed", "learner_step", "task", "snapshot", ...}``.
    """
    directory = snapshots.resolve(run_dir, step, snapshot)
    loaded = SnapshotPolicy(directory)
    return run_episodes(loaded, task or loaded.metadata["task"], seeds, episodes, video)


def evaluate_all(
    run_dir: str,
    out: str,
    *,
    task: str | None = None,
    episodes: int = 10,
    seeds: Sequence[int] = (12345,),
    echo=None,
) -> list[dict[str, Any]]:
    """Evaluates every kept snapshot of `run_dir` (ascending steps) into the CSV `out`."""
    snapshots.resolve(run_dir, None, None)  # The clear errors: not a run, no snapshots.
    rows = []
    for step in snapshots.kept_steps(run_dir):
        result = evaluate(run_dir, step=step, task=task, episodes=episodes, seeds=seeds)
        rows.append(result)
        if echo is not None:
            echo(
                f"step {step:,}: return {result['mean']:.1f} +- {result['std']:.1f} "
                f"over {result['episodes']} episode(s)"
            )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(CURVE_COLUMNS)
        for r in rows:
            writer.writerow(
                [
                    r["learner_step"],
                    r["mean"],
                    r["std"],
                    r["episodes"],
                    " ".join(map(str, r["seeds"])),
                    r["snapshot"],
                ]
            )
    return rows


def _frame(env, episode_return: float):
    """One rendered frame with the return so far written in its top-left corner."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from PIL import Image, ImageDraw  # pylint: disable=import-outside-toplevel

    import environments  # pylint: disable=import-outside-toplevel

    try:
        pixels = env.physics.render(height=VIDEO_SIZE[0], width=VIDEO_SIZE[1], camera_id=0)
    except Exception as e:  # pylint: disable=broad-except
        raise LaunchError(
            f"cannot render frames for --video: {environments.wrappers.rendering_help(e)}",
            exit_code=1,
        ) from None
    image = Image.fromarray(np.ascontiguousarray(pixels))
    draw = ImageDraw.Draw(image)
    text = f"return {episode_return:.1f}"
    draw.rectangle((4, 4, 12 + 7 * len(text), 20), fill=(0, 0, 0))
    draw.text((8, 6), text, fill=(255, 255, 255))
    return np.asarray(image)
