"""The alternating launches' rates: the learner's running rate leaves the start-up out."""

import pytest

# The benchmark scripts import each other as top-level modules, from benchmarks/ on the
# path, which this import sets up as they do.
from benchmarks import launch_replay_layout  # noqa: F401

import launch_alternating  # isort: skip

pytestmark = pytest.mark.timeout(60)


def _run():
    """A launch whose first evaluation comes at 12 s (after a slow start-up: 1,000 actor steps), then
    2,000 actor steps/s from 15 s to 65 s; 2 learner updates per actor step over the run.
    Its wall time (90 s) holds the start-up and the shutdown."""
    curve = [[1000.0, 12.0, 0.0]] + [
        [1000.0 + 2000.0 * (t - 15.0) + 12_000.0, t, 1.0] for t in range(15, 66, 5)
    ]
    actor_steps = curve[-1][0]
    return {
        "curve": curve,
        "actor_steps": actor_steps,
        "learner_steps": 2 * actor_steps,
        "wall_s": 90.0,
    }


def test_the_running_rate_is_taken_after_the_start_up():
    run = _run()
    assert launch_alternating.running_learner_updates_per_s(run) == pytest.approx(4000.0)
    # The whole launch's rate, start-up and shutdown included, is lower.
    assert run["learner_steps"] / run["wall_s"] < 3000


def test_the_summary_holds_the_median_running_rate():
    fast, slow = _run(), _run()
    slow["learner_steps"] = slow["actor_steps"]  # 1 update per actor step: 2,000/s.
    for run in (fast, slow):
        run.update(
            learner_updates_per_s=0.0,
            actor_steps_per_s=0.0,
            seconds_to_target=None,
            actor_steps_to_target=None,
            final_eval_return=1.0,
        )
    summary = launch_alternating.summarise({"a": {"0": fast, "1": slow, "2": fast}})
    assert summary["a"]["median_running_learner_updates_per_s"] == pytest.approx(4000.0)
