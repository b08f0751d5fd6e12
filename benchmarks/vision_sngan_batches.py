"""Do larger batches give a better SN-GAN here? Global batches 32, 128, 512 on `cpu:4`.

The paper's vision claim: class-conditional SN-GAN samples get better with larger batches
spread over more replicas. This trains `replicator train sngan --data digits` on `cpu:4`
logical replicas at each global batch with the default (Miyato et al. 2018) optimisation
(5 discriminator steps per generator step, Adam 2e-4, betas (0, 0.9), learning rates decayed
linearly to 0) and the SAME number of generator steps for every batch, so a larger batch sees
proportionally more images, as in the paper. It reports the EMA generator's FID, Inception
Score and class accuracy (digits classifier, trained once per sweep) at the end of each run,
and per batch the mean, min and max over seeds.

Every (batch, seed) run is its own subprocess, so `cpu:4`'s logical devices are set up before
that process's TensorFlow starts. The result file is rewritten after each run, keyed by batch
and seed: a rerun skips the runs it holds (a killed run resumes from its run directory's
checkpoint) and a partial sweep is still a valid result. Runs go seed by seed (every batch of
seed 0, then of seed 1), so a partial sweep covers every batch.

Usage: .venv/bin/python benchmarks/vision_sngan_batches.py [--batch-sizes 32,128,512
       --seeds 0,1 --steps 1000 --replicas cpu:4 --work-dir runs/vision_sngan_batches
       --out benchmarks/results/vision_sngan_batches.json]
About 1 hour on a quiet 2-core machine (batch 512: ~20 min a seed).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import vision_sngan_common as common  # noqa: E402

NOISY_LOAD = 2.0
# Settings every run of one result must share: runs that differ in these do not compare.
SHARED = ("steps", "replicas")
# A killed run (e.g. a sweep stopped at a deadline) resumes from its last checkpoint.
CHECKPOINT_EVERY = 250


def summarise(runs: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict]:
    """Per batch (smallest first): the seeds run and mean/min/max over them of each metric at
    the end and of the wall seconds."""
    summary = {}
    for batch in sorted(runs, key=int):
        by_seed = runs[batch]
        seeds = sorted(by_seed, key=int)
        stats: dict[str, Any] = {"seeds": [int(s) for s in seeds]}
        series = {n: [by_seed[s]["at_end"][n] for s in seeds] for n in common.METRIC_NAMES}
        series["wall_s"] = [by_seed[s]["wall_s"] for s in seeds]
        for name, values in series.items():
            stats[name] = {
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
            }
        summary[batch] = stats
    return summary


def trend(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Per metric, how the mean over seeds moves as the batch grows: "better", "worse" (at
    every step from one batch to the next larger) or "mixed"; "one batch" with fewer than 2."""
    batches = sorted(summary, key=int)
    verdicts = {}
    for name in common.METRIC_NAMES:
        means = [summary[b][name]["mean"] for b in batches]
        if len(means) < 2:
            verdicts[name] = "one batch"
            continue
        sign = -1 if common.LOWER_IS_BETTER[name] else 1
        steps = [sign * (after - before) for before, after in itertools.pairwise(means)]
        verdicts[name] = (
            "better"
            if all(s > 0 for s in steps)
            else "worse"
            if all(s < 0 for s in steps)
            else "mixed"
        )
    return verdicts


def merge_run(
    result: Mapping[str, Any], batch: int, seed: int, record: Mapping[str, Any]
) -> dict[str, Any]:
    """`result` with `record` as the run (batch, seed), and the summary, trend and highest
    load recomputed over every run it holds."""
    runs = {b: dict(by_seed) for b, by_seed in result.get("runs", {}).items()}
    runs.setdefault(str(batch), {})[str(seed)] = dict(record)
    summary = summarise(runs)
    loads = [
        value
        for by_seed in runs.values()
        for r in by_seed.values()
        for value in r["load_average"].values()
    ]
    return {
        **result,
        "runs": runs,
        "summary": summary,
        "trend": trend(summary),
        "max_load_average": max(loads),
        "noisy": max(loads) > NOISY_LOAD,
        "date": time.strftime("%Y-%m-%d"),
    }


