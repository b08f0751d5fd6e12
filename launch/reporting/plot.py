"""`replicator plot`: learning curves of many runs, averaged over seeds, as one PNG.

Runs are grouped by task and config (every config key but `seed`), so the runs of one
group differ only by their seed. Each group is drawn as the mean over its runs and a 95%
confidence band of that mean (Student t over seeds), against actor steps and against wall
time. Curves are put on a common x grid first: the union of the runs' x values where all
of them have data, each run linearly interpolated (runs evaluated at the same steps are
therefore not interpolated at all).

`reference=[...]` adds the published mean curves of other agents on the same task
(`launch.reporting.references`: state-feature baselines, 50k-500k environment steps) to the
actor-steps panel, dashed; with one method, also its min-max band over seeds, lightly
(several bands would hide the runs' own confidence band). A run that acts on every
environment step (`action_repeat` 1, the features' default) has as many actor steps as
environment steps, so the two share the x axis; for runs that repeat each action R times a
reference's E environment steps are drawn at E / R, where those runs stand after E
environment steps (runs of one task with different repeats get none). The reference is
drawn only up to the first reference step at or beyond the runs' largest step (e.g. runs
reaching 120k show the reference at 50k, 100k and 150k), so the axis stretches at most one
reference interval past the runs; a run shorter than 50k steps therefore shows the single
50k point. It is left out, with a note on stderr saying why, for pixel runs (`from_pixels`:
the references learned from state features), for tasks without reference curves, and
for metrics other than `eval_return`.

The plotted values are read back from the figure's own artists (lines and bands) and
stored in the PNG as a "replicator-data" text chunk (JSON), so what the figure shows can
be checked without reading pixels.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence
from typing import Any

from launch.reporting import references as refs
from launch.runtime.errors import LaunchError
from launch.runtime.metrics import read_csv
from launch.runtime.run_dir import RunDir

PNG_DATA_KEY = "replicator-data"
PNG_NOTES_KEY = "replicator-notes"  # The figure's footnotes (e.g. the references' source).
_X_AXES = (("actor_steps", "actor steps", 1.0), ("wall_time_s", "wall time (minutes)", 60.0))
_IGNORED_CONFIG = ("seed",)  # What distinguishes the replicates of one experiment.
# One colour per reference method, away from the first colours the runs take (C0-C4).
_REFERENCE_COLORS = {"d4pg": "black", "ddpg": "C5", "mpo": "C6", "dmpo": "C8", "dreamerv3": "C9"}
# Dashed line styles, one per method when several tasks share the panel.
_REFERENCE_STYLES = ["--", (0, (1, 1)), "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2))]


class _Run:
    def __init__(self, path: str, metric: str):
        rd = RunDir(path)
        if not os.path.isdir(rd.root):
            raise LaunchError(f"run {path} does not exist.")
        identity = rd.read_identity() or {}
        self.path = rd.root
        self.task = identity.get("task", "?")
        self.config = identity.get("config", {})
        if not os.path.exists(rd.csv_path):
            raise LaunchError(
                f"{rd.csv_path} does not exist: the run has no evaluation yet. Let it "
                "train until the evaluator reports (see its progress line), then retry.",
                exit_code=1,
            )
        rows = read_csv(rd.csv_path)
        columns = set().union(*(r.keys() for r in rows)) if rows else set()
        self.rows = [r for r in rows if metric in r]
        if not self.rows:
            hint = f" Columns with data: {', '.join(sorted(columns))}." if columns else ""
            raise LaunchError(
                f"{rd.csv_path} has no {metric!r} values yet.{hint}",
                exit_code=1,
            )

    def key(self, group_by: Sequence[str] | None) -> tuple[str, ...]:
        if group_by is None:
            config = {k: v for k, v in self.config.items() if k not in _IGNORED_CONFIG}
            return (self.task, json.dumps(config, sort_keys=True))
        out = []
        for field in group_by:
            if field == "task":
                out.append(self.task)
            elif field == "config":
                config = {k: v for k, v in self.config.items() if k not in _IGNORED_CONFIG}
                out.append(json.dumps(config, sort_keys=True))
            else:
                out.append(f"{field}={self.config.get(field.removeprefix('config.'))}")
        return tuple(out)


def parse_group_by(text: str | None) -> list[str] | None:
    """'task,config.sigma' -> ['task', 'config.sigma'] (checked)."""
    if text is None:
        return None
    fields = [f.strip() for f in text.split(",") if f.strip()]
    from agents.d4pg.config import D4PGConfig  # pylint: disable=import-outside-toplevel

    known = set(D4PGConfig().to_dict())
    for field in fields:
        if field in ("task", "config"):
            continue
        if not field.startswith("config.") or field.removeprefix("config.") not in known:
            raise LaunchError(
                f"--group-by {field}: use task, config, or config.KEY with a D4PG config key "
                "(e.g. --group-by task,config.sigma)."
            )
    if not fields:
        raise LaunchError("--group-by needs at least one field, e.g. --group-by task.")
    return fields


def parse_references(text: str | None) -> list[str]:
    """'d4pg,mpo' -> ['d4pg', 'mpo']; 'all' -> every reference method; None -> [] (checked)."""
    if text is None:
        return []
    known = refs.methods()
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if "all" in names:
        return known
    for name in names:
        if name not in known:
            raise LaunchError(
                f"--reference {name}: use all or one or more of {', '.join(known)} "
                "(comma-separated), e.g. --reference d4pg,mpo."
            )
    if not names:
        raise LaunchError("--reference needs a method, e.g. --reference d4pg or all.")
    return list(dict.fromkeys(names))


def confidence_band(values, level: float = 0.95):
    """Mean over axis 0 and the half-width of its `level` Student-t confidence interval."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    from scipy import stats  # pylint: disable=import-outside-toplevel

    values = np.asarray(values, float)
    n = values.shape[0]
    mean = values.mean(axis=0)
    if n < 2:
        return mean, np.zeros_like(mean)
    sem = values.std(axis=0, ddof=1) / math.sqrt(n)
    return mean, stats.t.ppf(0.5 + level / 2, n - 1) * sem


