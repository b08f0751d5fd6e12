"""`replicator train resnet50`: run directory contents, exact resume, usage errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from vision.common import run_dir as training_common
from vision.resnet import cli as resnet_cli

pytestmark = pytest.mark.timeout(600)

SMALL = [
    "--data",
    "digits",
    "--replicas",
    "cpu:2",
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
]


def _cli(*args: str) -> int:
    return resnet_cli.main(["train", "resnet50", *args])


def _checkpoint(run_dir, step: int) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints", f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith(("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter"))
    }


def _train_losses(run_dir) -> dict[int, float]:
    return {
        row["step"]: row["value"]
        for row in training_common.read_metrics(run_dir)
        if row["name"] == "train/loss"
    }


def test_stopped_run_resumes_exactly_like_an_uninterrupted_one(tmp_path, capsys):
    straight, interrupted = str(tmp_path / "straight"), str(tmp_path / "interrupted")
    assert _cli(*SMALL, "--steps", "12", "--run-dir", straight) == 0
    assert _cli(*SMALL, "--steps", "12", "--run-dir", interrupted, "--stop-at", "6") == 0
    assert "Stopped at step 6 of 12" in capsys.readouterr().out
    assert sorted(os.listdir(os.path.join(interrupted, "checkpoints"))) == [
        "checkpoint",
        "ckpt-4.data-00000-of-00001",
        "ckpt-4.index",
        "ckpt-6.data-00000-of-00001",
        "ckpt-6.index",
    ]
    config_before = open(os.path.join(interrupted, "config.json")).read()

    assert _cli("--run-dir", interrupted) == 0  # every setting comes from the run directory
    out = capsys.readouterr().out
    assert "Resuming from step 6" in out and "eval at step 12: top-1" in out
    # It ends saying where the run's products are (a ResNet run has no sample grid).
    assert out.rstrip().endswith(
        f"Run directory: {interrupted}\n"
        f"  metrics:     {os.path.join(interrupted, 'metrics.csv')}\n"
        f"  TensorBoard: tensorboard --logdir {os.path.join(interrupted, 'tensorboard')}"
    ), out
    assert open(os.path.join(interrupted, "config.json")).read() == config_before

    # Same parameters, batch-norm statistics, momentum and step counter ...
    a, b = _checkpoint(straight, 12), _checkpoint(interrupted, 12)
    assert a.keys() == b.keys() and len(a) > 30
    assert any("momentum" in k for k in a) and any("moving_variance" in k for k in a)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-6, err_msg=name)
    # ... because the resumed run read the same examples at the same steps.
    losses_a, losses_b = _train_losses(straight), _train_losses(interrupted)
    assert sorted(losses_b) == [2, 4, 6, 8, 10, 12]
    np.testing.assert_allclose(
        [losses_b[s] for s in (8, 10, 12)], [losses_a[s] for s in (8, 10, 12)], rtol=1e-6
    )

    # The run directory holds what a user looks for.
    config = json.load(open(os.path.join(straight, "config.json")))
    assert config["kind"] == "resnet50" and config["config"]["batch_size"] == 16
    assert config["config"]["warmup_steps"] == 1 and config["config"]["image_size"] == 8
    names = {row["name"] for row in training_common.read_metrics(straight)}
    assert {"train/loss", "train/images_per_second", "eval/top1", "eval/top5"} <= names
    assert os.listdir(os.path.join(straight, "tensorboard"))
    invocations = open(os.path.join(interrupted, "invocations.jsonl")).read().splitlines()
    assert [json.loads(line)["start_step"] for line in invocations] == [0, 6]
    assert not os.path.exists(os.path.join(straight, ".lock"))

    # Asking for steps already done trains nothing and says so.
    assert _cli("--run-dir", straight) == 0
    assert "Already trained 12 of 12 steps" in capsys.readouterr().out


def _error(capsys, *args: str) -> str:
    assert _cli(*args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replicator train resnet50: error:") and "\n" not in err, err
    return err


def test_usage_errors_exit_2_and_write_nothing(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    small = [*SMALL, "--steps", "2"]  # if an error were missed, fail fast
    assert "does not exist" in _error(
        capsys, *small, "--data", str(tmp_path / "no"), "--run-dir", run_dir
    )
    assert "not divisible by the 2 replicas" in _error(
        capsys, *small, "--batch-size", "15", "--run-dir", run_dir
    )
    assert "at least 4x4" in _error(
        capsys, *small, "--stem", "imagenet", "--image-size", "3", "--run-dir", run_dir
    )
    assert "cpu:x" in _error(capsys, *small, "--replicas", "cpu:x", "--run-dir", run_dir)
    assert "at least 1" in _error(capsys, *small, "--steps", "0", "--run-dir", run_dir)
    assert not os.path.exists(run_dir)
    with pytest.raises(SystemExit) as exit_info:  # argparse: invalid choice
        _cli(*small, "--precision", "float16", "--run-dir", run_dir)
    assert exit_info.value.code == 2


def test_existing_directories_are_never_overwritten(tmp_path, capsys):
    stranger = tmp_path / "not_a_run"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("precious")
    assert "not a run directory" in _error(
        capsys, *SMALL, "--steps", "2", "--run-dir", str(stranger)
    )
    assert os.listdir(stranger) == ["notes.txt"]

    run_dir = str(tmp_path / "run")
    assert _cli(*SMALL, "--steps", "2", "--run-dir", run_dir) == 0
    capsys.readouterr()
    before = {
        name: open(os.path.join(run_dir, name), "rb").read()
        for name in ("config.json", "metrics.csv")
    }
    error = _error(capsys, *SMALL, "--steps", "4", "--lr", "0.1", "--run-dir", run_dir)
    assert "base_learning_rate: 0.4 in the run, 0.1 now" in error
    for name, content in before.items():
        assert open(os.path.join(run_dir, name), "rb").read() == content


def test_replicator_console_script_registers_resnet50(tmp_path, capsys):
    from launch import cli  # the `replicator` entry point

    code = cli.main(
        [
            "train",
            "resnet50",
            "--data",
            str(tmp_path / "missing"),
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from tests.support import REPO_ROOT, python_env

    run_dir = str(tmp_path / "run")
    command = [
        sys.executable,
        "-m",
        "vision.resnet.cli",
        "train",
        "resnet50",
        *SMALL,
        "--replicas",
        "cpu",
        "--steps",
        "100000",
        "--run-dir",
        run_dir,
    ]
    process = subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        while not (os.path.exists(os.path.join(run_dir, "metrics.csv")) and _train_losses(run_dir)):
            assert process.poll() is None and time.time() < deadline, process.communicate()
            time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    stopped = int(out.split("Stopped at step ")[1].split()[0])
    assert 2 <= stopped < 100000
    assert os.path.exists(os.path.join(run_dir, "checkpoints", f"ckpt-{stopped}.index"))
    assert not os.path.exists(os.path.join(run_dir, ".lock"))


@pytest.mark.parametrize("form", ["tfrecord", "folders"])
def test_trains_on_both_imagenet_forms(tmp_path, capsys, form):
    from vision import data

    root = data.write_tiny_imagenet(
        str(tmp_path / "data"), form=form, num_classes=3, images_per_class=4, size=20
    )
    assert (
        _cli(
            "--data",
            root,
            "--replicas",
            "cpu:2",
            "--image-size",
            "16",
            "--stem",
            "small",
            "--blocks",
            "1",
            "--channels",
            "8",
            "--stem-channels",
            "4",
            "--batch-size",
            "4",
            "--steps",
            "3",
            "--log-every",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "step 3/3" in out and "eval at step 3" in out and "(3 images)" in out


@pytest.mark.parametrize("form", ["tfrecord", "folders"])
def test_missing_eval_split_is_found_before_training_and_no_eval_skips_it(tmp_path, capsys, form):
    import glob
    import shutil

    from vision import data

    root = data.write_tiny_imagenet(
        str(tmp_path / "data"), form=form, num_classes=2, images_per_class=4, size=16
    )
    if form == "folders":
        shutil.rmtree(os.path.join(root, "val"))
    else:
        for path in glob.glob(os.path.join(root, "**", "*-validation.tfrecord-*"), recursive=True):
            os.remove(path)
    run_dir = str(tmp_path / "run")
    tiny = [
        "--data",
        root,
        "--replicas",
        "cpu",
        "--image-size",
        "8",
        "--stem",
        "small",
        "--blocks",
        "1",
        "--channels",
        "8",
        "--stem-channels",
        "4",
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--run-dir",
        run_dir,
    ]
    error = _error(capsys, *tiny)
    assert "no evaluation split" in error and "--no-eval" in error
    assert not os.path.exists(run_dir)  # found before anything was written
    assert _cli(*tiny, "--no-eval") == 0
    out = capsys.readouterr().out
    assert "step 2/2" in out and "eval at" not in out
    assert not any(r["name"].startswith("eval/") for r in training_common.read_metrics(run_dir))
