"""Actor scaling on the local backend: total actor steps/s with 2 actors over 1 actor.

The program is the real D4PG one (replay node + actor nodes, each its own process)
with the learner replaced by a node that publishes one set of weights and idles, and
the replay table's rate limiter relaxed (`samples_per_insert=0`: MinSize only), so
actors are never throttled by learning. The ratio is measured in one run, with the
1- and 2-actor programs alternated `--rounds` times.

    python benchmarks/launch_actor_scaling.py [--task cartpole:swingup] [--seconds 40]

Writes benchmarks/results/launch_actor_scaling.json. Target: ratio >= 1.7 on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launch.d4pg import program as d4pg_program  # noqa: E402
from launch.runtime import launcher  # noqa: E402
from launch.runtime.program import Node, Program, Ref  # noqa: E402


def weights_publisher(ctx, *, task: str, config: dict, replay_address: str) -> None:
    """Publishes random acting weights once (stands in for a paused learner), then idles."""
    import numpy as np
    import reverb

    import environments
    from agents.d4pg import builder, networks, variables
    from agents.d4pg.config import D4PGConfig

    cfg = D4PGConfig.from_dict(config)
    env = builder.make_environment(cfg, task, seed=0)
    spec = environments.make_environment_spec(env)
    rng = np.random.default_rng(0)
    arrays = [
        rng.normal(0, 0.1, s).astype(np.float32) for s in networks.acting_variable_shapes(cfg, spec)
    ]
    variables.publish(reverb.Client(replay_address), 0, arrays)
    ctx.log("published one set of weights; idling like a paused learner")
    while not ctx.wait(1.0):
        pass


def make_program(task: str, num_actors: int, config: dict) -> Program:
    full = d4pg_program.make_program(
        d4pg_program.D4PGProgramSettings(task=task, num_actors=num_actors), config
    )
    nodes = [
        full.node("replay"),
        Node(
            "publisher",
            "benchmarks.launch_actor_scaling:weights_publisher",
            {"task": task, "config": config, "replay_address": Ref("replay_address")},
        ),
    ]
    nodes += [n for n in full.nodes if n.name.startswith("actor_")]
    return Program("actor-scaling", nodes)


def _actor_rate(run_dir: str, node: str, warmup_episodes: int) -> float:
    episodes = []
    with open(os.path.join(run_dir, "metrics", f"{node}.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if record.get("kind") == "count":
                episodes.append((record["t"], record["actor_steps"]))
    usable = episodes[warmup_episodes:]
    if len(usable) < 2:
        raise RuntimeError(f"{node} finished too few episodes to measure ({len(episodes)})")
    steps = sum(s for _, s in usable[1:])
    return steps / (usable[-1][0] - usable[0][0])


def measure(
    task: str, num_actors: int, config: dict, seconds: float, warmup_episodes: int = 2
) -> dict:
    run_dir = tempfile.mkdtemp(prefix=f"actor-scaling-{num_actors}-")
    names = [f"actor_{i}" for i in range(num_actors)]
    state = {"start": None}

    def done(progress) -> bool:
        # Start the clock once every actor finished its warm-up episodes.
        if state["start"] is None:
            counts = [_episodes(run_dir, n) for n in names]
            if min(counts) >= warmup_episodes:
                state["start"] = time.monotonic()
            return False
        return time.monotonic() - state["start"] >= seconds

    outcome = launcher.run(
        make_program(task, num_actors, config),
        run_dir,
        "local",
        stop_when=done,
        progress_every=0,
        env={"PYTHONPATH": ROOT},
    )
    if outcome.reason != "finished":
        raise RuntimeError(f"benchmark run ended: {outcome.reason} {outcome.message}")
    rates = [_actor_rate(run_dir, n, warmup_episodes) for n in names]
    return {
        "actors": num_actors,
        "per_actor_steps_per_s": rates,
        "total_steps_per_s": sum(rates),
        "run_dir": run_dir,
    }


def _episodes(run_dir: str, node: str) -> int:
    try:
        with open(os.path.join(run_dir, "metrics", f"{node}.jsonl")) as f:
            return sum('"kind": "count"' in line for line in f)
    except FileNotFoundError:
        return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="cartpole:swingup")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out", default=os.path.join(ROOT, "benchmarks", "results", "launch_actor_scaling.json")
    )
    args = parser.parse_args()
    from agents.d4pg.config import D4PGConfig

    config = D4PGConfig.from_overrides(
        {**d4pg_program.PRESETS["quick"], "samples_per_insert": 0.0, "max_replay_size": 200_000}
    ).to_dict()
    runs = []
    for r in range(args.rounds):
        for n in (1, 2):
            result = measure(args.task, n, config, args.seconds)
            print(
                f"round {r}: {n} actor(s): {result['total_steps_per_s']:.0f} steps/s "
                f"(per actor {[round(x) for x in result['per_actor_steps_per_s']]})",
                flush=True,
            )
            runs.append(result)
    ratios = [
        b["total_steps_per_s"] / a["total_steps_per_s"] for a, b in zip(runs[0::2], runs[1::2])
    ]
    summary = {
        "benchmark": "launch_actor_scaling",
        "command": "python " + " ".join(sys.argv),
        "task": args.task,
        "seconds_per_measurement": args.seconds,
        "config": "quick preset, samples_per_insert=0 (MinSize limiter), weights published once",
        "runs": [{k: v for k, v in r.items() if k != "run_dir"} for r in runs],
        "ratios_2_over_1": ratios,
        "ratio_median": statistics.median(ratios),
        "target": 1.7,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1_5_15": os.getloadavg(),
            "note": "2-core machine shared with other engineers' jobs; noisy.",
        },
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)
    print(
        f"2-actor / 1-actor total steps/s: median {summary['ratio_median']:.2f} "
        f"(rounds: {[round(x, 2) for x in ratios]}) -> {args.out}"
    )


if __name__ == "__main__":
    main()