def _aggregate(runs: list[_Run], x_key: str, metric: str, scale: float):
    import numpy as np  # pylint: disable=import-outside-toplevel

    curves = []
    for run in runs:
        pairs = sorted((r[x_key] / scale, r[metric]) for r in run.rows if x_key in r)
        if pairs:
            curves.append((np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])))
    if len(curves) < len(runs):
        return None
    lo = max(c[0][0] for c in curves)
    hi = min(c[0][-1] for c in curves)
    grid = np.unique(np.concatenate([c[0] for c in curves]))
    grid = grid[(grid >= lo) & (grid <= hi)]
    if grid.size == 0:
        return None
    values = np.stack([np.interp(grid, x, y) for x, y in curves])
    mean, half = confidence_band(values)
    return grid, mean, half


def plot(
    runs: Sequence[str],
    out: str | None = None,
    *,
    metric: str = "eval_return",
    group_by: Sequence[str] | None = None,
    reference: Sequence[str] = (),
) -> str:
    """Writes the curves of `runs` (grouped, mean and 95% band over seeds); returns the PNG path.

    `reference` names `launch.reporting.references` methods whose published curves are drawn beside
    the runs on the actor-steps panel (see the module docstring for when and how far).

    Raises:
      LaunchError: no runs, a run without data for `metric`, or runs of different tasks
        without `group_by` (their returns do not share a scale).
    """
    if not runs:
        raise LaunchError(
            "no runs to plot: pass one or more run directories (replicator plot RUN)."
        )
    loaded = [_Run(path, metric) for path in runs]
    tasks = sorted({r.task for r in loaded})
    if len(tasks) > 1 and group_by is None:
        raise LaunchError(
            f"these runs are of different tasks ({', '.join(tasks)}); plot each task "
            "separately, or pass --group-by task to draw them as separate curves."
        )
    groups: dict[tuple[str, ...], list[_Run]] = {}
    for run in loaded:
        groups.setdefault(run.key(group_by), []).append(run)
    labels = _labels(groups, group_by)

    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    task_colors: dict[str, str] = {}  # Of each task's first curve, for its references.
    for key, members in groups.items():
        label = f"{labels[key]} ({len(members)} run{'s' if len(members) > 1 else ''})"
        color = None
        for ax, (x_key, x_label, scale) in zip(axes, _X_AXES):
            aggregated = _aggregate(members, x_key, metric, scale)
            if aggregated is None:
                continue
            x, mean, half = aggregated
            (line,) = ax.plot(x, mean, marker="o", markersize=3, label=label, color=color)
            color = line.get_color()
            if not members[0].config.get("from_pixels"):
                task_colors.setdefault(members[0].task, color)
            band = ax.fill_between(x, mean - half, mean + half, alpha=0.2, color=color)
            line.set_gid(json.dumps({"group": label, "axis": x_key}))
            band.set_gid(json.dumps({"group": label, "axis": x_key, "band": True}))
            ax.set_xlabel(x_label)
    for ax in axes:
        ax.grid(alpha=0.3)
    drawn = _draw_references(
        axes[0], loaded, reference, metric, task_colors if len(tasks) > 1 else None
    )
    spread = "mean and min-max over seeds" if len(reference) == 1 else "mean over seeds"
    axes[0].set_ylabel(f"{metric} (mean, 95% CI over seeds)")
    axes[0].legend(fontsize=8, loc="best")
    title = tasks[0] if len(tasks) == 1 else ", ".join(tasks)
    fig.suptitle(f"D4PG on {title}: {metric}, {len(loaded)} run(s)")
    if drawn:
        fig.text(
            0.01,
            0.01,
            f"Dashed: {refs.SOURCE_SHORT}; {spread}.",
            fontsize=7,
            color="0.3",
            gid="note",
        )
        fig.tight_layout(rect=(0, 0.04, 1, 1))
    else:
        fig.tight_layout()
    data = figure_data(fig)
    notes = [t.get_text() for t in fig.texts if t.get_gid() == "note"]
    out = out or (
        RunDir(runs[0]).path(f"{metric}.png")
        if len(runs) == 1
        else os.path.abspath(f"{metric}.png")
    )
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    metadata = {PNG_DATA_KEY: json.dumps(data), PNG_NOTES_KEY: json.dumps(notes)}
    fig.savefig(out, dpi=100, metadata=metadata)
    plt.close(fig)
    return out


