"""Distributed D4PG on the Ray backend, on a private local Ray instance (loopback only)."""

import os
import signal

import psutil
import pytest

from tests.launch import d4pg_support as s

# conftest.py keeps Ray on 127.0.0.1 (it would otherwise use the machine's IP).
ray = pytest.importorskip("ray")

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def ray_instance():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_ray_backend_runs_d4pg_and_restarts_a_killed_actor(tmp_path, ray_instance):
    assert ray_instance.startswith("127.0.0.1:")
    run_dir = str(tmp_path / "run")
    bg = s.Background(s.tiny_program(num_actors=2), run_dir, backend="ray")
    sup = bg.supervisor
    handles = s.wait_for(
        lambda: sup.handles() if len(sup.handles()) == 5 else None, 180, "all five node actors"
    )
    assert sup.published["replay_address"].startswith("127.0.0.1:")
    pids = {name: ray.get(h.actor.pid.remote(), timeout=120) for name, h in handles.items()}
    assert os.getpid() not in pids.values() and len(set(pids.values())) == 5

    # Metrics and logs reach the run dir through the launcher.
    s.wait_for(lambda: (s.gauge(run_dir, "learner_steps") or 0) >= 30, 300, "learner steps")
    first = s.wait_for(
        lambda: s.gauge(run_dir, "weights_version_actor_1"), 180, "actor_1 to use learner weights"
    )
    s.wait_for(
        lambda: (s.gauge(run_dir, "weights_version_actor_1") or 0) > first,
        180,
        "actor_1 to pull newer weights",
    )
    assert "running on 127.0.0.1" in s.log_text(run_dir, "learner")

    # kill -9 an actor's worker process: Ray reports the death, the launcher restarts it.
    os.kill(pids["actor_0"], signal.SIGKILL)
    s.wait_for(lambda: sup.restarts()["actor_0"] == 1, 120, "actor_0 to be restarted")
    episodes = len(s.records(run_dir, "actor_0", "episode"))
    s.wait_for(
        lambda: len(s.records(run_dir, "actor_0", "episode")) > episodes,
        180,
        "the restarted actor_0 to act",
    )

    outcome = bg.stop()
    assert outcome.reason == "interrupted"
    assert outcome.progress.gauges["learner_steps"] >= 30
    assert "final learner checkpoint" in s.log_text(run_dir, "learner")
    s.wait_for(
        lambda: not any(_alive(p) for p in pids.values()), 60, "the node actors' processes to exit"
    )


def test_ray_backend_writes_every_record_of_a_stopping_node_once(tmp_path, ray_instance):
    # Issue 18, item 8: the drain in flight when a node ended was dropped, and with it
    # the node's last records (53 sent, 43 written in a reproduction).
    from launch.runtime.program import Node, Program

    del ray_instance
    run_dir = str(tmp_path / "run")
    program = Program("numbers", [Node("numbered", "tests.launch.nodes:numbered")])
    bg = s.Background(program, run_dir, backend="ray")
    s.wait_for(lambda: len(s.records(run_dir, "numbered", "numbered")) >= 300, 180, "records")
    bg.stop()
    numbers = [r["n"] for r in s.records(run_dir, "numbered", "numbered")]
    (last,) = s.records(run_dir, "numbered", "last")
    assert numbers == list(range(last["count"]))
