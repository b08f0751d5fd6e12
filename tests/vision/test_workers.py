"""`replicator train resnet50|sngan --workers K`: K local processes, one strategy, one run dir."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.support import REPO_ROOT, python_env
from vision.common import run_dir as run_dir_lib
from vision.resnet import cli as resnet_cli
from vision.sngan import cli as sngan_cli

pytestmark = pytest.mark.timeout(600)

SMALL = [
    "--data",
    "digits",
    "--image-size",
    "8",
    "--blocks",
    "1",
    "--channels",
    "16",
    "--stem-channels",
    "8",
    "--batch-size",
    "16",
    "--lr",
    "0.4",
    "--log-every",
    "2",
    "--checkpoint-every",
    "4",
    "--steps",
    "6",
]


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vision.resnet.cli", "train", "resnet50", *args],
        cwd=REPO_ROOT,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=400,
    )


def _checkpoint(run_dir: str, step: int) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints", f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter"))
    }


def test_two_workers_train_exactly_like_one_with_the_same_global_batch(tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    result = _train(*SMALL, "--workers", "2", "--run-dir", two)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "on 2 replica(s) [multiworker x 2 workers]" in result.stdout
    assert result.stdout.count("eval at step 6") == 1  # the chief alone reports
    result = _train(*SMALL, "--replicas", "cpu", "--run-dir", one)
    assert result.returncode == 0, result.stderr[-3000:]

    # One run directory, written once: the other worker wrote nothing anywhere here.
    assert sorted(os.listdir(tmp_path)) == ["one", "two"]
    assert sorted(os.listdir(two)) == sorted(os.listdir(one))
    with open(os.path.join(two, run_dir_lib.INVOCATIONS_FILE)) as f:
        assert len(f.read().splitlines()) == 1
    rows = collections.Counter((row["step"], row["name"]) for row in run_dir_lib.read_metrics(two))
    assert rows and max(rows.values()) == 1
    config = json.load(open(os.path.join(two, "config.json")))["config"]
    assert (config["workers"], config["replicas"], config["batch_size"]) == (2, "multiworker", 16)

    # Same global batches, cross-replica batch norm, averaged gradients: the same model.
    a, b = _checkpoint(one, 6), _checkpoint(two, 6)
    assert a.keys() == b.keys() and len(a) > 30
    assert any("moving_variance" in k for k in a) and any("momentum" in k for k in a)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-5, err_msg=name)
    losses = {
        cli: {
            r["step"]: r["value"] for r in run_dir_lib.read_metrics(d) if r["name"] == "train/loss"
        }
        for cli, d in (("one", one), ("two", two))
    }
    assert sorted(losses["two"]) == [2, 4, 6]
    np.testing.assert_allclose(
        [losses["two"][s] for s in (2, 4, 6)], [losses["one"][s] for s in (2, 4, 6)], rtol=1e-5
    )


@pytest.mark.parametrize("main", [resnet_cli.main, sngan_cli.main], ids=["resnet50", "sngan"])
def test_bad_worker_requests_exit_2_and_write_nothing(tmp_path, capsys, main):
    model = "resnet50" if main is resnet_cli.main else "sngan"
    run_dir = str(tmp_path / "run")
    cases = [
        (["--workers", "0"], "--workers must be at least 1"),
        (["--workers", "2", "--batch-size", "15"], "not divisible by the 2 workers"),
        (["--workers", "2", "--batch-size", "16", "--replicas", "cpu:2"], "--replicas multiworker"),
    ]
    for args, message in cases:
        assert main(["train", model, "--data", "digits", "--run-dir", run_dir, *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err, err
        assert not os.path.exists(run_dir)


def test_gpus_are_dealt_out_so_no_two_workers_share_one():
    from vision.common.workers import split_gpus

    assert split_gpus([], 3) == [None, None, None]  # no GPUs: nothing to split
    assert split_gpus(["0", "1", "2", "3"], 2) == ["0,1", "2,3"]
    assert split_gpus(["4", "5", "7"], 2) == ["4,5", "7"]
    with pytest.raises(ValueError, match="at least 3 GPUs"):
        split_gpus(["0", "1"], 3)


def test_the_chief_of_a_tf_config_cluster_is_worker_0(monkeypatch):
    from vision.common.cli import role_from_tf_config

    cluster = {"worker": ["h0:1", "h1:1", "h2:1"]}
    for index in range(3):
        monkeypatch.setenv(
            "TF_CONFIG",
            json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
        )
        role = role_from_tf_config()
        assert (role.index, role.chief, len(role.addresses)) == (index, index == 0, 3)
    with_chief = {"chief": ["c:1"], "worker": ["h0:1"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": with_chief, "task": {"type": "worker", "index": 0}})
    )
    assert not role_from_tf_config().chief
    monkeypatch.delenv("TF_CONFIG")
    assert role_from_tf_config() is None


def test_sigterm_stops_two_workers_with_a_chief_checkpoint_and_no_orphans(tmp_path):
    import signal
    import time

    import psutil

    run_dir = str(tmp_path / "run")
    steps = [a for a in SMALL if a not in ("--steps", "6")]
    process = subprocess.Popen(
        [sys.executable, "-m", "vision.resnet.cli", "train", "resnet50", *steps]
        + ["--steps", "100000", "--workers", "2", "--run-dir", run_dir],
        cwd=REPO_ROOT,
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    children = []
    try:
        deadline = time.time() + 300
        metrics = os.path.join(run_dir, run_dir_lib.METRICS_FILE)
        while not (os.path.exists(metrics) and run_dir_lib.read_metrics(run_dir)):
            assert process.poll() is None and time.time() < deadline, process.communicate()
            time.sleep(0.5)
        children = psutil.Process(process.pid).children()
        assert len(children) == 2
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=180)
    finally:
        if process.poll() is None:
            process.kill()
        for child in children:
            if child.is_running():
                child.kill()
    assert process.returncode == 0, err[-3000:]
    stopped = int(out.split("Stopped at step ")[1].split()[0])
    assert os.path.exists(os.path.join(run_dir, "checkpoints", f"ckpt-{stopped}.index"))
    assert not os.path.exists(os.path.join(run_dir, ".lock"))
    assert not any(child.is_running() and child.status() != "zombie" for child in children)
