"""bin/gpu-check's runner on the CPU: the no-GPU answer, time limits, verdicts, results.

The checks themselves need a GPU; what runs them does not. Real child processes stand in for
the checks through the runner's internal `--checks-file` table, and `--assume-gpus` skips
detection; nothing of the runner is mocked.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from benchmarks import gpu_check, gpu_check_d4pg

pytestmark = pytest.mark.timeout(180)

RUNNER = [sys.executable, str(gpu_check.ROOT / "benchmarks" / "gpu_check.py")]


def emit_line(ok, figure, **raw):
    return json.dumps({"gpu_check": 1, "ok": ok, "figure": figure, "raw": raw})


def python_check(name, code, limit_s=60):
    return {"name": name, "command": ["{python}", "-c", textwrap.dedent(code)], "limit_s": limit_s}


def run_runner(tmp_path, checks, *extra, assume=True):
    table = tmp_path / "checks.json"
    table.write_text(json.dumps(checks))
    results = tmp_path / "results.json"
    args = [*RUNNER, "--checks-file", str(table), "--results", str(results), *extra]
    if assume:
        args += ["--assume-gpus", "Fake GPU 0"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=150, cwd=gpu_check.ROOT)
    return out, results


def passing(name, figure="1234 things/s"):
    return python_check(name, f"print('noise'); print({emit_line(True, figure, value=1234)!r})")


def failing(name, figure="diff 3e-2"):
    return python_check(name, f"print({emit_line(False, figure)!r})")


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    # No nvidia-smi on PATH and no CUDA device for TensorFlow: the machine of any CI.
    results = tmp_path / "results.json"
    env = {**os.environ, "PATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run(
        [*RUNNER, "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=gpu_check.ROOT,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    assert lines[0].startswith("gpu-check: no NVIDIA GPU visible to TensorFlow here (")
    assert lines[0].endswith("; nothing to check.")
    assert "nvidia-smi not found" in lines[0]
    assert not results.exists()  # nothing ran, so no result claims anything


def test_verdicts_table_counts_and_exit_code(tmp_path):
    out, _ = run_runner(tmp_path, [passing("alpha"), failing("beta")])
    assert out.returncode == 1
    assert "PASS alpha: 1234 things/s" in out.stdout
    assert "FAIL beta: diff 3e-2" in out.stdout
    rows = out.stdout.splitlines()
    table_start = next(i for i, line in enumerate(rows) if line.startswith("check"))
    assert rows[table_start + 1].split()[:2] == ["alpha", "PASS"]
    assert rows[table_start + 2].split()[:2] == ["beta", "FAIL"]
    assert "1 passed, 1 failed" in out.stdout

    out, _ = run_runner(tmp_path, [passing("alpha"), passing("gamma")])
    assert out.returncode == 0, out.stdout
    assert "2 passed, 0 failed" in out.stdout


def test_results_json_holds_command_machine_load_and_raw_figures(tmp_path):
    out, results = run_runner(tmp_path, [passing("alpha"), failing("beta")], "--only", "alpha")
    assert out.returncode == 0, out.stdout
    data = json.loads(results.read_text())
    assert data["command"].startswith("bin/gpu-check")
    assert "--only alpha" in data["command"]
    assert data["machine"]["assumed_gpus"] == ["Fake GPU 0"]
    assert data["machine"]["cores"] == os.cpu_count()
    assert set(data["load_average"]) == {"at_start", "at_end"}
    assert [c["name"] for c in data["checks"]] == ["alpha"]
    check = data["checks"][0]
    assert check["passed"] is True and check["raw"] == {"value": 1234}
    assert check["limit_s"] == 60 and check["seconds"] >= 0
    assert (data["passed"], data["failed"]) == (1, 0)


def test_only_runs_the_named_checks_and_refuses_unknown_names(tmp_path):
    marker = tmp_path / "beta-ran"
    beta = python_check("beta", f"open({str(marker)!r}, 'w').close()")
    out, _ = run_runner(tmp_path, [passing("alpha"), beta], "--only", "alpha")
    assert out.returncode == 0
    assert "PASS alpha" in out.stdout and "beta" not in out.stdout
    assert not marker.exists()

    out, _ = run_runner(tmp_path, [passing("alpha")], "--only", "alpha,nope")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "gpu-check: unknown check(s) nope; use some of alpha"
    ]


@pytest.mark.parametrize(
    "code, last",
    [
        ("print('step 1 fine'); raise ValueError('cuDNN exploded')", "ValueError: cuDNN exploded"),
        ("print('{not json'); print('garbage at the end')", "garbage at the end"),
    ],
)
def test_a_crashing_or_garbage_child_fails_with_its_last_log_line(tmp_path, code, last):
    log_dir = tmp_path / "logs"
    out, _ = run_runner(tmp_path, [python_check("bad", code)], "--log-dir", str(log_dir))
    assert out.returncode == 1
    line = next(x for x in out.stdout.splitlines() if x.startswith("FAIL bad:"))
    assert "no result line" in line and f"(last: {last})" in line
    assert last in (log_dir / "bad.log").read_text()  # --log-dir keeps the child's log


def _state(pid):
    """A process's state letter, None when it no longer exists."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def test_a_timeout_kills_the_childs_whole_process_tree(tmp_path):
    # The child starts one grandchild in its group and one in a session of its own (as the
    # launcher starts its nodes), then hangs; both must be gone after the limit.
    pids = tmp_path / "pids"
    code = f"""
        import subprocess, sys, time
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        a = subprocess.Popen(sleeper)
        b = subprocess.Popen(sleeper, start_new_session=True)
        with open({str(pids)!r}, "w") as f:
            f.write(f"{{a.pid}} {{b.pid}}")
        print("waiting forever", flush=True)
        time.sleep(600)
    """
    start = time.monotonic()
    out, results = run_runner(tmp_path, [python_check("hang", code, limit_s=4)])
    assert time.monotonic() - start < 120
    assert out.returncode == 1
    assert "FAIL hang: timed out after 4 s (last: waiting forever)" in out.stdout
    grandchildren = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_state(p) not in (None, "Z") for p in grandchildren):
        time.sleep(0.2)
    assert [_state(p) in (None, "Z") for p in grandchildren] == [True, True]
    assert json.loads(results.read_text())["checks"][0]["passed"] is False


