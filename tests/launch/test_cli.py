"""The `replicator` CLI: a short real launch, evaluate, plot, resume rules, bad input."""

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from launch import cli
from launch.cli import d4pg_flags
from launch.runtime.run_dir import LOCK_FILES
from tests.launch import d4pg_support as s

pytestmark = pytest.mark.timeout(600)


def _run(*args, env=None, timeout=400):
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=s.REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return proc.returncode, proc.stdout, proc.stderr


def _snapshot(root):
    """Every file under `root` with its size, mtime and content hash."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            with open(path, "rb") as f:
                out[path] = (st.st_size, st.st_mtime_ns, hashlib.sha1(f.read()).hexdigest())
    return out


def _error_line(capsys):
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    return captured.err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("cli") / "run")
    code, out, err = _run(
        "launch",
        "d4pg",
        "--backend",
        "local",
        "--env",
        s.TASK,
        "--actors",
        "1",
        "--steps",
        "1200",
        "--run-dir",
        run_dir,
        "--eval-every",
        "2",
        "--eval-episodes",
        "1",
        "--checkpoint-every",
        "50",
        "--progress-every",
        "2",
        *s.TINY_FLAGS,
    )
    assert code == 0, out + err
    return run_dir, out


def test_launch_writes_the_run_directory(finished_run):
    run_dir, out = finished_run
    assert f"Run directory: {run_dir}" in out
    assert "Finished: " in out and "actor steps" in out
    # The summary says which evaluation its return is: steps and episodes.
    assert re.search(r"last eval return -?[\d.]+ @ [\d,]+ actor steps \(1 episode\)\.", out), out
    for name in (
        "run.json",
        "config.json",
        "metrics.csv",
        "logs/learner.log",
        "logs/replay.log",
        "logs/actor_0.log",
        "logs/evaluator.log",
        "checkpoints/learner/checkpoint",
    ):
        assert os.path.exists(os.path.join(run_dir, name)), name
    assert os.listdir(os.path.join(run_dir, "checkpoints", "replay"))
    for node in ("learner", "evaluator"):
        events = os.listdir(os.path.join(run_dir, "tensorboard", node))
        assert any(e.startswith("events.out.tfevents") for e in events), node
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        header, *rows = f.read().splitlines()
    assert header.startswith("wall_time_s,unix_time,actor_steps,learner_steps")
    assert rows


def test_evaluate_prints_return_and_writes_video(finished_run):
    run_dir, _ = finished_run
    video = os.path.join(run_dir, "episode.gif")
    code, out, err = _run("evaluate", "--run-dir", run_dir, "--episodes", "2", "--video", video)
    assert code == 0, out + err
    assert "return over 2 episode(s): mean" in out
    assert os.path.getsize(video) > 1000


def test_plot_writes_png(finished_run):
    run_dir, _ = finished_run
    assert cli.main(["plot", "--run-dir", run_dir]) == 0
    with open(os.path.join(run_dir, "eval_return.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_relaunch_rules_leave_the_run_untouched(finished_run, capsys):
    run_dir, _ = finished_run
    before = _snapshot(run_dir)
    # Another task: refused, with what to do.
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--env", "walker:walk"]) == 2
    err = _error_line(capsys)
    assert "holds a different run" in err and "task" in err and "new --run-dir" in err
    # A config that changes the networks: refused.
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--config.policy_layers=8"]) == 2
    assert "config.policy_layers" in _error_line(capsys)
    # Budget already spent: nothing to do, and says how to continue.
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--steps", "1000"]) == 0
    assert "pass a larger --steps" in capsys.readouterr().out
    after = _snapshot(run_dir)
    changed = {p for p in before if before[p] != after.get(p)}
    assert changed <= {os.path.join(run_dir, f) for f in LOCK_FILES}, changed


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--env", "cartpole:swingupp"], 2, "Did you mean: cartpole:swingup"),
        (["--backend", "slurm"], 2, "invalid choice: 'slurm'"),
        (["--learner-replicas", "cpu:x"], 2, "Valid forms"),
        (["--config.batch_sise=32"], 2, "Unknown D4PG config key(s) ['batch_sise']"),
        (["--config.batch_size=abc"], 2, "Bad value for D4PG config key 'batch_size'"),
        (["--learner-replicas", "cpu:3"], 2, "must be divisible by the 3 learner replicas"),
        (["--ray-address", "127.0.0.1:1"], 2, "--ray-address only applies to --backend ray"),
        (["--actors", "0"], 2, "--actors must be at least 1"),
        (["--learner-workers", "0"], 2, "--learner-workers must be at least 1"),
        (["--learner-stall-timeout", "-1"], 2, "--learner-stall-timeout must be 0 (never)"),
        (["--learner-intra-op-threads", "-1"], 2, "--learner-intra-op-threads must be >= 0"),
        (["--learner-workers", "2", "--learner-replicas", "cpu:2"], 2, "one CPU device per"),
        (["--learner-workers", "3"], 2, "divisible by the 3 learner replicas (3 worker(s)"),
        (["--learner-workers", "2", "--backend", "threads"], 2, "use --backend local or ray"),
        (["--learner-replicas", "ps"], 2, "use --learner-workers K"),
        (["--learner-replicas", "multiworker"], 2, "use --learner-workers K"),
        (["--learner-replicas", "tpu"], 2, "use --learner-workers K"),
        (["--ray-resources", "learner=h:1"], 2, "--ray-resources only applies to --backend ray"),
        (["--backend", "ray", "--ray-resources", "gpu=h:1"], 2, "ROLE one of replay"),
        (
            ["--preset", "paper", "--config.sigma_final_scale=0.5"],
            2,
            "sigma_final_scale follows the learning rates' decay",
        ),
    ],
)
def test_bad_launch_input(tmp_path, capsys, args, code, message):
    run_dir = str(tmp_path / "run")
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, *args]) == code
    err = _error_line(capsys)
    assert message in err
    assert len(err.strip().splitlines()) == 1 or "Valid forms" in err
    assert not os.path.exists(run_dir)


def test_port_in_use(tmp_path, capsys):
    with socket.socket(socket.AF_INET6) as held:
        held.bind(("::", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert (
            cli.main(
                ["launch", "d4pg", "--run-dir", str(tmp_path / "run"), "--replay-port", str(port)]
            )
            == 2
        )
    assert f"--replay-port {port} is already in use" in _error_line(capsys)
    assert not os.path.exists(tmp_path / "run")


def test_a_port_left_in_time_wait_counts_as_free():
    # Issue 18, item 13: a relaunch right after a clean stop found the replay's port in
    # TIME_WAIT and exited 2, though the replay (gRPC, SO_REUSEADDR) could bind it.
    with socket.socket(socket.AF_INET6) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # As gRPC's servers.
        server.bind(("::", 0))
        server.listen(1)
        port = server.getsockname()[1]
        client = socket.create_connection(("::1", port))
        conn, _ = server.accept()
        conn.close()  # The side closing first keeps the connection in TIME_WAIT.
        client.close()
    d4pg_flags.check_port_free(port)  # Nothing listens: no error.


def test_ray_unreachable(tmp_path, capsys):
    with socket.socket() as sock:  # A port nobody listens on.
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert (
        cli.main(
            [
                "launch",
                "d4pg",
                "--backend",
                "ray",
                "--ray-address",
                f"127.0.0.1:{port}",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 1
    )
    err = _error_line(capsys)
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err and "ray start --head" in err
    assert not os.path.exists(tmp_path / "run")


def _stored_run(tmp_path, settings):
    """A run directory whose launch.json holds `settings` (as if edited by hand)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "launch.json").write_text(json.dumps({"settings": settings, "history": []}))
    return str(run_dir)


