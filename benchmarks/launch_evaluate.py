"""Evaluation speed: `replicator evaluate`'s steps/s over raw env.step, and load time.

A snapshot of a D4PG policy (paper-size networks 256x3, random weights: speed does not
depend on them) is written once; then, alternating in each round:
  - raw:      env.step with a fixed action, no policy (the simulator alone);
  - evaluate: `launch.reporting.evaluate.run_episodes` on the snapshot (numpy acting, the real path);
  - tf_call:  the SavedModel's `act` called once per step (what numpy acting avoids).
The figure is the median over rounds of evaluate / raw steps per second (evaluate's time
includes building the environment of its seed); 1.0 would mean the policy costs nothing.
`env_step_fraction_of_evaluate` is the share of evaluate's wall time spent inside the
environment (construction, reset, step). The time to load the snapshot (`SnapshotPolicy`) is recorded.

    python benchmarks/launch_evaluate.py [--task cartpole:swingup] [--rounds 5]

Writes benchmarks/results/launch_evaluate.json (load average recorded: the machine is
shared, results are marked noisy when it exceeds 2).
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
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MUJOCO_GL", "egl")


def _raw_steps_per_s(env, steps: int) -> float:
    import numpy as np

    action = np.zeros(env.action_spec().shape, np.float32)
    env.reset()
    done = 0
    start = time.perf_counter()
    while done < steps:
        timestep = env.step(action)
        done += 1
        if timestep.last():
            env.reset()
    return done / (time.perf_counter() - start)


def _tf_call_steps_per_s(policy, env, steps: int) -> float:
    import numpy as np

    timestep = env.reset()
    done = 0
    start = time.perf_counter()
    while done < steps:
        action = policy.act(timestep.observation[None].astype(np.float32)).numpy()[0]
        timestep = env.step(action)
        done += 1
        if timestep.last():
            timestep = env.reset()
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="cartpole:swingup")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=10, help="per round (1000 steps each)")
    args = parser.parse_args()

    import tensorflow as tf

    import environments
    from agents.d4pg import builder, networks, snapshot
    from agents.d4pg.config import D4PGConfig
    from launch.reporting import evaluate

    config = D4PGConfig()  # Paper-size networks.
    env = builder.make_environment(config, args.task, seed=0)
    spec = environments.make_environment_spec(env)
    nets = networks.make_networks(config, spec)
    directory = os.path.join(tempfile.mkdtemp(prefix="bench-evaluate-"), "snapshot")
    snapshot.write(
        directory,
        config=config,
        env_spec=spec,
        weights=[v.numpy() for v in nets.acting_variables()],
        task=args.task,
        learner_step=0,
    )
    start = time.perf_counter()
    loaded = evaluate.SnapshotPolicy(directory)
    load_seconds = time.perf_counter() - start
    saved_model = tf.saved_model.load(directory)

    rounds = []
    for i in range(args.rounds):
        result = evaluate.run_episodes(loaded, args.task, seeds=[i], episodes=args.episodes)
        eval_rate = result["steps"] / result["wall_s"]
        raw_rate = _raw_steps_per_s(env, result["steps"])
        tf_rate = _tf_call_steps_per_s(saved_model, env, result["steps"] // 4)
        rounds.append(
            {
                "evaluate_steps_per_s": eval_rate,
                "raw_env_steps_per_s": raw_rate,
                "tf_call_steps_per_s": tf_rate,
                "ratio": eval_rate / raw_rate,
                "env_step_fraction_of_evaluate": result["env_step_fraction"],
            }
        )
        print(
            f"round {i + 1}: evaluate {eval_rate:,.0f} steps/s, raw env.step {raw_rate:,.0f}, "
            f"SavedModel per step {tf_rate:,.0f}; ratio {eval_rate / raw_rate:.2f}",
            flush=True,
        )
    load = os.getloadavg()
    ratio = statistics.median(r["ratio"] for r in rounds)
    out = {
        "benchmark": "launch_evaluate",
        "command": "python benchmarks/launch_evaluate.py " + " ".join(sys.argv[1:]),
        "task": args.task,
        "policy_layers": list(config.policy_layers),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "snapshot_load_seconds": load_seconds,
        "ratio_median": ratio,
        "evaluate_steps_per_s_median": statistics.median(r["evaluate_steps_per_s"] for r in rounds),
        "raw_env_steps_per_s_median": statistics.median(r["raw_env_steps_per_s"] for r in rounds),
        "tf_call_steps_per_s_median": statistics.median(r["tf_call_steps_per_s"] for r in rounds),
        "env_step_fraction_of_evaluate_median": statistics.median(
            r["env_step_fraction_of_evaluate"] for r in rounds
        ),
        "rounds": rounds,
        "noisy": max(load) > 2.0,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1_5_15": list(load),
            "note": "2-core machine shared with other engineers' jobs"
            + ("; load above 2: noisy" if max(load) > 2.0 else ""),
        },
    }
    path = os.path.join(ROOT, "benchmarks", "results", "launch_evaluate.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"evaluate / raw env.step: {ratio:.2f} (median of {len(rounds)}); {path}")


if __name__ == "__main__":
    main()
