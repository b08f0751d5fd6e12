"""The exceptions the launcher turns into messages and exit codes (no traceback)."""

from __future__ import annotations

# Exit status of `replicator` (documented in docs/fault-tolerance.md).
EXIT_FINISHED = 0
EXIT_NODE_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
# Exit status of a node process whose failure is deterministic (see `is_deterministic`).
EXIT_NODE_STARTUP_ERROR = 3


class LaunchError(Exception):
    """A problem the user can fix; the message says what to do next.

    Attributes:
      exit_code: 2 for usage errors (bad flags, wrong run dir), 1 for failures at run time.
    """

    def __init__(self, message: str, exit_code: int = EXIT_USAGE):
        super().__init__(message)
        self.exit_code = exit_code


class NodeStartupError(Exception):
    """A node cannot start with the arguments it was given (bad config, missing file).

    Raised by node bodies before they do any work. Restarting would fail the same way,
    so the supervisor ends the run on the first such failure.
    """


# Failures that a restart cannot cure: code that does not import, arguments that do not
# match the entry point, configs that do not parse.
_DETERMINISTIC = (ImportError, SyntaxError, NodeStartupError)


# An ImportError with one of these is the machine's state, not the code: loading a shared
# library failed for lack of memory or of a resource (seen under memory pressure).
_TRANSIENT_IMPORT_MARKERS = (
    "cannot allocate memory",
    "failed to map segment",
    "resource temporarily unavailable",
    "too many open files",
)


def is_deterministic(error: BaseException) -> bool:
    """True when `error` would recur on every restart (so restarting only wastes time)."""
    if isinstance(error, ImportError) and not isinstance(error, ModuleNotFoundError):
        text = str(error).lower()
        if any(marker in text for marker in _TRANSIENT_IMPORT_MARKERS):
            return False
    return isinstance(error, _DETERMINISTIC)