def test_a_hand_edited_launch_json_of_the_wrong_type_is_one_clear_line(tmp_path, capsys):
    run_dir = _stored_run(tmp_path, {"actors": "4"})
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir]) == 2
    err = _error_line(capsys)
    assert 'has actors = "4", which should be a int' in err and len(err.splitlines()) == 1


def test_ray_address_of_the_environment_beats_the_stored_one(
    finished_run, tmp_path, capsys, monkeypatch
):
    ports = []
    for _ in range(2):  # Ports nobody listens on.
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    stored, current = (f"127.0.0.1:{p}" for p in ports)
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run[0], run_dir)
    with open(os.path.join(run_dir, "launch.json")) as f:
        launch = json.load(f)
    launch["settings"].update(backend="ray", ray_address=stored, steps=10**6)
    with open(os.path.join(run_dir, "launch.json"), "w") as f:
        json.dump(launch, f)
    monkeypatch.setenv("RAY_ADDRESS", current)  # The cluster moved since the last launch.
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir]) == 1
    assert f"cannot reach a Ray cluster at {current}" in _error_line(capsys)


def test_ray_not_installed(tmp_path):
    # An environment where `import ray` fails, as it does when Ray is not installed.
    fake = tmp_path / "no_ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    code, out, err = _run(
        "launch",
        "d4pg",
        "--backend",
        "ray",
        "--run-dir",
        str(tmp_path / "run"),
        env={"PYTHONPATH": f"{fake.parent}{os.pathsep}{s.REPO}"},
    )
    assert code == 2, out + err
    assert "needs Ray, which is not installed" in err and "pip install" in err
    assert "Traceback" not in err
    assert not os.path.exists(tmp_path / "run")


