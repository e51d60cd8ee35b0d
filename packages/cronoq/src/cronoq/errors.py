"""The exceptions of cronoq, all rooted in ``CronoqError``.

Validation errors also derive from ``ValueError`` so that callers which
already catch ``ValueError`` for bad input keep working.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = [
    "AdmissionRejected",
    "CronoqError",
    "DuplicateSchedule",
    "Fenced",
    "InvalidArgument",
    "InvalidCron",
    "LimitFull",
    "NotRetryable",
    "PayloadError",
    "PermissionDenied",
    "ScheduleNotFound",
    "SchedulerError",
    "SchedulerStopped",
    "StaleAttempt",
    "StoreError",
    "StoreFatal",
    "TaskError",
    "TaskNotFound",
    "Unauthenticated",
    "Unavailable",
    "UnknownDependency",
    "UnknownLimit",
    "UnknownPool",
    "UnknownTimeZone",
    "WaitTimedOut",
    "WorkerDetached",
]


class CronoqError(Exception):
    """Root of every exception cronoq raises."""


class InvalidArgument(CronoqError, ValueError):
    """A call was given input it cannot accept; nothing was applied."""


class UnknownPool(InvalidArgument):
    """The named pool is not configured on this scheduler."""


class UnknownLimit(InvalidArgument):
    """The named limit is not configured on this scheduler (``docs/limits.md``)."""


class InvalidCron(InvalidArgument):
    """A cron expression does not parse."""


class UnknownTimeZone(InvalidArgument):
    """A time zone name is not in the IANA database."""


class UnknownDependency(InvalidArgument):
    """A dependency names a task id this cluster never issued."""


class PayloadError(InvalidArgument):
    """The codec could not encode or decode a payload or output."""


class DuplicateSchedule(InvalidArgument):
    """A schedule with this name already exists."""


class TaskNotFound(CronoqError, LookupError):
    """No task with this id or key is known."""


class ScheduleNotFound(CronoqError, LookupError):
    """No schedule with this name is known."""


class NotRetryable(CronoqError):
    """``retry`` refused: the task is live or succeeded, or retrying it could not run it (its
    deadline passed, another live task holds its key, a dependency failed, it used every
    attempt a task may have, its row was quarantined). Nothing was applied."""


class WaitTimedOut(CronoqError, TimeoutError):
    """``wait(timeout=...)`` gave up: the task is still live (it carries on)."""


class SchedulerError(CronoqError):
    """An operation could not be made durable, or the scheduler is not serving.

    ``applied`` says what is known of the operation: False, it was not applied and may be
    retried as it is; None, it may have been applied (a commit the store never confirmed),
    so retry it only with a task key, which makes the retry idempotent.
    """

    def __init__(self, message: str, *, applied: bool | None = None) -> None:
        super().__init__(message)
        self.applied = applied


class SchedulerStopped(SchedulerError):
    """The scheduler is not running (not started, closed, fenced or failed)."""

    def __init__(self, message: str, *, applied: bool | None = False) -> None:
        super().__init__(message, applied=applied)


class AdmissionRejected(SchedulerError):
    """A submission would exceed the configured bound on live tasks; nothing was applied."""

    def __init__(self, message: str) -> None:
        super().__init__(message, applied=False)


class LimitFull(AdmissionRejected):
    """A limit with ``on_full="reject"`` has no room for the task; nothing was applied."""


class StaleAttempt(CronoqError):
    """A heartbeat or report names an attempt that is not its task's current one: it changed
    nothing. ``reason`` is ``lease`` (its lease ran out and it was counted lost), ``attempt``
    (a newer attempt exists, or this one already ended), ``epoch`` (an earlier leader's
    attempt), ``finished`` (the task is over) or ``unknown`` (no such task or attempt, or an
    attempt running in this process, which a worker may not end)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class Unauthenticated(CronoqError):
    """A cronoq server did not accept the caller's credentials (none, a token it does not
    accept, a certificate it does not trust): nothing was applied, and trying again with the
    same credentials gets the same answer."""


class PermissionDenied(CronoqError):
    """The caller's identity lacks ``permission`` (``read``, ``submit``, ``cancel``,
    ``schedules``, ``work``, ``admin``) for this call, or for its pool or kind: nothing was
    applied."""

    def __init__(self, message: str, permission: str) -> None:
        super().__init__(message)
        self.permission = permission


class WorkerDetached(CronoqError):
    """The worker link was closed: it receives no more attempts."""


class TaskError(CronoqError):
    """Raised by an executor to fail an attempt with control over the retry.

    ``retryable=False`` dead-letters the task at once; ``retry_after`` (seconds, at most ten
    years) overrides the backoff before the next attempt. Bad arguments raise
    ``InvalidArgument`` here, in the executor, so they fail the attempt with that message
    instead of reaching the scheduler.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = True,
        retry_after: float | timedelta | None = None,
    ) -> None:
        if not isinstance(message, str):
            raise InvalidArgument(f"TaskError message must be a str, got {type(message).__name__}")
        if not isinstance(retryable, bool):
            raise InvalidArgument(f"retryable must be a bool, got {type(retryable).__name__}")
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self._retry_after_ns = _retry_after_ns(retry_after)
        self._retry_after = retry_after

    @property
    def retry_after(self) -> float | timedelta | None:
        """Seconds before the next attempt, as given; None: the policy's backoff."""
        return self._retry_after

    @property
    def retry_after_ns(self) -> int | None:
        """``retry_after`` in nanoseconds, checked when the error was made."""
        return self._retry_after_ns


# Duplicated from _validate (which imports this module): ten years, like RetryPolicy's maximum.
_MAX_RETRY_AFTER_S = 10 * 366 * 24 * 3600


def _retry_after_ns(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):  # like every other duration of the API
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(
            "retry_after must be seconds (int or float), a timedelta or None, got "
            f"{type(value).__name__}"
        )
    # inf would leave the task running forever with its pool slot taken; compared before any
    # conversion, since float(10**400) raises OverflowError. NaN fails the comparison.
    if not 0 <= value <= _MAX_RETRY_AFTER_S:
        given = repr(value)
        if isinstance(value, int) and value.bit_length() > 64:  # no 4300-digit messages
            given = f"an int of {value.bit_length()} bits"
        raise InvalidArgument(f"retry_after must be 0..{_MAX_RETRY_AFTER_S} seconds, got {given}")
    return round(value * 1_000_000_000)


class StoreError(CronoqError):
    """Raised by a Store. Subclasses say how the scheduler reacts."""


class Unavailable(StoreError):
    """Transient: the scheduler retries the commit until ``commit_timeout``."""


class Fenced(StoreError):
    """Another instance took over leadership: this instance must stop serving."""


class StoreFatal(StoreError):
    """Not retryable (newer schema, permissions, corruption): the scheduler stops."""
