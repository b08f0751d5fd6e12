"""Snapshots of a real short run: evaluate, export, curves, quiet consoles, bad input."""

import csv
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from launch import cli
from launch.cli import app, d4pg_flags
from tests.launch import d4pg_support as s

pytestmark = pytest.mark.timeout(600)

# Prefixes of C++ log lines: TensorFlow/XLA/CUDA plugins, Reverb, absl/glog.
CPP_LOG = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] "
    r"|\[reverb/cc/"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ "
    r"|WARNING: All log messages before absl::InitializeLog"
    r"|To enable the following instructions:)",
    re.MULTILINE,
)


def _run(*args, timeout=400, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        cwd=cwd or s.REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**env, "PYTHONPATH": s.REPO},
    )
    return proc.returncode, proc.stdout, proc.stderr


def _assert_quiet(out, err):
    found = CPP_LOG.findall(out + "\n" + err)
    assert not found, f"C++ log lines on the console: {found}\n{err[-2000:]}"


def _files(root):
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[path] = hashlib.sha1(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("evaluate") / "run")
    code, out, err = _run(
        "launch",
        "d4pg",
        "--env",
        s.TASK,
        "--actors",
        "1",
        "--steps",
        "3000",  # Inserts lag actor steps by the actor's pool (256) with 16 per item.
        "--run-dir",
        run_dir,
        "--eval-every-steps",
        "400",
        "--eval-episodes",
        "1",
        "--checkpoint-every",
        "40",
        "--progress-every",
        "2",
        *s.TINY_FLAGS,
    )
    assert code == 0, out + err
    return run_dir, out, err


def _kept(run_dir):
    return sorted(int(n[5:]) for n in os.listdir(os.path.join(run_dir, "snapshots")))