def test_evaluate_and_plot_need_a_run(tmp_path, capsys):
    empty = str(tmp_path)
    assert cli.main(["evaluate", "--run-dir", empty]) == 2
    assert "is not a D4PG run directory" in _error_line(capsys)
    assert cli.main(["plot", "--run-dir", empty]) == 1
    assert "has no evaluation yet" in _error_line(capsys)


def test_list_tasks(capsys):
    assert cli.main(["list-tasks"]) == 0
    assert "cartpole:swingup" in capsys.readouterr().out.split()


def test_train_subcommands_come_from_vision(capsys):
    import importlib.util

    have = [
        m
        for m in ("vision.resnet.cli", "vision.sngan.cli")
        if importlib.util.find_spec(m) is not None
    ]
    code = cli.main(["train", "--help"])
    captured = capsys.readouterr()
    if have:
        assert code == 0
        for name, module in (("resnet50", "vision.resnet.cli"), ("sngan", "vision.sngan.cli")):
            assert (name in captured.out) == (module in have)
    else:
        assert code == 2 and "needs the vision trainers" in captured.err


def test_show_config_prints_effective_flags(capsys):
    assert cli.main(["launch", "d4pg", "--show-config", "--config.sigma=0.2"]) == 0
    lines = capsys.readouterr().out.split()
    assert "--config.sigma=0.2" in lines and "--config.policy_layers=64,64" in lines
    assert "--config.transitions_per_item=16" in lines  # Resolved, as the run stores it.
    # The quick preset guards against a saturated policy; the paper preset is Acme's.
    assert "--config.policy_preactivation_penalty=0.0001" in lines
    assert "--config.lr_decay_updates=50000" in lines  # Over the 100k-step budget; Acme: 0.
    assert "--config.lr_decay_start_fraction=0.5" in lines  # Held for the first half.
    assert cli.main(["launch", "d4pg", "--preset", "paper", "--show-config"]) == 0
    paper = capsys.readouterr().out.split()
    assert "--config.policy_layers=256,256,256" in paper
    assert "--config.policy_preactivation_penalty=0.0" in paper
    assert "--config.lr_decay_updates=0" in paper
    assert "--config.lr_decay_start_fraction=0.0" in paper


