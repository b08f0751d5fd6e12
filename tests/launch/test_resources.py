"""Each node asks for exactly the devices it uses (GPUs on `local`, requests of a program)."""

import pytest

from launch.runtime import resources
from launch.runtime.errors import LaunchError
from launch.runtime.program import Node, Program, Resources
from tests.launch import d4pg_support as s

pytestmark = pytest.mark.timeout(180)


def test_d4pg_program_requests():
    program = s.tiny_program(
        num_actors=2,
        learner_workers=2,
        learner_gpus=1.0,
        ray_resources={"learner": {"learner_host": 1}, "actor": {"actor_slot": 1}},
    )
    by_name = {n.name: n.resources for n in program.nodes}
    assert by_name["learner"].gpus == by_name["learner_1"].gpus == 1.0
    assert all(by_name[n].gpus == 0 for n in ("replay", "actor_0", "actor_1", "evaluator"))
    assert by_name["learner_1"].custom == {"learner_host": 1}
    assert by_name["actor_0"].custom == {"actor_slot": 1} and by_name["actor_0"].spread
    assert by_name["replay"].custom == {}
    groups = {n.name: n.group for n in program.nodes}
    assert groups["learner"] == groups["learner_1"] == "learner" and groups["actor_0"] == ""
    # One worker: no group, no GPU for a cpu learner.
    single = {n.name: n for n in s.tiny_program().nodes}
    assert single["learner"].group == "" and single["learner"].resources.gpus == 0


def test_learner_gpus_per_worker():
    four = ["0", "1", "2", "3"]
    assert resources.learner_gpus("cpu", 2, "local", []) == 0
    assert resources.learner_gpus("gpu", 2, "local", four) == 2
    assert resources.learner_gpus("gpu:1", 2, "local", four) == 1
    assert resources.learner_gpus("gpu", 1, "ray", None) == 1  # Ray cluster: one unless gpu:N.
    assert resources.learner_gpus("gpu:2", 3, "ray", None) == 2
    with pytest.raises(LaunchError, match="this machine has no GPU"):
        resources.learner_gpus("gpu", 1, "local", [])
    with pytest.raises(LaunchError, match="needs 6 GPUs but this machine has 4"):
        resources.learner_gpus("gpu:3", 2, "local", four)


def test_local_backend_splits_gpus_and_hides_them_from_other_nodes(tmp_path, monkeypatch):
    # No GPU here: the test checks what each process is given, not a GPU run.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert resources.local_gpu_ids() == ["0", "1", "2", "3"]
    node = "tests.launch.nodes:report_env"
    program = Program(
        "gpus",
        [
            Node("learner", node, resources=Resources(gpus=2), group="learner"),
            Node("learner_1", node, resources=Resources(gpus=2), group="learner"),
            Node("actor_0", node),
        ],
    )
    run_dir = str(tmp_path / "run")
    bg = s.Background(program, run_dir, backend="local")
    try:
        envs = s.wait_for(
            lambda: (lambda r: r if len(r) == 3 else None)(s.records(run_dir, kind="env")),
            120,
            "three env records",
        )
    finally:
        bg.stop()
    seen = {r["node"]: r for r in envs}
    assert seen["learner"]["cuda_visible_devices"] == "0,1"
    assert seen["learner_1"]["cuda_visible_devices"] == "2,3"
    assert seen["actor_0"]["cuda_visible_devices"] == ""
    addresses = seen["learner"]["group_addresses"]
    assert addresses == seen["learner_1"]["group_addresses"] and len(set(addresses)) == 2
    assert all(a.startswith("127.0.0.1:") for a in addresses)
    assert seen["actor_0"]["group_addresses"] is None


def test_a_node_asking_for_more_gpus_than_are_free_cannot_start(tmp_path, monkeypatch):
    from launch.runtime.local import LocalBackend
    from launch.runtime.run_dir import RunDir

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    backend = LocalBackend(RunDir(str(tmp_path / "run")))
    try:
        assert (
            backend.node_env(Node("a", "m:f", resources=Resources(gpus=1)))["CUDA_VISIBLE_DEVICES"]
            == "0"
        )
        with pytest.raises(RuntimeError, match="asks for 1 GPU"):
            backend.node_env(Node("b", "m:f", resources=Resources(gpus=1)))
    finally:
        backend.close()
