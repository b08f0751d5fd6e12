"""Supervision on real processes: start order, restarts, shutdown, no orphans.

The node bodies (tests/launch/nodes.py) are tiny and TF-free so these run in seconds.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from launch.runtime import launcher
from launch.runtime.program import NEVER_RESTART, Node, Program, RestartPolicy
from launch.runtime.run_dir import RunDir, RunDirError
from tests.launch import nodes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {"PYTHONPATH": REPO}

pytestmark = pytest.mark.timeout(120)


def _gauges(run_dir):
    out = {}
    metrics = os.path.join(run_dir, "metrics")
    if not os.path.isdir(metrics):
        return out
    for name in os.listdir(metrics):
        with open(os.path.join(metrics, name)) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("kind") == "gauge":
                    out.update({k: v for k, v in r.items() if k not in ("t", "node", "kind")})
    return out


def _counts(run_dir, node):
    try:
        with open(os.path.join(run_dir, "metrics", f"{node}.jsonl")) as f:
            return sum('"kind": "count"' in line for line in f)
    except FileNotFoundError:
        return 0


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _run_in_thread(program, run_dir, backend="local", **kwargs):
    """Runs the launcher in a thread; returns (thread, result dict, supervisor holder)."""
    result, holder = {}, {}

    def target():
        result["outcome"] = launcher.run(
            program,
            run_dir,
            backend,
            progress_every=0,
            on_supervisor=lambda s: holder.setdefault("sup", s),
            **({"env": ENV} if backend == "local" else {}),
            **{"stop_grace": 3.0, **kwargs},
        )

    t = threading.Thread(target=target, daemon=True)
    t.start()
    _wait_for(lambda: "sup" in holder, 10, "the supervisor")
    return t, result, holder["sup"]


def test_local_program_runs_and_stops_without_orphans(tmp_path):
    run_dir = str(tmp_path / "run")
    me = psutil.Process()
    t, result, sup = _run_in_thread(nodes.demo_program(), run_dir)
    # The client starts only once the server published its address, then makes progress.
    _wait_for(lambda: sup.published.get("server_address"), 30, "the server address")
    assert sup.published["server_address"].startswith("127.0.0.1:")
    pids = _wait_for(
        lambda: [h.pid for h in sup.handles().values()] if len(sup.handles()) == 3 else None,
        30,
        "three node processes",
    )
    for pid in pids:
        assert _alive(pid)
        assert os.getpgid(pid) == pid  # Each node leads its own process group.
    _wait_for(lambda: _counts(run_dir, "client") >= 3, 30, "client requests")
    t0 = time.monotonic()
    sup.request_stop()
    t.join(30)
    assert not t.is_alive()
    assert time.monotonic() - t0 < 15
    assert result["outcome"].reason == "interrupted"
    assert result["outcome"].progress.totals["actor_steps"] > 0
    # The server is in a later stop phase and saved its state on the way out.
    assert os.path.exists(os.path.join(run_dir, "server_stopped.txt"))
    for pid in pids:
        assert not _alive(pid)
    assert not me.children(recursive=True)


@pytest.mark.parametrize("may_finish", [False, True])
def test_a_node_that_returns_unasked_has_failed_unless_it_may_finish(tmp_path, capsys, may_finish):
    # Issue 18, item 1: SIGTERM to one node (an out-of-memory killer's first signal)
    # makes its body save and return; without `may_finish` that is a failure, restarted,
    # not a finished node the run then waits on for ever.
    run_dir = str(tmp_path / "run")
    program = Program(
        "p",
        [
            Node(
                "worker",
                "tests.launch.nodes:counter",
                restart=RestartPolicy(initial_backoff=0.1),
                may_finish=may_finish,
            ),
            Node("other", "tests.launch.nodes:counter"),
        ],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    pid = _wait_for(lambda: _gauges(run_dir).get("pid_worker"), 30, "the worker")
    os.kill(pid, signal.SIGTERM)
    _wait_for(lambda: not _alive(pid), 30, "the worker to return")
    if may_finish:
        time.sleep(2.0)  # Time it would take to restart it.
    else:
        _wait_for(lambda: _gauges(run_dir).get("attempt_worker") == 1, 30, "a restart")
    sup.request_stop()
    t.join(30)
    err = capsys.readouterr().err
    assert result["outcome"].restarts["worker"] == (0 if may_finish else 1)
    assert ("worker failed (returned without being asked to stop" in err) != may_finish, err
    assert ("worker finished" in err) == may_finish, err


def test_crashed_node_restarts_with_backoff(tmp_path):
    run_dir = str(tmp_path / "run")
    policy = RestartPolicy(initial_backoff=0.5, max_backoff=1.0)
    program = Program(
        "p",
        [
            Node(
                "worker",
                "tests.launch.nodes:counter",
                {"crash_on_attempt": 0, "crash_after": 3},
                restart=policy,
            )
        ],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    _wait_for(lambda: _gauges(run_dir).get("attempt_worker") == 1, 40, "the restarted worker")
    sup.request_stop()
    t.join(30)
    assert result["outcome"].restarts == {"worker": 1}
    log = open(os.path.join(run_dir, "logs", "worker.log")).read()
    assert "crashes on purpose" in log and "start #1" in log


def test_a_node_whose_heartbeats_stop_is_killed_and_restarted(tmp_path, capsys):
    # Issue 18, item 3: a worker blocked in a collective whose peer hangs never returns
    # and ignores stop requests; its heartbeats stop, and the watchdog restarts it.
    run_dir = str(tmp_path / "run")
    program = Program(
        "p",
        [
            Node(
                "worker",
                "tests.launch.nodes:beating",
                {"hang_on_attempt": 0},
                restart=RestartPolicy(initial_backoff=0.1),
                stall_timeout=6.0,
            )
        ],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    pid = _wait_for(lambda: _gauges(run_dir).get("pid_worker"), 30, "the worker")
    _wait_for(lambda: _gauges(run_dir).get("attempt_worker") == 1, 60, "the hung worker's restart")
    assert not _alive(pid)
    time.sleep(10.0)  # Longer than stall_timeout: a beating node is left alone.
    sup.request_stop()
    t.join(30)
    err = capsys.readouterr().err
    assert result["outcome"].restarts == {"worker": 1}, err
    assert "worker failed (no heartbeat for" in err, err


def test_the_stall_watchdog_does_not_time_the_start_up(tmp_path):
    # Armed by the first heartbeat of each start: restores and compilation are not timed.
    run_dir = str(tmp_path / "run")
    program = Program(
        "p",
        [Node("worker", "tests.launch.nodes:beating", {"quiet_start": 8.0}, stall_timeout=3.0)],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    _wait_for(lambda: _gauges(run_dir).get("pid_worker"), 30, "the worker")
    time.sleep(12.0)
    sup.request_stop()
    t.join(30)
    assert result["outcome"].restarts == {"worker": 0}


def test_kill_9_node_is_restarted(tmp_path):
    run_dir = str(tmp_path / "run")
    t, result, sup = _run_in_thread(nodes.demo_program(), run_dir)
    pid = _wait_for(lambda: _gauges(run_dir).get("pid_client"), 40, "the client pid")
    os.kill(pid, signal.SIGKILL)
    _wait_for(lambda: _gauges(run_dir).get("pid_client") not in (None, pid), 40, "a new client")
    sup.request_stop()
    t.join(30)
    assert result["outcome"].restarts["client"] == 1


def test_non_restartable_failure_stops_the_run(tmp_path):
    program = Program(
        "p",
        [
            Node(
                "bad",
                "tests.launch.nodes:failing",
                restart=NEVER_RESTART.__class__(restart=False, fatal_hint="Relaunch to resume."),
            ),
            Node("counter", "tests.launch.nodes:counter"),
        ],
    )
    t, result, _ = _run_in_thread(program, str(tmp_path / "run"))
    t.join(60)
    outcome = result["outcome"]
    assert outcome.reason == "failed"
    assert "'bad' failed (exit code 1)" in outcome.message
    assert "Relaunch to resume." in outcome.message
    assert not psutil.Process().children(recursive=True)


def test_threads_backend_runs_same_program(tmp_path):
    run_dir = str(tmp_path / "run")
    t, result, sup = _run_in_thread(nodes.demo_program(), run_dir, backend="threads")
    _wait_for(lambda: _counts(run_dir, "client") >= 3, 30, "client requests")
    sup.request_stop()
    t.join(30)
    assert result["outcome"].progress.totals["actor_steps"] > 0


def _launcher_process(run_dir, *extra):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.launch.nodes", run_dir, "local", *extra],
        cwd=REPO,
        env={**os.environ, **ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _node_pids(run_dir):
    g = _gauges(run_dir)
    return [g[k] for k in ("pid_server", "pid_client", "pid_counter") if k in g]


@pytest.mark.parametrize("stubborn", [False, True])
def test_sigterm_stops_everything_within_seconds(tmp_path, stubborn):
    run_dir = str(tmp_path / "run")
    proc = _launcher_process(run_dir, *(["stubborn"] if stubborn else []))
    pids = _wait_for(lambda: len(_node_pids(run_dir)) == 3 and _node_pids(run_dir), 60, "nodes")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert time.monotonic() - t0 < 15, out
    assert "OUTCOME interrupted" in out
    if stubborn:
        assert "counter: still running 2s after the stop request" in out
    for pid in pids:
        assert not _alive(pid), (pid, out)


def test_one_signal_during_a_shutdown_the_launcher_began_does_not_kill_a_saving_node(tmp_path):
    # Issue 18, item 5: the run stops itself (here a fatal failure); one Ctrl-C while a
    # node saves is the user's first signal, not a second one that kills it mid-save.
    run_dir = str(tmp_path / "run")
    program = Program(
        "p",
        [
            Node("saver", "tests.launch.nodes:slow_saver", stop_timeout=30.0),
            Node(
                "bad",
                "tests.launch.nodes:crash_every_time",
                {"after": 5.0},
                restart=NEVER_RESTART,
            ),
        ],
    )
    saving = os.path.join(run_dir, "saving.txt")

    def interrupt_while_saving():
        _wait_for(lambda: os.path.exists(saving), 60, "the save to begin")
        os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=interrupt_while_saving, daemon=True)
    helper.start()
    outcome = launcher.run(program, run_dir, "local", progress_every=0, env=ENV)
    helper.join(10)
    assert outcome.reason == "failed"
    assert os.path.exists(os.path.join(run_dir, "saved.txt"))
    assert outcome.stop_failures == []


def test_kill_9_launcher_leaves_no_orphans(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = _launcher_process(run_dir)
    pids = _wait_for(lambda: len(_node_pids(run_dir)) == 3 and _node_pids(run_dir), 60, "nodes")
    proc.kill()
    proc.wait()
    _wait_for(lambda: not any(_alive(p) for p in pids), 10, "the nodes to die with their launcher")


def test_a_relaunch_waits_for_the_nodes_of_a_killed_launcher(tmp_path):
    # Issue 18, item 2: after kill -9 of the launcher its nodes save for up to their stop
    # timeout; a relaunch in that window must not start a second generation beside them.
    run_dir = str(tmp_path / "run")
    proc = _launcher_process(run_dir, "stubborn")  # Its counter ignores stop requests.
    pids = _wait_for(lambda: len(_node_pids(run_dir)) == 3 and _node_pids(run_dir), 60, "nodes")
    proc.kill()
    proc.wait()
    counter = _gauges(run_dir)["pid_counter"]
    with pytest.raises(RunDirError, match="nodes of an earlier launch .* are still running"):
        RunDir(run_dir).lock(wait_for_nodes_s=0.5)
    assert _alive(counter)
    told = []
    relaunch = RunDir(run_dir)
    relaunch.lock(wait_for_nodes_s=60, notify=told.append)
    try:
        assert not any(_alive(p) for p in pids)
        assert len(told) == 1 and "still saving" in told[0], told
    finally:
        relaunch.unlock()


def test_second_launcher_on_same_run_dir_is_refused(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    rd.lock()
    try:
        with pytest.raises(Exception, match="another launcher is using"):
            RunDir(rd.root).lock()
    finally:
        rd.unlock()
