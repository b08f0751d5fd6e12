"""The generic program-of-nodes machinery: programs, the supervisor and its backends.

A `program.Program` is data (entry points as ``"module:function"`` strings, JSON
arguments, resources, restart policies); `supervisor.Supervisor` runs one on a backend
(`local` processes, `ray_backend`, `threads`) and keeps it going under faults, with
the run directory (`run_dir`) and the metrics it collects (`metrics`).

The import rule: nothing here imports `agents`, `environments`, `vision`,
`launch.d4pg`, `launch.reporting` or `launch.cli` (tests/launch/test_layout.py checks
it), so any agent's program can run on it.
"""
