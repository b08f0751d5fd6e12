"""Programs of nodes and the backends that run them (threads, local processes, Ray).

`launch` knows nothing of the maths: a `Program` is data (entry points, JSON
arguments, resources, restart policies); `launch.d4pg_program` builds the D4PG one.
"""

from launch.context import NodeContext
from launch.errors import LaunchError, NodeStartupError
from launch.program import NEVER_RESTART, Node, Program, Ref, Resources, RestartPolicy
from launch.run_dir import RunDir, RunDirError
from launch.supervisor import Outcome, Supervisor

__all__ = [
    "NEVER_RESTART",
    "LaunchError",
    "Node",
    "NodeContext",
    "NodeStartupError",
    "Outcome",
    "Program",
    "Ref",
    "Resources",
    "RestartPolicy",
    "RunDir",
    "RunDirError",
    "Supervisor",
]
