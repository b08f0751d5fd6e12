"""N replicas with per-replica batch B make the same update as one replica with batch N*B."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(400)

SCRIPT = Path(__file__).with_name("replicated_update_script.py")
ROOT = Path(__file__).resolve().parents[2]


def test_cpu2_update_equals_cpu_update_on_the_same_data():
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=360,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    results = json.loads(line[len("RESULT ") :])
    assert results["fused"]["clip=True"]["updates_per_call"] == 3
    assert results["fused"]["clip=True"]["final_policy_lr"] == pytest.approx(1e-5)  # Decayed.
    assert set(results) == {"features", "pixels", "fused", "polyak"}
    for torso, by_clip in results.items():
        for clip, r in by_clip.items():
            where = f"{torso}, {clip}: {r}"
            assert r["replicas"] == [2, 1], where
            assert r["steps"] == [5 * r["updates_per_call"]] * 2, where
            assert r["max_param_change"] > 1e-4, where  # The networks really moved...
            assert r["max_param_diff"] < 1e-5, where  # ...and identically.
            assert r["metric_diff"] < 1e-5, where
            if clip == "clip=True":  # Both kinds of clip acted in the last update.
                critic, _, dqda = r["clip_fractions"]
                assert critic == 1.0 and dqda > 0.5, where