def _draw_references(
    ax, runs: list[_Run], methods, metric: str, task_colors: dict[str, str] | None
) -> bool:
    """Draws `methods`' reference curves for the tasks of the state-feature `runs` on `ax`.

    One task: a colour per method, dashed. Several (`task_colors` given): a task's
    references take the colour of its runs' curve and a line style per method.
    Returns whether anything was drawn; says on stderr why a reference is left out.
    """
    if not methods:
        return False
    if metric != "eval_return":
        _note(f"references not drawn: they exist only for eval_return, not {metric}.")
        return False
    pixels = sorted({r.task for r in runs if r.config.get("from_pixels")})
    if pixels:
        _note(
            f"references not drawn for the pixel runs of {', '.join(pixels)} "
            "(from_pixels=true): the references are state-feature curves."
        )
    last_steps: dict[str, float] = {}
    repeats: dict[str, set[int]] = {}  # A task's runs' action repeats.
    for run in runs:
        if not run.config.get("from_pixels"):
            run_steps = [r["actor_steps"] for r in run.rows if "actor_steps" in r]
            last_steps[run.task] = max([last_steps.get(run.task, 0.0), *run_steps])
            repeats.setdefault(run.task, set()).add(run.config.get("action_repeat") or 1)
    mixed = sorted(t for t, r in repeats.items() if len(r) > 1)
    if mixed:
        _note(
            f"references not drawn for {', '.join(mixed)}: its runs repeat actions "
            "differently, and the references count environment steps (actor steps x "
            "action_repeat); plot runs of one action_repeat together."
        )
    missing = sorted(t for t in last_steps if t not in refs.tasks())
    if missing:
        _note(
            f"references not drawn for {', '.join(missing)}: the reference file has curves "
            f"for {', '.join(refs.tasks())} only."
        )
    drawn = False
    for task, last in sorted(last_steps.items()):
        if task in missing or task in mixed:
            continue
        # The x axis counts actor steps; a run acting every R environment steps meets a
        # reference's E environment steps at E / R of its own.
        (repeat,) = repeats[task]
        limit = reference_limit(last * repeat)
        for i, method in enumerate(methods):
            points = [p for p in refs.curve(method, task) if p[0] <= limit]
            if not points:
                continue
            x, mean, low, high = (list(column) for column in zip(*points))
            x = [value / repeat for value in x]
            label = refs.METHOD_NAMES.get(method, method)
            label += f" on {task}" if task_colors else ""
            label += " (published, state features"
            label += f"; at environment steps / {repeat})" if repeat > 1 else ")"
            if task_colors:
                color, style = task_colors.get(task), _REFERENCE_STYLES[i % len(_REFERENCE_STYLES)]
            else:
                color, style = _REFERENCE_COLORS.get(method), "--"
            (line,) = ax.plot(
                x, mean, linestyle=style, marker=".", color=color, label=label, linewidth=1.2
            )
            gid = {"group": label, "axis": "actor_steps", "reference": method, "task": task}
            line.set_gid(json.dumps(gid))
            if len(methods) == 1:
                band = ax.fill_between(x, low, high, alpha=0.08, color=line.get_color())
                band.set_gid(json.dumps({**gid, "band": True}))
            drawn = True
    return drawn


