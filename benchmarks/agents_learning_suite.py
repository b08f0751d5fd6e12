"""D4PG learning suite: the defaults a user gets, on six control-suite tasks, 3 seeds each.

Each (task, seed) is one `python -m launch.cli launch d4pg` (local backend, 2 actors, the
default preset, nothing tuned) for 200k actor steps, evaluated with 10 noise-free episodes
every 10k actor steps, read back from its run directory's metrics.csv. Per task the
results file sets our mean return at 50k, 100k, 200k (and 500k where run) beside the
published state-feature curves of D4PG, DDPG, MPO, DMPO and DreamerV3 at the same steps
(`launch/reporting/references.py`), with actor steps and wall time to the D4PG reference's return
(medians over all seeds, censored), the wall time per run and collapses. The references
count environment steps: a run launched with `--config.action_repeat=R` is set beside
them at R times its actor steps (its `--steps` and evaluation period stay in actor steps).

    python benchmarks/agents_learning_suite.py                       # everything (hours)
    python benchmarks/agents_learning_suite.py --tasks cartpole:swingup --seeds 0
    python benchmarks/agents_learning_suite.py --seeds 1 &  # a second stream, same file
    python benchmarks/agents_learning_suite.py --tasks cheetah:run --steps 500000 \
        --results benchmarks/results/agents_learning_suite_500k.json  # where it plateaus
    python benchmarks/agents_learning_suite.py --launch-flag=--config.n_step=3 \
        --results /tmp/suite_n3.json                                  # a candidate setting
    python benchmarks/agents_learning_suite.py --budget-scale 0.01   # smoke test

Runs merge into the results file (keyed by task and seed; default
benchmarks/results/agents_learning_suite.json), under a lock, so the suite can be done
over several sittings or by two processes at once; a (task, seed) already there is rerun
only with --rerun. The summary is recomputed from every stored run each time.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launch.d4pg import program as d4pg_program  # noqa: E402
from launch.reporting import references  # noqa: E402
from launch.runtime.metrics import read_csv  # noqa: E402

RESULTS = os.path.join(ROOT, "benchmarks", "results", "agents_learning_suite.json")

# Actor-step budgets sized for a 2-core machine (roughly 5-15 minutes a run at the
# quick preset's learner speed); the published scores took 1e8 steps.
BUDGETS = {
    "cartpole:swingup": 200_000,
    "walker:walk": 200_000,
    "cheetah:run": 200_000,
    "finger:spin": 200_000,
    "reacher:easy": 200_000,
    "ball_in_cup:catch": 200_000,
}
# Every evaluation of a suite run: 10 episodes every 10k actor steps, so that each
# reference point (50k, 100k, 150k, 200k, ...) has an evaluation of its own.
EVAL_EPISODES = 10
EVAL_EVERY_STEPS = 10_000
OWN_LOAD = 4.0  # 1-minute load average a 2-actor launch keeps up on its own.
# Environment steps (actor steps x action repeat, `environment_curve`) at which runs are
# set beside the references (those a run reached).
REPORT_STEPS = (50_000, 100_000, 200_000, 500_000)


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
    # What the run resolved (e.g. the preset's decay span from --steps), as it stored it.
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
        run_config = json.load(f)
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
        "quick_preset": {
            **d4pg_program.PRESETS["quick"],
            **d4pg_program.preset_task_values(
                "quick", task, bool(run_config.get("from_pixels", False))
            ),
        },
        "run_config": run_config,
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


def environment_curve(run: dict) -> list:
    """A run's evaluations as [environment steps, wall time, return]: its actor steps
    times its action repeat (its stored config's `action_repeat`; unset for features
    means 1). The references count environment steps, so a run that acts every R steps
    is set beside them at R times its actor steps."""
    repeat = (run.get("run_config") or {}).get("action_repeat") or 1
    return [[steps * repeat, wall_time_s, value] for steps, wall_time_s, value in run["curve"]]


def evaluation_at(curve: list, at_steps: int) -> list | None:
    """The evaluation of `curve` nearest to `at_steps` steps, or None if none is near.

    An evaluation is due when the actors pass a multiple of the evaluation period, and
    its row records the actor steps when it was written, after its episodes (1-2k more
    at 10 episodes). Runs made before evaluations kept to that grid drifted by about
    1k steps per evaluation, so the nearest within one period is taken, and the summary
    keeps the mean actor steps of the evaluations it used.
    """
    if not curve:
        return None
    nearest = min(curve, key=lambda point: abs(point[0] - at_steps))
    return nearest if abs(nearest[0] - at_steps) <= EVAL_EVERY_STEPS else None


def censored_median(values: list[float | None]) -> float | None:
    """The median over every seed, a seed that never got there (None) counting as +inf.

    None when the median falls on a seed that never got there: it is then only known to
    lie beyond the budget, and tables say so with the number of seeds that got there.
    """
    ordered = sorted(math.inf if v is None else v for v in values)
    if not ordered:
        return None
    n = len(ordered)
    middle = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return None if math.isinf(middle) else middle


def collapses(curve: list) -> int:
    """Evaluations after a run's best that fall below half of it (0: no collapse)."""
    if not curve:
        return 0
    returns = [point[2] for point in curve]
    best_index = max(range(len(returns)), key=returns.__getitem__)
    return sum(r < 0.5 * returns[best_index] for r in returns[best_index + 1 :])


