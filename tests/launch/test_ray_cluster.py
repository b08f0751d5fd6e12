"""Distributed D4PG on a real 3-node Ray cluster on this machine (loopback IPs only).

Each Ray node is its own raylet with its own CPUs, its own custom resources and its
own loopback IP (127.0.0.1, .2, .3: Linux routes all of 127/8 to the loopback
interface), so addresses advertised from the wrong node would not be the node's.
The launch runs as a user would: `replicator launch d4pg --ray-address ...` in a
subprocess, with per-role resources; a raylet is removed mid-run.
"""

import os
import re
import subprocess
import sys
import time

import pytest

from tests.launch import d4pg_support as s

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.timeout(900)

# Learner workers and actors spread over B and C; the replay alone on the head A.
HEAD = {"num_cpus": 2, "resources": {"replay_host": 1}, "node_ip_address": "127.0.0.1"}
NODE_B = {
    "num_cpus": 3,
    "resources": {"learner_host": 1, "actor_slot": 1},
    "node_ip_address": "127.0.0.2",
}
NODE_C = {
    "num_cpus": 6,
    "resources": {"learner_host": 2, "actor_slot": 2},
    "node_ip_address": "127.0.0.3",
}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(
        initialize_head=True,
        head_node_args={**HEAD, "include_dashboard": False},
        shutdown_at_exit=True,
    )
    try:
        b = c.add_node(**NODE_B)
        cc = c.add_node(**NODE_C)
        c.wait_for_nodes()
        yield c, {"A": c.head_node.node_id, "B": b.node_id, "C": cc.node_id}, b
    finally:
        c.shutdown()


def _cli(*args, timeout=600):
    return subprocess.Popen(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=s.REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": s.REPO},
    )


def _starts(run_dir, node):
    """(ip, Ray node id) of each start of `node`, in order."""
    text = s.log_text(run_dir, node)
    return re.findall(r"running on (\S+) \(Ray node (\w+), pid", text)


def test_d4pg_on_three_ray_nodes_survives_a_lost_raylet(cluster, tmp_path):
    c, ids, node_b = cluster
    run_dir = str(tmp_path / "run")
    launch = _cli(
        "launch", "d4pg", "--backend", "ray", "--ray-address", c.address,
        "--bind-host", "0.0.0.0", "--env", s.TASK, "--actors", "2",
        "--learner-workers", "2", "--steps", "9000", "--run-dir", run_dir,
        "--checkpoint-every", "40", "--eval-every", "5", "--eval-episodes", "1",
        "--progress-every", "5",
        "--ray-resources", "replay=replay_host:1",
        "--ray-resources", "learner=learner_host:1",
        "--ray-resources", "actor=actor_slot:1",
        *s.TINY_FLAGS,
    )  # fmt: skip
    try:
        s.wait_for(
            lambda: (
                (s.gauge(run_dir, "learner_steps") or 0) >= 60
                and os.path.isdir(f"{run_dir}/checkpoints/learner")
                and any(f.startswith("ckpt-") for f in os.listdir(f"{run_dir}/checkpoints/learner"))
            ),
            400,
            "the learner group to step and checkpoint",
        )
        # Placement by resources: replay on A; the learner workers and actors on B and C.
        assert _starts(run_dir, "replay") == [("127.0.0.1", ids["A"])]
        learners = [_starts(run_dir, n)[0] for n in ("learner", "learner_1")]
        actors = [_starts(run_dir, n)[0] for n in ("actor_0", "actor_1")]
        assert sorted(learners) == sorted([("127.0.0.2", ids["B"]), ("127.0.0.3", ids["C"])])
        assert sorted(actors) == sorted(learners)  # spread: one per node with a slot
        # Addresses come from the node each server runs on.
        chief = s.log_text(run_dir, "learner")
        assert "replay at 127.0.0.1:" in chief
        group = re.search(r"; group (\S+), (\S+)", chief).groups()
        assert sorted(a.rsplit(":", 1)[0] for a in group) == ["127.0.0.2", "127.0.0.3"]
        on_b = [n for n, (ip, _) in zip(["learner", "learner_1"], learners) if ip == "127.0.0.2"]

        c.remove_node(node_b)  # Its raylet and every worker on it die.
        removed_at = time.time()
        s.wait_for(lambda: len(_starts(run_dir, on_b[0])) >= 2, 300, "the lost worker to come back")
        out, _ = launch.communicate(timeout=500)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    (tmp_path / "launch.out").write_text(out)
    assert launch.returncode == 0, out[-4000:]
    assert "Finished: " in out
    assert re.search(r"group 'learner': \w+ failed", out), out[-4000:]
    # Every node started after the removal ran on a surviving Ray node.
    for node in ("learner", "learner_1", "actor_0", "actor_1", "evaluator", "replay"):
        for ip, node_id in _starts(run_dir, node)[1:]:
            assert node_id in (ids["A"], ids["C"]) and ip != "127.0.0.2", (node, ip)
    assert _starts(run_dir, "learner")[-1] == ("127.0.0.3", ids["C"])
    # The group resumed from the chief's checkpoint and kept learning to the budget.
    restored = re.findall(r"restored at step (\d+)", s.log_text(run_dir, "learner"))
    assert restored and int(restored[-1]) > 0
    final = re.findall(r"final learner checkpoint at step (\d+)", s.log_text(run_dir, "learner"))
    assert final and int(final[-1]) > int(restored[-1]), out[-4000:]
    steps_after = [r for r in s.records(run_dir, "actor_0", "count") if r["t"] > removed_at + 1] + [
        r for r in s.records(run_dir, "actor_1", "count") if r["t"] > removed_at + 1
    ]
    assert steps_after, "no actor stepped after the raylet was removed"


