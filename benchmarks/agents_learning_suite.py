"""D4PG learning suite: the defaults a user gets, on six control-suite tasks, 3 seeds each.

Each (task, seed) is one `python -m launch.cli launch d4pg` (local backend, 2 actors,
the default preset, nothing tuned) with a fixed actor-step budget per task, read back
from its run directory's metrics.csv. Per task the results file holds: final and best
evaluation return (mean and spread over seeds), actor steps and wall time to fixed
fractions of the published D4PG score, and that score with its source.

    python benchmarks/agents_learning_suite.py                       # everything (hours)
    python benchmarks/agents_learning_suite.py --tasks cartpole:swingup --seeds 0
    python benchmarks/agents_learning_suite.py --budget-scale 0.01   # smoke test

Runs merge into benchmarks/results/agents_learning_suite.json (keyed by task and seed),
so the suite can be completed over several sittings; a (task, seed) already there is
rerun only with --rerun. The summary is recomputed from every stored run each time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launch import d4pg_program  # noqa: E402
from launch.metrics import read_csv  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "agents_learning_suite.json")

# Actor-step budgets sized for a 2-core machine (roughly 5-15 minutes a run at the
# quick preset's learner speed); the published scores took 1e8 steps.
BUDGETS = {
    "cartpole:swingup": 200_000,
    "walker:walk": 200_000,
    "cheetah:run": 200_000,
    "finger:spin": 150_000,
    "reacher:easy": 150_000,
    "ball_in_cup:catch": 150_000,
}
FRACTIONS = (0.5, 0.8, 0.9)
OWN_LOAD = 4.0  # 1-minute load average a 2-actor launch keeps up on its own.

# D4PG after 1e8 environment steps as reported in the DeepMind Control Suite report
# (Tassa et al. 2018) and tabulated in PlaNet (Hafner et al. 2019, Table 1, row
# "D4PG (100M steps)"), which is D4PG learning FROM PIXELS; the features agent is at
# least as good on these tasks. The numbers were transcribed from memory: neither paper's
# table could be read from this machine (no internet; the stored copies hold only their
# first pages), so check them against the table before quoting them.
PUBLISHED = {
    "cartpole:swingup": 862.0,
    "reacher:easy": 967.0,
    "cheetah:run": 524.0,
    "finger:spin": 985.0,
    "ball_in_cup:catch": 980.0,
    "walker:walk": 968.0,
}
PUBLISHED_SOURCE = (
    "D4PG from pixels after 1e8 environment steps: Tassa et al. 2018 (DeepMind Control "
    "Suite), as tabulated by Hafner et al. 2019 (PlaNet, Table 1, 'D4PG (100M steps)'). "
    "Transcribed from memory: the tables could not be read from the build machine, so "
    "check them before quoting them."
)


def run_one(task: str, seed: int, steps: int, timeout_s: float, keep: bool, extra_flags=()) -> dict:
    """One default launch (plus `extra_flags`); returns its evaluation curve and figures."""
    run_dir = tempfile.mkdtemp(prefix=f"suite-{task.replace(':', '-')}-s{seed}-")
    command = [
        sys.executable,
        "-m",
        "launch.cli",
        "launch",
        "d4pg",
        "--env",
        task,
        "--actors",
        "2",
        "--backend",
        "local",
        "--steps",
        str(steps),
        "--run-dir",
        run_dir,
        f"--config.seed={seed}",
        *extra_flags,
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.setdefault("MUJOCO_GL", "egl")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    load_before = os.getloadavg()
    start = time.monotonic()
    proc = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    rows = read_csv(os.path.join(run_dir, "metrics.csv"))
    evals = [r for r in rows if "eval_return" in r]
    totals = _totals(run_dir)
    load_after = os.getloadavg()
    result = {
        "command": " ".join(command[1:]),
        "run_dir": run_dir if keep else None,
        "wall_s": wall,
        "actor_steps": totals["actor_steps"],
        "learner_steps": totals["learner_steps"],
        "last_learner_metrics": totals["last_learner"],
        "final_eval_return": evals[-1]["eval_return"] if evals else None,
        "best_eval_return": max((r["eval_return"] for r in evals), default=None),
        "curve": [[r["actor_steps"], r["wall_time_s"], r["eval_return"]] for r in evals],
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in load_after],
        # The run itself keeps ~4 processes busy, so the load after it says nothing about
        # other jobs; runs go back to back, so the load before includes the previous run's
        # decaying load. Only a load beyond what one run makes marks another job.
        "noisy": load_before[0] > OWN_LOAD + (os.cpu_count() or 1),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
        # The defaults change as they are tuned: keep the ones this run got.
        "quick_preset": dict(d4pg_program.PRESETS["quick"]),
    }
    if not keep:
        subprocess.run(["rm", "-rf", run_dir], check=False)
    return result


def _totals(run_dir: str) -> dict:
    """Actor steps (summed counts), learner steps and the last learner record of a run."""
    actor_steps, learner_steps, last_learner = 0, 0, None
    metrics_dir = os.path.join(run_dir, "metrics")
    for name in sorted(os.listdir(metrics_dir)) if os.path.isdir(metrics_dir) else []:
        with open(os.path.join(metrics_dir, name), encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # A line cut by a stop.
                if record.get("kind") == "count":
                    actor_steps += record.get("actor_steps", 0)
                elif record.get("kind") == "gauge" and "learner_steps" in record:
                    learner_steps = max(learner_steps, record["learner_steps"])
                elif record.get("kind") == "learner":
                    last_learner = {k: v for k, v in record.items() if k not in ("node", "kind")}
    return {
        "actor_steps": actor_steps,
        "learner_steps": learner_steps,
        "last_learner": last_learner,
    }


def _mean_spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    mean = sum(values) / len(values)
    std = (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": len(values)}


def first_reaching(curve: list, target: float) -> dict | None:
    """Actor steps and wall time of the first evaluation at or above `target`."""
    for actor_steps, wall_time_s, eval_return in curve:
        if eval_return >= target:
            return {"actor_steps": actor_steps, "wall_time_s": wall_time_s}
    return None


def summarise(runs: dict) -> dict:
    """Per task: final/best return over seeds, steps/time to fractions, published figure.

    The fractions are recomputed from each run's stored evaluation curve, so correcting a
    published figure updates the summary without rerunning anything.
    """
    summary = {}
    for task, by_seed in sorted(runs.items()):
        seeds = list(by_seed.values())
        published = PUBLISHED.get(task)
        fractions = {}
        for fraction in FRACTIONS if published is not None else ():
            hits = [first_reaching(s["curve"], fraction * published) for s in seeds]
            reached = [h for h in hits if h]
            fractions[str(fraction)] = {
                "seeds_reached": len(reached),
                "actor_steps": _mean_spread([h["actor_steps"] for h in reached]),
                "wall_time_s": _mean_spread([h["wall_time_s"] for h in reached]),
            }
        summary[task] = {
            "seeds": sorted(int(s) for s in by_seed),
            "budget_actor_steps": max(s["actor_steps"] for s in seeds),
            "final_eval_return": _mean_spread([s["final_eval_return"] for s in seeds]),
            "best_eval_return": _mean_spread([s["best_eval_return"] for s in seeds]),
            "to_fraction_of_published": fractions,
            "published_d4pg": PUBLISHED.get(task),
            "noisy": any(s["noisy"] for s in seeds),
        }
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(BUDGETS), help="comma-separated tasks")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply every budget (smoke tests)"
    )
    parser.add_argument("--timeout-minutes", type=float, default=120.0, help="per run")
    parser.add_argument("--rerun", action="store_true", help="redo runs already stored")
    parser.add_argument("--keep-run-dirs", action="store_true")
    parser.add_argument("--results", default=RESULTS, help="results JSON to merge into")
    args = parser.parse_args(argv)

    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in BUDGETS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; the suite has {sorted(BUDGETS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")

    stored = {}
    if os.path.exists(args.results):
        with open(args.results, encoding="utf-8") as f:
            stored = json.load(f)
    runs = stored.get("runs", {})
    for task in tasks:
        budget = max(1000, int(BUDGETS[task] * args.budget_scale))
        for seed in seeds:
            if str(seed) in runs.get(task, {}) and not args.rerun:
                print(f"{task} seed {seed}: stored, skipped (--rerun to redo)")
                continue
            print(f"{task} seed {seed}: {budget:,} actor steps ...", flush=True)
            result = run_one(task, seed, budget, args.timeout_minutes * 60, args.keep_run_dirs)
            result["budget_scale"] = args.budget_scale
            runs.setdefault(task, {})[str(seed)] = result
            print(
                f"  final {result['final_eval_return']}, best {result['best_eval_return']}, "
                f"{result['wall_s']:.0f}s{' (noisy)' if result['noisy'] else ''}",
                flush=True,
            )
            output = {
                "description": "D4PG defaults (launch d4pg, local backend, 2 actors) on "
                "six control-suite tasks from features",
                "published_source": PUBLISHED_SOURCE,
                "fractions_of_published": list(FRACTIONS),
                "budgets": BUDGETS,
                "cpu_count": os.cpu_count(),
                # Each run's own launch keeps ~4 busy; "noisy" in a run says whether
                # another job ran too.
                "max_load_average": max(
                    r["load_average_before"][0]
                    for by_seed in runs.values()
                    for r in by_seed.values()
                ),
                "summary": summarise(runs),
                "runs": runs,
            }
            os.makedirs(os.path.dirname(args.results), exist_ok=True)
            with open(args.results, "w", encoding="utf-8") as f:
                json.dump(output, f, indent=2, sort_keys=True)
                f.write("\n")
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