def reference_limit(last_steps: float) -> int:
    """The largest reference step drawn beside runs reaching `last_steps` actor steps.

    The first reference step at or beyond `last_steps` (the last one if the runs go further):
    the reference then spans the runs' range without stretching the axis past the next point.
    """
    ref_steps = refs.steps()
    return next((s for s in ref_steps if s >= last_steps), ref_steps[-1])


def _note(message: str) -> None:
    print(f"replicator plot: {message}", file=sys.stderr, flush=True)


def _labels(groups: dict[tuple[str, ...], list[_Run]], group_by) -> dict[tuple[str, ...], str]:
    """Short legend labels: the task, plus the config keys that differ between groups."""
    if group_by is not None:
        return {
            k: ", ".join(p if len(p) < 40 else "config " + str(i) for i, p in enumerate(k))
            for k in groups
        }
    configs = {k: members[0].config for k, members in groups.items()}
    differing = sorted(
        {
            name
            for c in configs.values()
            for name in c
            if name not in _IGNORED_CONFIG
            and len({json.dumps(d.get(name)) for d in configs.values()}) > 1
        }
    )
    return {
        k: " ".join([members[0].task] + [f"{n}={members[0].config.get(n)}" for n in differing])
        for k, members in groups.items()
    }


def figure_data(fig) -> list[dict[str, Any]]:
    """The curves a figure draws, read back from its artists: x, mean, band low/high.

    `panel` is the index of the curve's axes in the figure (0: actor steps, 1: wall time).
    """
    out = []
    for panel, ax in enumerate(fig.axes):
        bands = {}
        for collection in ax.collections:
            gid = collection.get_gid()
            if gid:
                key = json.loads(gid)
                path = collection.get_paths()[0].vertices
                bands[(key["group"], key["axis"])] = path
        for line in ax.lines:
            gid = line.get_gid()
            if not gid:
                continue
            key = json.loads(gid)
            x, y = line.get_xdata(), line.get_ydata()
            vertices = bands.get((key["group"], key["axis"]))
            entry = {"group": key["group"], "axis": key["axis"], "panel": panel}
            entry["x"] = list(map(float, x))
            if "reference" in key:
                entry["reference"], entry["task"] = key["reference"], key["task"]
            entry["mean"] = list(map(float, y))
            if vertices is not None:
                # fill_between's polygon: start, upper edge forward... ; read both edges by x.
                lows, highs = _band_edges(vertices, x)
                entry["low"], entry["high"] = lows, highs
            out.append(entry)
    return out


def _band_edges(vertices, x) -> tuple[list[float], list[float]]:
    """Lower and upper edges of a fill_between polygon at each x."""
    lows, highs = [], []
    for xi in x:
        ys = [
            float(v[1])
            for v in vertices
            if math.isclose(float(v[0]), float(xi), rel_tol=1e-9, abs_tol=1e-12)
        ]
        lows.append(min(ys))
        highs.append(max(ys))
    return lows, highs


def read_png_data(path: str) -> list[dict[str, Any]]:
    """The curve data stored in a PNG written by `plot`."""
    return json.loads(_png_text(path)[PNG_DATA_KEY])


def read_png_notes(path: str) -> list[str]:
    """The footnotes of a PNG written by `plot` (e.g. the references' source)."""
    return json.loads(_png_text(path).get(PNG_NOTES_KEY, "[]"))


def _png_text(path: str) -> dict[str, str]:
    from PIL import Image, PngImagePlugin  # pylint: disable=import-outside-toplevel

    with Image.open(path) as image:
        if not isinstance(image, PngImagePlugin.PngImageFile):
            raise LaunchError(f"{path} is not a PNG written by `replicator plot`.")
        return dict(image.text)
