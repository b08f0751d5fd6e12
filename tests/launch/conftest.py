"""Launch tests: keep any Ray instance on loopback (must be set before `import ray`), and
stop the nodes of a test that failed before stopping them."""

import os
import sys

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _stop_background_launches():
    """A test that fails mid-run leaves its `Background` launch running; its nodes would
    then be the next test's stray children (e.g. `test_supervision`'s check that none is
    left). Stop them at teardown."""
    yield
    support = sys.modules.get("tests.launch.d4pg_support")  # Not imported: nothing started.
    if support is not None:
        support.stop_all_running()
