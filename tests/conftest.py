"""Shared test setup.

TensorFlow fixes its device list at the first op, so the logical CPU devices that
multi-replica tests need (`cpu:2`, `cpu:4`, `cpu:2x2`) are created here, before
any test module touches TensorFlow. Any test in this process may then call
`replication.make("cpu:N")` for N <= 4 without a subprocess.
"""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("MUJOCO_GL", "egl")

LOGICAL_CPUS = 4


def pytest_configure(config: pytest.Config) -> None:
    """Creates the logical CPUs in every process that runs tests.

    Under pytest-xdist the controller runs none, so it skips TensorFlow's start-up.
    """
    is_xdist_controller = bool(getattr(config.option, "numprocesses", None)) and not hasattr(
        config, "workerinput"
    )
    if is_xdist_controller:
        return
    import replication

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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in RAY_CLUSTER_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))