def test_cluster_refusals(cluster, tmp_path):
    c, _, _ = cluster
    run_dir = str(tmp_path / "run")
    base = ["launch", "d4pg", "--backend", "ray", "--run-dir", run_dir, *s.TINY_FLAGS]
    cases = [
        # Default loopback advertising on a cluster whose nodes have several IPs.
        ([*base, "--ray-address", c.address], "Pass --bind-host 0.0.0.0"),
        # A GPU learner on a cluster without GPUs (checked against the cluster's nodes).
        (
            [
                *base,
                "--ray-address",
                c.address,
                "--bind-host",
                "0.0.0.0",
                "--learner-replicas",
                "gpu",
            ],
            "no node of the Ray cluster can host node 'learner'",
        ),
        # A bind IP no Ray node has; $RAY_ADDRESS stands for --ray-address.
        ([*base, "--bind-host", "127.0.0.9"], "--bind-host 127.0.0.9 is not the IP of any node"),
    ]
    for args, message in cases:
        env = {**os.environ, "PYTHONPATH": s.REPO, "RAY_ADDRESS": c.address}
        proc = subprocess.run(
            [sys.executable, "-m", "launch.cli", *args],
            cwd=s.REPO,
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        ours = [line for line in proc.stderr.splitlines() if line.startswith("replicator: error")]
        assert proc.returncode == 2 and len(ours) == 1 and message in ours[0], proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert not os.path.exists(run_dir)


DRIVER = r"""
import sys
from launch.runtime import launcher
from launch.runtime.program import Node, Program, Resources
from tests.launch import d4pg_support as s

address, run_dir = sys.argv[1], sys.argv[2]
node = "tests.launch.nodes:report_env"
program = Program("gpus", [
    Node("gpu_node", node, resources=Resources(cpus=0.5, gpus=1, custom={"gpu_box": 1})),
    Node("cpu_node", node, resources=Resources(cpus=0.5, custom={"gpu_box": 1})),
])
outcome = launcher.run(
    program, run_dir, "ray", ray_address=address, bind_host="0.0.0.0", progress_every=0,
    stop_when=lambda p: len(s.records(run_dir, kind="env")) >= 2,
)
print(outcome.reason)
"""


def test_ray_gives_a_gpu_request_its_gpu_and_none_to_others(cluster, tmp_path):
    # Ray counts declared GPUs, so a node declaring one stands in for a GPU machine here.
    c, _, _ = cluster
    gpu_box = c.add_node(
        num_cpus=1, num_gpus=1, resources={"gpu_box": 2}, node_ip_address="127.0.0.4"
    )
    try:
        run_dir = str(tmp_path / "run")
        proc = subprocess.run(
            [sys.executable, "-c", DRIVER, c.address, run_dir],
            cwd=s.REPO,
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "PYTHONPATH": s.REPO},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        seen = {r["node"]: r for r in s.records(run_dir, kind="env")}
        assert seen["gpu_node"]["ray_node_id"] == seen["cpu_node"]["ray_node_id"] == gpu_box.node_id
        assert seen["gpu_node"]["cuda_visible_devices"] == "0"
        assert seen["cpu_node"]["cuda_visible_devices"] == ""  # Not unset: TF would take all.
    finally:
        c.remove_node(gpu_box)


def test_a_node_without_the_dependencies_is_refused(cluster):
    from launch.runtime.errors import LaunchError
    from launch.runtime.ray_cluster import check_dependencies, code_runtime_env

    c, _, _ = cluster
    ray.init(address=c.address, runtime_env=code_runtime_env(), log_to_driver=False)
    try:
        alive = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
        check_dependencies(ray)  # This machine's nodes have everything.
        with pytest.raises(LaunchError) as error:
            check_dependencies(ray, modules=("tensorflow", "no_such_package_here"))
    finally:
        ray.shutdown()
    message = str(error.value)
    assert message.count("lacks no_such_package_here") == len(alive) >= 2  # One per node.
    assert all(f"{ip} lacks" in message for ip in alive)
    assert "tensorflow" not in message.split("lacks")[1]
