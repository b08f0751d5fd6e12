"""`bin/gpu-check`: prove every GPU path of the project on a GPU machine, in minutes.

No GPU has ever run this project: the `gpu`/`gpu:N` deployments, a D4PG learner on
`--learner-replicas gpu` and ResNet-50 / SN-GAN on a GPU are written against the documented
TensorFlow 2.15 APIs and tested only where they run without one. When a GPU machine is
available there will be minutes to find what breaks, so this runner does it in one command:

  replication  `gpu` (and `gpu:2` with 2+ GPUs) equals `cpu` on the same global batch,
               and which all-reduce ran (NCCL or not)     benchmarks/gpu_check_replication.py
  d4pg         `launch d4pg --learner-replicas gpu` reaches its budget; learner updates/s
               against `cpu`; each node's CUDA_VISIBLE_DEVICES  benchmarks/gpu_check_d4pg.py
  vision       ResNet-50 images/s in float32 / mixed float16 / bfloat16 against Keras'
               ResNet50 in the same process               benchmarks/gpu_check_vision.py
  sngan        a few hundred SN-GAN steps on the GPU with finite losses  (same file)

This module never imports TensorFlow: without a GPU it answers in one line within seconds.
Each check is a child process in its own process group with its own time limit; on timeout
the whole group (and any descendant that left it) is killed. A child reports with one JSON
line on stdout, ``{"gpu_check": 1, "ok": bool, "figure": "...", "raw": {...}}``; no pickle.
Anything else it prints goes to its log, whose last line explains a failure.

Usage: bin/gpu-check [--only replication,d4pg] [--results PATH] [--log-dir DIR]

Internal options (for tests; hidden from --help):
  --checks-file PATH   a JSON list of {"name", "command": [argv...], "limit_s"} replacing
                       the built-in table (`CHECKS`); "{python}" in a command is this
                       interpreter.
  --assume-gpus NAMES  skip GPU detection and act as if these GPUs (comma-separated names)
                       were visible.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_check.json"
CUDA_INSTALL = ".venv/bin/pip install 'tensorflow[and-cuda]==2.15.1'"
PROBE_TIMEOUT_S = 60.0
KILL_GRACE_S = 5.0


@dataclasses.dataclass(frozen=True)
class Check:
    """One child process: its name, its argv ("{python}" = this interpreter), its limit."""

    name: str
    command: tuple[str, ...]
    limit_s: float


# Limits add up to 560 s: the whole check stays under 10 minutes on one GPU. d4pg holds two
# launches of up to 95 s each (`gpu_check_d4pg.py --timeout`).
CHECKS = (
    Check("replication", ("{python}", "benchmarks/gpu_check_replication.py"), 80.0),
    Check("d4pg", ("{python}", "benchmarks/gpu_check_d4pg.py"), 200.0),
    Check("vision", ("{python}", "benchmarks/gpu_check_vision.py", "resnet"), 220.0),
    Check("sngan", ("{python}", "benchmarks/gpu_check_vision.py", "sngan"), 60.0),
)


@dataclasses.dataclass
class Outcome:
    """What one check did: PASS/FAIL, its figure (or why it failed) and its raw report."""

    name: str
    passed: bool
    figure: str
    seconds: float
    limit_s: float
    raw: dict
    log: str | None = None


# GPU detection -------------------------------------------------------------------------

_PROBE = r"""
import json, os
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import tensorflow as tf
info = tf.sysconfig.get_build_info()
gpus = tf.config.list_physical_devices("GPU")
details = []
for gpu in gpus:
    try:
        d = tf.config.experimental.get_device_details(gpu)
    except Exception:
        d = {}
    cc = d.get("compute_capability")
    details.append({"name": d.get("device_name", gpu.name),
                    "compute_capability": list(cc) if cc else None})
print(json.dumps({"tensorflow": tf.__version__,
                  "is_cuda_build": bool(info.get("is_cuda_build")),
                  "cuda_version": info.get("cuda_version"),
                  "cudnn_version": info.get("cudnn_version"),
                  "gpus": details}))
"""


def nvidia_smi_gpus() -> list[str] | None:
    """GPU lines of `nvidia-smi -L` ([] when it lists none); None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("GPU")]


