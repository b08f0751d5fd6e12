"""Fault handling of the supervisor and metrics, on real processes (no TF; seconds each).

Crash loops and deterministic start-up errors, stop failures in the exit status, a
republished address restarting its users, launcher death (kill -9, SIGHUP) with
saves, and metrics that count every record once across crashes and relaunches.
"""

import csv
import json
import os
import signal
import time

import psutil
import pytest

from launch.runtime.context import FileSink, NodeContext
from launch.runtime.metrics import Progress
from launch.runtime.program import Node, Program, Ref, RestartPolicy
from launch.runtime.run_dir import RunDir
from tests.launch import nodes
from tests.launch.test_supervision import (
    _alive,
    _gauges,
    _launcher_process,
    _node_pids,
    _run_in_thread,
    _wait_for,
)

pytestmark = pytest.mark.timeout(120)


def test_import_error_at_start_up_stops_after_the_first_failure(tmp_path):
    run_dir = str(tmp_path / "run")
    program = Program(
        "p",
        [
            Node(
                "broken", "tests.launch.nodes:broken_import", restart=RestartPolicy(max_restarts=50)
            ),
            Node("counter", "tests.launch.nodes:counter"),
        ],
    )
    t0 = time.monotonic()
    t, result, _ = _run_in_thread(program, run_dir)
    t.join(60)
    outcome = result["outcome"]
    assert outcome.reason == "failed"
    assert outcome.restarts["broken"] == 0  # Not restarted: it would fail the same way.
    assert "would recur on every restart" in outcome.message
    assert "No module named 'a_module_that_does_not_exist'" in outcome.message  # Its log tail.
    assert os.path.join(run_dir, "logs", "broken.log") in outcome.message
    assert time.monotonic() - t0 < 30
    assert not psutil.Process().children(recursive=True)


def test_bad_node_arguments_are_a_start_up_error(tmp_path):
    program = Program("p", [Node("bad", "tests.launch.nodes:counter", {"no_such_arg": 1})])
    t, result, _ = _run_in_thread(program, str(tmp_path / "run"), backend="threads")
    t.join(60)
    assert result["outcome"].reason == "failed"
    assert result["outcome"].restarts["bad"] == 0
    assert "no_such_arg" in result["outcome"].message


def _crash_loop(tmp_path, **policy):
    """The outcome of a node that crashes 0.1 s after every start, under `policy`.

    Every crash comes after a "healthy" start (healthy_after 0.05 s), so only the
    restart budget can stop the loop.
    """
    policy = RestartPolicy(initial_backoff=0.1, max_backoff=0.2, healthy_after=0.05, **policy)
    program = Program("p", [Node("loop", "tests.launch.nodes:crash_every_time", restart=policy)])
    t, result, _ = _run_in_thread(program, str(tmp_path / "run"))
    t.join(60)
    return result["outcome"]


def test_restart_budget_stops_a_crash_loop_with_the_last_log_lines(tmp_path):
    outcome = _crash_loop(tmp_path, max_restarts=3, restart_window=60.0)
    assert outcome.reason == "failed"
    assert outcome.restarts["loop"] == 3
    assert "failed 4 times within 1 min (restart budget: 3)" in outcome.message
    assert "RuntimeError: crash number 4" in outcome.message  # From the log tail.


def test_a_crash_loop_slower_than_the_restart_window_is_stopped_by_the_total_cap(tmp_path):
    # Issue 18, item 9: a node failing just after each window's worth of running never
    # exceeds the sliding budget; the cap on the launch's restarts stops it.
    outcome = _crash_loop(
        tmp_path,
        max_restarts=3,
        restart_window=0.05,  # Shorter than a run of the node: the window never fills.
        max_total_restarts=4,
    )
    assert outcome.reason == "failed"
    assert outcome.restarts["loop"] == 4
    assert "it was restarted 4 times in this launch (at most 4)" in outcome.message


