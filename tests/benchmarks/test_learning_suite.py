"""The learning suite's summary: medians over all seeds, points at equal steps, collapses."""

import pytest

from benchmarks import agents_learning_suite as suite

pytestmark = pytest.mark.timeout(60)


def _run(curve):
    return {
        "curve": curve,
        "actor_steps": curve[-1][0],
        "final_eval_return": curve[-1][2],
        "best_eval_return": max(p[2] for p in curve),
        "wall_s": curve[-1][1] + 5.0,
        "noisy": False,
    }


def test_a_seed_that_never_got_there_counts_in_the_median():
    # Over the seeds that got there the median would be 150; over all three it is 200.
    assert suite.censored_median([100.0, 200.0, None]) == 200.0
    # The middle seed never got there: the median is only known to lie past the budget.
    assert suite.censored_median([100.0, None, None]) is None
    assert suite.censored_median([300.0, 100.0]) == 200.0


def test_collapse_counts_evaluations_below_half_of_the_best_after_it():
    curve = [[10_000, 1.0, 50.0], [20_000, 2.0, 900.0], [30_000, 3.0, 449.0], [40_000, 4.0, 460.0]]
    assert suite.collapses(curve) == 1  # 449 < 450; 460 is not a collapse.
    # Low evaluations before the best are learning, not collapse.
    assert suite.collapses([[10_000, 1.0, 0.0], [20_000, 2.0, 900.0]]) == 0


def test_summary_sets_each_seed_evaluation_at_a_step_beside_the_references():
    def curve(scale):
        return [[s + 37, s / 1000.0, scale * s / 1000.0] for s in range(10_000, 210_000, 10_000)]

    summary = suite.summarise({"walker:walk": {"0": _run(curve(4.0)), "1": _run(curve(2.0))}})
    at_100k = summary["walker:walk"]["at_steps"]["100000"]
    assert at_100k["ours"]["mean"] == pytest.approx((400.0 + 200.0) / 2)
    assert at_100k["references"]["d4pg"] == pytest.approx(360.6)
    assert at_100k["best_reference"]["method"] == "ddpg"
    assert "500000" not in summary["walker:walk"]["at_steps"]  # no run reached it
    # D4PG's 200k return (806.5): neither seed gets there (seed 0 ends at 800).
    to_200k = summary["walker:walk"]["to_d4pg_reference_return_at"]["200000"]
    assert to_200k["seeds_reached"] == 0 and to_200k["median_actor_steps"] is None
    to_100k = summary["walker:walk"]["to_d4pg_reference_return_at"]["100000"]
    # D4PG's 100k return (360.6): seed 0 passes it at 100k (400), seed 1 at 190k (380).
    assert to_100k["seeds_reached"] == 2
    assert to_100k["median_actor_steps"] == pytest.approx((100_037 + 190_037) / 2)


def test_an_evaluation_more_than_a_period_away_is_not_the_point():
    curve = [[39_000, 1.0, 10.0], [61_000, 2.0, 20.0]]
    assert suite.evaluation_at(curve, 50_000) is None
    assert suite.evaluation_at([[50_400, 1.0, 10.0]], 50_000) == [50_400, 1.0, 10.0]


def test_a_run_that_repeats_actions_is_compared_at_its_environment_steps():
    # Evaluations every 5k actor steps of a run acting every 2 environment steps: its
    # evaluation at 50k actor steps is the one at the references' 100k environment steps.
    curve = [[s, s / 1000.0, s / 100.0] for s in range(5_000, 105_000, 5_000)]
    run = {**_run(curve), "run_config": {"action_repeat": 2}}
    summary = suite.summarise({"walker:walk": {"0": run}})
    assert summary["walker:walk"]["at_steps"]["100000"]["ours"]["mean"] == pytest.approx(500.0)
    assert summary["walker:walk"]["at_steps"]["200000"]["ours"]["mean"] == pytest.approx(1000.0)
    # D4PG's 100k return (360.6) is first passed at 40k actor steps (400): 80k steps.
    to_100k = summary["walker:walk"]["to_d4pg_reference_return_at"]["100000"]
    assert to_100k["median_actor_steps"] == pytest.approx(80_000)
    # A stored config without a repeat (features) counts actor steps as they are.
    plain = {**_run(curve), "run_config": {"action_repeat": None}}
    assert suite.summarise({"walker:walk": {"0": plain}})["walker:walk"]["at_steps"]["100000"][
        "ours"
    ]["mean"] == pytest.approx(1000.0)