def tensorflow_probe(timeout: float = PROBE_TIMEOUT_S) -> dict | str:
    """What TensorFlow sees, from a child process (dict), or why it could not say (str)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return f"the TensorFlow probe timed out after {timeout:.0f} s"
    for line in reversed(out.stdout.splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and "gpus" in report:
            return report
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return f"the TensorFlow probe failed (exit {out.returncode}: {tail})"


def detect() -> tuple[dict | None, str, int]:
    """(machine facts when a usable GPU is visible, else None; the message; the exit code).

    Exit 0 with no GPU at all (nothing to check); exit 1 when nvidia-smi lists GPUs that
    TensorFlow cannot use (that is the first thing a GPU machine must fix).
    """
    smi = nvidia_smi_gpus()
    if smi is not None and not smi:
        return None, _no_gpu("nvidia-smi lists none"), 0
    probe = tensorflow_probe()
    if isinstance(probe, str):
        if smi:
            return None, f"gpu-check: nvidia-smi lists {len(smi)} GPU(s) but {probe}.", 1
        return None, _no_gpu(f"nvidia-smi not found; {probe}"), 0
    cuda_hint = (
        ""
        if probe["is_cuda_build"]
        else f"; TensorFlow {probe['tensorflow']} is not a CUDA build: on a GPU machine "
        f"install one with {CUDA_INSTALL}"
    )
    if not probe["gpus"]:
        if smi:
            return (
                None,
                f"gpu-check: nvidia-smi lists {len(smi)} GPU(s) but TensorFlow "
                f"{probe['tensorflow']} sees none{cuda_hint or ' (its CUDA libraries are missing)'}"
                f". Install the CUDA build and its libraries with {CUDA_INSTALL}, then rerun "
                "bin/gpu-check.",
                1,
            )
        return None, _no_gpu("nvidia-smi not found" + cuda_hint), 0
    return {"nvidia_smi": smi, **probe}, "", 0


def _no_gpu(why: str) -> str:
    return f"gpu-check: no NVIDIA GPU visible to TensorFlow here ({why}); nothing to check."


# Running one check ---------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc), including those in other sessions."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _signal_all(pgid: int, pids: Sequence[int], sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(proc: subprocess.Popen) -> None:
    """Ends `proc`'s process group and every descendant: SIGTERM, then SIGKILL after a grace.

    The launcher's nodes run in sessions of their own, so the group alone would miss them.
    """
    pids = descendants(proc.pid)
    _signal_all(proc.pid, pids, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or _alive(pids)):
        time.sleep(0.1)
    _signal_all(proc.pid, pids + descendants(proc.pid), signal.SIGKILL)
    proc.wait()


def _alive(pids: Sequence[int]) -> bool:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
        except OSError:
            continue
    return False


def parse_report(text: str) -> dict | None:
    """The child's last result line in its output (None: it printed none)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and report.get("gpu_check") == 1 and "ok" in report:
            return report
    return None


def last_line(text: str) -> str:
    """The last non-empty line of a log that is not a result line (why a check failed)."""
    for line in reversed(text.splitlines()):
        if line.strip() and parse_report(line) is None:
            return line.strip()[-300:]
    return "no output"


