"""`replicator plot`: evaluation return vs actor steps and vs wall time, as one PNG."""

from __future__ import annotations

import os

from launch.errors import LaunchError
from launch.metrics import read_csv
from launch.run_dir import RunDir


def plot(run_dir: str, out: str | None = None) -> str:
    """Writes the learning curves of `run_dir` (from its metrics.csv); returns the PNG path."""
    rd = RunDir(run_dir)
    if not os.path.exists(rd.csv_path):
        raise LaunchError(
            f"{rd.csv_path} does not exist: the run has no evaluation yet. Let it "
            "train until the evaluator reports (see its progress line), then retry.",
            exit_code=1,
        )
    rows = [r for r in read_csv(rd.csv_path) if "eval_return" in r]
    if not rows:
        raise LaunchError(f"{rd.csv_path} has no evaluation rows yet.", exit_code=1)
    import matplotlib  # pylint: disable=import-outside-toplevel

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

    identity = rd.read_identity() or {}
    title = f"D4PG on {identity.get('task', '?')} ({os.path.basename(rd.root)})"
    mean = [r["eval_return"] for r in rows]
    std = [r.get("eval_return_std", 0.0) for r in rows]
    lower = [m - s for m, s in zip(mean, std)]
    upper = [m + s for m, s in zip(mean, std)]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key, label, scale in (
        (axes[0], "actor_steps", "actor steps", 1.0),
        (axes[1], "wall_time_s", "wall time (minutes)", 60.0),
    ):
        x = [r[key] / scale for r in rows]
        ax.plot(x, mean, marker="o", markersize=3)
        ax.fill_between(x, lower, upper, alpha=0.2)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("evaluation return (mean ± std)")
    fig.suptitle(title)
    fig.tight_layout()
    out = out or rd.path("eval_return.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