def test_launch_is_quiet_snapshots_and_reports(run):
    run_dir, out, err = run
    _assert_quiet(out, err)
    # The C++ lines went to the launcher's log instead.
    assert os.path.exists(os.path.join(run_dir, "logs", "launcher.log"))
    steps = _kept(run_dir)
    assert 1 <= len(steps) <= 3  # --keep-snapshots default.
    with open(os.path.join(run_dir, "checkpoints", "learner", "checkpoint")) as f:
        latest_checkpoint = int(re.search(r"ckpt-(\d+)", f.readline()).group(1))
    assert steps[-1] == latest_checkpoint  # The final checkpoint wrote a snapshot too.
    # The progress line and metrics.csv carry the bottleneck verdict.
    verdicts = ("learner-bound", "actor-bound", "balanced", "filling replay")
    assert any(v in line for line in out.splitlines() for v in verdicts), out
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["bottleneck"] for r in rows[1:])
    events = os.listdir(os.path.join(run_dir, "tensorboard", "replay"))
    assert any(e.startswith("events.out.tfevents") for e in events)
    # Evaluations were due once per multiple of 400 actor steps (replay inserts) passed.
    with open(os.path.join(run_dir, "metrics", "evaluator.jsonl")) as f:
        evals = [r for r in map(json.loads, f) if r.get("kind") == "eval"]
    inserts = [r["replay_inserts"] for r in evals]
    assert len(inserts) >= 2 and all(b // 400 > a // 400 for a, b in itertools.pairwise(inserts))


def _evaluate_via_learner(run_dir, episodes, seed):
    """The previous path: a learner restored next to a private Reverb server publishes its
    weights, and an evaluator pulls them (as `replicator evaluate` did before snapshots)."""
    import environments
    import replication
    from agents.d4pg import builder
    from agents.d4pg.config import D4PGConfig

    with open(os.path.join(run_dir, "run.json")) as f:
        identity = json.load(f)
    config = D4PGConfig.from_dict(identity["config"])
    env = builder.make_environment(config, identity["task"], seed=seed)
    spec = environments.make_environment_spec(env)
    scratch = tempfile.mkdtemp()
    server = builder.make_replay_server(config, spec, checkpoint_dir=scratch)
    address = f"localhost:{server.port}"
    try:
        learner = builder.make_learner(
            config,
            spec,
            address,
            replication.make("cpu"),
            os.path.join(run_dir, "checkpoints", "learner"),
        )
        assert learner.restore()
        agent = builder.make_evaluator(config, spec, address, seed=seed)
        agent.update(wait=True)
        returns = []
        for _ in range(episodes):
            timestep = env.reset()
            total = 0.0
            while not timestep.last():
                timestep = env.step(agent.select_action(timestep.observation))
                total += float(timestep.reward)
            returns.append(total)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return float(np.mean(returns)), learner.num_steps


def test_snapshot_evaluation_equals_the_learner_path(run):
    from launch.reporting import evaluate

    run_dir, _, _ = run
    expected, step = _evaluate_via_learner(run_dir, episodes=2, seed=7)
    result = evaluate.evaluate(run_dir, episodes=2, seeds=[7])
    assert result["learner_step"] == step
    assert result["mean"] == pytest.approx(expected, abs=1e-6)
    assert result["episodes"] == 2 and result["steps"] == 2 * 200
    # Another task with the same specs.
    other = evaluate.evaluate(run_dir, task="cartpole:swingup", episodes=1, seeds=[7])
    assert (other["task"], other["trained_on"]) == ("cartpole:swingup", s.TASK)
    assert other["mean"] != result["mean"]


def test_evaluate_json_video_and_quiet_console(run, tmp_path):
    run_dir, _, _ = run
    video = str(tmp_path / "episode.gif")
    args = ["evaluate", run_dir, "--episodes", "1", "--seeds", "1", "2"]
    code, out, err = _run(*args, "--json", "--video", video)
    assert code == 0, out + err
    _assert_quiet(out, err)
    lines = out.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["seeds"] == [1, 2] and set(result["returns_per_seed"]) == {"1", "2"}
    assert result["mean"] == pytest.approx(
        np.mean([r for rs in result["returns_per_seed"].values() for r in rs])
    )
    assert result["learner_step"] == _kept(run_dir)[-1]
    assert os.path.getsize(video) > 1000
    # --verbose lets TensorFlow's C++ lines through.
    code, out, err = _run(*args, "--verbose")
    assert code == 0 and CPP_LOG.search(err), err[-2000:]


def test_all_snapshots_curve_and_plot_console(run, tmp_path):
    run_dir, _, _ = run
    out_csv = str(tmp_path / "curve.csv")
    assert cli.main(["evaluate", "--run-dir", run_dir, "--all-snapshots", "--episodes", "1",
                     "--out", out_csv]) == 0  # fmt: skip
    with open(out_csv) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["learner_step"]) for r in rows] == _kept(run_dir)
    assert all(float(r["mean"]) > 0 for r in rows)
    png = str(tmp_path / "curve.png")
    code, out, err = _run("plot", run_dir, "--out", png)
    assert code == 0, out + err
    _assert_quiet(out, err)
    assert out.strip() == png


def test_export_any_kept_checkpoint(run, tmp_path):
    import tensorflow as tf

    run_dir, _, _ = run
    kept = _kept(run_dir)
    # Remove the oldest snapshot so that export has to read the learner checkpoint.
    copy = str(tmp_path / "run")
    shutil.copytree(run_dir, copy)
    shutil.rmtree(os.path.join(copy, "snapshots", f"step_{kept[0]}"))
    out = str(tmp_path / "policy")
    code, stdout, err = _run("export", copy, "--step", str(kept[0]), "--out", out)
    assert code == 0, stdout + err
    _assert_quiet(stdout, err)
    assert f"learner step {kept[0]:,}" in stdout
    exported = tf.saved_model.load(out)
    original = tf.saved_model.load(os.path.join(run_dir, "snapshots", f"step_{kept[0]}"))
    obs = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    np.testing.assert_allclose(exported.act(obs).numpy(), original.act(obs).numpy(), atol=1e-6)
    assert json.loads(exported.metadata().numpy())["learner_step"] == kept[0]