def run_check(check: Check, log_path: Path, env: dict[str, str]) -> Outcome:
    """Runs one check as a child in its own process group under its time limit."""
    command = [sys.executable if part == "{python}" else part for part in check.command]
    start = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )  # fmt: skip
        except OSError as error:
            return Outcome(check.name, False, f"could not start: {error}", 0.0, check.limit_s, {})
        try:
            code = proc.wait(timeout=check.limit_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            code, timed_out = proc.returncode, True
    seconds = time.monotonic() - start
    text = log_path.read_text(errors="replace")
    if timed_out:
        figure = f"timed out after {check.limit_s:.0f} s (last: {last_line(text)})"
        return Outcome(check.name, False, figure, seconds, check.limit_s, {}, str(log_path))
    report = parse_report(text)
    if report is None:
        figure = f"exit {code}, no result line (last: {last_line(text)})"
        return Outcome(check.name, False, figure, seconds, check.limit_s, {}, str(log_path))
    passed = bool(report["ok"]) and code == 0
    figure = str(report.get("figure", ""))
    if report["ok"] and code != 0:
        figure += f" (but exit {code})"
    raw = report.get("raw") if isinstance(report.get("raw"), dict) else {}
    return Outcome(check.name, passed, figure, seconds, check.limit_s, raw, str(log_path))


# The whole run -------------------------------------------------------------------------


def load_checks(path: str | None) -> tuple[Check, ...]:
    """The built-in table, or the one in a --checks-file (tests use it)."""
    if path is None:
        return CHECKS
    entries = json.loads(Path(path).read_text())
    return tuple(Check(e["name"], tuple(e["command"]), float(e["limit_s"])) for e in entries)


def table(outcomes: Sequence[Outcome]) -> str:
    """The summary: one row per check, then the counts."""
    width = max([len(o.name) for o in outcomes] + [5])
    rows = [f"{'check':<{width}}  result  seconds  figure"]
    for o in outcomes:
        result = "PASS" if o.passed else "FAIL"
        rows.append(f"{o.name:<{width}}  {result:<6}  {o.seconds:7.1f}  {o.figure}")
    passed = sum(o.passed for o in outcomes)
    rows.append(f"{passed} passed, {len(outcomes) - passed} failed")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bin/gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=None, metavar="NAME[,NAME]", help="checks to run")
    parser.add_argument("--results", default=str(RESULTS), metavar="PATH", help="results JSON")
    parser.add_argument("--log-dir", default=None, metavar="DIR", help="keep each check's log")
    parser.add_argument("--checks-file", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--assume-gpus", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    try:
        checks = load_checks(args.checks_file)
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"gpu-check: cannot read --checks-file {args.checks_file}: {error}", file=sys.stderr)
        return 2
    if args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        known = [c.name for c in checks]
        unknown = [name for name in wanted if name not in known]
        if unknown:
            print(
                f"gpu-check: unknown check(s) {', '.join(unknown)}; use some of {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
        checks = tuple(c for c in checks if c.name in wanted)

    if args.assume_gpus is not None:
        machine: dict | None = {"assumed_gpus": args.assume_gpus.split(",")}
    else:
        machine, message, code = detect()
        if machine is None:
            print(message, file=sys.stdout if code == 0 else sys.stderr)
            return code
    assert machine is not None

    keep_logs = args.log_dir is not None
    log_dir = Path(args.log_dir) if keep_logs else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    load_start = os.getloadavg()
    print(f"gpu-check: {len(checks)} check(s) on {_gpu_summary(machine)}", flush=True)
    outcomes = []
    try:
        for check in checks:
            print(f"[{check.name}] running (limit {check.limit_s:.0f} s)", flush=True)
            outcome = run_check(check, log_dir / f"{check.name}.log", env)
            outcomes.append(outcome)
            print(
                f"{'PASS' if outcome.passed else 'FAIL'} {check.name}: {outcome.figure}",
                flush=True,
            )
    finally:
        if not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    load_end = os.getloadavg()
    print()
    print(table(outcomes))
    write_results(Path(args.results), outcomes, machine, load_start, load_end, argv, keep_logs)
    print(f"wrote {args.results}" + (f"; logs in {log_dir}" if keep_logs else ""))
    return 0 if all(o.passed for o in outcomes) else 1


def _gpu_summary(machine: dict) -> str:
    if "assumed_gpus" in machine:
        return "assumed GPUs " + ", ".join(machine["assumed_gpus"])
    names = [g["name"] for g in machine["gpus"]]
    return f"{len(names)} GPU(s): " + ", ".join(names)


def write_results(
    path: Path,
    outcomes: Sequence[Outcome],
    machine: dict,
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
    argv: Sequence[str] | None,
    keep_logs: bool,
) -> None:
    """The results JSON: command, machine, load, and every check's verdict and raw figures."""
    cores = os.cpu_count() or 1
    result = {
        "benchmark": "gpu_check",
        "command": shlex.join(["bin/gpu-check", *(sys.argv[1:] if argv is None else argv)]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            **machine,
            "cores": cores,
            "platform": platform.platform(),
            "hostname": platform.node(),
        },
        "load_average": {"at_start": list(load_start), "at_end": list(load_end)},
        # Checks time GPU work against a baseline in the same run; a loaded host still
        # slows their CPU side (input, actors), so say when the load exceeded the cores.
        "noisy": max(load_start[0], load_end[0]) > cores,
        "checks": [
            {
                "name": o.name,
                "passed": o.passed,
                "figure": o.figure,
                "seconds": round(o.seconds, 1),
                "limit_s": o.limit_s,
                "raw": o.raw,
                **({"log": o.log} if keep_logs and o.log else {}),
            }
            for o in outcomes
        ],
        "passed": sum(o.passed for o in outcomes),
        "failed": sum(not o.passed for o in outcomes),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def emit(ok: bool, figure: str, **raw) -> None:
    """What a check child prints last: its one JSON result line on stdout."""
    print(json.dumps({"gpu_check": 1, "ok": ok, "figure": figure, "raw": raw}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
