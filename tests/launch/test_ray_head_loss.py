"""A lost Ray head: every node saves before Ray ends the cluster, and the launcher says so.

Issue 18, item 7: without GCS fault tolerance, Ray ends every raylet, worker and driver
that cannot reach the GCS for 60 s, so the run's nodes died mid-step with no final
save and the launcher exited with Ray's own fatal log. Now the nodes and the launcher
watch the GCS (`launch.runtime.ray_head_watch`): the nodes stop and save, the launcher
restarts nothing and prints one line that says what happened and how to resume.

The runs are small programs (a node that saves when stopped, and a counter) rather than
D4PG: what is tested is the stop, and the D4PG nodes' saves on a stop are tested in
`test_ray_launcher_death.py` and the local fault tests.
"""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading

import psutil
import pytest

from launch.runtime.ray_head_watch import HeadWatch, gcs_answers
from tests.launch import d4pg_support as s

# conftest.py keeps Ray on 127.0.0.1 (it would otherwise use the machine's IP).
ray = pytest.importorskip("ray")
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402


def _serving_socket():
    """A server that accepts and closes every connection, as a live GCS accepts them."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # Closed.
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.timeout(60)
def test_the_head_watch_fires_once_the_gcs_port_stops_answering_and_not_before():
    server, address = _serving_socket()
    lost = []
    fired = threading.Event()

    def on_lost(silence):
        lost.append(silence)
        fired.set()

    watch = HeadWatch(address, on_lost, grace=1.0, interval=0.1)
    try:
        # Answered: never lost.
        assert not fired.wait(2.5)
        assert gcs_answers(address)
        server.close()
        assert fired.wait(10), "the watch did not notice the closed port"
        assert len(lost) == 1 and lost[0] >= 1.0
        assert not gcs_answers(address)
    finally:
        watch.close()
        server.close()


DRIVER = r"""
import sys
from launch.runtime import launcher
from launch.runtime.program import Node, Program

from launch.runtime import ray_head_watch

address, run_dir = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:  # The launcher's own watch only (the nodes keep the default).
    ray_head_watch.HEAD_GRACE_S = float(sys.argv[3])
program = Program("head-loss", [
    Node("saver", "tests.launch.nodes:slow_saver", {"save_s": 1.0}),
    Node("counter", "tests.launch.nodes:counter"),
])
outcome = launcher.run(program, run_dir, "ray", ray_address=address, progress_every=0)
print("OUTCOME", outcome.reason, outcome.message, flush=True)
sys.exit(0 if outcome.reason == "finished" else 1)
"""


@contextlib.contextmanager
def _headed_run(run_dir, launcher_grace=None):
    """The driver on a one-node cluster of its own; yields (launcher, gcs process) once the
    saver runs. The test process never connects to the cluster: Ray would end it too."""
    head = {"num_cpus": 4, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head, shutdown_at_exit=False)
    out = open(run_dir + ".out", "w")
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, cluster.address, run_dir]
        + ([str(launcher_grace)] if launcher_grace else []),
        cwd=s.REPO,
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": s.REPO},
    )
    try:
        gcs = cluster.head_node.all_processes[ray_constants.PROCESS_TYPE_GCS_SERVER][0].process
        s.wait_for(lambda: _saver_pid(run_dir) is not None, 120, "the saver to run")
        yield proc, gcs
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        try:
            cluster.shutdown()
        except Exception:  # pylint: disable=broad-except
            pass  # Its GCS is gone; its raylet ends by itself.


def _saver_pid(run_dir):
    if not os.path.exists(os.path.join(run_dir, "logs", "saver.log")):
        return None
    found = re.findall(r"\(Ray node \w+, pid (\d+)\)", s.log_text(run_dir, "saver"))
    return int(found[0]) if found else None


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("launcher_grace", [None, 20.0], ids=["default", "nodes-first"])
def test_a_lost_ray_head_lets_every_node_save_and_the_launcher_say_so(tmp_path, launcher_grace):
    # "nodes-first": the launcher's own watch waits 20 s, so the nodes stop for the loss
    # before it knows (as a loaded launcher may): their exits must not count as failures.
    run_dir = str(tmp_path / "run")
    with _headed_run(run_dir, launcher_grace) as (proc, gcs):
        pid = _saver_pid(run_dir)
        gcs.send_signal(signal.SIGKILL)
        gcs.wait()
        # The launcher ends by itself, before Ray's 60 s deadline would end it.
        code = proc.wait(timeout=45)
        with open(run_dir + ".out") as f:
            out = f.read()
        assert code == 1 and "OUTCOME failed the Ray head is unreachable" in out, out
        assert f"relaunch with --run-dir {run_dir}" in out, out
        assert "Failed to connect to GCS" not in out, out  # Not Ray's own fatal exit.
        assert "restart #" not in out, out  # Nothing restarted into a headless cluster.
        assert os.path.exists(os.path.join(run_dir, "saved.txt"))
        # The saver's actor outlives the launcher (Ray cannot kill it without the head);
        # once it has ended, nothing the launcher wrote has been written again.
        s.wait_for(lambda: _gone(pid), 70, "the saver's process to end")
        assert s.log_text(run_dir, "saver").count("the Ray head is unreachable") == 1


@pytest.mark.timeout(300)
def test_nodes_that_lose_the_head_and_their_launcher_together_still_save(tmp_path):
    # The launcher usually runs on the head machine: both go at once. The nodes hear
    # neither, and must not wait on the GCS to decide.
    run_dir = str(tmp_path / "run")
    with _headed_run(run_dir) as (proc, gcs):
        proc.kill()
        gcs.send_signal(signal.SIGKILL)
        proc.wait()
        gcs.wait()
        saved = os.path.join(run_dir, "saved.txt")
        s.wait_for(lambda: os.path.exists(saved), 55, "the saver's save (Ray ends it at 60 s)")
        s.wait_for(lambda: "the Ray head is unreachable" in s.log_text(run_dir, "saver"), 30, "log")
