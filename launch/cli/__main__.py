"""``python -m launch.cli ARGS``: the same as the `replicator` console script."""

import sys

from launch.cli import main

sys.exit(main())
