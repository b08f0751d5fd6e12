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
import time
from typing import Any

from launch.runtime.run_dir import RunDir, RunDirError, write_json_atomic

SETTINGS_FILE = "launch.json"


def stored_flag_defaults() -> dict[str, Any]:
    """``{argparse dest: default for a new run}`` of the flags a run remembers."""
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel

    d = d4pg_program.D4PGProgramSettings()
    return {
        "steps": d4pg_program.QUICK_STEPS,
        "actors": d.num_actors,
        "envs_per_actor": d.envs_per_actor,
        "backend": "local",
        "learner_replicas": d.learner_replicas,
        "learner_workers": d.learner_workers,
        "learner_intra_op_threads": None,  # The learner's own default (see the program).
        "ray_address": None,
        "ray_resources": None,
        "bind_host": "127.0.0.1",
        "replay_port": d.replay_port,
        # Both None: evaluate every max(1000, steps / 20) actor steps (see the CLI).
        "eval_every": None,
        "eval_every_steps": None,
        "eval_episodes": d.eval_episodes,
        "keep_snapshots": d.keep_snapshots,
        "snapshot_every": d.learner_snapshot_every_s,
        "checkpoint_every": d.learner_checkpoint_every_steps,
        "replay_checkpoint_every": d.replay_checkpoint_every_s,
        "learner_stall_timeout": d.learner_stall_timeout_s,
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


# The JSON types each stored flag may have (a hand-edited file is checked against them).
_NUMBER = (int, float)
_STORED_TYPES: dict[str, tuple[type, ...]] = {
    "ray_address": (str,),
    "ray_resources": (list,),
    "eval_every": _NUMBER,
    "eval_every_steps": (int,),
    "learner_intra_op_threads": (int,),
    "replay_checkpoint_every": _NUMBER,
    "snapshot_every": _NUMBER,
    "restart_window": _NUMBER,
    "learner_stall_timeout": _NUMBER,
}


def _check_stored(own: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Raises `RunDirError` naming the first stored value of the wrong type."""
    for dest, value in own.items():
        if dest not in defaults or value is None:
            continue
        types = _STORED_TYPES.get(dest) or (type(defaults[dest]),)
        if isinstance(value, bool) or not isinstance(value, types):
            wanted = " or ".join(t.__name__ for t in types).replace("int or float", "number")
            raise RunDirError(
                f"{SETTINGS_FILE} of this run has {dest} = {json.dumps(value)}, which should "
                f"be a {wanted}; fix it (or delete the file and pass the flags again)."
            )


def resolve(args: argparse.Namespace, stored: dict[str, Any] | None) -> dict[str, Any]:
    """Fills every stored flag of `args` in place: given > the run's own > default.

    Returns:
      ``{dest: value}`` of the flags given on this command line.

    Raises:
      RunDirError: a stored value has the wrong type (the file was edited by hand).
    """
    own = (stored or {}).get("settings", {})
    defaults = stored_flag_defaults()
    if not isinstance(own, dict):
        raise RunDirError(f"{SETTINGS_FILE} of this run has no settings object; fix or delete it.")
    _check_stored(own, defaults)
    given = {}
    for dest, default in defaults.items():
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
    write_json_atomic(run_dir.path(SETTINGS_FILE), {"settings": settings, "history": history})
