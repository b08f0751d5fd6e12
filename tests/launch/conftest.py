"""Launch tests: keep any Ray instance on loopback (must be set before `import ray`)."""

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