def test_finger_spin_gets_the_presets_task_values_under_the_users_flags(capsys):
    """The quick preset's finger:spin values apply on features, under --config flags."""

    def shown(*flags: str) -> list[str]:
        assert cli.main(["launch", "d4pg", "--show-config", *flags]) == 0
        return capsys.readouterr().out.split()

    finger = shown("--env", "finger:spin")
    assert "--config.critic_layers=256,256" in finger
    assert "--config.samples_per_insert=64.0" in finger
    assert "--config.lr_decay_updates=100000" in finger  # Its own updates in the budget.
    overridden = shown("--env", "finger:spin", "--config.samples_per_insert=32")
    assert "--config.samples_per_insert=32.0" in overridden
    assert "--config.critic_layers=256,256" in overridden  # The other value stays.
    for flags in (
        ("--env", "cheetah:run"),
        ("--env", "finger:spin", "--config.from_pixels=true"),
        ("--env", "finger:spin", "--preset", "paper"),
    ):
        lines = shown(*flags)
        assert "--config.samples_per_insert=32.0" in lines, flags
        assert "--config.critic_layers=256,256" not in lines, flags


def test_gpu_spec_without_gpus(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # No GPU, whatever the machine has.
    for spec in ("gpu", "gpu:1"):
        run_dir = str(tmp_path / spec.replace(":", "-"))
        assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--learner-replicas", spec]) == 2
        err = _error_line(capsys)
        assert "this machine has no GPU" in err and len(err.strip().splitlines()) == 1
        assert not os.path.exists(run_dir)


def test_bad_scale_out_input_leaves_an_existing_run_untouched(finished_run, capsys, monkeypatch):
    run_dir, _ = finished_run
    before = _snapshot(run_dir)
    base = ["launch", "d4pg", "--run-dir", run_dir, "--steps", "100000"]
    assert cli.main([*base, "--learner-workers", "0"]) == 2
    assert "--learner-workers must be at least 1" in _error_line(capsys)
    assert cli.main([*base, "--learner-workers", "5"]) == 2  # batch 16 over 5 workers
    assert "must be divisible by the 5 learner replicas" in _error_line(capsys)
    # $RAY_ADDRESS is honoured like --ray-address: unreachable -> one line, exit 1.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert cli.main([*base, "--backend", "ray"]) == 1
    err = _error_line(capsys)
    assert f"cannot reach a Ray cluster at 127.0.0.1:{port}" in err
    assert len(err.strip().splitlines()) == 1
    monkeypatch.delenv("RAY_ADDRESS")
    # A --bind-host IP that no node of the (here: private, one-node) Ray cluster has.
    pytest.importorskip("ray")
    assert cli.main([*base, "--backend", "ray", "--bind-host", "192.0.2.77"]) == 2
    err = _error_line(capsys)
    # (Ray itself may print a notice of its own when it starts; ours is one line.)
    ours = [line for line in err.splitlines() if line.startswith("replicator: error:")]
    assert len(ours) == 1
    assert "--bind-host 192.0.2.77 is not the IP of any node of the Ray cluster" in ours[0]
    after = _snapshot(run_dir)
    changed = {p for p in before if before[p] != after.get(p)} | (set(after) - set(before))
    assert changed <= {os.path.join(run_dir, f) for f in LOCK_FILES}, changed


def test_a_learner_group_launch_says_its_servers_are_exposed():
    # Issue 18, item 12: TF 2.15's gRPC servers cannot be bound to one address; a launch
    # that starts them says so in one line (and one that does not stays quiet).
    from launch.cli import launch_d4pg
    from launch.d4pg.program import D4PGProgramSettings

    note = launch_d4pg.exposure_note(D4PGProgramSettings(learner_workers=2))
    assert "listen on all interfaces" in note and len(note.splitlines()) == 1
    assert launch_d4pg.exposure_note(D4PGProgramSettings()) == ""
