"""Asynchronous training: one parameter server, two workers, on loopback."""

import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.support import free_port, python_env

PROGRAM = Path(__file__).with_name("parameter_server_program.py")


def test_async_cluster_trains_a_regression_to_threshold(tmp_path):
    out = tmp_path / "ps.npz"
    ports = [str(free_port()) for _ in range(3)]
    process = subprocess.run(
        [sys.executable, str(PROGRAM), str(out), *ports],
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stdout[-3000:] + process.stderr[-3000:]
    result = np.load(out)
    assert bool(result["asynchronous"])
    assert int(result["steps"]) == 300  # every scheduled step applied exactly once
    # Both workers took part: each ran a share of the steps, together all of them.
    per_worker = result["steps_per_worker"]
    assert len(per_worker) == 2 and per_worker.sum() == 300 and per_worker.min() >= 30, per_worker
    # Noise variance is 0.01: the fit must get close to it from a loss of ~7.
    assert float(result["initial"]) > 1.0
    assert float(result["final"]) < 0.03
