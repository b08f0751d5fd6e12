"""Recovery time after kill -9: replay serving, learner stepping, actor inserting again.

One run of tiny D4PG (1 actor, cartpole:balance, the tests' small networks) on the
local backend. The replay, the learner and actor_0 are killed with SIGKILL in turn,
`--kills` times each, and for every kill the time from the kill to the node's first
useful work again is measured:

  replay   until `server_info` on its address answers (it restored its checkpoint and
           rebound its port; the learner, actors and evaluator reconnect by themselves);
  learner  until its step count moves past the restored step (reported every 0.5 s,
           so this is up to 0.5 s late);
  actor    until its first new episode started (episode end minus its length at its
           own rate: its first insert follows within n steps).

Each includes the restart backoff (1 s for the replay and actors, 2 s for the learner)
and a Python + TensorFlow start on a shared 2-core machine.

    python benchmarks/launch_fault_recovery.py [--kills 3]

Writes benchmarks/results/launch_fault_recovery.json (raw rounds, medians, load).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from launch.d4pg import program as d4pg_program  # noqa: E402
from launch.runtime import launcher  # noqa: E402

# The launch tests' tiny D4PG (one definition for tests and this benchmark).
from tests.launch.d4pg_support import TASK, TINY  # noqa: E402


def _records(run_dir: str, node: str) -> list[dict]:
    out = []
    try:
        with open(os.path.join(run_dir, "metrics", f"{node}.jsonl")) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
    except FileNotFoundError:
        pass
    return out


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def _replay_answers(address: str) -> bool:
    import reverb

    try:
        reverb.Client(address).server_info(timeout=1)
        return True
    except Exception:
        return False


def _learner_stepping_after(run_dir: str, killed: float) -> float | None:
    gauges = [
        r
        for r in _records(run_dir, "learner")
        if r.get("kind") == "gauge" and "learner_steps" in r and r["t"] > killed
    ]
    if len(gauges) < 2:
        return None
    restored = gauges[0]["learner_steps"]
    moved = [r for r in gauges[1:] if r["learner_steps"] > restored]
    return moved[0]["t"] if moved else None


def _actor_inserting_after(run_dir: str, killed: float) -> float | None:
    episodes = [
        r for r in _records(run_dir, "actor_0") if r.get("kind") == "episode" and r["t"] > killed
    ]
    counts = [
        r for r in _records(run_dir, "actor_0") if r.get("kind") == "count" and r["t"] > killed
    ]
    if not episodes or not counts:
        return None
    return episodes[0]["t"] - counts[0]["actor_steps"] / max(episodes[0]["steps_per_s"], 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3, help="kills of each node")
    parser.add_argument("--settle", type=float, default=8.0, help="seconds between kills")
    args = parser.parse_args()

    from agents.d4pg.config import D4PGConfig

    config = D4PGConfig.from_overrides(TINY).to_dict()
    settings = d4pg_program.D4PGProgramSettings(
        task=TASK,
        num_actors=1,
        learner_checkpoint_every_steps=50,
        replay_checkpoint_every_s=5.0,
        eval_every_s=30.0,
        eval_episodes=1,
        report_every_s=0.5,
        max_restarts=100,
    )
    program = d4pg_program.make_program(settings, config)
    run_dir = tempfile.mkdtemp(prefix="fault-recovery-")
    holder, result = {}, {}

    def run():
        result["outcome"] = launcher.run(
            program,
            run_dir,
            "local",
            progress_every=0,
            on_supervisor=lambda s: holder.setdefault("sup", s),
            env={"PYTHONPATH": ROOT},
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    sup = _wait(lambda: holder.get("sup"), 60, "the supervisor")
    rounds: dict[str, list[float]] = {"replay": [], "learner": [], "actor_0": []}
    loads = []
    try:
        _wait(lambda: _learner_stepping_after(run_dir, 0.0), 600, "the learner to step")
        _wait(lambda: _actor_inserting_after(run_dir, 0.0), 600, "an actor episode")
        for k in range(args.kills):
            for node in rounds:
                time.sleep(args.settle)
                pid = _wait(lambda n=node: getattr(sup.handles().get(n), "pid", None), 120, node)
                address = sup.published["replay_address"]
                loads.append(os.getloadavg()[0])
                killed = time.time()
                os.kill(pid, signal.SIGKILL)
                if node == "replay":
                    time.sleep(0.2)  # Let the old server's socket go before probing.
                    _wait(lambda a=address: _replay_answers(a), 300, "the replay")
                    back = time.time()
                elif node == "learner":
                    back = _wait(
                        lambda t=killed: _learner_stepping_after(run_dir, t), 300, "learner"
                    )
                else:
                    back = _wait(lambda t=killed: _actor_inserting_after(run_dir, t), 300, "actor")
                rounds[node].append(back - killed)
                print(
                    f"kill {k + 1} of {node}: useful again after {back - killed:.1f}s", flush=True
                )
    finally:
        sup.request_stop()
        thread.join(180)
    outcome = result.get("outcome")
    out = {
        "task": TASK,
        "what": {
            "replay": "kill -9 -> server_info answers (restored checkpoint, same port)",
            "learner": "kill -9 -> step count moves past the restored step (+<=0.5 s)",
            "actor_0": "kill -9 -> first new episode starts (first insert within n steps)",
        },
        "rounds_seconds": rounds,
        "median_seconds": {k: statistics.median(v) for k, v in rounds.items() if v},
        "restarts": outcome.restarts if outcome else None,
        "load_average_at_kills": loads,
        "noisy": max(loads + [os.getloadavg()[0]]) > 2,
        "command": "python benchmarks/launch_fault_recovery.py " + " ".join(sys.argv[1:]),
    }
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from agents_common import write_result

    write_result("launch_fault_recovery", out)


if __name__ == "__main__":
    main()
