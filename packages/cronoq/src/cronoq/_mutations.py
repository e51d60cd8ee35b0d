"""The mutations a step persists, as plain frozen values (re-exported by ``cronoq.store``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from cronoq._frozen import quick_init
from cronoq._model import OccurrenceOutcome, ScheduleSpec, Status, TaskSpec

__all__ = [
    "ATTEMPTS_KEPT",
    "AttemptEnded",
    "AttemptLease",
    "CancelRequested",
    "Mutation",
    "OccurrenceRecorded",
    "PoolPaused",
    "ScheduleRecord",
    "ScheduleRemoved",
    "ScheduleSaved",
    "TaskRecord",
    "TaskRetried",
    "TaskSubmitted",
    "TaskUpdated",
    "quarantine_message",
    "sanitize_message",
]


_SURROGATE = re.compile("[\ud800-\udfff]")


def sanitize_message(message: str) -> str:
    """NUL cannot live in PostgreSQL text, nor a lone surrogate in UTF-8 (an exception message
    may hold one, from a file name say): every store replaces both with U+FFFD so all behave
    alike, and a message never stops the scheduler at commit."""
    message = message.replace("\x00", "\ufffd")
    if message.isascii():
        return message
    return _SURROGATE.sub("\ufffd", message)


def quarantine_message(reason: str) -> str:
    """The message of a task whose row could not be decoded: stores write it into the row,
    the engine and lookups answer with it. ``reason`` is what ``RecoveredState.quarantined``
    carries: what went wrong, without this prefix."""
    return f"quarantined: {reason}"


# --- mutations: what a step persists -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptLease:
    """The lease of a running remote attempt, kept with its row so that a new leader waits for
    its worker instead of starting another attempt, and can tell that worker from an impostor
    when it re-attaches. ``epoch`` started the attempt (its token's epoch); ``id_hash`` is the
    SHA-256 of the lease id the worker holds (the id itself never reaches a store or a log)."""

    epoch: int
    id_hash: bytes


@quick_init
@dataclass(frozen=True, slots=True)
class TaskSubmitted:
    """A new task row. ``status`` is its first status (waiting, scheduled or ready)."""

    task_id: int
    spec: TaskSpec
    status: Status
    submitted_ns: int


@quick_init
@dataclass(frozen=True, slots=True)
class TaskUpdated:
    """A persisted status change: running, retrying or terminal.

    ``due_ns`` is when a retrying task may start its next attempt; ``output`` is set only for
    succeeded tasks; ``at_ns`` is the time of the change (the finish time when terminal).
    ``lease`` is set only when a remote attempt starts; every update replaces the row's lease
    with its own (so any later status clears it), a cancellation request keeps it.
    """

    task_id: int
    status: Status
    attempt: int
    message: str
    at_ns: int
    due_ns: int | None = None
    output: bytes | None = None
    lease: AttemptLease | None = None


@dataclass(frozen=True, slots=True)
class TaskRetried:
    """A finished task (failed or cancelled) made live again by an operator's retry.

    ``spec`` is the row's spec as it now is: only its retry policy may differ (its
    ``max_attempts`` raised so that one more attempt is allowed); stores rewrite what they keep
    of it (the options). ``status`` is its new status (ready, scheduled or waiting);
    ``attempt`` is unchanged (attempts keep counting); ``at_ns`` is the time of the retry.
    The row's finish time, due time, output, lease and cancellation request are cleared.
    """

    task_id: int
    spec: TaskSpec
    status: Status
    attempt: int
    message: str
    at_ns: int


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """A running task was asked to stop; recovery ends it cancelled instead of retrying it.

    Stores set the cancellation flag and the message; ``updated_ns`` keeps the attempt's start,
    from which its timeout counts.
    """

    task_id: int
    at_ns: int
    message: str


ATTEMPTS_KEPT = 25
"""How many ended attempts (``AttemptEnded``) a store keeps per task: the latest ones."""


@dataclass(frozen=True, slots=True)
class AttemptEnded:
    """An attempt that ended without success: it failed (retried or not), timed out, met its
    task's deadline, was cancelled while it ran, or was lost (its lease lapsed, its worker or
    its leader vanished). Append-only history, keyed by (``task_id``, ``attempt``): a store
    writes it once (a repeated commit changes nothing), keeps the latest ``ATTEMPTS_KEPT`` of
    a task, and deletes them with the task's row. ``started_ns`` and ``ended_ns`` are the
    attempt's start and end; ``message`` is the task's message as the attempt's end left it.
    A successful attempt writes none: the task's row (succeeded, its attempt, its finish
    time) says it. ``get_attempts`` returns these, in engine time."""

    task_id: int
    attempt: int
    started_ns: int
    ended_ns: int
    message: str


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """A schedule's definition and progress: next occurrence, pause, last task created."""

    spec: ScheduleSpec
    next_ns: int
    paused: bool = False
    last_task_id: int | None = None