@pytest.mark.parametrize("stateless", [False, True])
def test_a_stateful_node_waiting_to_restart_at_the_stop_is_reported(tmp_path, stateless):
    # Issue 18, item 10: it failed and its restart was not due when the stop came, so it
    # made no final save; the exit status must not say "every state saved".
    run_dir = str(tmp_path / "run")
    policy = RestartPolicy(initial_backoff=60.0)
    program = Program(
        "p",
        [
            Node(
                "worker",
                "tests.launch.nodes:counter",
                {"crash_on_attempt": 0, "crash_after": 3},
                restart=policy,
                stateless=stateless,
            ),
            Node("other", "tests.launch.nodes:counter", stateless=True),  # Keeps the run going.
        ],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    _wait_for(lambda: sup.restarts()["worker"] == 1, 30, "the failure")
    sup.request_stop()
    t.join(30)
    failures = result["outcome"].stop_failures
    expected = [] if stateless else ["worker had failed and was waiting to restart"]
    assert [f.split(":")[0] for f in failures] == expected


@pytest.mark.parametrize("launcher_dies", [False, True])
def test_a_node_that_asks_for_more_stop_time_gets_it(tmp_path, launcher_dies):
    # Issue 18, item 6: a replay's checkpoint outgrows its fixed stop timeout (96 s for a
    # 1M-step pixel replay against 60 s); it asks for more and saves instead of a kill.
    run_dir = str(tmp_path / "run")
    saver = nodes.slow_saver_program().node("saver")
    saved = os.path.join(run_dir, "saved.txt")
    if launcher_dies:  # Its own watch waits as long, after a kill -9 of the launcher.
        proc = _launcher_process(run_dir, "slow-saver")
        _wait_for(lambda: _gauges(run_dir).get("pid_counter"), 60, "the nodes")
        time.sleep(1.0)  # The saver has published its need by now (it did at once).
        proc.kill()
        proc.wait()
        _wait_for(lambda: os.path.exists(saved), 30, "the save")
        return
    t, result, sup = _run_in_thread(Program("p", [saver]), run_dir, stop_grace=None)
    _wait_for(lambda: sup.published.get("stop_time_needed/saver"), 30, "the request")
    sup.request_stop()
    t.join(30)
    assert os.path.exists(saved)
    assert result["outcome"].stop_failures == []


def test_a_stateful_node_that_fails_to_save_is_reported(tmp_path):
    run_dir = str(tmp_path / "run")
    program = Program(
        "p",
        [
            Node("saver", "tests.launch.nodes:fails_on_stop"),
            Node("helper", "tests.launch.nodes:fails_on_stop", stateless=True),
        ],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    _wait_for(
        lambda: "pid_saver" in _gauges(run_dir) and "pid_helper" in _gauges(run_dir), 30, "nodes"
    )
    sup.request_stop()
    t.join(30)
    failures = result["outcome"].stop_failures
    assert len(failures) == 1, failures  # The stateless helper loses nothing.
    assert failures[0].startswith("saver failed while stopping (exit code 1)")
    assert os.path.join(run_dir, "logs", "saver.log") in failures[0]


def test_only_a_stateful_node_killed_at_the_stop_deadline_is_reported(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    program = Program(
        "p",
        [
            Node("saver", "tests.launch.nodes:counter", {"ignore_stop": True}, stop_timeout=1.0),
            Node(
                "actor",
                "tests.launch.nodes:counter",
                {"ignore_stop": True},
                stop_timeout=1.0,
                stateless=True,
            ),
        ],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    _wait_for(
        lambda: "pid_saver" in _gauges(run_dir) and "pid_actor" in _gauges(run_dir), 30, "nodes"
    )
    pids = [_gauges(run_dir)[k] for k in ("pid_saver", "pid_actor")]
    sup.request_stop()
    t.join(30)
    # Both were killed; only the one that could have lost state is on the console.
    assert not any(_alive(pid) for pid in pids)
    console = capsys.readouterr().err
    assert "saver: still running 1s after the stop request" in console, console
    assert "actor:" not in console, console
    assert [f.split(" was killed")[0] for f in result["outcome"].stop_failures] == ["saver"]


@pytest.mark.parametrize("blocked", [False, True])
def test_a_republished_address_restarts_its_users(tmp_path, capsys, blocked):
    # A user blocked on the old address (it ignores the stop request) is killed at its
    # stop timeout, then restarted like the others (issue 18, item 4).
    run_dir = str(tmp_path / "run")
    user_kwargs = {"address": Ref("server_address"), "ignore_stop": blocked}
    program = Program(
        "p",
        [
            Node(
                "server",
                "tests.launch.nodes:moving_server",
                restart=RestartPolicy(initial_backoff=0.1),
            ),
            Node("user", "tests.launch.nodes:address_user", user_kwargs, stop_timeout=2.0),
        ],
    )
    t, result, sup = _run_in_thread(program, run_dir)
    first = _wait_for(lambda: _gauges(run_dir).get("address_user"), 30, "the user")
    os.kill(_gauges(run_dir)["pid_server"], signal.SIGKILL)
    second = _wait_for(
        lambda: (
            _gauges(run_dir).get("address_user") not in (None, first)
            and _gauges(run_dir)["address_user"]
        ),
        30,
        "the user restarted with the new address",
    )
    assert second == sup.published["server_address"]
    sup.request_stop()
    t.join(30)
    assert result["outcome"].restarts == {"server": 1, "user": 1}
    killed = "user: still running 2s after the stop request; killed to restart it"
    assert (killed in capsys.readouterr().err) == blocked
    if not blocked:
        assert result["outcome"].stop_failures == []


def _saved(run_dir):
    return os.path.exists(os.path.join(run_dir, "server_stopped.txt"))


def test_kill_9_of_the_launcher_lets_nodes_save_then_leaves_no_orphan(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = _launcher_process(run_dir)
    pids = _wait_for(lambda: len(_node_pids(run_dir)) == 3 and _node_pids(run_dir), 60, "nodes")
    proc.kill()
    proc.wait()
    # SIGTERM (not SIGKILL) through the parent-death signal: the server saves on its way out.
    _wait_for(lambda: _saved(run_dir), 15, "the server's save after its launcher died")
    _wait_for(lambda: not any(_alive(p) for p in pids), 15, "the nodes to exit")


def test_sighup_stops_like_sigterm(tmp_path):
    run_dir = str(tmp_path / "run")
    proc = _launcher_process(run_dir)
    pids = _wait_for(lambda: len(_node_pids(run_dir)) == 3 and _node_pids(run_dir), 60, "nodes")
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=30)
    assert "SIGHUP: stopping every node" in out
    assert "OUTCOME interrupted" in out
    assert _saved(run_dir)
    for pid in pids:
        assert not _alive(pid)


# Metrics: once and only once.


def _eval_rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def test_torn_line_is_skipped_alone(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    path = rd.metrics_path("actor_0")
    NodeContext("actor_0", rd.root, metrics_sink=FileSink(path)).count(actor_steps=100)
    with open(path, "a") as f:
        f.write('{"t": 1.0, "node": "actor_0", "kind": "count", "actor_st')  # Killed mid-write.
    # The restarted node's first record must not be swallowed by the torn line.
    NodeContext("actor_0", rd.root, metrics_sink=FileSink(path)).count(actor_steps=10)
    assert Progress(rd, "p").totals["actor_steps"] == 110


def test_each_record_counts_once_and_missing_rows_are_written_on_relaunch(tmp_path):
    rd = RunDir(str(tmp_path / "run"))
    ctx = NodeContext("evaluator", rd.root, metrics_sink=FileSink(rd.metrics_path("evaluator")))
    actor = NodeContext("actor_0", rd.root, metrics_sink=FileSink(rd.metrics_path("actor_0")))
    progress = Progress(rd, "p")
    actor.count(actor_steps=1000)
    ctx.record("eval", **{"return": 1.0, "return_std": 0.0, "episodes": 1, "learner_steps": 5})
    progress.update()
    assert len(_eval_rows(rd.root)) == 1
    # An evaluation arrives, then the launcher dies before it reads it.
    actor.count(actor_steps=1000)
    ctx.record("eval", **{"return": 2.0, "return_std": 0.0, "episodes": 1, "learner_steps": 9})
    # A record delivered twice (e.g. drained again after a crash) counts once.
    with open(rd.metrics_path("actor_0")) as f:
        last = f.read().splitlines()[-1]
    with open(rd.metrics_path("actor_0"), "a") as f:
        f.write(last + "\n")
    relaunched = Progress(rd, "p")
    assert relaunched.totals["actor_steps"] == 2000
    rows = _eval_rows(rd.root)
    assert [float(r["eval_return"]) for r in rows] == [1.0, 2.0]
    assert rows[1]["actor_steps"] == "2000"  # The totals at the moment of that evaluation.
    assert len({r["record_id"] for r in rows}) == 2
    # A third launch adds nothing.
    Progress(rd, "p")
    assert len(_eval_rows(rd.root)) == 2
    ids = {f"{r['src']}:{r['seq']}" for r in map(json.loads, open(rd.metrics_path("evaluator")))}
    assert ids == {r["record_id"] for r in rows}


# Launch settings stored with the run.


def test_stored_settings_are_reused_and_given_flags_override_and_are_recorded(tmp_path):
    import argparse

    from launch.cli import run_settings

    rd = RunDir(str(tmp_path / "run"))
    os.makedirs(rd.root)
    nothing = {dest: None for dest in run_settings.stored_flag_defaults()}
    first = argparse.Namespace(**{**nothing, "steps": 5000, "actors": 3, "eval_every": 7.0})
    given = run_settings.resolve(first, run_settings.read(rd))
    assert given == {"steps": 5000, "actors": 3, "eval_every": 7.0}
    assert first.backend == "local" and first.eval_episodes == 3  # Defaults of a new run.
    run_settings.write(rd, first, given)

    # A relaunch with no flag: the run's own values, not the defaults.
    again = argparse.Namespace(**nothing)
    assert run_settings.resolve(again, run_settings.read(rd)) == {}
    assert (again.steps, again.actors, again.eval_every) == (5000, 3, 7.0)
    # A flag given on relaunch wins, and is stored for the next one.
    third = argparse.Namespace(**{**nothing, "actors": 1})
    given = run_settings.resolve(third, run_settings.read(rd))
    run_settings.write(rd, third, given)
    stored = run_settings.read(rd)
    assert stored["settings"]["actors"] == 1 and stored["settings"]["steps"] == 5000
    assert [h["given"] for h in stored["history"]] == [
        {"steps": 5000, "actors": 3, "eval_every": 7.0},
        {"actors": 1},
    ]


def test_compatibility_is_checked_again_under_the_lock(tmp_path, monkeypatch, capsys):
    from launch import cli

    run_dir = str(tmp_path / "run")
    original = RunDir.lock

    def lock_after_another_launcher(self, **kwargs):
        # Another launcher created a run of another task between our check and our lock.
        os.makedirs(self.root, exist_ok=True)
        self.write_identity({"program": "d4pg", "task": "walker:walk", "config": {}})
        original(self, **kwargs)

    monkeypatch.setattr(RunDir, "lock", lock_after_another_launcher)
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--env", "cartpole:balance"]) == 2
    assert "holds a different run" in capsys.readouterr().err
    assert RunDir(run_dir).read_identity()["task"] == "walker:walk"  # Theirs, untouched.


def test_an_import_error_is_deterministic_unless_the_machine_ran_out_of_something():
    from launch.runtime.errors import is_deterministic

    assert is_deterministic(ModuleNotFoundError("No module named 'a_module'"))
    assert is_deterministic(ImportError("cannot import name 'x' from 'y'"))
    # Issue 18, item 13: memory pressure while loading a shared library is worth a restart.
    oom = "libtensorflow_cc.so.2: failed to map segment from shared object: Cannot allocate memory"
    assert not is_deterministic(ImportError(oom))
    assert not is_deterministic(ImportError("libcuda.so: Too many open files"))