def summarise(runs: dict) -> dict:
    """Per task: our mean return at each reported step next to the references there.

    For every point of `REPORT_STEPS` that every seed reached: the mean (and spread)
    over seeds of the evaluation at that point, each reference method's mean and the
    best of them. Then steps and wall time to the D4PG reference's return at 100k
    and 200k steps, as medians over all seeds (censored: a seed that never got there
    counts as never), the runs' wall time, and collapses. All of it is recomputed from
    the stored curves, so a corrected reference file updates it without a rerun. Steps
    are environment steps (`environment_curve`): actor steps unless a run repeats actions.
    """
    summary = {}
    for task, by_seed in sorted(runs.items()):
        seeds = list(by_seed.values())
        points = {}
        for at in REPORT_STEPS:
            found = [evaluation_at(environment_curve(s), at) for s in seeds]
            if not found or any(f is None for f in found):
                continue
            best = references.best_at(task, at)
            points[str(at)] = {
                "ours": _mean_spread([f[2] for f in found]),
                "actor_steps": _mean_spread([f[0] for f in found]),
                "wall_time_s": _mean_spread([f[1] for f in found]),
                "references": {m: references.mean_at(m, task, at) for m in references.methods()},
                "best_reference": {"method": best[0], "mean": best[1]} if best else None,
            }
        thresholds = {}
        for at in (100_000, 200_000):
            target = references.mean_at("d4pg", task, at)
            if target is None:
                continue
            hits = [first_reaching(environment_curve(s), target) for s in seeds]
            thresholds[str(at)] = {
                "target_return": target,
                "seeds_reached": sum(h is not None for h in hits),
                "seeds": len(hits),
                "median_actor_steps": censored_median([h and h["actor_steps"] for h in hits]),
                "median_wall_time_s": censored_median([h and h["wall_time_s"] for h in hits]),
            }
        summary[task] = {
            "seeds": sorted(int(s) for s in by_seed),
            "budget_actor_steps": min(s["actor_steps"] for s in seeds),
            "at_steps": points,
            "to_d4pg_reference_return_at": thresholds,
            "final_eval_return": _mean_spread([s["final_eval_return"] for s in seeds]),
            "best_eval_return": _mean_spread([s["best_eval_return"] for s in seeds]),
            "wall_s": _mean_spread([s["wall_s"] for s in seeds]),
            "runs_collapsed": sum(collapses(s["curve"]) > 0 for s in seeds),
            "evaluations_below_half_of_best": sum(collapses(s["curve"]) for s in seeds),
            "noisy": any(s["noisy"] for s in seeds),
        }
    return summary