@dataclass(frozen=True, slots=True)
class ScheduleSaved:
    """Insert or replace the schedule row named ``schedule.spec.name``."""

    schedule: ScheduleRecord


@dataclass(frozen=True, slots=True)
class ScheduleRemoved:
    name: str


@dataclass(frozen=True, slots=True)
class PoolPaused:
    """An operator paused (``paused``) or resumed a pool: a paused pool starts no attempt.
    Stores keep it by pool name, across restarts and failovers, until it is resumed."""

    name: str
    paused: bool


@dataclass(frozen=True, slots=True)
class OutboxTaken:
    """Rows of the store's own outbox (``OutboxSource.transactional``) that this batch turned
    into tasks, or found held by a key: the commit deletes them with the rest of the batch,
    so that a row becomes exactly one task whatever crashes or failovers happen."""

    row_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OccurrenceRecorded:
    """The ledger record of a schedule's occurrences that came due and were decided in one
    firing: those due from ``due_ns`` up to (not including) ``until_ns``, the schedule's
    next occurrence after the firing. Usually one occurrence; several when a leader fires
    after downtime (coalesced, missed) or a paused schedule resumes. The records of a
    schedule partition its timeline: each occurrence that came due is in exactly one.

    ``task_id``: the task it created (started, coalesced), or the earlier task still live
    (skipped); None otherwise. ``at_ns``: when it was decided. ``message``: why, for people.

    Keyed by (``schedule``, ``due_ns``): a store writes it once (a repeated commit changes
    nothing), returns it from ``get_occurrences``, and prunes it with the finished tasks
    (its ``until_ns`` against the same horizon: a span of a week's pause is written when it
    ends), whether or not the schedule still exists."""

    schedule: str
    due_ns: int
    until_ns: int
    outcome: OccurrenceOutcome
    task_id: int | None
    at_ns: int
    message: str


Mutation = (
    TaskSubmitted
    | TaskUpdated
    | TaskRetried
    | CancelRequested
    | AttemptEnded
    | ScheduleSaved
    | ScheduleRemoved
    | PoolPaused
    | OutboxTaken
    | OccurrenceRecorded
)


@quick_init
@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task as persisted. ``output`` is filled by lookups, never by ``recover``; ``lease``
    is the lease of its running remote attempt, as the last update left it; ``started_ns``
    is the start of its latest attempt (the time of the last ``TaskUpdated`` to running),
    kept once it ends, None before its first."""

    task_id: int
    spec: TaskSpec
    status: Status
    attempt: int
    message: str
    submitted_ns: int
    updated_ns: int
    due_ns: int | None = None
    cancel_requested: bool = False
    output: bytes | None = None
    lease: AttemptLease | None = None
    started_ns: int | None = None
    waiting_for: str | None = None
    """Set by the engine's reads of a ready task a limit holds back (``TaskSummary``); never
    stored, and None from a store."""

    @property
    def finished_ns(self) -> int | None:
        return self.updated_ns if self.status.is_terminal else None
