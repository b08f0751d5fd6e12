"""Chooses the `quick` preset by measurement: actor steps to evaluation return 800.

Each candidate is the quick preset plus a few overrides; each (candidate, seed) is one
distributed launch (local backend, 2 actors, 1 learner, 1 evaluator, cartpole:swingup)
that stops when an evaluation reaches `--target` or the actor-step budget is spent.
The figure of merit is actor steps to the target, which the load of a shared machine
barely moves (the rate limiter ties learner updates to actor steps), so `--parallel`
launches may share the machine; wall times are recorded but only mean anything for a
run that had the machine to itself.

    python benchmarks/agents_quick_preset_sweep.py --candidates spi16_lr3e-4,spi32_lr1e-3

Runs merge into benchmarks/results/agents_quick_preset_sweep.json, keyed by candidate
and seed; a (candidate, seed) already there is skipped unless --rerun.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

RESULTS = os.path.join(ROOT, "benchmarks", "results", "agents_quick_preset_sweep.json")

# Each candidate is the quick preset with these keys set (all three tuned keys explicitly,
# so a candidate means the same after the preset changes). Updates per actor step =
# samples_per_insert / batch_size (64). "spi16_lr3e-4" was the quick preset before this
# sweep; "spi32_lr1e-3" is the one it chose.
_TUNED = ("samples_per_insert", "policy_lr", "critic_lr")
CANDIDATES: dict[str, dict[str, object]] = {
    "spi16_lr3e-4": dict(zip(_TUNED, (16.0, 3e-4, 3e-4))),
    "spi16_lr1e-3": dict(zip(_TUNED, (16.0, 1e-3, 1e-3))),
    "spi16_critic_lr1e-3": dict(zip(_TUNED, (16.0, 3e-4, 1e-3))),
    "spi32_lr3e-4": dict(zip(_TUNED, (32.0, 3e-4, 3e-4))),
    "spi32_lr1e-3": dict(zip(_TUNED, (32.0, 1e-3, 1e-3))),
    "spi16_lr3e-4_sigma0.2": {**dict(zip(_TUNED, (16.0, 3e-4, 3e-4))), "sigma": 0.2},
}


def run_one(candidate: str, seed: int, target: float, budget: int, eval_every: int) -> dict:
    """One launch of `candidate` with `seed`, in this process; returns its curve."""
    from agents.d4pg.config import D4PGConfig
    from launch.d4pg import program as d4pg_program
    from launch.runtime import launcher
    from launch.runtime.metrics import read_csv

    overrides = {**d4pg_program.PRESETS["quick"], **CANDIDATES[candidate], "seed": seed}
    config = D4PGConfig.from_overrides(overrides).to_dict()
    settings = d4pg_program.D4PGProgramSettings(
        task="cartpole:swingup", num_actors=2, eval_every_steps=eval_every
    )
    run_dir = tempfile.mkdtemp(prefix=f"sweep-{candidate}-s{seed}-")

    def done(progress) -> bool:
        hit = progress.last_eval is not None and progress.last_eval["return"] >= target
        return hit or progress.totals["actor_steps"] >= budget

    load_before = os.getloadavg()
    start = time.monotonic()
    outcome = launcher.run(
        d4pg_program.make_program(settings, config),
        run_dir,
        "local",
        stop_when=done,
        progress_every=0,
        echo=lambda _: None,
    )
    wall = time.monotonic() - start
    rows = [r for r in read_csv(os.path.join(run_dir, "metrics.csv")) if "eval_return" in r]
    hit = next((r for r in rows if r["eval_return"] >= target), None)
    shutil.rmtree(run_dir, ignore_errors=True)
    return {
        "overrides": CANDIDATES[candidate],
        "outcome": outcome.reason,
        "wall_s": round(wall, 1),
        "actor_steps_to_target": hit["actor_steps"] if hit else None,
        "seconds_to_target": hit["wall_time_s"] if hit else None,
        "best_eval_return": max((r["eval_return"] for r in rows), default=None),
        "curve": [[r["actor_steps"], r["wall_time_s"], r["eval_return"]] for r in rows],
        "load_average_before": [round(x, 2) for x in load_before],
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def summarise(runs: dict, budget: int) -> dict:
    """Per candidate: seeds reaching the target, median steps to it (misses count as the budget)."""
    summary = {}
    for candidate, by_seed in sorted(runs.items()):
        steps = [r["actor_steps_to_target"] for r in by_seed.values()]
        reached = [s for s in steps if s is not None]
        summary[candidate] = {
            "overrides": CANDIDATES.get(candidate),
            "seeds": len(steps),
            "seeds_reached": len(reached),
            "median_actor_steps_to_target_misses_as_budget": statistics.median(
                [s if s is not None else budget for s in steps]
            ),
            "actor_steps_to_target": sorted(steps, key=lambda s: (s is None, s or 0)),
        }
    return summary


def _worker_command(candidate: str, seed: int, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        f"--candidates={candidate}",
        f"--seeds={seed}",
        f"--target={args.target}",
        f"--budget={args.budget}",
        f"--eval-every={args.eval_every}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--candidates", default=",".join(CANDIDATES), help=f"of: {', '.join(CANDIDATES)}"
    )
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--target", type=float, default=800.0)
    parser.add_argument("--budget", type=int, default=200_000, help="actor steps per run")
    parser.add_argument("--eval-every", type=int, default=5000, help="actor steps")
    parser.add_argument("--parallel", type=int, default=2, help="launches at once")
    parser.add_argument("--rerun", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    candidates = args.candidates.split(",")
    unknown = [c for c in candidates if c not in CANDIDATES]
    if unknown:
        parser.error(f"unknown candidates {unknown}; choose from {', '.join(CANDIDATES)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.worker:
        result = run_one(candidates[0], seeds[0], args.target, args.budget, args.eval_every)
        print(json.dumps(result))
        return

    stored = {}
    if os.path.exists(RESULTS):
        with open(RESULTS) as f:
            stored = json.load(f)
    runs = stored.get("runs", {})
    todo = [
        (c, s) for c in candidates for s in seeds if args.rerun or str(s) not in runs.get(c, {})
    ]
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    def launch(job: tuple[str, int]) -> tuple[str, int, dict]:
        candidate, seed = job
        proc = subprocess.run(
            _worker_command(candidate, seed, args),
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{candidate} seed {seed} failed:\n{proc.stderr[-3000:]}")
        return candidate, seed, json.loads(proc.stdout.strip().splitlines()[-1])

    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        for candidate, seed, result in pool.map(launch, todo):
            runs.setdefault(candidate, {})[str(seed)] = result
            print(
                f"{candidate} seed {seed}: steps to {args.target:g} = "
                f"{result['actor_steps_to_target']} (best {result['best_eval_return']:.0f}, "
                f"{result['wall_s']:.0f} s)",
                flush=True,
            )
            output = {
                "benchmark": "agents_quick_preset_sweep",
                "command": "python " + " ".join(sys.argv),
                "task": "cartpole:swingup",
                "target_return": args.target,
                "budget_actor_steps": args.budget,
                "eval_every_actor_steps": args.eval_every,
                "parallel_launches": args.parallel,
                "summary": summarise(runs, args.budget),
                "runs": runs,
                "machine": {
                    "cpu_count": os.cpu_count(),
                    "platform": platform.platform(),
                    "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
                    "note": "actor steps to the target are the measure; wall times of "
                    "parallel launches share 2 cores and are not comparable.",
                },
            }
            with open(RESULTS, "w") as f:
                json.dump(output, f, indent=1)
    print(json.dumps(summarise(runs, args.budget), indent=1))


if __name__ == "__main__":
    main()
