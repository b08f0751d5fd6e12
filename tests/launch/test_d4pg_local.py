"""Distributed D4PG on the local backend: real processes, Reverb, dm-control; faults.

One scenario (process start-up dominates the cost on 2 cores): run, check learning
plumbing, kill -9 an actor, kill -9 the learner, stop, relaunch the same run dir. Policy
snapshots ride on learner checkpoints only once per `learner_snapshot_every_s`: an hour in
the first launch (only the final checkpoint writes one), every checkpoint in the relaunch.
"""

import os
import re
import signal
import time

import psutil
import pytest

from launch.d4pg import snapshots
from tests.launch import d4pg_support as s

pytestmark = pytest.mark.timeout(600)


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _latest_checkpoint_step(run_dir):
    path = os.path.join(run_dir, "checkpoints", "learner", "checkpoint")
    if not os.path.exists(path):
        return None
    match = re.search(r'model_checkpoint_path: "ckpt-(\d+)"', open(path).read())
    return int(match.group(1)) if match else None


def _restored_step(run_dir, after=0):
    """The step in the first "restored at step N" line after offset `after` of the log."""
    text = s.log_text(run_dir, "learner")[after:]
    match = re.search(r"restored at step (\d+)", text)
    return int(match.group(1)) if match else None


def test_local_d4pg_runs_survives_kills_and_resumes(tmp_path):
    run_dir = str(tmp_path / "run")
    me = psutil.Process()
    bg = s.Background(s.tiny_program(num_actors=2, learner_snapshot_every_s=3600.0), run_dir)
    sup = bg.supervisor

    # Nodes are separate processes, each its own process group.
    handles = s.wait_for(
        lambda: sup.handles() if len(sup.handles()) == 5 else None, 120, "all five nodes to start"
    )
    pids = {name: h.pid for name, h in handles.items()}
    assert len(set(pids.values())) == 5 and os.getpid() not in pids.values()

    # The learner learns and the actors act with ever newer weights.
    s.wait_for(lambda: (s.gauge(run_dir, "learner_steps") or 0) >= 30, 240, "learner steps")
    first = s.wait_for(
        lambda: s.gauge(run_dir, "weights_version_actor_0"), 120, "actor_0 to use learner weights"
    )
    s.wait_for(
        lambda: (s.gauge(run_dir, "weights_version_actor_0") or 0) > first,
        120,
        "actor_0 to pull newer weights",
    )
    assert s.records(run_dir, "evaluator", "eval"), "the evaluator reported no evaluation"

    # kill -9 an actor: it is restarted and acting continues.
    os.kill(pids["actor_0"], signal.SIGKILL)
    s.wait_for(lambda: sup.restarts()["actor_0"] == 1, 60, "actor_0 to be restarted")
    episodes_before = len(s.records(run_dir, "actor_0", "episode"))
    s.wait_for(
        lambda: len(s.records(run_dir, "actor_0", "episode")) > episodes_before,
        180,
        "the restarted actor_0 to finish an episode",
    )

    # kill -9 the learner after a checkpoint: it resumes from it, the step count kept.
    saved = s.wait_for(lambda: _latest_checkpoint_step(run_dir), 120, "a learner checkpoint")
    log_offset = len(s.log_text(run_dir, "learner"))
    os.kill(sup.handles()["learner"].pid, signal.SIGKILL)
    s.wait_for(lambda: sup.restarts()["learner"] == 1, 60, "the learner to be restarted")
    restored = s.wait_for(
        lambda: _restored_step(run_dir, log_offset), 180, "the learner to restore"
    )
    assert restored >= saved > 0
    s.wait_for(
        lambda: (s.gauge(run_dir, "learner_steps") or 0) > restored,
        120,
        "the learner to continue after its restore",
    )

    # Stop everything: within seconds, nothing left behind.
    t0 = time.monotonic()
    outcome = bg.stop()
    assert time.monotonic() - t0 < 60
    assert outcome.reason == "interrupted"
    assert not me.children(recursive=True), me.children(recursive=True)
    for pid in pids.values():
        assert not _alive(pid)
    final_steps = _latest_checkpoint_step(run_dir)
    replay_size = s.gauge(run_dir, "replay_size", "replay")
    assert final_steps >= restored and replay_size > 0
    assert "final replay checkpoint" in s.log_text(run_dir, "replay")
    # Checkpoints every 50 updates, but within the hour only the final one wrote a snapshot.
    assert snapshots.kept_steps(run_dir) == [final_steps]

    # Relaunch with the same run dir: learner steps, weights and replay continue.
    episodes_before = len(s.records(run_dir, "actor_0", "episode"))
    log_offset = len(s.log_text(run_dir, "learner"))
    replay_offset = len(s.log_text(run_dir, "replay"))
    bg = s.Background(s.tiny_program(num_actors=1, learner_snapshot_every_s=1e-3), run_dir)
    assert (
        s.wait_for(
            lambda: _restored_step(run_dir, log_offset), 180, "the relaunched learner to restore"
        )
        == final_steps
    )
    restored_size = s.wait_for(
        lambda: re.search(
            r"(\d+) transitions restored", s.log_text(run_dir, "replay")[replay_offset:]
        ),
        60,
        "the replay restore line",
    )
    assert int(restored_size.group(1)) == replay_size
    # Actors act with the restored weights (published at the restored step), not new ones.
    new_episodes = s.wait_for(
        lambda: s.records(run_dir, "actor_0", "episode")[episodes_before:],
        180,
        "an episode of the relaunched actor_0",
    )
    assert new_episodes[0]["weights_version"] >= final_steps
    # A period shorter than the checkpoints': a snapshot with a checkpoint before the stop.
    s.wait_for(
        lambda: max(snapshots.kept_steps(run_dir)) > final_steps,
        120,
        "a snapshot written with a learner checkpoint of the relaunch",
    )
    outcome = bg.stop()
    assert outcome.progress.totals["actor_steps"] > 0
    assert not me.children(recursive=True)
