"""Programs of nodes and the backends that run them (threads, local processes, Ray).

`launch` knows nothing of the maths. Its parts:
  runtime/    the generic machinery: a `Program` is data (entry points, JSON arguments,
              resources, restart policies); a `Supervisor` runs it on a backend.
  d4pg/       D4PG's distributed program and node bodies, built on `runtime`.
  reporting/  evaluation, plots, reference curves and the bottleneck report.
  cli/        the `replicator` command, one module per command.
`runtime` imports none of the others (nor agents, environments or vision). This
package re-exports the runtime's public names.
"""

from launch.runtime.context import NodeContext
from launch.runtime.errors import LaunchError, NodeStartupError
from launch.runtime.program import NEVER_RESTART, Node, Program, Ref, Resources, RestartPolicy
from launch.runtime.run_dir import RunDir, RunDirError
from launch.runtime.supervisor import Outcome, Supervisor

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
