"""Small `dm_env.Environment` wrappers that turn a dm-control task into what agents expect.

`environments.make` stacks them, innermost first:

    dm-control env -> ActionRepeat (if k > 1) -> FlattenFeatures | PixelObservation
                   -> CanonicalActions

so that per agent step the action is mapped once, the physics runs k times, and the
observation is flattened (with `normalize`, also standardised in place) or rendered once.
Each wrapper forwards anything it does not change, including attribute access
(`env.physics` reaches the dm-control physics).

An actor calls `step` millions of times, so wrappers precompute everything derived from
specs in their constructor and do a handful of numpy calls per step; none copies a dict.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import dm_env
import numpy as np
from dm_env import specs

from environments.feature_stats import FeatureStandardization, flat_features

# An actuator without `ctrlrange` is reported by dm-control with bounds of +-mjMAXVAL
# (1e10). Any bound this large is treated as "no bound" by `CanonicalActions`.
_UNBOUNDED_MAGNITUDE = 1e9
_FLOAT32_ONE = np.float32(1.0)


class RenderingUnavailableError(RuntimeError):
    """No OpenGL backend could render MuJoCo frames (pixel observations need one)."""


def rendering_help(cause: object) -> str:
    """The message of a `RenderingUnavailableError`: what failed and how to fix it."""
    backend = os.environ.get("MUJOCO_GL", "<unset>")
    return (
        f"Cannot render dm-control pixel observations with MUJOCO_GL={backend}: {cause}\n"
        "Select a working headless OpenGL backend before Python starts, with "
        "PYOPENGL_PLATFORM unset:\n"
        "  MUJOCO_GL=egl     Mesa EGL (GPU or CPU): apt-get install libegl1 libegl-mesa0\n"
        "  MUJOCO_GL=osmesa  software rendering:    apt-get install libosmesa6\n"
        "Feature observations (from_pixels=False) need no renderer."
    )


class Wrapper(dm_env.Environment):
    """Forwards every call to the wrapped environment; subclasses override what they change."""

    def __init__(self, environment: dm_env.Environment):
        self._environment = environment

    @property
    def environment(self) -> dm_env.Environment:
        """The wrapped environment."""
        return self._environment

    def reset(self) -> dm_env.TimeStep:
        return self._environment.reset()

    def step(self, action) -> dm_env.TimeStep:
        return self._environment.step(action)

    def observation_spec(self):
        return self._environment.observation_spec()

    def action_spec(self):
        return self._environment.action_spec()

    def reward_spec(self):
        return self._environment.reward_spec()

    def discount_spec(self):
        return self._environment.discount_spec()

    def close(self) -> None:
        self._environment.close()

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes this wrapper lacks (e.g. `physics`, `task`).
        if name.startswith("__") or name == "_environment":
            raise AttributeError(name)
        return getattr(self._environment, name)


class ActionRepeat(Wrapper):
    """Applies each action `num_repeats` times and returns one aggregated timestep.

    With rewards r_1..r_m and discounts d_1..d_m of the m <= k inner steps taken:
    reward = r_1 + ... + r_m and discount = d_1 * ... * d_m. Repetition stops early when
    an inner step ends the episode (m < k then). The observation is the last one.
    dm-control discounts are 1 except at a terminal step, where the episode stops, so the
    plain sum equals the discounted sum sum_i r_i * prod_{j<i} d_j.
    """

    def __init__(self, environment: dm_env.Environment, num_repeats: int):
        super().__init__(environment)
        if num_repeats < 1:
            raise ValueError(f"num_repeats must be >= 1, got {num_repeats}.")
        self._extra_repeats = range(num_repeats - 1)

    @property
    def num_repeats(self) -> int:
        return len(self._extra_repeats) + 1

    def step(self, action) -> dm_env.TimeStep:
        timestep = self._environment.step(action)
        # A FIRST timestep here means the inner env auto-reset after a LAST one.
        if timestep.step_type is not dm_env.StepType.MID:
            return timestep
        reward = timestep.reward
        discount = timestep.discount
        for _ in self._extra_repeats:
            timestep = self._environment.step(action)
            reward += timestep.reward
            discount *= timestep.discount
            if timestep.step_type is dm_env.StepType.LAST:
                break
        return dm_env.TimeStep(timestep.step_type, reward, discount, timestep.observation)


class _ObservationWrapper(Wrapper):
    """Base of the two observation wrappers; they also cast reward and discount to float32.

    The cast lives here, not in its own wrapper, because every `make` env has exactly one
    observation wrapper, so the timestep is rebuilt once per step instead of twice.
    """

    _REWARD_SPEC = specs.Array(shape=(), dtype=np.float32, name="reward")
    _DISCOUNT_SPEC = specs.BoundedArray(
        shape=(), dtype=np.float32, minimum=0.0, maximum=1.0, name="discount"
    )

    def __init__(
        self,
        environment: dm_env.Environment,
        reward_bounds: tuple[float, float] | None = None,
    ):
        super().__init__(environment)
        self._reward_spec = self._REWARD_SPEC
        if reward_bounds is not None:
            # Declared, not enforced: agents size their value support from it.
            low, high = (float(b) for b in reward_bounds)
            if not low <= high:
                raise ValueError(
                    f"reward_bounds must be (low, high) with low <= high, got {reward_bounds}."
                )
            self._reward_spec = specs.BoundedArray(
                shape=(), dtype=np.float32, minimum=low, maximum=high, name="reward"
            )

    def reward_spec(self) -> specs.Array:
        """float32 scalar; a `BoundedArray` when the reward bounds per step are known."""
        return self._reward_spec

    def discount_spec(self) -> specs.BoundedArray:
        return self._DISCOUNT_SPEC

    @staticmethod
    def _timestep(timestep: dm_env.TimeStep, observation: np.ndarray) -> dm_env.TimeStep:
        reward = timestep.reward
        discount = timestep.discount
        if discount == 1.0:  # Every MID step: reuse one (immutable) numpy scalar.
            discount = _FLOAT32_ONE
        elif discount is not None:  # None on FIRST timesteps (dm_env convention): keep.
            discount = np.float32(discount)
        return dm_env.TimeStep(
            timestep.step_type,
            None if reward is None else np.float32(reward),
            discount,
            observation,
        )


class FlattenFeatures(_ObservationWrapper):
    """Concatenates a dict of feature arrays into one float32 vector, in the dict's order.

    `reward_bounds` (low, high), when given, makes `reward_spec()` a `BoundedArray`.
    `standardization`, when given, standardises the vector per feature
    (`feature_stats.FeatureStandardization`: subtract the mean, scale, clip), in place.

    Scalars become length-1 segments and matrices are flattened row-major.
    `feature_slices` says where each named feature lives in the vector.
    """

    def __init__(
        self,
        environment: dm_env.Environment,
        reward_bounds: tuple[float, float] | None = None,
        standardization: FeatureStandardization | None = None,
    ):
        super().__init__(environment, reward_bounds)
        self.standardization = standardization
        self.feature_slices: dict[str, slice] = {}
        start = 0
        for name, spec in environment.observation_spec().items():
            size = int(np.prod(spec.shape, dtype=np.int64))
            self.feature_slices[name] = slice(start, start + size)
            start += size
        self._spec = specs.Array(shape=(start,), dtype=np.float32, name="observations")

    def observation_spec(self) -> specs.Array:
        return self._spec

    def _flatten(self, observation) -> np.ndarray:
        flat = flat_features(observation)
        return flat if self.standardization is None else self.standardization.apply_(flat)

    def reset(self) -> dm_env.TimeStep:
        timestep = self._environment.reset()
        return self._timestep(timestep, self._flatten(timestep.observation))

    def step(self, action) -> dm_env.TimeStep:
        timestep = self._environment.step(action)
        return self._timestep(timestep, self._flatten(timestep.observation))


def make_camera(
    physics: Any, height: int, width: int, camera_id: int, *, shadows_and_reflections: bool
) -> Any:
    """A `dm_control.mujoco.Camera` to keep and render from, optionally without the shadow
    and reflection passes (see `PixelObservation`)."""
    # Imported here: dm_control.mujoco picks its GL backend on import.
    from dm_control import mujoco  # pylint: disable=import-outside-toplevel
    from dm_control.mujoco.wrapper.mjbindings import enums  # pylint: disable=import-outside-toplevel

    camera = mujoco.Camera(physics, height=height, width=width, camera_id=camera_id)
    if not shadows_and_reflections:
        camera.scene.flags[enums.mjtRndFlag.mjRND_SHADOW] = 0
        camera.scene.flags[enums.mjtRndFlag.mjRND_REFLECTION] = 0
    return camera


class PixelObservation(_ObservationWrapper):
    """Replaces the observation by rendered frames: uint8 (height, width, 3 * frame_stack).

    Frames are stacked along channels, oldest first: channels [3*i, 3*i+3) hold the frame
    from `frame_stack - 1 - i` steps ago. `reward_bounds` as in `FlattenFeatures`.
    On a FIRST timestep (reset, or an inner auto-reset)
    the first frame fills every slot, so the stack never mixes two episodes.

    Frames come from one `dm_control.mujoco.Camera` kept for the wrapper's life
    (`physics.render` builds a new camera and scene on every call). With
    `shadows_and_reflections=False` (the default) the scene skips MuJoCo's shadow and
    reflection passes: with software OpenGL (Mesa) a 64x64 cartpole frame then takes
    ~1.3 ms instead of ~10 ms, and the frame changes by under one intensity level per pixel
    on average (the floor's shadow and mirror image). True renders exactly what
    `physics.render` does.

    Raises:
      RenderingUnavailableError: (in the constructor) if no OpenGL backend can render.
    """

    def __init__(
        self,
        environment: dm_env.Environment,
        *,
        height: int = 84,
        width: int = 84,
        camera_id: int = 0,
        frame_stack: int = 1,
        reward_bounds: tuple[float, float] | None = None,
        shadows_and_reflections: bool = False,
    ):
        super().__init__(environment, reward_bounds)
        if height < 1 or width < 1:
            raise ValueError(f"height and width must be positive, got {height}x{width}.")
        if frame_stack < 1:
            raise ValueError(f"frame_stack must be >= 1, got {frame_stack}.")
        physics = environment.physics
        num_cameras = physics.model.ncam
        if not -1 <= camera_id < num_cameras:
            raise ValueError(
                f"camera_id={camera_id} is out of range: this task has {num_cameras} cameras "
                f"(ids 0..{num_cameras - 1}; -1 is the free camera)."
            )
        self._camera: Any = None
        self._frame_stack = frame_stack
        self._frames: collections.deque[np.ndarray] = collections.deque(maxlen=frame_stack)
        self._spec = specs.BoundedArray(
            shape=(height, width, 3 * frame_stack),
            dtype=np.uint8,
            minimum=0,
            maximum=255,
            name="pixels",
        )
        try:  # Fail here, with instructions, rather than on the first reset of an actor.
            self._camera = make_camera(
                physics, height, width, camera_id, shadows_and_reflections=shadows_and_reflections
            )
            self._camera.render()
        except Exception as e:  # dm-control raises RuntimeError, ImportError, GL errors.
            raise RenderingUnavailableError(rendering_help(e)) from e

    def observation_spec(self) -> specs.BoundedArray:
        return self._spec

    def _observe(self, timestep: dm_env.TimeStep) -> dm_env.TimeStep:
        # The camera returns a (flipped) view of its one pixel buffer, which the next render
        # overwrites: the stack needs its own C-ordered copy of each frame.
        frame = self._camera.render().copy()
        if self._frame_stack == 1:
            return self._timestep(timestep, frame)
        if timestep.step_type is dm_env.StepType.FIRST:
            self._frames.extend([frame] * self._frame_stack)
        else:
            self._frames.append(frame)  # maxlen drops the oldest.
        return self._timestep(timestep, np.concatenate(self._frames, axis=-1))

    def reset(self) -> dm_env.TimeStep:
        return self._observe(self._environment.reset())

    def step(self, action) -> dm_env.TimeStep:
        return self._observe(self._environment.step(action))


def canonical_action_mapping(spec: specs.BoundedArray) -> tuple[np.ndarray, np.ndarray]:
    """Returns (scale, offset) with `task_action = scale * canonical_action + offset`.

    Each bounded dimension maps [-1, 1] affinely onto [minimum, maximum]: -1 -> minimum,
    +1 -> maximum, 0 -> the midpoint. A dimension with an infinite bound or one of
    magnitude >= 1e9 (dm-control reports unlimited actuators as +-1e10) has no range to
    map onto, so it gets scale 1 and offset 0: the canonical action is applied as is.

    Example: bounds [-1, 1.1] give scale 1.05 and offset 0.05.
    """
    minimum = np.broadcast_to(np.asarray(spec.minimum, np.float64), spec.shape)
    maximum = np.broadcast_to(np.asarray(spec.maximum, np.float64), spec.shape)
    bounded = (
        np.isfinite(minimum)
        & np.isfinite(maximum)
        & (np.abs(minimum) < _UNBOUNDED_MAGNITUDE)
        & (np.abs(maximum) < _UNBOUNDED_MAGNITUDE)
    )
    # Unbounded dimensions become [-1, 1] first, which gives them scale 1 and offset 0.
    minimum = np.where(bounded, minimum, -1.0)
    maximum = np.where(bounded, maximum, 1.0)
    return (maximum - minimum) / 2.0, (maximum + minimum) / 2.0


class CanonicalActions(Wrapper):
    """Exposes actions as float32 in [-1, 1] and maps them affinely to the task's bounds.

    Out-of-range actions are clipped to [-1, 1] before mapping. This changes no dynamics
    for limited actuators (MuJoCo clamps `ctrl` to `ctrlrange` anyway), but it keeps the
    documented contract true for every task: exploration noise added on top of a tanh
    policy can never reach an unlimited actuator (LQR) as an arbitrarily large command.
    See `canonical_action_mapping` for the mapping.

    Raises:
      ValueError: (in `step`) if the action's shape is not the spec's shape.
    """

    def __init__(self, environment: dm_env.Environment):
        super().__init__(environment)
        inner = environment.action_spec()
        if not isinstance(inner, specs.BoundedArray):
            raise TypeError(f"CanonicalActions needs a BoundedArray action spec, got {inner!r}.")
        self._shape = inner.shape
        self._scale, self._offset = canonical_action_mapping(inner)
        # Almost every dm-control task already uses [-1, 1]; skip the affine map then.
        self._identity = bool(np.all(self._scale == 1.0) and np.all(self._offset == 0.0))
        # Bounds as arrays of the action's shape and dtype: numpy handles those several
        # times faster than Python scalars, which it must convert on every call.
        self._low = np.full(inner.shape, -1.0, np.float32)
        self._high = np.full(inner.shape, 1.0, np.float32)
        self._spec = specs.BoundedArray(
            shape=inner.shape,
            dtype=np.float32,
            minimum=-1.0,
            maximum=1.0,
            name=inner.name or "action",
        )

    def action_spec(self) -> specs.BoundedArray:
        return self._spec

    def to_task_action(self, action) -> np.ndarray:
        """Clips a canonical action to [-1, 1] and maps it onto the task's bounds."""
        # Two ufuncs on precomputed arrays: several times cheaper than np.clip on tiny arrays.
        try:
            clipped = np.minimum(np.maximum(action, self._low), self._high)
        except ValueError:  # Shapes that do not even broadcast.
            clipped = None
        if clipped is None or clipped.shape != self._shape:
            raise ValueError(
                f"Action has shape {np.shape(action)}; this environment expects "
                f"{self._shape} (see env.action_spec())."
            )
        if self._identity:
            return clipped
        return clipped * self._scale + self._offset

    def step(self, action) -> dm_env.TimeStep:
        return self._environment.step(self.to_task_action(action))