def _error(capsys):
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_bad_evaluate_and_export_input(run, tmp_path, capsys):
    run_dir, _, _ = run
    before = _files(run_dir)
    assert cli.main(["evaluate", "--run-dir", run_dir, "--env", "walker:walk"]) == 2
    err = _error(capsys)
    assert "expects observation shape [5], but walker:walk has [24]" in err
    assert cli.main(["evaluate", "--run-dir", run_dir, "--step", "7"]) == 2
    err = _error(capsys)
    assert "--step 7: no snapshot of learner step 7 is kept" in err and "kept steps:" in err
    assert cli.main(["evaluate", "--snapshot", str(tmp_path)]) == 2
    assert "is not a policy snapshot" in _error(capsys)
    assert cli.main(["evaluate"]) == 2
    assert "name a policy: RUN_DIR [--step N], or --snapshot DIR" in _error(capsys)
    assert cli.main(["evaluate", run_dir, "--snapshot", str(tmp_path)]) == 2
    assert "--snapshot names one snapshot: drop the run directory" in _error(capsys)
    other = str(tmp_path / "other")
    for command in (["evaluate"], ["export", "--out", str(tmp_path / "x")]):
        assert cli.main([*command, run_dir, "--run-dir", other]) == 2
        assert f"two run directories given ({run_dir} and --run-dir {other})" in _error(capsys)
    assert cli.main(["evaluate", other]) == 2
    assert f"run directory {other} does not exist" in _error(capsys)
    assert cli.main(["export", "--out", str(tmp_path / "x")]) == 2
    assert "which run? Pass its directory: RUN_DIR or --run-dir RUN_DIR." in _error(capsys)
    assert (
        cli.main(["export", "--run-dir", run_dir, "--step", "7", "--out", str(tmp_path / "x")]) == 2
    )
    assert "--step 7: the run keeps no checkpoint or snapshot" in _error(capsys)
    assert cli.main(["export", "--run-dir", run_dir, "--out", run_dir]) == 2
    assert "is not empty" in _error(capsys)
    assert _files(run_dir) == before


@pytest.mark.timeout(300)
def test_train_console_is_quiet(tmp_path):
    code, out, err = _run(
        "train", "sngan", "--data", "digits", "--steps", "2", "--batch-size", "8",
        "--disc-steps", "1", "--run-dir", str(tmp_path / "gan"),
    )  # fmt: skip
    assert code == 0, out + err
    assert "step 2/2" in out
    _assert_quiet(out, err)


def _settings(*flags, tmp_path):
    argv = ["launch", "d4pg", "--run-dir", str(tmp_path / "run"), *flags]
    args = app.build_parser(argv).parse_args(argv)
    return d4pg_flags.resolve(args, {})[0]


def test_evaluation_schedule_flags(tmp_path, capsys):
    assert _settings("--steps", "200000", tmp_path=tmp_path).eval_every_steps == 10_000
    assert _settings("--steps", "5000", tmp_path=tmp_path).eval_every_steps == 1000
    settings = _settings("--eval-every-steps", "300", tmp_path=tmp_path)
    assert (settings.eval_every_steps, settings.keep_snapshots) == (300, 3)
    settings = _settings("--eval-every", "7", "--keep-snapshots", "9", tmp_path=tmp_path)
    assert (settings.eval_every_steps, settings.eval_every_s, settings.keep_snapshots) == (
        None,
        7.0,
        9,
    )
    run_dir = str(tmp_path / "run")
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--eval-every", "5",
                     "--eval-every-steps", "10"]) == 2  # fmt: skip
    assert "not both" in _error(capsys)
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--keep-snapshots", "0"]) == 2
    assert "--keep-snapshots must be at least 1" in _error(capsys)
    assert _settings(tmp_path=tmp_path).learner_snapshot_every_s == 60.0
    assert _settings("--snapshot-every", "5", tmp_path=tmp_path).learner_snapshot_every_s == 5.0
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--snapshot-every", "0"]) == 2
    assert "--snapshot-every must be a positive number of seconds" in _error(capsys)
    assert not os.path.exists(run_dir)


def test_evaluations_stay_on_the_grid_of_their_period():
    from launch.d4pg.nodes import evaluation_due

    # The evaluator looks every 600 actor steps, and an evaluation takes 1.2k steps of
    # looking away. Each of the 20 is due at the first look past its multiple of 10k:
    # none drifts by the steps the previous ones took (counted from the last, the 20th
    # would be due at 204k).
    last, due_at, steps = None, [], 0
    while steps < 205_000:
        if evaluation_due(steps, last, 10_000):
            due_at.append(steps)
            last = steps
            steps += 1_200
        steps += 600
    assert [d // 10_000 for d in due_at] == list(range(21))
    assert all(d % 10_000 < 600 for d in due_at)
    # A replay restarted without its counters: due at once.
    assert evaluation_due(500, 190_000, 10_000)
