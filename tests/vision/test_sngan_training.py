"""`replicator train sngan` end to end: learning on digits, exact resume, clear errors."""

import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import PIL.Image
import pytest
import tensorflow as tf

from tests import support
from vision.common import run_dir as training_common
from vision.metrics import digits_classifier
from vision.metrics import gan as gan_metrics
from vision.sngan import cli as sngan_cli


def _cli(*args):
    return sngan_cli.main(["train", "sngan", *args])


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
    """The digits classifier the GAN metrics use, trained here (as a user would)."""
    model, accuracy = digits_classifier.train(digits_classifier.ClassifierConfig(image_size=16))
    assert accuracy >= 0.97, f"digits classifier eval accuracy {accuracy:.3f} < 0.97"
    path = str(tmp_path_factory.mktemp("classifier") / "digits")
    digits_classifier.save(model, path, image_size=16)
    return path


def test_digits_classifier_checkpoint_is_accurate(classifier_dir):
    from vision import data  # pylint: disable=import-outside-toplevel

    images, labels = data.Digits().arrays("eval", 16, task="gan", channels=1)
    _, logits = gan_metrics.Classifier(classifier_dir)(images)
    assert np.mean(np.argmax(logits, 1) == labels) >= 0.97


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sngan_learns_class_conditional_digits(tmp_path, classifier_dir):
    run = str(tmp_path / "run")
    steps = 700
    assert (
        _cli(
            "--data",
            "digits",
            "--replicas",
            "cpu",
            "--run-dir",
            run,
            "--steps",
            str(steps),
            "--batch-size",
            "32",
            "--disc-steps",
            "1",
            "--g-lr",
            "1e-3",
            "--d-lr",
            "2e-3",
            "--beta2",
            "0.999",
            "--lr-decay",
            "constant",
            "--seed",
            "0",
            "--classifier",
            classifier_dir,
            "--eval-every",
            "0",
            "--log-every",
            "100",
            "--checkpoint-every",
            str(steps),
        )
        == 0
    )
    values = {(r["step"], r["name"]): r["value"] for r in training_common.read_metrics(run)}
    # The classifier labels EMA samples as their conditioning class, and FID falls.
    assert values[(steps, "eval/class_accuracy")] >= 0.8
    assert values[(steps, "eval/fid")] < 0.3 * values[(0, "eval/fid")]
    assert values[(steps, "eval/inception_score")] > values[(0, "eval/inception_score")]
    assert values[(steps, "train/images_per_second")] > 0
    # The run directory holds everything the run produced.
    assert os.path.exists(os.path.join(run, "config.json"))
    assert os.path.exists(os.path.join(run, "checkpoints", f"ckpt-{steps}.index"))
    assert os.listdir(os.path.join(run, "tensorboard"))
    grid = PIL.Image.open(os.path.join(run, "samples.png"))
    scale = grid.height // (10 * 17 + 1)
    assert scale >= 1 and grid.height == scale * (10 * 17 + 1)  # one row per class
    assert os.path.exists(os.path.join(run, "samples", f"step_{steps:07d}.png"))


_TINY = [
    "--image-size",
    "8",
    "--g-channels",
    "4",
    "--d-channels",
    "4",
    "--latent-dim",
    "8",
    "--batch-size",
    "8",
    "--disc-steps",
    "2",
    "--ema-start",
    "1",
    "--log-every",
    "1",
    "--eval-every",
    "0",
    "--checkpoint-every",
    "100",
]


