"""`replicator plot` of several runs: grouping, mean and 95% band from the figure's data."""

import csv
import json
import os

import numpy as np
import pytest

from launch import cli
from launch.reporting import plot, references
from launch.runtime.metrics import CSV_COLUMNS

pytestmark = pytest.mark.timeout(120)

T_975_2DF = 4.302652729911275  # Student t quantile 0.975 with 2 degrees of freedom (tables).
STEPS = [0, 1000, 2000, 3000]
WALL = [10.0, 70.0, 130.0, 190.0]
RETURNS = {  # Per seed: eval_return at STEPS.
    0: [1.0, 100.0, 300.0, 500.0],
    1: [3.0, 140.0, 320.0, 700.0],
    2: [2.0, 60.0, 400.0, 600.0],
}
LOSSES = {0: [5.0, 4.0, 3.0, 2.0], 1: [6.0, 4.5, 3.5, 1.0], 2: [4.0, 3.5, 2.0, 1.5]}


def _make_run(
    root,
    name,
    seed,
    task="cartpole:swingup",
    sigma=0.3,
    steps=STEPS,
    returns=None,
    from_pixels=False,
    action_repeat=None,
):
    run = os.path.join(root, name)
    os.makedirs(run)
    config = {"seed": seed, "sigma": sigma, "batch_size": 64, "from_pixels": from_pixels}
    config["action_repeat"] = action_repeat
    with open(os.path.join(run, "run.json"), "w") as f:
        json.dump({"program": "d4pg", "task": task, "config": config}, f)
    returns = returns or RETURNS[seed]
    with open(os.path.join(run, "metrics.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS)
        writer.writeheader()
        for i, step in enumerate(steps):
            writer.writerow(
                {
                    "wall_time_s": WALL[i],
                    "actor_steps": step,
                    "eval_return": returns[i],
                    "critic_loss": LOSSES[seed][i],
                    "bottleneck": "learner-bound: actors blocked 62% of the time: ...",
                }
            )
    return run


def _hand(values):
    values = np.asarray(values, float)
    mean = values.mean(axis=0)
    half = T_975_2DF * values.std(axis=0, ddof=1) / np.sqrt(len(values))
    return mean, mean - half, mean + half


def test_three_seeds_mean_and_band_match_a_hand_computation(tmp_path):
    runs = [_make_run(str(tmp_path), f"seed{s}", s) for s in (0, 1, 2)]
    out = str(tmp_path / "curves.png")
    assert cli.main(["plot", *runs, "--out", out]) == 0
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    data = plot.read_png_data(out)
    assert len(data) == 2  # One group, drawn against actor steps and wall time.
    mean, low, high = _hand([RETURNS[s] for s in (0, 1, 2)])
    for curve, xs in zip(data, (STEPS, [w / 60 for w in WALL])):
        assert "3 runs" in curve["group"]
        np.testing.assert_allclose(curve["x"], xs)
        np.testing.assert_allclose(curve["mean"], mean)
        np.testing.assert_allclose(curve["low"], low)
        np.testing.assert_allclose(curve["high"], high)
    assert {c["axis"] for c in data} == {"actor_steps", "wall_time_s"}


def test_any_column_and_config_groups(tmp_path):
    runs = [_make_run(str(tmp_path), f"seed{s}", s) for s in (0, 1, 2)]
    # Another sigma: its own group (label says what differs), one run, no band.
    other = _make_run(str(tmp_path), "sigma", 0, sigma=0.5)
    out = str(tmp_path / "loss.png")
    assert cli.main(["plot", *runs, other, "--metric", "critic_loss", "--out", out]) == 0
    data = [c for c in plot.read_png_data(out) if c["axis"] == "actor_steps"]
    by_group = {c["group"]: c for c in data}
    assert set(by_group) == {
        "cartpole:swingup sigma=0.3 (3 runs)",
        "cartpole:swingup sigma=0.5 (1 run)",
    }
    mean, low, high = _hand([LOSSES[s] for s in (0, 1, 2)])
    np.testing.assert_allclose(by_group["cartpole:swingup sigma=0.3 (3 runs)"]["mean"], mean)
    np.testing.assert_allclose(by_group["cartpole:swingup sigma=0.3 (3 runs)"]["low"], low)
    np.testing.assert_allclose(by_group["cartpole:swingup sigma=0.3 (3 runs)"]["high"], high)
    single = by_group["cartpole:swingup sigma=0.5 (1 run)"]
    np.testing.assert_allclose(single["mean"], LOSSES[0])
    np.testing.assert_allclose(single["low"], single["high"])


def test_runs_at_different_steps_are_interpolated_on_their_common_range(tmp_path):
    a = _make_run(str(tmp_path), "a", 0, steps=[0, 1000, 2000, 3000], returns=[0, 10, 20, 30])
    b = _make_run(str(tmp_path), "b", 1, steps=[500, 1500, 2500, 3500], returns=[5, 15, 25, 35])
    out = str(tmp_path / "x.png")
    assert cli.main(["plot", a, b, "--out", out]) == 0
    curve = next(c for c in plot.read_png_data(out) if c["axis"] == "actor_steps")
    np.testing.assert_allclose(curve["x"], [500, 1000, 1500, 2000, 2500, 3000])
    # Both runs lie on y = x / 100: the mean too, and the two runs agree (zero-width band).
    np.testing.assert_allclose(curve["mean"], np.array(curve["x"]) / 100)
    np.testing.assert_allclose(curve["high"], curve["low"], atol=1e-9)


def test_single_run_dir_still_works(tmp_path):
    run = _make_run(str(tmp_path), "one", 0)
    assert cli.main(["plot", "--run-dir", run]) == 0
    data = plot.read_png_data(os.path.join(run, "eval_return.png"))
    np.testing.assert_allclose(data[0]["mean"], RETURNS[0])


def _error(capsys):
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    return lines[0]


def test_bad_plot_input(tmp_path, capsys):
    assert cli.main(["plot"]) == 2
    assert "no runs to plot" in _error(capsys)
    a = _make_run(str(tmp_path), "a", 0)
    b = _make_run(str(tmp_path), "b", 1, task="walker:walk")
    assert cli.main(["plot", a, b]) == 2
    err = _error(capsys)
    assert "different tasks (cartpole:swingup, walker:walk)" in err and "--group-by task" in err
    out = str(tmp_path / "tasks.png")
    assert cli.main(["plot", a, b, "--group-by", "task", "--out", out]) == 0
    assert {c["group"] for c in plot.read_png_data(out)} == {
        "cartpole:swingup (1 run)",
        "walker:walk (1 run)",
    }
    capsys.readouterr()
    assert cli.main(["plot", a, "--group-by", "colour"]) == 2
    assert "--group-by colour" in _error(capsys)
    assert cli.main(["plot", a, "--metric", "nope"]) == 1
    assert "no 'nope' values" in _error(capsys)
    assert cli.main(["plot", str(tmp_path / "missing")]) == 2
    assert "does not exist" in _error(capsys)


# Runs long enough to meet the references (which start at 50k environment steps).
LONG_STEPS = [0, 40_000, 80_000, 120_000]


def _published(method, task, up_to):
    """(steps, mean, min, max) columns read straight from the shipped file, steps <= up_to."""
    with open(references.PATH, encoding="utf-8") as f:
        points = json.load(f)["methods"][method][task]
    rows = sorted((int(s), p["mean"], p["min"], p["max"]) for s, p in points.items() if p)
    return [list(c) for c in zip(*(r for r in rows if r[0] <= up_to))]


def _reference_curves(path):
    return [c for c in plot.read_png_data(path) if "reference" in c]


def test_reference_curves_are_the_published_ones_up_to_the_next_step_past_the_runs(
    tmp_path, capsys
):
    runs = [
        _make_run(str(tmp_path), f"seed{s}", s, task="walker:walk", steps=LONG_STEPS)
        for s in (0, 1, 2)
    ]
    for asked in (["mpo"], ["d4pg", "mpo"]):
        out = str(tmp_path / f"{'-'.join(asked)}.png")
        assert cli.main(["plot", *runs, "--reference", ",".join(asked), "--out", out]) == 0
        assert capsys.readouterr().err == ""  # Nothing left out, nothing to say.
        curves = _reference_curves(out)
        assert [c["reference"] for c in curves] == asked
        for curve, method in zip(curves, asked):
            # Runs end at 120k: the reference stops at 150k, the first reference step past.
            steps, mean, low, high = _published(method, "walker:walk", 150_000)
            assert steps == [50_000, 100_000, 150_000]
            assert curve["axis"] == "actor_steps" and curve["task"] == "walker:walk"
            name = references.METHOD_NAMES[method]
            assert curve["group"] == f"{name} (published, state features)"
            np.testing.assert_allclose(curve["x"], steps)
            np.testing.assert_allclose(curve["mean"], mean)
            if len(asked) == 1:  # One method: its min-max band; several: means only.
                np.testing.assert_allclose(curve["low"], low)
                np.testing.assert_allclose(curve["high"], high)
            else:
                assert "low" not in curve
    # The runs' own curves are unchanged, and the source is cited on the figure.
    mean, _, _ = _hand([RETURNS[s] for s in (0, 1, 2)])
    own = [c for c in plot.read_png_data(out) if "reference" not in c]
    assert {c["axis"] for c in own} == {"actor_steps", "wall_time_s"}
    steps_panel = next(c["panel"] for c in own if c["axis"] == "actor_steps")
    assert {c["panel"] for c in curves} == {steps_panel}  # Beside the runs' steps curve.
    np.testing.assert_allclose(own[0]["mean"], mean)
    assert any(references.SOURCE_SHORT in note for note in plot.read_png_notes(out))


def test_reference_all_and_its_limit(tmp_path):
    assert plot.reference_limit(3_000) == 50_000
    assert plot.reference_limit(150_000) == 150_000
    assert plot.reference_limit(150_001) == 200_000
    assert plot.reference_limit(2_000_000) == 500_000
    run = _make_run(str(tmp_path), "long", 0, steps=[0, 100_000, 400_000, 900_000])
    out = str(tmp_path / "all.png")
    assert cli.main(["plot", run, "--reference", "all", "--out", out]) == 0
    curves = {c["reference"]: c for c in _reference_curves(out)}
    assert list(curves) == references.methods()
    for method, curve in curves.items():
        steps, mean, _, _ = _published(method, "cartpole:swingup", 500_000)
        np.testing.assert_allclose(curve["x"], steps)
        np.testing.assert_allclose(curve["mean"], mean)
    # DreamerV3's published curve stops before 500k: that point is left out, not invented.
    assert curves["dreamerv3"]["x"][-1] == 300_000


def test_references_of_several_tasks_follow_each_task(tmp_path, capsys):
    walker = _make_run(str(tmp_path), "w", 0, task="walker:walk", steps=LONG_STEPS)
    cheetah = _make_run(str(tmp_path), "c", 1, task="cheetah:run", steps=[0, 1, 2, 60_000])
    pixels = _make_run(str(tmp_path), "p", 2, task="finger:spin", from_pixels=True)
    out = str(tmp_path / "tasks.png")
    args = ["plot", walker, cheetah, pixels, "--group-by", "task", "--reference", "d4pg"]
    assert cli.main([*args, "--out", out]) == 0
    assert "pixel runs of finger:spin" in _error(capsys)
    curves = {c["task"]: c for c in _reference_curves(out)}
    assert set(curves) == {"walker:walk", "cheetah:run"}  # Not finger:spin: pixels only.
    for task, up_to in (("walker:walk", 150_000), ("cheetah:run", 100_000)):
        steps, mean, _, _ = _published("d4pg", task, up_to)
        assert curves[task]["group"] == f"D4PG on {task} (published, state features)"
        np.testing.assert_allclose(curves[task]["x"], steps)
        np.testing.assert_allclose(curves[task]["mean"], mean)


def test_references_meet_runs_that_repeat_actions_at_their_environment_steps(tmp_path, capsys):
    # Runs acting every 2 environment steps, to 60k actor steps (120k environment steps).
    runs = [
        _make_run(
            str(tmp_path), f"r{s}", s, task="walker:walk", steps=[0, 1, 2, 60_000], action_repeat=2
        )
        for s in (0, 1)
    ]
    out = str(tmp_path / "repeat.png")
    assert cli.main(["plot", *runs, "--reference", "d4pg", "--out", out]) == 0
    assert capsys.readouterr().err == ""  # Nothing left out, nothing to say.
    (curve,) = _reference_curves(out)
    steps, mean, _, _ = _published("d4pg", "walker:walk", 150_000)
    np.testing.assert_allclose(curve["x"], [s / 2 for s in steps])  # 25k, 50k, 75k.
    np.testing.assert_allclose(curve["mean"], mean)
    assert curve["group"] == "D4PG (published, state features; at environment steps / 2)"
    # Runs of one task with different repeats share no step axis with the references.
    other = _make_run(str(tmp_path), "r2", 2, task="walker:walk", steps=LONG_STEPS)
    out = str(tmp_path / "mixed.png")
    assert cli.main(["plot", *runs, other, "--reference", "d4pg", "--out", out]) == 0
    assert "references not drawn for walker:walk: its runs repeat actions" in _error(capsys)
    assert _reference_curves(out) == []


def test_bad_reference_name_is_one_usage_error(tmp_path, capsys):
    run = _make_run(str(tmp_path), "a", 0)
    assert cli.main(["plot", run, "--reference", "d4pg,sac"]) == 2
    err = _error(capsys)
    assert "--reference sac" in err and "d4pg, ddpg, mpo, dmpo, dreamerv3" in err
    assert not os.path.exists(os.path.join(run, "eval_return.png"))


@pytest.mark.parametrize(
    "kind, expected",
    [
        ("pixels", "pixel runs of walker:walk (from_pixels=true)"),
        ("task", "not drawn for hopper:hop: the reference file has curves for"),
        ("metric", "only for eval_return, not critic_loss"),
    ],
)
def test_reference_left_out_says_why_and_still_plots_the_runs(tmp_path, capsys, kind, expected):
    task = "hopper:hop" if kind == "task" else "walker:walk"
    run = _make_run(
        str(tmp_path), "a", 0, task=task, steps=LONG_STEPS, from_pixels=kind == "pixels"
    )
    metric = "critic_loss" if kind == "metric" else "eval_return"
    out = str(tmp_path / "x.png")
    assert cli.main(["plot", run, "--reference", "all", "--metric", metric, "--out", out]) == 0
    assert expected in _error(capsys)
    data = plot.read_png_data(out)
    assert _reference_curves(out) == []
    assert {c["axis"] for c in data} == {"actor_steps", "wall_time_s"}
    assert plot.read_png_notes(out) == []
