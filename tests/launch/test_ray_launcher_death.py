"""A killed launcher on a Ray cluster: its nodes save, then leave no actor behind.

Issue 18, item 7: Ray actors die with the driver that owns them, so `kill -9` of the
launcher took every node with it, without a final save. On a cluster the launcher
connects to (`--ray-address`), node actors are now detached and watch the launcher's
heartbeat (`launch.runtime.ray_heartbeat`). The assertions mirror the local backend's
test (`test_d4pg_faults.py::test_kill_9_of_the_launcher_leaves_final_checkpoints_and_no_orphan`).
"""

import collections
import fcntl
import os
import re
import time

import psutil
import pytest

from tests.launch import d4pg_cli_support as c
from tests.launch import d4pg_support as s

# conftest.py keeps Ray on 127.0.0.1 (it would otherwise use the machine's IP).
ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from launch.runtime.ray_cluster import code_runtime_env  # noqa: E402
from launch.runtime.ray_heartbeat import NAMESPACE  # noqa: E402
from launch.runtime.ray_node import RayNode  # noqa: E402

pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def cluster():
    """A one-node cluster that is not the launcher's (it outlives the launcher), and a
    driver connection of the test's own to look at its actors."""
    head = {"num_cpus": 6, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    cl = Cluster(initialize_head=True, head_node_args=head, shutdown_at_exit=True)
    try:
        ray.init(address=cl.address, log_to_driver=False, runtime_env=code_runtime_env())
        yield cl.address
    finally:
        ray.shutdown()
        cl.shutdown()


def _run_actors():
    """Names of the live node actors of any launch (the backend's namespace)."""
    return sorted(
        a["name"]
        for a in ray.util.list_named_actors(all_namespaces=True)
        if a["namespace"] == NAMESPACE
    )


def _nodes_lock_free(run_dir):
    """Whether no node holds the run directory's nodes lock (a relaunch waits for them)."""
    fd = os.open(os.path.join(run_dir, ".nodes.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # Also releases the lock.


def _lock_holders(run_dir):
    """(pid, ppid, status, command) of each process holding the nodes lock (/proc/locks)."""
    ino = os.stat(os.path.join(run_dir, ".nodes.lock")).st_ino
    out = []
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 5 and parts[5].endswith(f":{ino}"):
                try:
                    p = psutil.Process(int(parts[4]))
                    out.append((p.pid, p.ppid(), p.status(), " ".join(p.cmdline())[:200]))
                except psutil.NoSuchProcess:
                    out.append((parts[4], "gone"))
    return out


def _node_pids(run_dir, node):
    return [int(p) for p in re.findall(r"\(Ray node \w+, pid (\d+)\)", s.log_text(run_dir, node))]


def test_a_killed_launcher_lets_ray_nodes_save_and_leaves_no_actor(cluster, tmp_path):
    run_dir = str(tmp_path / "run")
    args = ["--backend", "ray", "--ray-address", cluster]
    with c.running_cli(run_dir, *args, steps=100_000) as proc:
        s.wait_for(lambda: (s.gauge(run_dir, "learner_steps") or 0) >= 20, 300, "learner steps")
        names = _run_actors()
        assert len(names) == 4 and any("-learner-" in n for n in names), names
        pids = [
            p for n in ("learner", "replay", "actor_0", "evaluator") for p in _node_pids(run_dir, n)
        ]
        offsets = {n: len(s.log_text(run_dir, n)) for n in ("learner", "replay")}
        assert not _nodes_lock_free(run_dir)  # The node actors hold it, as local nodes do.
        killed_at = time.time()
        proc.kill()
        proc.wait()
    # Each node hears no heartbeat, stops, saves, and ends its detached actor.
    s.wait_for(lambda: not _run_actors(), 150, "every node actor of the run to end")
    s.wait_for(lambda: not any(c.alive(p) for p in pids), 30, "the node processes to exit")
    # Released with the last node process (a relaunch may start then); seen once still
    # held for a moment after every node process had ended, so waited for.
    try:
        s.wait_for(lambda: _nodes_lock_free(run_dir), 30, "the nodes lock to be free")
    except AssertionError as e:
        raise AssertionError(f"{e}; held by {_lock_holders(run_dir)}") from None
    learner, _ = s.assert_final_saves_after(run_dir, offsets, killed_at)
    assert "the launcher is gone" in learner, learner
    # Every record of every node once: what the dead launcher had drained but not yet
    # written, and what came after, the nodes wrote themselves (duplicates are dropped
    # by (src, seq) when read).
    seqs = collections.defaultdict(set)
    for r in s.records(run_dir):
        if r["node"] != "launcher":  # The launcher's own progress records have no seq.
            seqs[r["src"]].add(r["seq"])
    gaps = {src: sorted(set(range(1, max(v) + 1)) - v)[:5] for src, v in seqs.items()}
    assert not any(gaps.values()), gaps


def test_a_silent_launcher_whose_job_lives_does_not_stop_its_nodes(cluster):
    # Heartbeats can come late on a loaded machine (a node loading TensorFlow stalls for
    # seconds): a node stops only when Ray also says the launcher's job is not alive.
    # Here the test is the launcher: alive, but it sends no heartbeat at all.
    del cluster
    actor = (
        ray.remote(RayNode)
        .options(lifetime="detached", name="silent-launcher", namespace=NAMESPACE)
        .remote(1.0)  # A one-second grace.
    )
    pid = ray.get(actor.pid.remote(), timeout=120)
    try:
        time.sleep(5)
        assert ray.get(actor.pid.remote(), timeout=60) == pid
    finally:
        ray.kill(actor)
