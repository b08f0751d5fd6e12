"""Cost of crossing processes: D4PG learner updates/s, 2 workers x `cpu` over 1 worker x `cpu:2`.

Both layouts have two replicas and the same global batch; the only difference is
that `--learner-workers 2 --learner-replicas cpu` all-reduces over gRPC between two
processes (MultiWorkerMirroredStrategy on loopback), while `--learner-replicas cpu:2`
all-reduces between two logical CPU devices of one process. The learner is built as
the launcher's learner node builds it (`launch.runtime.learner_group.make_replicator`) and fed
fixed in-memory batches, so replay sampling does not enter the figure.

Rounds alternate the order of the two layouts; the load average is recorded per
round, and the result is marked noisy when it exceeded 2 (this machine is shared).
Writes benchmarks/results/launch_learner_workers.json.

    python benchmarks/launch_learner_workers.py [--rounds 3] [--steps 200] [--batch 256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "launch_learner_workers.json"
TASK = "cartpole:swingup"


def child(spec: str, index: int, steps: int, batch: int, addresses: list[str]) -> None:
    """One learner process: warm up, then time `steps` updates; prints JSON."""
    from launch.runtime import learner_group

    repl = learner_group.make_replicator(spec, addresses or None, index)
    import numpy as np
    import tensorflow as tf

    import environments
    from agents.d4pg import builder
    from agents.d4pg.config import D4PGConfig
    from agents.d4pg.learning import D4PGLearner, Transition
    from launch.d4pg.program import PRESETS

    config = D4PGConfig.from_overrides({**PRESETS["quick"], "batch_size": batch})
    spec_env = environments.make_environment_spec(builder.make_environment(config, TASK, 0))
    rng = np.random.RandomState(0)
    obs, act = spec_env.observations.shape, spec_env.actions.shape
    data = Transition(
        rng.randn(batch, *obs).astype(np.float32),
        rng.uniform(-1, 1, (batch, *act)).astype(np.float32),
        rng.randn(batch).astype(np.float32),
        np.full(batch, 0.99, np.float32),
        rng.randn(batch, *obs).astype(np.float32),
    )

    def input_fn(ctx):
        per_replica = ctx.get_per_replica_batch_size(batch)
        start = ctx.input_pipeline_id * per_replica
        part = tf.nest.map_structure(lambda x: x[start : start + per_replica], data)
        return tf.data.Dataset.from_tensors(Transition(*part)).repeat()

    learner = D4PGLearner(config, spec_env, repl, input_fn)
    for _ in range(20):
        learner.step()
    start = time.perf_counter()
    for _ in range(steps):
        learner.step()
    elapsed = time.perf_counter() - start
    print(
        json.dumps(
            {"index": index, "replicas": repl.num_replicas, "updates_per_s": steps / elapsed}
        )
    )


def _run(layout: str, steps: int, batch: int) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=str(ROOT), MUJOCO_GL="egl")
    if layout == "1 worker x cpu:2":
        commands = [["cpu:2", "0", "--"]]
    else:
        from launch.runtime.learner_group import reserve_ports

        addresses = reserve_ports("localhost", 2)
        commands = [["cpu", str(i), "--", *addresses] for i in range(2)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", *c[:2], str(steps), str(batch), *c[2:]],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for c in commands
    ]
    outs = [p.communicate(timeout=1800) for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(f"{layout} failed:\n{err[-3000:]}")
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    chief = min(results, key=lambda r: r["index"])
    assert chief["replicas"] == 2
    return chief


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        spec, index, steps, batch = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
        rest = sys.argv[6:]
        addresses = rest[1:] if rest and rest[0] == "--" else []
        child(spec, index, steps, int(batch), addresses)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=256, help="global batch (even)")
    args = parser.parse_args()
    layouts = ["2 workers x cpu", "1 worker x cpu:2"]
    rounds = []
    for r in range(args.rounds):
        order = layouts if r % 2 == 0 else layouts[::-1]
        entry = {"round": r + 1, "order": order, "load_before": os.getloadavg()[0]}
        for layout in order:
            entry[layout] = _run(layout, args.steps, args.batch)["updates_per_s"]
            print(f"round {r + 1}: {layout:18s} {entry[layout]:7.1f} updates/s", flush=True)
        entry["load_after"] = os.getloadavg()[0]
        entry["ratio"] = entry[layouts[0]] / entry[layouts[1]]
        rounds.append(entry)
    ratios = sorted(e["ratio"] for e in rounds)
    loads = [e[k] for e in rounds for k in ("load_before", "load_after")]
    summary = {
        "benchmark": "launch_learner_workers",
        "command": f"python benchmarks/launch_learner_workers.py --rounds {args.rounds} "
        f"--steps {args.steps} --batch {args.batch}",
        "what": "D4PG learner updates/s (quick preset networks, cartpole:swingup shapes, fixed "
        f"in-memory batches), global batch {args.batch}, 2 replicas either way",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "ratio_2workers_cpu_over_1worker_cpu2_median": ratios[len(ratios) // 2],
        "max_load_average": max(loads),
        "noisy": max(loads) > 2,
        "rounds": rounds,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"2 workers x cpu / 1 worker x cpu:2 updates/s: median ratio "
        f"{summary['ratio_2workers_cpu_over_1worker_cpu2_median']:.2f} (max load "
        f"{summary['max_load_average']:.1f}{', noisy' if summary['noisy'] else ''})"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
