"""The ``cronoq`` command's exit codes, one per class of error, and its one-line messages.

=====  =================================================================================
code   meaning
=====  =================================================================================
0      done
1      an unexpected error (a bug: please report it with the command and its output)
2      the command line or the config file is wrong (nothing was sent)
3      no such task or schedule
4      the server or client refused the input (InvalidArgument: a bad value, an unknown
       pool, a duplicate schedule, a payload the codec cannot take); nothing was applied
5      the server did not accept the credentials (Unauthenticated)
6      the credentials lack a permission (PermissionDenied)
7      the scheduler is unavailable and nothing was applied: run the command again (no
       server answered within ``--connect-timeout``: nothing listens at the target)
8      the outcome is unknown: it may have been applied (check before running it again)
9      ``tasks wait`` timed out: the task is still live
10     ``tasks wait``: the task ended failed or cancelled
11     ``tasks retry`` or ``tasks rerun`` refused (NotRetryable): the task is live (or,
       for a retry, succeeded), or could not run again; nothing was applied
130    interrupted (Ctrl-C)
=====  =================================================================================
"""

from __future__ import annotations

from enum import IntEnum
from typing import IO, Any

import click

from cronoq.errors import (
    CronoqError,
    InvalidArgument,
    NotRetryable,
    PermissionDenied,
    ScheduleNotFound,
    SchedulerError,
    TaskNotFound,
    Unauthenticated,
    WaitTimedOut,
)
from cronoq_client._client import Unreachable

__all__ = ["CommandFailed", "ConfigError", "ExitCode", "failure"]


class ExitCode(IntEnum):
    OK = 0
    ERROR = 1
    USAGE = 2
    NOT_FOUND = 3
    INVALID = 4
    UNAUTHENTICATED = 5
    PERMISSION_DENIED = 6
    UNAVAILABLE = 7
    UNKNOWN_OUTCOME = 8
    TIMED_OUT = 9
    TASK_FAILED = 10
    NOT_RETRYABLE = 11
    INTERRUPTED = 130


class CommandFailed(click.ClickException):
    """One line on stderr, ``error: <what happened>[; <what to do>]``, and the exit code."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        # click reads the exit code from the exception (a class attribute there).
        self.exit_code = int(code)  # type: ignore[misc]

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)


class ConfigError(CommandFailed):
    """The config file, a context or a connection flag is wrong."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ExitCode.USAGE)


def failure(error: CronoqError) -> CommandFailed:
    """The exit of a command that ``error`` ended."""
    # The most specific classes first: WaitTimedOut and the not-found errors are not
    # InvalidArgument, AdmissionRejected is a SchedulerError that applied nothing.
    if isinstance(error, WaitTimedOut):
        return CommandFailed(f"{error}; the task carries on", ExitCode.TIMED_OUT)
    if isinstance(error, TaskNotFound | ScheduleNotFound):
        return CommandFailed(str(error), ExitCode.NOT_FOUND)
    if isinstance(error, InvalidArgument):
        return CommandFailed(str(error), ExitCode.INVALID)
    if isinstance(error, NotRetryable):
        # Not InvalidArgument: the id is right, the task's state refuses it.
        return CommandFailed(
            f"{error}; see its status and message (cronoq tasks get)", ExitCode.NOT_RETRYABLE
        )
    if isinstance(error, Unauthenticated):
        return CommandFailed(
            f"{error}; check the token (--token-file, CRONOQ_TOKEN) or client certificate "
            "of the context",
            ExitCode.UNAUTHENTICATED,
        )
    if isinstance(error, PermissionDenied):
        return CommandFailed(
            f"{error}; an identity with the {error.permission!r} permission is needed",
            ExitCode.PERMISSION_DENIED,
        )
    if isinstance(error, Unreachable):
        return CommandFailed(
            f"{error}; is cronoq-server running there? Check --target (CRONOQ_TARGET, the "
            "context's target), or wait longer with --connect-timeout",
            ExitCode.UNAVAILABLE,
        )
    if isinstance(error, SchedulerError):
        if error.applied is False:
            return CommandFailed(
                f"{error}; nothing was applied: run the command again", ExitCode.UNAVAILABLE
            )
        return CommandFailed(
            f"{error}; it may have been applied: check (cronoq tasks list) before running it "
            "again, or give the tasks keys",
            ExitCode.UNKNOWN_OUTCOME,
        )
    return CommandFailed(f"{type(error).__name__}: {error}", ExitCode.ERROR)
