"""benchmarks/vision_sngan_batches.py keeps every finished run and summarises over seeds."""

import json

import pytest

from benchmarks import vision_sngan_batches as sweep

pytestmark = pytest.mark.timeout(60)


def _record(fid: float, inception: float, accuracy: float, wall: float) -> dict:
    return {
        "at_end": {"fid": fid, "inception_score": inception, "class_accuracy": accuracy},
        "wall_s": wall,
        "load_average": {"before": 1.0, "after": 3.0},
    }


def _sweep(*runs: tuple[int, int, dict]) -> dict:
    result = {"steps": 1000, "replicas": "cpu:4", "runs": {}}
    for batch, seed, record in runs:
        result = sweep.merge_run(result, batch, seed, record)
    return result


def test_a_merged_run_keeps_the_earlier_ones_and_the_summary_spans_the_seeds():
    result = _sweep(
        (32, 0, _record(40.0, 5.0, 0.30, 100.0)),
        (512, 0, _record(20.0, 6.0, 0.50, 900.0)),
        (32, 1, _record(60.0, 4.0, 0.20, 120.0)),
    )
    assert sorted(result["runs"]) == ["32", "512"]
    assert sorted(result["runs"]["32"]) == ["0", "1"]
    small = result["summary"]["32"]
    assert small["seeds"] == [0, 1]
    assert small["fid"] == {"mean": 50.0, "min": 40.0, "max": 60.0}
    assert small["class_accuracy"]["mean"] == pytest.approx(0.25)
    assert small["wall_s"] == {"mean": 110.0, "min": 100.0, "max": 120.0}
    assert result["summary"]["512"]["seeds"] == [0]
    # Lower FID, higher IS and accuracy at the larger batch: better on every metric.
    assert result["trend"] == {
        "fid": "better",
        "inception_score": "better",
        "class_accuracy": "better",
    }
    assert result["max_load_average"] == 3.0


def test_the_trend_is_mixed_unless_every_larger_batch_moves_the_same_way():
    result = _sweep(
        (32, 0, _record(40.0, 5.0, 0.30, 1.0)),
        (128, 0, _record(30.0, 4.0, 0.20, 1.0)),
        (512, 0, _record(35.0, 3.0, 0.10, 1.0)),
    )
    assert result["trend"] == {
        "fid": "mixed",
        "inception_score": "worse",
        "class_accuracy": "worse",
    }


def test_a_rerun_skips_the_runs_its_result_holds(tmp_path, capsys):
    """Resuming a sweep starts no training for a (batch, seed) already in the file."""
    out, work = tmp_path / "result.json", tmp_path / "work"
    (work / "classifier").mkdir(parents=True)
    result = _sweep((32, 0, _record(40.0, 5.0, 0.30, 1.0)), (128, 0, _record(30.0, 6.0, 0.40, 1.0)))
    result["classifier_eval_accuracy"] = 0.98
    out.write_text(json.dumps(result))
    argv = ["--batch-sizes", "32,128", "--seeds", "0", "--work-dir", str(work), "--out", str(out)]
    assert sweep.main(argv) == 0
    printed = capsys.readouterr().out
    assert "training" not in printed
    assert json.loads(out.read_text())["runs"] == result["runs"]


def test_a_result_from_other_settings_is_refused(tmp_path):
    """Runs of 20 generator steps would not compare with the file's runs of 1000."""
    out, work = tmp_path / "result.json", tmp_path / "work"
    (work / "classifier").mkdir(parents=True)
    result = _sweep((32, 0, _record(40.0, 5.0, 0.30, 1.0)))
    result["classifier_eval_accuracy"] = 0.98
    out.write_text(json.dumps(result))
    argv = ["--steps", "20", "--batch-sizes", "32", "--seeds", "0"]
    with pytest.raises(SystemExit, match="steps=1000, not 20"):
        sweep.main([*argv, "--work-dir", str(work), "--out", str(out)])
