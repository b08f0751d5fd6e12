"""The launch settings a run remembers, so a relaunch needs only ``--run-dir``.

``RUN_DIR/launch.json`` holds the effective value of every flag in `STORED_FLAGS`
(step budget, actors, backend, learner layout, evaluation and checkpoint periods,
restart budget) and a history of which flags each launch gave. On a relaunch a flag
that is given overrides the stored value (and is recorded); a flag that is not given
takes the run's own value; a new run takes the defaults.

The CLI gives these flags ``default=None`` so "not given" can be told apart from
"given with the default value".
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from launch.run_dir import RunDir, RunDirError

SETTINGS_FILE = "launch.json"


def stored_flag_defaults() -> dict[str, Any]:
    """``{argparse dest: default for a new run}`` of the flags a run remembers."""
    from launch import d4pg_program  # pylint: disable=import-outside-toplevel

    d = d4pg_program.D4PGProgramSettings()
    return {
        "steps": d4pg_program.QUICK_STEPS,
        "actors": d.num_actors,
        "envs_per_actor": d.envs_per_actor,
        "backend": "local",
        "learner_replicas": d.learner_replicas,
        "learner_workers": d.learner_workers,
        "ray_address": None,
        "ray_resources": None,
        "bind_host": "127.0.0.1",
        "replay_port": d.replay_port,
        # Both None: evaluate every max(1000, steps / 20) actor steps (see the CLI).
        "eval_every": None,
        "eval_every_steps": None,
        "eval_episodes": d.eval_episodes,
        "keep_snapshots": d.keep_snapshots,
        "checkpoint_every": d.learner_checkpoint_every_steps,
        "replay_checkpoint_every": d.replay_checkpoint_every_s,
        "max_restarts": d.max_restarts,
        "restart_window": d.restart_window_s / 60.0,
    }


def read(run_dir: RunDir) -> dict[str, Any] | None:
    """The run's stored settings and history, or None for a run that has none yet."""
    try:
        with open(run_dir.path(SETTINGS_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RunDirError(
            f"{run_dir.path(SETTINGS_FILE)} is unreadable ({e}); fix or delete it (the run's "
            "flags then fall back to the defaults; pass them explicitly)."
        ) from None
    return data if isinstance(data, dict) else None


def resolve(args: argparse.Namespace, stored: dict[str, Any] | None) -> dict[str, Any]:
    """Fills every stored flag of `args` in place: given > the run's own > default.

    Returns:
      ``{dest: value}`` of the flags given on this command line.
    """
    own = (stored or {}).get("settings", {})
    given = {}
    for dest, default in stored_flag_defaults().items():
        value = getattr(args, dest, None)
        if value is not None:
            given[dest] = value
        else:
            setattr(args, dest, own.get(dest, default))
    return given


def write(run_dir: RunDir, args: argparse.Namespace, given: dict[str, Any]) -> None:
    """Records the effective settings and the flags given at this launch (atomically)."""
    previous = read(run_dir) or {}
    settings = {dest: getattr(args, dest) for dest in stored_flag_defaults()}
    history = list(previous.get("history", []))
    history.append({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "given": given})
    tmp = run_dir.path(SETTINGS_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"settings": settings, "history": history}, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, run_dir.path(SETTINGS_FILE))
