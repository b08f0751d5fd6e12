"""`replicator launch d4pg --envs-per-actor K`: one actor process steps K environments."""

import json
import os
import subprocess
import sys

import pytest

from agents.d4pg.config import D4PGConfig
from launch import cli
from tests.launch import d4pg_support as s

pytestmark = pytest.mark.timeout(600)


def _launch(run_dir: str, *flags: str) -> subprocess.CompletedProcess:
    """`replicator launch d4pg` with tiny networks on the local backend, one actor."""
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", "launch", "d4pg", "--backend", "local"]
        + ["--env", s.TASK, "--actors", "1", "--run-dir", run_dir, *flags, *s.TINY_FLAGS],
        cwd=s.REPO,
        capture_output=True,
        text=True,
        timeout=400,
        env=dict(os.environ),
    )


def test_batched_actor_launch_runs_end_to_end(tmp_path):
    run_dir = str(tmp_path / "run")
    # The learner's row pool (4,096 rows by default) is filled before its first update; at
    # the tiny config's 4 samples per insert that takes ~1,100 of these 1,200 steps, and the
    # launch could end before an update. A pool of 256 rows leaves it most of the budget.
    proc = _launch(
        run_dir,
        *("--envs-per-actor", "3", "--steps", "1200", "--eval-every", "2"),
        *("--eval-episodes", "1", "--progress-every", "2"),
        "--config.shuffle_buffer_transitions=256",
        # The rates and the noise decay over the first 20 updates (half of them held).
        *("--config.sigma_final_scale=0.5", "--config.lr_decay_updates=20"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Finished: " in proc.stdout
    episodes = s.records(run_dir, "actor_0", "episode")
    # Three environments in one process, each reporting its own 200-step episodes.
    assert {r["env_index"] for r in episodes} == {0, 1, 2}
    assert len(episodes) >= 6
    # The scheduled exploration noise: each episode's sigma is the config's for the learner
    # step of the weights it acted with.
    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
        config = D4PGConfig.from_saved(json.load(f))
    for r in episodes:
        want = config.sigma_at(r["weights_version"])
        assert r["exploration_sigma"] == pytest.approx(want, rel=1e-6), r
    assert min(r["exploration_sigma"] for r in episodes) < config.sigma
    assert "acting in 3 x" in s.log_text(run_dir, "actor_0")
    assert s.records(run_dir, "evaluator", "eval")  # The evaluator ran as before.
    assert s.gauge(run_dir, "learner_steps", "learner") > 0


def test_envs_per_actor_must_be_positive(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert cli.main(["launch", "d4pg", "--run-dir", run_dir, "--envs-per-actor", "0"]) == 2
    captured = capsys.readouterr()
    assert "--envs-per-actor must be at least 1" in captured.err
    assert not os.path.exists(run_dir)


def test_grouped_replay_items_launch_counts_transitions(tmp_path):
    """G transitions per item: replay sizes and the evaluator's step count stay in steps."""
    run_dir = str(tmp_path / "run")
    proc = _launch(
        run_dir,
        *("--envs-per-actor", "2", "--steps", "2000", "--eval-every-steps", "500"),
        *("--eval-episodes", "1", "--config.transitions_per_item=4", "--config.item_pool_size=32"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = sum(r.get("actor_steps", 0) for r in s.records(run_dir, "actor_0", "count"))
    size = s.gauge(run_dir, "replay_size", "replay")
    # Transitions in replay: the finished episodes' steps, plus what the two unfinished
    # episodes wrote, minus what stayed in the actor's pool (< 32), the last n_step (5)
    # steps of each unfinished episode, which have no transition yet, and the items the
    # stopped actor's writer had not had confirmed (at most its 8 in flight plus the 3
    # written between its checks every 4 items: CI once saw 2748 for 2800 steps); whole
    # items of 4.
    pending = 32 + 2 * 5 + (8 + 3) * 4
    assert size % 4 == 0 and steps - pending <= size <= steps + 2 * 200, (size, steps)
    inserts = [r["replay_inserts"] for r in s.records(run_dir, "evaluator", "eval")]
    assert len(inserts) >= 2 and all(n % 4 == 0 for n in inserts), inserts
    # Counted in transitions: 2,000 steps make at most 500 items of 4. The last evaluation comes
    # after 1,500 actor steps, but under load its count lags them (1,360 seen), hence 500.
    assert inserts[-1] > 2000 // 4, inserts
