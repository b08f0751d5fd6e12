"""dm-control suite tasks by name: `make("cartpole:swingup")`, `list_tasks()`, and their errors.

Example:

>>> env = make("walker:walk", seed=1, action_repeat=2)
>>> timestep = env.reset()
>>> timestep.observation.dtype, timestep.observation.shape
(dtype('float32'), (24,))
>>> env.action_spec().minimum, env.action_spec().maximum
(array(-1., dtype=float32), array(1., dtype=float32))
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
from types import ModuleType

import dm_env

from environments import feature_stats, wrappers
from environments.wrappers import RenderingUnavailableError

_log = logging.getLogger(__name__)

# Set if the configured OpenGL backend failed to import and dm-control was loaded without
# rendering instead; `make(..., from_pixels=True)` reports it.
_render_import_error: Exception | None = None


class UnknownTaskError(ValueError):
    """A task name that is not `"domain:task"` for a dm-control suite task."""


@functools.cache
def _dm_suite() -> ModuleType:
    """Imports `dm_control.suite` once, surviving a broken OpenGL backend.

    dm-control imports the backend named by MUJOCO_GL eagerly, so a machine without
    libEGL would fail on `import dm_control.suite` even for feature observations. In that
    case import it again with rendering disabled (MUJOCO_GL is only changed during that
    import, so child processes still see the user's setting) and remember the error for
    `from_pixels=True`.
    """
    global _render_import_error
    try:
        from dm_control import suite

        return suite
    except Exception as e:  # The GL backends fail with ImportError, AttributeError, ...
        first_error = e
    saved = {k: os.environ.get(k) for k in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    os.environ["MUJOCO_GL"] = "disable"
    try:
        from dm_control import suite
    except Exception:
        raise first_error from None  # Not a rendering problem after all.
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    _render_import_error = first_error
    _log.warning(
        "dm-control could not load its OpenGL backend (MUJOCO_GL=%s: %s); "
        "feature observations work, pixel observations will raise.",
        saved["MUJOCO_GL"],
        first_error,
    )
    return suite


# Domains whose rewards are NOT confined to [0, 1] per step (LQR's quadratic cost
# makes its reward 1 - cost, unbounded below).
_UNBOUNDED_REWARD_DOMAINS = frozenset({"lqr"})


def reward_bounds(domain: str) -> tuple[float, float] | None:
    """Per-step reward bounds of a dm-control suite domain, before any action repeat.

    The Control Suite's design (Tassa et al. 2018, section 2) gives every benchmarking
    task rewards in [0, 1] per control step; the extra LQR tasks are the exception
    (None: no known bound). `make` declares these bounds, multiplied by `action_repeat`,
    in the reward spec, where agents can size their value estimates from them.
    """
    return None if domain in _UNBOUNDED_REWARD_DOMAINS else (0.0, 1.0)


def list_tasks() -> list[str]:
    """Returns every dm-control suite task as a sorted list of `"domain:task"` names."""
    return sorted(f"{domain}:{task}" for domain, task in _dm_suite().ALL_TASKS)


def parse_task_name(name: str) -> tuple[str, str]:
    """Splits `"domain:task"` into `(domain, task)` after checking the task exists.

    Raises:
      UnknownTaskError: if `name` is malformed or names no suite task; the message lists
        the closest valid names.
    """
    tasks = list_tasks()
    if name in tasks:
        domain, task = name.split(":")
        return domain, task
    if not isinstance(name, str) or name.count(":") != 1:
        problem = f"Malformed task name {name!r}: expected 'domain:task', e.g. 'cartpole:swingup'."
    else:
        problem = f"Unknown dm-control task {name!r}."
    query = str(name).lower()
    close = difflib.get_close_matches(query, tasks, n=5, cutoff=0.6)
    domain = query.split(":")[0]
    close += [t for t in tasks if t.startswith(domain + ":") and t not in close]
    hint = f" Did you mean: {', '.join(close[:8])}?" if close else ""
    raise UnknownTaskError(
        f"{problem}{hint} Run `replicator list-tasks` or call "
        f"environments.list_tasks() to see all {len(tasks)} tasks."
    )


def make(
    name: str,
    *,
    seed: int | None = 0,
    from_pixels: bool = False,
    height: int = 84,
    width: int = 84,
    camera_id: int = 0,
    frame_stack: int = 1,
    action_repeat: int = 1,
    time_limit: float | None = None,
    shadows_and_reflections: bool = False,
    normalize: bool = False,
) -> dm_env.Environment:
    """Builds a dm-control suite task with the observation and action conventions agents use.

    Observations are one flat float32 vector of the task's features (dict order), or, with
    `from_pixels=True`, uint8 frames of shape (height, width, 3 * frame_stack) stacked
    oldest first. Actions are float32 in [-1, 1], clipped, and mapped affinely onto the
    task's bounds. Rewards and discounts are float32; the reward spec is a
    `BoundedArray` of [0, action_repeat] for every domain but LQR (`reward_bounds`).

    Args:
      name: `"domain:task"`, e.g. `"cartpole:swingup"`; see `list_tasks()`.
      seed: seeds the task's random state (`task_kwargs={"random": seed}`): two envs with
        the same seed give identical trajectories for the same actions. None: unseeded.
      from_pixels: observe rendered frames instead of the features.
      height: frame height in pixels (pixels only).
      width: frame width in pixels (pixels only).
      camera_id: MuJoCo camera to render from (pixels only); -1 is the free camera.
      frame_stack: number of most recent frames stacked along channels (pixels only;
        3 is typical).
      action_repeat: physics steps per agent step; rewards are summed, discounts
        multiplied, and repetition stops early at the end of an episode.
      time_limit: episode length in simulated seconds (independent of `action_repeat`);
        None keeps the task's default.
      shadows_and_reflections: render MuJoCo's shadows and reflections (pixels only). Off
        by default: with software OpenGL they cost most of a frame's time and change
        little of the image (see `wrappers.PixelObservation`).
      normalize: standardise each feature with the task's fixed statistics under random
        actions (`task_statistics`, `feature_stats`): mean 0 and standard deviation 1
        there, clipped to +-10 (features only).

    Returns:
      A `dm_env.Environment`. Attributes of the dm-control env (e.g. `physics`) are
      reachable through it.

    Raises:
      UnknownTaskError: `name` is malformed or not a suite task.
      RenderingUnavailableError: `from_pixels=True` and no OpenGL backend can render.
      ValueError: an argument is out of range.
    """
    domain, task = parse_task_name(name)
    if action_repeat < 1:
        raise ValueError(f"action_repeat must be >= 1, got {action_repeat}.")
    if frame_stack < 1:
        raise ValueError(f"frame_stack must be >= 1, got {frame_stack}.")
    if frame_stack != 1 and not from_pixels:
        raise ValueError(
            "frame_stack applies to pixel observations; pass from_pixels=True "
            "or leave frame_stack=1."
        )
    if normalize and from_pixels:
        raise ValueError(
            "normalize standardises feature observations; pixels are scaled by the "
            "network (x / 255): leave normalize=False with from_pixels=True."
        )
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit}.")

    dm_suite = _dm_suite()
    if from_pixels and _render_import_error is not None:
        raise RenderingUnavailableError(wrappers.rendering_help(_render_import_error))
    task_kwargs: dict = {"random": seed}
    if time_limit is not None:
        # Every suite task takes time_limit as a task argument (not an environment one).
        task_kwargs["time_limit"] = time_limit
    env = dm_suite.load(domain, task, task_kwargs=task_kwargs)

    bounds = reward_bounds(domain)
    if bounds is not None:  # Rewards of k repeated steps add up.
        bounds = (bounds[0] * action_repeat, bounds[1] * action_repeat)
    if action_repeat > 1:
        env = wrappers.ActionRepeat(env, action_repeat)
    if from_pixels:
        env = wrappers.PixelObservation(
            env,
            height=height,
            width=width,
            camera_id=camera_id,
            frame_stack=frame_stack,
            reward_bounds=bounds,
            shadows_and_reflections=shadows_and_reflections,
        )
    else:
        standardization = task_statistics(domain, task, action_repeat) if normalize else None
        env = wrappers.FlattenFeatures(env, reward_bounds=bounds, standardization=standardization)
    return wrappers.CanonicalActions(env)


@functools.cache
def task_statistics(
    domain: str, task: str, action_repeat: int = 1
) -> feature_stats.FeatureStandardization:
    """The features' standardisation for `make(..., normalize=True)`, once per process.

    `feature_stats.random_action_statistics` of the task seeded with `feature_stats.SEED`;
    with an action repeat of k each random action is held for k physics steps, as the
    agent's are. The same numbers in every process of a run, without exchanging them.
    """
    environment = _dm_suite().load(domain, task, task_kwargs={"random": feature_stats.SEED})
    if action_repeat > 1:
        environment = wrappers.ActionRepeat(environment, action_repeat)
    try:
        return feature_stats.random_action_statistics(environment)
    finally:
        environment.close()
