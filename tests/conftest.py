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
