"""A D4PG learner spanning two processes (`--learner-workers 2`), on loopback only."""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests.launch import d4pg_support as s
from tests.support import python_env

pytestmark = pytest.mark.timeout(600)

PROGRAM = os.path.join(os.path.dirname(__file__), "learner_worker_program.py")


def _single_process_reference():
    code = (
        "import sys, numpy as np\n"
        "from launch.runtime import learner_group\n"
        "repl = learner_group.make_replicator('cpu')\n"
        "from tests.launch.learner_equivalence import build_learner, weights, STEPS\n"
        "learner = build_learner(repl)\n"
        "out = {}\n"
        "for step in range(STEPS):\n"
        "    learner.step()\n"
        "    out.update({f'step{step}_{i}': w for i, w in enumerate(weights(learner))})\n"
        "np.savez(sys.argv[1], **out)\n"
    )
    return code


def test_two_learner_workers_update_like_one_learner_on_the_global_batch(tmp_path):
    from launch.runtime.learner_group import reserve_ports

    workers = reserve_ports("localhost", 2)
    outputs = [str(tmp_path / f"worker{i}.npz") for i in range(2)]
    checkpoints = str(tmp_path / "checkpoints")
    reference = str(tmp_path / "reference.npz")
    processes = [
        subprocess.Popen(
            [sys.executable, PROGRAM, str(i), outputs[i], checkpoints, *workers],
            cwd=s.REPO,
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    processes.append(
        subprocess.Popen(
            [sys.executable, "-c", _single_process_reference(), reference],
            cwd=s.REPO,
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    )
    logs = []
    try:
        for process in processes:
            logs.append(process.communicate(timeout=300)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in processes] == [0, 0, 0], "\n".join(x[-3000:] for x in logs)

    expected = np.load(reference)
    for output in outputs:
        result = np.load(output)
        assert int(result["replicas"]) == 2
        assert bool(result["agreed"])  # Worker 1 alone asked to stop; both agreed.
        before, after = result["threads"]
        assert after - before < 50, f"{after - before} OS threads more after 150 updates"
        for key in expected.files:
            np.testing.assert_allclose(result[key], expected[key], rtol=1e-5, atol=1e-6)
    # The weights did change (the comparison is not between two initialisations).
    assert not np.allclose(expected["step1_0"], expected["step0_0"])
    # The chief's checkpoint (after update 1) restores into a one-process learner, as
    # `replicator evaluate` or a relaunch with --learner-workers 1 does.
    restored = str(tmp_path / "restored.npz")
    code = (
        "import sys, numpy as np\n"
        "from launch.runtime import learner_group\n"
        "repl = learner_group.make_replicator('cpu')\n"
        "from tests.launch.learner_equivalence import build_learner, weights\n"
        "learner = build_learner(repl, sys.argv[1])\n"
        "assert learner.restore() and learner.num_steps == 1\n"
        "np.savez(sys.argv[2], *weights(learner))\n"
    )
    subprocess.run(
        [sys.executable, "-c", code, checkpoints, restored],
        cwd=s.REPO,
        env=python_env(),
        check=True,
        timeout=300,
    )
    # The checkpoint holds exactly the chief's weights after update 1: compared bit for bit with
    # the chief's own snapshot (against the one-process learner the sums' order differs, ~1e-12).
    result = np.load(restored)
    chief = np.load(outputs[0])
    for i in range(len(result.files)):
        np.testing.assert_array_equal(result[f"arr_{i}"], chief[f"step0_{i}"])


def _files(root):
    return sorted(
        os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
    )


def test_local_learner_group_steps_writes_from_the_chief_and_restarts_together(tmp_path):
    run_dir = str(tmp_path / "run")
    program = s.tiny_program(num_actors=1, checkpoint_every_steps=40, learner_workers=2)
    assert [n.name for n in program.nodes if n.group == "learner"] == ["learner", "learner_1"]
    # Only the chief saves: a worker killed at its stop deadline does not fail the exit status.
    assert [n.stateless for n in program.nodes if n.group == "learner"] == [False, True]
    bg = s.Background(program, run_dir, backend="local")
    sup = bg.supervisor

    # Both workers update (in lockstep: one strategy), each reporting its own steps.
    s.wait_for(lambda: (s.gauge(run_dir, "learner_steps") or 0) >= 60, 300, "chief steps")
    s.wait_for(
        lambda: (s.gauge(run_dir, "learner_steps_learner_1", "learner_1") or 0) >= 60,
        120,
        "worker 1 steps",
    )
    chief_log, worker_log = s.log_text(run_dir, "learner"), s.log_text(run_dir, "learner_1")
    assert "worker 0 of 2 (chief)" in chief_log and "2 replica(s)" in chief_log
    assert "worker 1 of 2" in worker_log and "2 replica(s)" in worker_log
    s.wait_for(
        lambda: any(f.startswith("ckpt-") for f in os.listdir(f"{run_dir}/checkpoints/learner")),
        120,
        "a chief checkpoint",
    )

    # kill -9 the non-chief worker: the whole group restarts from the chief's checkpoint.
    before = s.gauge(run_dir, "learner_steps")
    os.kill(sup.handles()["learner_1"].pid, signal.SIGKILL)
    s.wait_for(
        lambda: sup.restarts()["learner"] == 1 and sup.restarts()["learner_1"] == 1,
        60,
        "the group restart",
    )
    # Both workers restore (worker 1 may log it a little after the chief).
    s.wait_for(
        lambda: all(
            s.log_text(run_dir, name).count("restored at step") >= 1
            for name in ("learner", "learner_1")
        ),
        240,
        "the group to restore the chief's checkpoint",
    )
    restored = s.log_text(run_dir, "learner_1").split("restored at step ")[-1].split()[0]
    assert int(restored) > 0
    s.wait_for(
        lambda: (s.gauge(run_dir, "learner_steps") or 0) > before + 20, 300, "steps after restart"
    )

    # kill -9 the replay under the group: the workers never reconnect one by one (they
    # could resume at different updates and wait in an all-reduce for ever). Either their
    # datasets resume on the rebound port by themselves, or a worker that sees the loss
    # fails and the group restarts as a whole; either way it steps again (issue 18, 3).
    before = s.gauge(run_dir, "learner_steps")
    os.kill(sup.handles()["replay"].pid, signal.SIGKILL)
    s.wait_for(lambda: sup.restarts()["replay"] == 1, 60, "the replay restart")
    s.wait_for(lambda: (s.gauge(run_dir, "learner_steps") or 0) > before + 20, 300, "steps again")
    outcome = bg.stop()
    assert outcome.reason == "interrupted"
    assert outcome.restarts["learner"] == outcome.restarts["learner_1"] >= 1
    assert "reconnected to the replay" not in s.log_text(run_dir, "learner_1")
    assert "final learner checkpoint" in s.log_text(run_dir, "learner")

    # Only the chief wrote checkpoints and TensorBoard; worker 1 only its log and metrics.
    files = _files(run_dir)
    assert [f for f in files if "learner_1" in f] == [
        "logs/learner_1.log",
        "metrics/learner_1.jsonl",
    ]
    # "launcher": the launcher's run-wide figures (actor weight staleness).
    assert sorted(os.listdir(f"{run_dir}/tensorboard")) == [
        "evaluator",
        "launcher",
        "learner",
        "replay",
    ]
    top = {f.split("/")[0] for f in files}
    assert top == {
        ".nodes.lock",  # Held by the node processes (a relaunch waits for them).
        "checkpoints",
        "logs",
        "metrics",
        "metrics.csv",
        "snapshots",
        "tensorboard",
    }, top
    learner_checkpoints = os.listdir(f"{run_dir}/checkpoints/learner")
    assert all(f == "checkpoint" or f.startswith("ckpt-") for f in learner_checkpoints)


def test_a_learner_group_blocked_without_deadline_restarts_from_the_stall_watchdog(
    tmp_path, capsys
):
    # Issue 18, item 3. A group's workers sample without a deadline and TF 2.15's
    # collectives have none; TF's coordination service aborts them only when a peer stops
    # answering (a SIGSTOPped worker, after the 60 s heartbeat timeout `replication.make`
    # sets). Here every process answers but the group waits for ever: the replay hangs
    # (SIGSTOP). The workers' heartbeats stop, the watchdog restarts the group, and once
    # the replay runs again it steps again.
    run_dir = str(tmp_path / "run")
    program = s.tiny_program(
        num_actors=1,
        checkpoint_every_steps=40,
        learner_workers=2,
        learner_stall_timeout_s=20.0,
        # No weight publication after the first: its 10 s deadline would otherwise see the
        # hung replay first (when the chief happens to be publishing), not the watchdog.
        config={"publish_period": 10**9},
    )
    assert [n.stall_timeout for n in program.nodes if n.group] == [20.0, 20.0]
    bg = s.Background(program, run_dir, backend="local")
    sup = bg.supervisor
    s.wait_for(lambda: (s.gauge(run_dir, "learner_steps") or 0) >= 60, 300, "chief steps")
    replay = sup.handles()["replay"].pid
    os.kill(replay, signal.SIGSTOP)
    try:
        s.wait_for(
            lambda: sup.restarts()["learner"] >= 1 and sup.restarts()["learner_1"] >= 1,
            120,
            "the watchdog's group restart",
        )
    finally:
        os.kill(replay, signal.SIGCONT)
    before = s.gauge(run_dir, "learner_steps")
    s.wait_for(
        lambda: (s.gauge(run_dir, "learner_steps") or 0) > before + 20, 300, "steps after restart"
    )
    outcome = bg.stop()
    err = capsys.readouterr().err
    assert outcome.reason == "interrupted"
    assert outcome.restarts["replay"] == 0
    assert "failed (no heartbeat for" in err, err
    assert "the whole group (learner, learner_1) restarts" in err, err
