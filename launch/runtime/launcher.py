"""Runs a program in a run directory on a named backend, with progress and a stop rule.

This is the programmatic form of ``replicator launch``:

>>> from launch.runtime import launcher, program as prog
>>> p = prog.Program("demo", [prog.Node("n", "mypkg.nodes:work")])
>>> outcome = launcher.run(p, "runs/demo", backend="threads",
...                        stop_when=lambda progress: progress.totals["actor_steps"] > 1000)
... # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from launch.runtime.errors import LaunchError
from launch.runtime.metrics import Progress
from launch.runtime.program import Program
from launch.runtime.run_dir import RunDir
from launch.runtime.supervisor import Backend, Outcome, Supervisor

BACKENDS = ("local", "ray", "threads")


def advertise_host_for(bind_host: str) -> str | None:
    """The host other nodes dial for a server on `bind_host` (None: the node's own IP)."""
    if bind_host in ("0.0.0.0", "::", ""):
        return None
    return bind_host


def make_backend(
    name: str,
    run_dir: RunDir,
    program: Program,
    *,
    ray_address: str | None = None,
    bind_host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
) -> Backend:
    """Creates the backend called `name` ("local", "ray" or "threads")."""
    host = advertise_host_for(bind_host)
    if name == "local":
        from launch.runtime.local import LocalBackend  # pylint: disable=import-outside-toplevel

        return LocalBackend(run_dir, advertise_host=host or "localhost", env=env)
    if name == "threads":
        from launch.runtime.threads import ThreadsBackend  # pylint: disable=import-outside-toplevel

        return ThreadsBackend(run_dir, program, advertise_host=host or "localhost")
    if name == "ray":
        from launch.runtime.ray_backend import RayBackend  # pylint: disable=import-outside-toplevel

        return RayBackend(run_dir, program, address=ray_address, advertise_host=host)
    raise LaunchError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}.")


def run(
    program: Program,
    run_dir: RunDir | str,
    backend: Backend | str = "local",
    *,
    stop_when: Callable[[Progress], bool] | None = None,
    progress_every: float = 10.0,
    stop_grace: float | None = None,
    echo: Callable[[str], None] | None = None,
    on_supervisor: Callable[[Supervisor], None] | None = None,
    **backend_kwargs,
) -> Outcome:
    """Runs `program` until `stop_when(progress)` is true, a signal, or a fatal failure.

    Args:
      program: The nodes to run.
      run_dir: The run directory (the caller has checked it is compatible).
      backend: A backend or its name; with a name, `backend_kwargs` go to `make_backend`.
      stop_when: Checked about once a second with the aggregated `Progress`.
      progress_every: Seconds between progress lines (0 disables them).
      stop_grace: If set, caps every node's stop timeout (see `Supervisor`).
      echo: Where progress lines and supervision messages go (default stdout).
      on_supervisor: Called with the supervisor before it starts (tests use it to
        reach node handles).

    Returns:
      The `Outcome` of the run.
    """
    run_dir = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    echo = echo or (lambda m: print(m, flush=True))
    if isinstance(backend, str):
        backend = make_backend(backend, run_dir, program, **backend_kwargs)
    progress = Progress(run_dir, program.name)
    last_line = [time.monotonic()]
    supervisor: Supervisor | None = None

    def tick() -> bool:
        progress.update()
        if progress_every and time.monotonic() - last_line[0] >= progress_every:
            last_line[0] = time.monotonic()
            echo(progress.line(supervisor.restarts() if supervisor else None))
        return bool(stop_when and stop_when(progress))

    supervisor = Supervisor(
        program,
        backend,
        on_tick=tick,
        stop_grace=stop_grace,
        echo=lambda m: print(m, file=sys.stderr, flush=True),
    )
    if on_supervisor is not None:
        on_supervisor(supervisor)
    outcome = supervisor.run()
    progress.update()
    if progress_every:
        echo(progress.line(supervisor.restarts()))
    outcome.progress = progress
    return outcome
