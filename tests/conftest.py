"""Shared test setup.

TensorFlow fixes its device list at the first op, so the logical CPU devices that
multi-replica tests need (`cpu:2`, `cpu:4`, `cpu:2x2`) are created here, before
any test module touches TensorFlow. Any test in this process may then call
`replication.make("cpu:N")` for N <= 4 without a subprocess.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MUJOCO_GL", "egl")

import replication

LOGICAL_CPUS = 4
replication.ensure_logical_cpus(LOGICAL_CPUS)


# Test modules that start a Ray cluster. Ray writes the address of the newest local cluster
# to one file per machine (`address="auto"` reads it), so two of these must never run at
# the same time; under pytest-xdist they share one group and so one worker.
RAY_CLUSTER_MODULES = frozenset(
    {
        "test_d4pg_ray.py",
        "test_ray_cluster.py",
        "test_ray_head_loss.py",
        "test_ray_launcher_death.py",
    }
)


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if item.path.name in RAY_CLUSTER_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))
