"""gpu-check `d4pg`: a short `launch d4pg --learner-replicas gpu` run, then the same on `cpu`.

Each run is the real CLI (`python -m launch.cli launch d4pg`, local backend) in a process
group of its own. It must exit 0 with its actor-step budget reached. While it runs, every
node process (a child of the launcher whose command line holds `node_main`) has its
environment read from /proc/PID/environ: the learner must see a GPU in CUDA_VISIBLE_DEVICES,
the replay, actors and evaluator none (`launch/resources.py` hands them ""). Learner
updates/s come from RUN/metrics/learner.jsonl; the ratio gpu/cpu is the figure.

The replay ratio limiter asks for 256 samples per inserted transition (4 updates of batch
64 per actor step, 8x the quick preset's): the actor waits for the learner, so the run lasts
as long as the learner needs for its few thousand updates and its updates/s measure the
learner's device, not the actors. (Without the limiter, fast actors end a short budget before the
learner has traced its first step; actors count their steps per 1,000-step episode.) The
networks are the quick preset's, small for a GPU: the ratio says the GPU path runs, not how
much faster a GPU trains a paper-sized D4PG.

    .venv/bin/python benchmarks/gpu_check_d4pg.py [--spec gpu --baseline cpu --steps 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_check import emit, kill_tree  # noqa: E402

TASK = "cartpole:balance"
SAMPLES_PER_INSERT = 256
_NODE_NAME = re.compile(r"([^/]+)-\d+\.spec\.json$")


def node_processes(launcher_pid: int) -> dict[int, str]:
    """{pid: node name} of the launcher's children whose command line holds `node_main`."""
    found = {}
    for pid, command in _children(launcher_pid):
        if "node_main" not in " ".join(command):
            continue
        match = _NODE_NAME.search(command[-1]) if command else None
        found[pid] = match.group(1) if match else " ".join(command[-1:])
    return found


def _children(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of `pid`'s direct children: psutil if installed, else /proc."""
    try:
        import psutil  # pylint: disable=import-outside-toplevel
    except ImportError:
        psutil = None
    if psutil is not None:
        out = []
        try:
            children = psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            return []
        for child in children:
            try:
                out.append((child.pid, child.cmdline()))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return out
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat[stat.rfind(")") + 2 :].split()[1]) != pid:
                continue
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            continue
        out.append((int(entry), [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]))
    return out


def read_environ(pid: int) -> dict[str, str]:
    """A process's environment as it was started (/proc/PID/environ; same user only)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            env[key] = value
    return env


def _records(path: Path) -> Iterator[dict]:
    """The JSON objects of a metrics file, one per line; torn or foreign lines skipped."""
    with open(path, errors="replace") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


def updates_per_second(metrics_file: Path) -> dict:
    """Learner updates/s over its records, from the first after its first update to the last.

    Starting at the first record with a positive `learner_steps` leaves out start-up and
    tracing; `t` is the record's wall time. Torn or foreign lines are skipped.
    """
    points = [
        (float(record["t"]), float(record["learner_steps"]))
        for record in _records(metrics_file)
        if record.get("learner_steps", 0) > 0 and "t" in record
    ]
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return {"updates_per_s": None, "updates": points[-1][1] if points else 0, "seconds": 0.0}
    points.sort()
    seconds = points[-1][0] - points[0][0]
    return {
        "updates_per_s": (points[-1][1] - points[0][1]) / seconds,
        "updates": points[-1][1],
        "seconds": seconds,
    }


def actor_steps(run_dir: Path) -> float:
    """Actor steps counted in the run's metrics (each record once, by its src and seq)."""
    seen, total = set(), 0.0
    for path in (run_dir / "metrics").glob("*.jsonl"):
        for record in _records(path):
            key = (record.get("src"), record.get("seq"))
            if record.get("kind") == "count" and key not in seen:
                seen.add(key)
                total += float(record.get("actor_steps", 0))
    return total


