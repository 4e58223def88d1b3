"""The CLI's errors and the exit codes they map to (0 ok, 1 operation failed, 2 bad usage/input)."""
from __future__ import annotations
from protocol.errors import ConfigurationError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CliError(ConfigurationError):
    """An error the CLI reports as `elastane: error: <message>` and exits with `exit_code`."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(CliError):
    """Bad usage or bad input (including an HTTP 400 / 404 from the RM): exit 2."""

    exit_code = EXIT_USAGE


class OperationFailed(CliError):
    """The operation could not be done (daemon unreachable, app failed ...): exit 1."""

    exit_code = EXIT_FAILED