def load_runs(path: str) -> dict:
    """The runs stored in `path` ({} when there is none yet), keyed by task then seed."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f).get("runs", {})


def store_run(path: str, task: str | None, seed: int | None, result: dict | None) -> None:
    """Merges one run into `path` (none: task None) and rewrites its summary, under a lock.

    Two suites may share a results file (e.g. one per seed on two cores): each re-reads
    the file under the lock, so neither overwrites the other's runs; the file is replaced
    by rename, so a stop mid-write never leaves it cut.
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        runs = load_runs(path)
        if task is not None:
            runs.setdefault(task, {})[str(seed)] = result
        output = {
            "description": "D4PG defaults (launch d4pg, local backend, 2 actors) on six "
            "control-suite tasks from state features, against published state-feature "
            "curves at equal environment steps",
            "references_source": references.SOURCE,
            "budgets": BUDGETS,
            "eval_episodes": EVAL_EPISODES,
            "eval_every_steps": EVAL_EVERY_STEPS,
            "cpu_count": os.cpu_count(),
            # Each run's own launch keeps ~4 busy; "noisy" in a run says whether
            # another job ran too.
            "max_load_average": max(
                r["load_average_before"][0] for by_seed in runs.values() for r in by_seed.values()
            ),
            "summary": summarise(runs),
            "runs": runs,
        }
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(output, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(temporary, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(BUDGETS), help="comma-separated tasks")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument(
        "--steps", type=int, default=None, help="actor steps per run (default: BUDGETS)"
    )
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="multiply every budget (smoke tests)"
    )
    parser.add_argument("--timeout-minutes", type=float, default=120.0, help="per run")
    parser.add_argument("--rerun", action="store_true", help="redo runs already stored")
    parser.add_argument(
        "--summarise-only",
        action="store_true",
        help="recompute the results file's summary from its stored runs, run nothing",
    )
    parser.add_argument("--keep-run-dirs", action="store_true")
    parser.add_argument("--results", default=RESULTS, help="results JSON to merge into")
    parser.add_argument(
        "--launch-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="one more flag for every launch, e.g. --launch-flag=--config.n_step=3 (repeatable;"
        " use a separate --results file per setting)",
    )
    args = parser.parse_args(argv)

    tasks = [t for t in args.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in BUDGETS]
    if unknown:
        parser.error(f"unknown task(s) {unknown}; the suite has {sorted(BUDGETS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        parser.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")

    if args.summarise_only:
        store_run(args.results, None, None, None)
        print(f"results: {args.results}")
        return
    flags = [
        "--eval-episodes",
        str(EVAL_EPISODES),
        "--eval-every-steps",
        str(EVAL_EVERY_STEPS),
        *args.launch_flag,
    ]
    # Seed-major order: an interrupted suite still has every task at the seeds it did.
    for seed in seeds:
        for task in tasks:
            budget = max(1000, int((args.steps or BUDGETS[task]) * args.budget_scale))
            if str(seed) in load_runs(args.results).get(task, {}) and not args.rerun:
                print(f"{task} seed {seed}: stored, skipped (--rerun to redo)")
                continue
            print(f"{task} seed {seed}: {budget:,} actor steps ...", flush=True)
            # Half an evaluation period past the budget, so that the evaluation due at
            # the budget runs before the launch stops.
            steps = budget + EVAL_EVERY_STEPS // 2
            result = run_one(
                task, seed, steps, args.timeout_minutes * 60, args.keep_run_dirs, flags
            )
            result["budget_actor_steps"] = budget
            result["budget_scale"] = args.budget_scale
            result["eval_episodes"] = EVAL_EPISODES
            result["launch_flags"] = list(args.launch_flag)
            store_run(args.results, task, seed, result)
            print(
                f"  final {result['final_eval_return']}, best {result['best_eval_return']}, "
                f"{result['wall_s']:.0f}s{' (noisy)' if result['noisy'] else ''}",
                flush=True,
            )
    print(f"results: {args.results}")


if __name__ == "__main__":
    main()