def test_node_environments_are_read_from_the_launchers_node_main_children(tmp_path, monkeypatch):
    # A stand-in launcher starts two "nodes" (command lines as launch/runtime/local.py makes them,
    # each with its own CUDA_VISIBLE_DEVICES) and one helper that is not a node.
    ready = tmp_path / "ready"
    code = f"""
        import os, subprocess, sys, time
        sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
        def node(name, visible):
            env = {{**os.environ, "CUDA_VISIBLE_DEVICES": visible}}
            return subprocess.Popen(sleeper + ["-m", "launch.runtime.node_main", f"/s/{{name}}-0.spec.json"], env=env)
        procs = [node("learner", "1"), node("actor_0", ""), subprocess.Popen(sleeper)]
        open({str(ready)!r}, "w").close()
        time.sleep(120)
    """
    launcher = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # the children have exec'd their interpreters
        for use_psutil in (True, False):
            if not use_psutil:
                monkeypatch.setitem(sys.modules, "psutil", None)  # the /proc fallback
            nodes = gpu_check_d4pg.node_processes(launcher.pid)
            assert sorted(nodes.values()) == ["actor_0", "learner"], use_psutil
            seen = {
                name: gpu_check_d4pg.read_environ(pid)["CUDA_VISIBLE_DEVICES"]
                for pid, name in nodes.items()
            }
            assert seen == {"learner": "1", "actor_0": ""}
    finally:
        gpu_check.kill_tree(launcher)


def test_learner_updates_per_second_from_its_metrics_file(tmp_path):
    path = tmp_path / "learner.jsonl"
    records = [
        {"t": 100.0, "node": "learner", "kind": "gauge", "learner_steps": 0},
        {"t": 130.0, "node": "learner", "kind": "gauge", "learner_steps": 50},  # after tracing
        {"t": 130.1, "node": "learner", "kind": "learner", "learner_steps": 50, "critic_loss": 1},
        {"t": 140.0, "node": "learner", "kind": "gauge", "learner_steps": 450},
    ]
    lines = (
        [json.dumps(r) for r in records[:3]]
        + ['{"t": 135.0, "learner_st']
        + [json.dumps(records[3])]
    )
    path.write_text("\n".join(lines) + "\n")
    rate = gpu_check_d4pg.updates_per_second(path)
    assert rate["updates_per_s"] == pytest.approx(40.0)  # (450 - 50) / (140 - 130)
    assert rate["updates"] == 450 and rate["seconds"] == pytest.approx(10.0)


def test_a_node_that_may_see_a_gpu_it_should_not_is_a_failure():
    run = {
        "timed_out": False,
        "exit_code": 0,
        "seconds": 50.0,
        "actor_steps": 10_000,
        "budget": 10_000,
        "learner": {"updates_per_s": 100.0},
        "last_output": "",
        "cuda_visible_devices": {"learner": "0", "replay": "", "actor_0": "", "evaluator": ""},
    }
    assert gpu_check_d4pg.problems(run, "gpu") == []
    leaky = {**run, "cuda_visible_devices": {**run["cuda_visible_devices"], "actor_0": None}}
    assert gpu_check_d4pg.problems(leaky, "gpu") == [
        "gpu: actor_0 may see a GPU (CUDA_VISIBLE_DEVICES=None)"
    ]
    blind = {**run, "cuda_visible_devices": {**run["cuda_visible_devices"], "learner": ""}}
    assert gpu_check_d4pg.problems(blind, "gpu") == [
        "gpu: learner sees no GPU (CUDA_VISIBLE_DEVICES='')"
    ]
    short = {**run, "actor_steps": 9_000}
    assert gpu_check_d4pg.problems(short, "gpu") == ["gpu: 9000 of 10000 actor steps"]


def test_its_results_json_needs_no_row_in_the_readme_table(tmp_path):
    # The README's table test demands a row for every results JSON; a GPU machine's check
    # is not a benchmark row, so writing gpu_check.json must not break that test.
    import shutil

    from benchmarks import readme_table

    results = tmp_path / "results"
    shutil.copytree(readme_table.RESULTS, results)
    (results / gpu_check.RESULTS.name).write_text("{}")
    assert readme_table.uncovered(results) == []