def _checkpoint_values(run, step):
    reader = tf.train.load_checkpoint(os.path.join(run, "checkpoints", f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith("save_counter")
    }


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
    """A run of 4 steps, and one stopped at step 2 and resumed (with its saved settings) to 4.

    (The learning rates decay over --steps, so the interrupted run must keep --steps 4.)
    """
    root = tmp_path_factory.mktemp("tiny_runs")
    straight, resumed = str(root / "straight"), str(root / "resumed")
    assert _cli("--run-dir", straight, "--steps", "4", *_TINY) == 0
    assert _cli("--run-dir", resumed, "--steps", "4", "--stop-at", "2", *_TINY) == 0
    assert _cli("--run-dir", resumed) == 0
    return straight, resumed


@pytest.mark.timeout(600)
def test_resume_continues_exactly(tiny_runs):
    straight, resumed = tiny_runs
    a, b = _checkpoint_values(straight, 4), _checkpoint_values(resumed, 4)
    assert sorted(a) == sorted(b)
    assert any("generator_ema" in name for name in a)
    assert int(a["learner/step/.ATTRIBUTES/VARIABLE_VALUE"]) == 4
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    with open(os.path.join(resumed, training_common.INVOCATIONS_FILE)) as f:
        assert len(f.read().splitlines()) == 2
    # Resuming a finished run trains nothing and changes no checkpoint.
    assert _cli("--run-dir", resumed) == 0
    np.testing.assert_equal(_checkpoint_values(resumed, 4), b)


def _digest(directory):
    digest = {}
    for root, _, files in os.walk(directory):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                digest[os.path.relpath(os.path.join(root, name), directory)] = hashlib.sha256(
                    f.read()
                ).hexdigest()
    return digest


@pytest.mark.timeout(600)
def test_bad_requests_exit_2_and_touch_nothing(tmp_path, tiny_runs, capsys):
    new_run = str(tmp_path / "new")
    bad_folder = tmp_path / "bad_images" / "cat"
    bad_folder.mkdir(parents=True)
    (bad_folder / "0.png").write_bytes(b"\x89PNG truncated")
    cases = [
        (["--data", str(tmp_path / "missing")], "does not exist"),
        (["--data", str(tmp_path / "bad_images")], "cannot decode"),
        (["--image-size", "20"], "power of two"),
        (["--classifier", str(tmp_path / "no_classifier")], "classifier"),
        (["--steps", "0"], "steps"),
    ]
    for args, message in cases:
        assert _cli("--run-dir", new_run, *args) == 2, args
        assert message in capsys.readouterr().err, args
        assert not os.path.exists(new_run), args  # validated before anything is written

    run = str(tmp_path / "run")
    shutil.copytree(tiny_runs[0], run)
    before = _digest(run)
    for args, message in [
        (["--batch-size", "16"], "different config"),
        (["--data", str(tmp_path / "missing")], "does not exist"),
        (["--image-size", "12"], "power of two"),
    ]:
        assert _cli("--run-dir", run, *args) == 2, args
        assert message in capsys.readouterr().err, args
        assert _digest(run) == before, args

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert _cli("--run-dir", str(foreign), *_TINY) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert os.listdir(foreign) == ["notes.txt"]


def test_batch_not_divisible_by_replicas(tmp_path):
    # A fresh interpreter: logical CPU devices are fixed when TensorFlow starts.
    run = str(tmp_path / "run")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vision.sngan.cli",
            "train",
            "sngan",
            "--replicas",
            "cpu:2",
            "--batch-size",
            "7",
            "--image-size",
            "8",
            "--run-dir",
            run,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=support.python_env(),
        cwd=support.REPO_ROOT,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "not divisible" in result.stderr
    assert not os.path.exists(run)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("form", ["tfrecord", "folders"])
def test_trains_on_both_imagenet_forms(tmp_path, capsys, form):
    from vision import data  # pylint: disable=import-outside-toplevel

    root = data.write_tiny_imagenet(
        str(tmp_path / "data"), form=form, num_classes=3, images_per_class=4, size=20
    )
    run = str(tmp_path / "run")
    args = list(_TINY)
    args[args.index("--image-size") + 1] = "16"
    assert _cli("--data", root, "--run-dir", run, "--steps", "2", *args) == 0
    out = capsys.readouterr().out
    assert "16x16x3, 3 classes" in out and "step 2/2" in out
    assert f"  samples:     {os.path.join(run, 'samples.png')}" in out  # The closing lines.
    assert os.path.exists(os.path.join(run, "checkpoints", "ckpt-2.index"))
    grid = PIL.Image.open(os.path.join(run, "samples.png"))
    assert grid.mode == "RGB"  # three rows (classes) of colour samples


def test_sigterm_stops_at_a_step_boundary_with_a_checkpoint(tmp_path):
    import signal
    import time

    run = str(tmp_path / "run")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vision.sngan.cli",
            "train",
            "sngan",
            "--run-dir",
            run,
            "--steps",
            "100000",
            *_TINY,
        ],
        cwd=support.REPO_ROOT,
        env=support.python_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 300
        metrics = os.path.join(run, training_common.METRICS_FILE)
        while not (os.path.exists(metrics) and len(training_common.read_metrics(run)) > 8):
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
    assert os.path.exists(os.path.join(run, "checkpoints", f"ckpt-{stopped}.index"))
    assert not os.path.exists(os.path.join(run, ".lock"))