def launch_run(spec: str, steps: int, run_dir: Path, timeout: float) -> dict:
    """One `launch d4pg` run on learner spec `spec`; what it did and what its nodes saw."""
    command = [
        sys.executable, "-m", "launch.cli", "launch", "d4pg",
        "--backend", "local", "--env", TASK, "--actors", "1", "--steps", str(steps),
        "--learner-replicas", spec, "--run-dir", str(run_dir),
        "--eval-episodes", "1", "--progress-every", "5",
        f"--config.samples_per_insert={SAMPLES_PER_INSERT}", "--config.min_replay_size=1000",
    ]  # fmt: skip
    log_path = run_dir.parent / f"{run_dir.name}.cli.log"
    seen: dict[str, str | None] = {}
    start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        timed_out = False
        while proc.poll() is None:
            for pid, name in node_processes(proc.pid).items():
                if name not in seen:
                    try:
                        seen[name] = read_environ(pid).get("CUDA_VISIBLE_DEVICES")
                    except OSError:
                        continue  # exited between listing and reading: try its restart
            if time.monotonic() - start > timeout:
                kill_tree(proc)
                timed_out = True
                break
            time.sleep(0.5)
    text = log_path.read_text(errors="replace").strip().splitlines()
    metrics = run_dir / "metrics" / "learner.jsonl"
    return {
        "spec": spec,
        "command": " ".join(command[1:]),
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "seconds": time.monotonic() - start,
        "actor_steps": actor_steps(run_dir) if (run_dir / "metrics").is_dir() else 0.0,
        "budget": steps,
        "cuda_visible_devices": seen,
        "learner": updates_per_second(metrics) if metrics.exists() else {"updates_per_s": None},
        "last_output": text[-1] if text else "",
    }


def problems(run: dict, spec: str) -> list[str]:
    """What is wrong with one run (empty: it passed)."""
    found = []
    if run["timed_out"]:
        found.append(f"{spec}: did not finish in {run['seconds']:.0f} s")
    elif run["exit_code"] != 0:
        found.append(f"{spec}: exit {run['exit_code']} ({run['last_output']})")
    if run["actor_steps"] < run["budget"]:
        found.append(f"{spec}: {run['actor_steps']:.0f} of {run['budget']} actor steps")
    if not run["learner"].get("updates_per_s"):
        found.append(f"{spec}: no learner updates recorded")
    seen = run["cuda_visible_devices"]
    if "learner" not in seen:
        found.append(f"{spec}: never saw the learner process")
    for name, visible in seen.items():
        wants_gpu = name.startswith("learner") and spec.startswith("gpu")
        if wants_gpu and not visible:
            found.append(f"{spec}: {name} sees no GPU (CUDA_VISIBLE_DEVICES={visible!r})")
        if not wants_gpu and visible != "":
            found.append(f"{spec}: {name} may see a GPU (CUDA_VISIBLE_DEVICES={visible!r})")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", default="gpu", help="learner spec under test")
    parser.add_argument("--baseline", default="cpu", help="learner spec to compare with")
    parser.add_argument("--steps", type=int, default=3_000, help="actor-step budget per run")
    parser.add_argument("--timeout", type=float, default=95.0, help="seconds per run")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="gpu-check-d4pg-"))
    load_start = os.getloadavg()[0]
    runs = {}
    try:
        for role, spec in (("under_test", args.spec), ("baseline", args.baseline)):
            runs[role] = launch_run(spec, args.steps, workdir / role, args.timeout)
            print(f"{role} {spec}: {json.dumps(runs[role])}", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    found = [p for run in runs.values() for p in problems(run, run["spec"])]
    rate, base = (runs[r]["learner"].get("updates_per_s") for r in ("under_test", "baseline"))
    ratio = rate / base if rate and base else None
    seen = runs["under_test"]["cuda_visible_devices"]
    figure = (
        f"learner updates/s {args.spec} {rate or 0:.0f} vs {args.baseline} "
        f"{base or 0:.0f} (ratio {ratio or 0:.2f}); CUDA_VISIBLE_DEVICES "
        + ", ".join(f"{name}={value!r}" for name, value in sorted(seen.items()))
    )
    if found:
        figure = "; ".join(found) + " | " + figure
    emit(
        not found,
        figure,
        runs=runs,
        ratio=ratio,
        load_average={"at_start": load_start, "at_end": os.getloadavg()[0]},
    )
    return 0 if not found else 1


if __name__ == "__main__":
    sys.exit(main())
