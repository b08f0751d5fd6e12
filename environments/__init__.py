"""dm-control suite tasks as `dm_env` environments with agent-ready conventions.

>>> import environments
>>> env = environments.make("cartpole:swingup", seed=0)
>>> spec = environments.make_environment_spec(env)
"""

import os

# dm-control picks its OpenGL backend when first imported: default to headless EGL, before
# anything below can import it. An explicit MUJOCO_GL from the user wins.
os.environ.setdefault("MUJOCO_GL", "egl")

from environments.specs import EnvironmentSpec, make_environment_spec
from environments.suite import (
    UnknownTaskError,
    list_tasks,
    make,
    parse_task_name,
    reward_bounds,
)
from environments.wrappers import RenderingUnavailableError

__all__ = [
    "EnvironmentSpec",
    "RenderingUnavailableError",
    "UnknownTaskError",
    "list_tasks",
    "make",
    "make_environment_spec",
    "parse_task_name",
    "reward_bounds",
]
