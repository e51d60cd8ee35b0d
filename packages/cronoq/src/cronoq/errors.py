"""The exceptions of cronoq, all rooted in :class:`CronoqError`.

Validation errors also derive from :class:`ValueError` so that callers which
already catch ``ValueError`` for bad input keep working.
"""

from __future__ import annotations

__all__ = [
    "AdmissionRejected",
    "CronoqError",
    "DuplicateSchedule",
    "Fenced",
    "InvalidArgument",
    "InvalidCron",
    "PayloadError",
    "ScheduleNotFound",
    "SchedulerError",
    "SchedulerStopped",
    "StoreError",
    "StoreFatal",
    "TaskError",
    "TaskNotFound",
    "Unavailable",
    "UnknownDependency",
    "UnknownPool",
    "UnknownTimeZone",
    "WaitTimedOut",
]


class CronoqError(Exception):
    """Root of every exception cronoq raises."""


class InvalidArgument(CronoqError, ValueError):
    """A call was given input it cannot accept; nothing was applied."""


class UnknownPool(InvalidArgument):
    """The named pool is not configured on this scheduler."""


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


class WaitTimedOut(CronoqError, TimeoutError):
    """``wait(timeout=...)`` gave up: the task is still live (it carries on)."""


class SchedulerError(CronoqError):
    """An operation could not be made durable, or the scheduler is not serving.

    The operation may be retried; use a task key to make the retry idempotent.
    """


class SchedulerStopped(SchedulerError):
    """The scheduler is not running (not started, closed, fenced or failed)."""


class AdmissionRejected(SchedulerError):
    """A submission would exceed the configured bound on live tasks."""


class TaskError(CronoqError):
    """Raised by an executor to fail an attempt with control over the retry.

    ``retryable=False`` dead-letters the task at once; ``retry_after`` (seconds)
    overrides the backoff before the next attempt.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = True,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        if retry_after is not None and not retry_after >= 0:
            raise InvalidArgument(f"retry_after must be >= 0 seconds, got {retry_after!r}")
        self.message = message
        self.retryable = retryable
        self.retry_after = retry_after


class StoreError(CronoqError):
    """Raised by a Store. Subclasses say how the scheduler reacts."""


class Unavailable(StoreError):
    """Transient: the scheduler retries the commit until ``commit_timeout``."""


class Fenced(StoreError):
    """Another instance took over leadership: this instance must stop serving."""


class StoreFatal(StoreError):
    """Not retryable (newer schema, permissions, corruption): the scheduler stops."""
