"""The README's benchmark table is what benchmarks/readme_table.py makes of the result JSONs."""

import json
import shutil

import pytest

from agents.d4pg.config import D4PGConfig
from benchmarks import readme_table, vision_sngan_batches

pytestmark = pytest.mark.timeout(60)


def test_readme_table_matches_the_results():
    text = readme_table.README.read_text(encoding="utf-8")
    assert readme_table.current_block(text) == readme_table.render(), (
        "README.md's benchmark table disagrees with benchmarks/results/*.json: run "
        "python benchmarks/readme_table.py"
    )


def test_readme_learning_suite_table_matches_its_results():
    text = readme_table.README.read_text(encoding="utf-8")
    block = readme_table.current_block(text, readme_table.SUITE_BEGIN, readme_table.SUITE_END)
    assert block == readme_table.render_suite(), "run python benchmarks/readme_table.py"


def test_the_suite_table_recomputes_from_a_changed_summary(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(readme_table.RESULTS, results)
    path = results / readme_table.SUITE_RESULT
    data = json.loads(path.read_text())
    task = sorted(data["summary"])[0]
    data["summary"][task]["at_steps"]["100000"]["ours"]["mean"] = 123.0
    path.write_text(json.dumps(data))
    assert "| **123** ±" in readme_table.render_suite(results)
    assert "| **123** ±" not in readme_table.render_suite()


def test_readme_sngan_batch_table_matches_its_results():
    text = readme_table.README.read_text(encoding="utf-8")
    block = readme_table.current_block(text, readme_table.SNGAN_BEGIN, readme_table.SNGAN_END)
    assert block == readme_table.render_sngan_batches(), "run python benchmarks/readme_table.py"


def test_the_sngan_batch_table_shows_the_seeds_still_missing(tmp_path):
    """A sweep stopped early: each batch's row says how many of the planned seeds it holds."""
    result = {"steps": 1000, "replicas": "cpu:4", "classifier_eval_accuracy": 0.98, "runs": {}}
    config = json.loads((readme_table.RESULTS / "vision_sngan_defaults.json").read_text())
    for batch, seed, fid in ((32, 0, 40.0), (32, 1, 60.0), (128, 0, 30.0)):
        record = {
            "at_end": {"fid": fid, "inception_score": 5.0, "class_accuracy": 0.5},
            "wall_s": 100.0,
            "load_average": {"before": 1.0, "after": 2.5},
            "config": config["config"],
        }
        result = vision_sngan_batches.merge_run(result, batch, seed, record)
    result["planned"] = {"batch_sizes": [32, 128, 512], "seeds": [0, 1]}
    (tmp_path / readme_table.SNGAN_BATCHES_RESULT).write_text(json.dumps(result))
    table = readme_table.render_sngan_batches(tmp_path)
    assert "| 32 (8 per replica) | 0, 1 | 50.0 (40.0-60.0) | 5.00 (5.00-5.00) |" in table
    assert "| 128 (32 per replica) | 0 (1 of 2 run) | 30.0 | 5.00 | 0.500 | 100 | 2.5 |" in table
    assert "| 512 (128 per replica) | none (0 of 2 run) | - | - | - | - | - |" in table
    assert "the mean FID gets better, Inception Score: mixed" in table


def test_every_result_has_a_row():
    assert readme_table.uncovered() == [], "add a Row for it in benchmarks/readme_table.py"


def test_a_changed_result_changes_the_table(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(readme_table.RESULTS, results)
    path = results / "vision_sngan.json"
    data = json.loads(path.read_text())
    assert "| 0.93 (global batch 64: 0.91); noisy |" in readme_table.render(results)
    data["ratio_cpu2_over_cpu_median"]["256"] = 0.54
    path.write_text(json.dumps(data))
    table = readme_table.render(results)
    assert "| 0.54 (global batch 64: 0.91); noisy |" in table
    assert table != readme_table.current_block(readme_table.README.read_text(encoding="utf-8"))


def test_targets_are_checked_against_the_json():
    row = readme_table.Row(
        "x.json", "x", "{a/b|.1f}", readme_table.Target(">=", 1.0, "a/b"), derived={}
    )
    assert readme_table.render_row(row, {"a": {"b": 1.25}}).startswith("| x | 1.2 | >= 1 |")
    assert "| >= 1 (not met) |" in readme_table.render_row(row, {"a": {"b": 0.5}})
    with pytest.raises(KeyError, match="x.json: no 'a/c'"):
        readme_table.render_row(readme_table.Row("x.json", "x", "{a/c}"), {"a": {"b": 1}})


@pytest.mark.parametrize("noisy", [True, False])
def test_the_actor_target_is_checked_on_cpu_time_only_under_load(noisy):
    """Under load the wall ratio measures the scheduler, not the actor: the K=16 target is
    checked on the process-CPU-time ratio then, and on the wall ratio on a quiet machine."""
    (row,) = [
        r
        for r in readme_table.ROWS
        if r.result == "agents_replay_layout.json" and "one actor" in r.what
    ]
    data = json.loads((readme_table.RESULTS / row.result).read_text())
    data["noisy"] = noisy
    data["actor"]["actor_over_raw_process_cpu"]["g16_k16"] = 0.85
    data["actor"]["actor_over_raw_wall"]["g16_k16"] = 0.7
    target = readme_table.render_row(row, data).split(" | ")[-2]
    assert target.endswith(">= 0.8" if noisy else ">= 0.8 (not met)")


def test_the_suite_note_names_a_learning_rate_decay_from_the_preset_or_a_flag():
    constant = {"samples_per_insert": 32.0, "policy_lr": 1e-3, "critic_lr": 1e-3}
    decaying = "decaying linearly to x0.1 over 100,000 learner updates"
    assert "decaying" not in readme_table._preset_summary(constant)
    flags = ["--config.lr_decay_updates=100000", "--config.lr_final_scale=0.1"]
    assert decaying in readme_table._preset_summary(constant, flags)
    in_preset = dict(constant, lr_decay_updates=100_000, lr_final_scale=0.1)
    assert decaying in readme_table._preset_summary(in_preset)
    off_by_flag = readme_table._preset_summary(in_preset, ["--config.lr_decay_updates=0"])
    assert "decaying" not in off_by_flag
    policy_kept = readme_table._preset_summary(in_preset, ["--config.policy_lr_final_scale=1"])
    assert "decaying linearly to x1 (policy) / x0.1 (critic) over 100,000" in policy_kept
    held = readme_table._preset_summary(in_preset, ["--config.lr_decay_start_fraction=0.5"])
    assert "held for 50,000 learner updates, then decaying linearly to x0.1 by update 100,000" in (
        held
    )


def test_the_suite_rows_of_a_presets_task_values_ran_with_todays_values():
    """A task's second suite row must show runs of the values the preset now gives it."""
    from launch.d4pg import program as d4pg_program  # pylint: disable=import-outside-toplevel

    assert set(readme_table.SUITE_TASK_VALUE_RESULTS) == set(
        d4pg_program.PRESET_TASK_VALUES["quick"]
    )
    files = [*readme_table.SUITE_TASK_VALUE_RESULTS.items()]
    files += readme_table.SUITE_TASK_VALUE_LONG_RESULTS.items()
    for task, name in files:
        values = d4pg_program.preset_task_values("quick", task, from_pixels=False)
        runs = json.loads((readme_table.RESULTS / name).read_text())["runs"][task]
        for seed, run in runs.items():
            stored = D4PGConfig.from_dict(run["run_config"])
            assert {k: getattr(stored, k) for k in values} == values, (name, seed)


def test_a_suite_run_is_summarised_by_the_config_it_stored_before_its_preset_and_flags():
    """A run's own config holds what the launch resolved (the decay span from --steps)."""
    preset = {"samples_per_insert": 32.0, "policy_lr": 1e-3, "critic_lr": 1e-3}
    stored = dict(preset, lr_decay_updates=102_500, lr_final_scale=0.1)
    run = {"quick_preset": preset, "launch_flags": [], "run_config": stored}
    assert "over 102,500 learner updates" in readme_table._run_preset_summary(run)
    older = {"quick_preset": preset, "launch_flags": ["--config.lr_decay_updates=100000"]}
    assert "over 100,000 learner updates" in readme_table._run_preset_summary(older)


def test_a_candidate_is_compared_with_the_baseline_runs_of_its_own_seeds(monkeypatch):
    """Means over the candidate's seeds only, and a run counts as collapsed when an
    evaluation after its best falls below half of it (a low one before it does not)."""
    kept, collapsed = (
        [[50_000, 0, 100.0], [100_000, 0, 400.0], [200_000, 0, 800.0]],
        [[100_000, 0, 800.0], [200_000, 0, 300.0]],
    )
    baseline = {
        "runs": {
            "t": {
                "0": {"curve": kept},
                "1": {"curve": collapsed},
                "2": {"curve": [[200_000, 0, 0.0]]},
            }
        }
    }
    monkeypatch.setattr(readme_table, "_read_result", lambda name: baseline)
    candidate = {"runs": {"t": {"0": {"curve": collapsed}, "1": {"curve": collapsed}}}}
    text = readme_table._candidate_vs_default_text(candidate, "base.json", collapses=True)
    assert text == "`t` (seeds 0, 1): 800 vs 600 at 100k, 300 vs 550 at 200k, collapses 2 vs 1"


def test_long_runs_count_collapses_over_the_seeds_both_files_ran():
    """A seed only one file holds plays no part: neither in the means nor in the counts."""
    kept = [[200_000, 0, 600.0], [500_000, 0, 700.0]]
    collapsed = [[200_000, 0, 800.0], [500_000, 0, 300.0]]
    before = {
        "runs": {"t": {"0": {"curve": collapsed}, "1": {"curve": kept}}},
        "summary": {"t": {"runs_collapsed": 1, "seeds": [0, 1]}},
    }
    now = {
        "runs": {"t": {"0": {"curve": kept}, "1": {"curve": kept}, "2": {"curve": collapsed}}},
        "summary": {"t": {"runs_collapsed": 1, "seeds": [0, 1, 2]}},
    }
    text = readme_table._long_runs_text(before, now=now)
    assert text == (
        "`t` (seeds 0, 1): 600 vs 700 at 200k, 700 vs 500 at 500k; collapses 0 of 2 vs 1 of 2"
    )
