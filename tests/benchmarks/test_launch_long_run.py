"""The long-run benchmark's reading of a run's metrics: paces per window, and its merging."""

import json

import pytest

from benchmarks import launch_long_run as long_run

pytestmark = pytest.mark.timeout(60)


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _run_dir(tmp_path):
    """60 episodes of 1,000 actor steps: 2,000 steps/s for the first 30k, then 1,600;
    the learner gauged every 5 s at half the actor steps (as with 32 samples per insert
    and batch 64), and one replay checkpoint."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    t, times = 1000.0, []
    for episode in range(60):
        t += 0.5 if episode < 30 else 0.625
        times.append(t)
    # Two actors, alternating episodes, as their own files.
    for actor in (0, 1):
        _write(
            metrics / f"actor_{actor}.jsonl",
            [
                {"t": times[e], "node": f"actor_{actor}", "kind": "count", "actor_steps": 1000}
                for e in range(actor, 60, 2)
            ],
        )

    def actor_steps_at(when):
        return 1000 * sum(1 for x in times if x <= when)

    gauges = [
        {
            "t": 1000.0 + g,
            "node": "learner",
            "kind": "gauge",
            "learner_steps": actor_steps_at(1000.0 + g) / 2,
        }
        for g in range(0, 36, 1)
    ]
    _write(metrics / "learner.jsonl", gauges)
    _write(
        metrics / "replay.jsonl",
        [
            {
                "t": 1020.0,
                "node": "replay",
                "kind": "replay_checkpoint",
                "size_after": 4096,
                "seconds": 0.5,
            }
        ],
    )
    return str(tmp_path)


def test_the_windows_hold_the_pace_of_their_own_actor_steps(tmp_path):
    figures = long_run.analyse(_run_dir(tmp_path), warmup=5000, size=20000, loads=[])
    assert figures["actor_steps"] == 60000
    first, last = figures["first_window"], figures["last_window"]
    assert first["actor_steps"] == [5000, 25000] and last["actor_steps"] == [40000, 60000]
    assert first["actor_steps_per_s"] == pytest.approx(2000.0)
    assert last["actor_steps_per_s"] == pytest.approx(1600.0)
    # The learner's gauges are read over the same seconds (to the gauges' 1 s resolution).
    assert first["learner_updates_per_s"] == pytest.approx(1000.0, rel=0.03)
    assert last["learner_updates_per_s"] == pytest.approx(800.0, rel=0.03)
    assert figures["last_over_first"]["actor_steps_per_s"] == pytest.approx(0.8)
    assert figures["replay_checkpoints"] == [{"t": 19.5, "transitions": 4096, "seconds": 0.5}]


def test_stored_runs_are_kept_and_another_setting_is_refused(tmp_path):
    setting = {"task": "cheetah:run", "steps": 500000, "launch_flags": []}
    path = tmp_path / "result.json"
    path.write_text(json.dumps({**setting, "runs": {"0": {"wall_s": 1.0}}}), encoding="utf-8")
    assert long_run.stored_runs(str(path), setting) == {"0": {"wall_s": 1.0}}
    with pytest.raises(ValueError, match="another setting .steps.*another --results"):
        long_run.stored_runs(str(path), {**setting, "steps": 200000})
    assert long_run.stored_runs(str(tmp_path / "none.json"), setting) == {}
