"""The one exception type the CLI turns into a message and an exit code (no traceback)."""


class LaunchError(Exception):
    """A problem the user can fix; the message says what to do next.

    Attributes:
      exit_code: 2 for usage errors (bad flags, wrong run dir), 1 for failures at run time.
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code
