"""Chaos run as the issue states it: a fault to a random node every 20-40 s, seeded.

One `replicator launch d4pg` (tiny D4PG, 1 actor, cartpole:balance) with a budget of
`--steps` actor steps; while it runs, a seeded random node among replay, learner,
actor_0 and evaluator gets a seeded signal among `--signals` (SIGKILL: a crash;
SIGTERM to that node alone: it saves and returns unasked, which must count as a
failure and restart it) every uniform(20, 40) s, until 90% of the budget (a fault
during the final stop is a failed save, which the exit status must report). With
`--relaunch-at F` the launcher itself is killed (-9) once F of the budget is done and
the run is relaunched with only `--run-dir` at once, while the old nodes still save:
the relaunch must wait for them (never two replays or learners on one directory).
With `--learner-workers 2 --victims replay --every 65,90` the learner is a synchronous
2-worker group and only the replay is faulted (more than 60 s apart: a node failing
sooner after each start is a crash loop, which stops the run by design): the group must
come back in lockstep (a worker left waiting in an all-reduce would stall every actor on
the rate limiter: `--stall-timeout` seconds without a new actor step end the run with
the check `never_stalled` failed).
At the end it checks what `tests/launch/test_d4pg_chaos.py` checks (the test is the
short, every-node-once form): exit code 0, the budget reached, every restarted learner
restored at least its last checkpoint, every restarted replay restored its last
checkpoint's size, no process left, metrics.csv holding every evaluation exactly once.

    python benchmarks/launch_chaos.py [--seed 1 --steps 80000 --signals kill,term \
        --relaunch-at 0.5 --learner-workers 2 --victims replay --every 65,90 \
        --results launch_chaos]

Writes benchmarks/results/RESULTS.json (kills, checks, duration, load).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from agents_common import write_result  # noqa: E402

from tests.launch import d4pg_cli_support as c  # noqa: E402
from tests.launch import d4pg_support as s  # noqa: E402

VICTIMS = ("replay", "learner", "actor_0", "evaluator")
SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}


def _checkpoint_step(run_dir: str) -> int:
    try:
        with open(os.path.join(run_dir, "checkpoints", "learner", "checkpoint")) as f:
            match = re.search(r'model_checkpoint_path: "ckpt-(\d+)"', f.read())
    except FileNotFoundError:
        return 0
    return int(match.group(1)) if match else 0


def _relaunch(run_dir: str, state: dict):
    """Relaunches with only --run-dir while the killed launcher's nodes may still save;
    watches that no new node starts before every old one has exited."""
    old = [p for p in state["old_pids"] if c.alive(p)]
    state["old_alive_at_relaunch"] = len(old)
    offset = len(c.cli_output(run_dir))
    proc = c.start_cli(run_dir)
    overlap = set()
    passed_lock_early = False
    while any(c.alive(p) for p in old):
        new = [p for p in c.all_node_pids(proc) if p not in state["old_pids"]]
        if new:
            overlap.update(new)
        out = c.cli_output(run_dir)[offset:]
        # The relaunch prints "Resuming" once it holds the run's lock; an old node still
        # alive then, without the wait announced, means the lock did not wait for it.
        passed_lock_early |= "Resuming" in out and "are still saving" not in out
        time.sleep(0.05)
    state.update(pending=False, overlap=sorted(overlap), passed_lock_early=passed_lock_early)
    state["waited"] = "are still saving" in c.cli_output(run_dir)[offset:]
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=80_000)
    parser.add_argument("--signals", default="kill", help="comma-separated: kill, term")
    parser.add_argument(
        "--relaunch-at", type=float, default=None, help="kill -9 the launcher at this fraction"
    )
    parser.add_argument("--learner-workers", type=int, default=1, help="learner group size")
    parser.add_argument(
        "--victims", default=",".join(VICTIMS), help="comma-separated nodes to fault"
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=240.0,
        help="seconds without a new actor step that count as a hang (the run is then stopped)",
    )
    parser.add_argument(
        "--every",
        default="20,40",
        help="seconds between faults, MIN,MAX (uniform); one victim killed more often than "
        "every 60 s counts as a crash loop and stops the run, as the supervisor should",
    )
    parser.add_argument("--results", default="launch_chaos", help="result file name, no .json")
    args = parser.parse_args()
    signals = [SIGNALS[name] for name in args.signals.split(",")]
    try:
        low, high = (float(x) for x in args.every.split(","))
    except ValueError:
        parser.error(f"--every takes MIN,MAX seconds, got {args.every!r}")
    victims = [v for v in args.victims.split(",") if v]
    unknown = set(victims) - set(VICTIMS)
    if unknown or not victims:
        parser.error(f"--victims takes some of {', '.join(VICTIMS)}, got {args.victims!r}")
    rng = random.Random(args.seed)
    run_dir = os.path.join(tempfile.mkdtemp(prefix="chaos-"), "run")
    started = time.monotonic()
    extra = ["--replay-checkpoint-every", "5", "--learner-workers", str(args.learner_workers)]
    proc = c.start_cli(run_dir, steps=args.steps, extra=extra)
    kills, pids, loads = [], set(), []
    relaunch: dict = {}
    stalled = False
    last_steps, last_progress = -1, time.monotonic()
    try:
        next_kill = time.monotonic() + rng.uniform(low, high)
        while proc.poll() is None or relaunch.get("pending"):
            time.sleep(0.2)
            pids.update(c.all_node_pids(proc))
            steps_now = c.actor_steps(run_dir)
            if steps_now != last_steps:
                last_steps, last_progress = steps_now, time.monotonic()
            elif time.monotonic() - last_progress > args.stall_timeout:
                stalled = True
                print(f"no new actor step for {args.stall_timeout:.0f} s: stopping", flush=True)
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                break
            if relaunch.get("pending"):
                proc = _relaunch(run_dir, relaunch)
                continue
            if (
                args.relaunch_at is not None
                and not relaunch
                and c.actor_steps(run_dir) >= args.relaunch_at * args.steps
            ):
                relaunch.update(pending=True, old_pids=c.all_node_pids(proc))
                proc.kill()
                proc.wait()
                print(f"{time.monotonic() - started:.0f}s: kill -9 the launcher", flush=True)
                continue
            if time.monotonic() < next_kill:
                continue
            if c.actor_steps(run_dir) >= 0.9 * args.steps:
                # Near the budget the run may be stopping: a kill then is a fault during
                # shutdown, which the exit status rightly reports as a failed save.
                continue
            victim = rng.choice(victims)
            pid = c.node_pid(proc, victim)
            if pid is None:  # Between a death and its restart: try again shortly.
                continue
            offset = len(s.log_text(run_dir, victim))
            saved = c.checkpoint_lines(run_dir, 0, offset)
            expected = saved[-1] if victim == "replay" and saved else _checkpoint_step(run_dir)
            sent = rng.choice(signals)
            os.kill(pid, sent)
            loads.append(os.getloadavg()[0])
            kills.append(
                {
                    "victim": victim,
                    "signal": signal.Signals(sent).name,
                    "at_s": time.monotonic() - started,
                    "offset": offset,
                    "expected": expected,
                }
            )
            print(f"{kills[-1]['at_s']:.0f}s: {kills[-1]['signal']} to {victim}", flush=True)
            next_kill = time.monotonic() + rng.uniform(low, high)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    duration = time.monotonic() - started
    checks = {
        "exit_code_0": code == 0,
        "budget_reached": c.actor_steps(run_dir) >= args.steps,
        "never_stalled": not stalled,
    }
    problems = []
    if relaunch:
        # The relaunch started no node while one of the old generation was alive.
        checks["relaunch_waited_for_old_nodes"] = relaunch.get("overlap") == []
        # It waited (and said so) if the old nodes were still alive when it reached the
        # lock; old nodes that exited while it started up needed no wait.
        checks["relaunch_announced_any_wait"] = not relaunch.get("passed_lock_early", True)
    for kill in kills:
        text = s.log_text(run_dir, kill["victim"])[kill["offset"] :]
        if "start #" not in text:
            problems.append(f"{kill['victim']} was not restarted after {kill['signal']}")
        if kill["victim"] == "learner":
            match = re.search(r"restored at step (\d+)", text)
            if not match or int(match.group(1)) < kill["expected"]:
                problems.append(f"learner restored {match and match.group(1)} < {kill['expected']}")
        if kill["victim"] == "replay" and kill["expected"]:
            sizes = c.restored_sizes(run_dir, kill["offset"])
            # A checkpoint may have completed between the log read and the kill: at least
            # the last logged one is restored.
            if not sizes or sizes[0] < kill["expected"][0]:
                problems.append(f"replay restored {sizes[:1]} < {kill['expected']}")
    checks["restores_not_behind_checkpoints"] = not problems
    time.sleep(5)
    checks["no_process_left"] = not any(c.alive(p) for p in pids)
    evals = []
    with open(os.path.join(run_dir, "metrics", "evaluator.jsonl")) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("kind") == "eval":
                evals.append(f"{r['src']}:{r['seq']}")
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = [r["record_id"] for r in csv.DictReader(f)]
    checks["csv_every_eval_exactly_once"] = sorted(rows) == sorted(evals) and len(set(rows)) == len(
        rows
    )
    print(json.dumps(checks), problems, flush=True)
    write_result(
        args.results,
        {
            "seed": args.seed,
            "steps": args.steps,
            "signals": args.signals,
            "victims": victims,
            "every_s": [low, high],
            "learner_workers": args.learner_workers,
            "relaunch": {k: v for k, v in relaunch.items() if k != "old_pids"},
            "duration_s": duration,
            "kills": [{k: v for k, v in kill.items() if k != "offset"} for kill in kills],
            "checks": checks,
            "problems": problems,
            "all_passed": all(checks.values()),
            "load_average_at_kills": loads,
            "noisy": max(loads + [os.getloadavg()[0]]) > 2,
            "run_dir": run_dir,
            "command": "python benchmarks/launch_chaos.py " + " ".join(sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