def write_result(path: Path, result: Mapping[str, Any]) -> None:
    """Replaces `path` whole (a killed sweep never leaves half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.tmp")
    partial.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    os.replace(partial, path)


def load_result(path: Path, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The result so far at `path` (new if none); exits if it was made with other settings."""
    if not path.exists():
        return {
            "benchmark": "vision_sngan_batches",
            "what": "class-conditional SN-GAN on the digits, global batches on cpu:4, the "
            "paper's optimisation and the same generator steps: EMA generator at the end",
            **settings,
            "runs": {},
        }
    result = json.loads(path.read_text())
    for key in SHARED:
        if result.get(key) != settings[key]:
            sys.exit(
                f"{path} holds runs with {key}={result.get(key)!r}, not {settings[key]!r}: "
                "pass another --out, or delete it to start over"
            )
    return result


def train_one(
    run: Path, batch: int, seed: int, args: argparse.Namespace, classifier: str
) -> dict[str, Any]:
    """One (batch, seed) training run in its own process; its record for the result."""
    argv = common.train_argv(
        str(run),
        args.steps,
        batch,
        classifier,
        ["--replicas", args.replicas, "--seed", str(seed)],
        checkpoint_every=CHECKPOINT_EVERY,
    )
    command = [sys.executable, "-m", "vision.sngan.cli", *argv]
    resumed = run.exists()
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with open(run.parent / f"{run.name}.log", "a") as log:
        code = subprocess.run(
            command,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            check=False,
        ).returncode
    seconds = time.perf_counter() - start
    if code != 0:
        sys.exit(f"batch {batch} seed {seed}: training exited {code}; see {run}.log")
    try:
        at_end = common.eval_metrics(str(run), args.steps)
    except KeyError:  # Stopped early (SIGTERM): the run directory holds its checkpoint.
        sys.exit(f"batch {batch} seed {seed}: stopped before step {args.steps}; rerun to resume")
    record = {
        "command": "python -m vision.sngan.cli " + " ".join(argv),
        "wall_s": seconds,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "resumed": resumed,  # wall_s then covers only the last invocation
        "load_average": {"before": load_before, "after": os.getloadavg()[0]},
        "at_end": at_end,
        "config": common.run_config(str(run)),
    }
    try:
        record["at_step_0"] = common.eval_metrics(str(run), 0)
    except KeyError:  # Killed before its step-0 evaluation, then resumed.
        pass
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="32,128,512")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--steps", type=int, default=1000, help="generator steps, every batch")
    parser.add_argument("--replicas", default="cpu:4")
    parser.add_argument(
        "--work-dir",
        default=str(ROOT / "runs" / "vision_sngan_batches"),
        help="classifier and run directories (kept, so a rerun resumes)",
    )
    parser.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "vision_sngan_batches.json")
    )
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batch_sizes.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error("--batch-sizes and --seeds take comma-separated integers, e.g. 32,128,512")
    out, work = Path(args.out), Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    result = load_result(out, {"steps": args.steps, "replicas": args.replicas})
    result["planned"] = {"batch_sizes": batches, "seeds": seeds}
    classifier = work / "classifier"
    if "classifier_eval_accuracy" not in result or not classifier.exists():
        # One classifier per sweep: every run's IS/FID/accuracy use the same features.
        result["classifier_eval_accuracy"] = common.train_classifier(str(classifier))
        print(f"classifier: test accuracy {result['classifier_eval_accuracy']:.4f}", flush=True)
    for seed in seeds:
        for batch in batches:
            if str(seed) in result["runs"].get(str(batch), {}):
                print(f"batch {batch} seed {seed}: in {out} already", flush=True)
                continue
            print(f"batch {batch} seed {seed}: training ...", flush=True)
            record = train_one(work / f"b{batch}-s{seed}", batch, seed, args, str(classifier))
            result = merge_run(result, batch, seed, record)
            result["command"] = "python benchmarks/vision_sngan_batches.py " + " ".join(
                sys.argv[1:] if argv is None else argv
            )
            write_result(out, result)
            end = record["at_end"]
            print(
                f"batch {batch} seed {seed}: FID {end['fid']:.1f}, IS {end['inception_score']:.2f}, "
                f"class accuracy {end['class_accuracy']:.3f}, {record['wall_s']:.0f} s",
                flush=True,
            )
    if result["runs"]:
        write_result(out, result)  # The plan, when every run was there already.
    print(json.dumps({"summary": result["summary"], "trend": result["trend"]}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
