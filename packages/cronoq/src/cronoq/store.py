"""The contract between the scheduler and a durable store.

A store is a write-ahead log of the engine's state transitions. It never decides anything: the
engine computes every transition, the driver hands each step's mutations to ``Store.commit()``
as ONE batch, and after a restart ``Store.recover()`` gives back the rows the engine is rebuilt
from. Third-party stores implement ``Store`` and prove it with ``cronoq-conformance``.

Obligations of every store (each one is checked by the conformance kit):

- ``commit`` applies a whole batch atomically, or nothing of it. A commit whose call failed
  has landed by the time a later ``recover`` of the same instance returns, or never lands.
  Every mutation is part of its batch, the operator's ``PoolPaused`` and the history's
  ``AttemptEnded`` as much as a task's row: a batch that fails midway leaves no pause, resume
  or attempt behind, and a fenced commit writes none.
- A ``TaskUpdated`` replaces the row's ``lease`` with its own (None clears it); a
  ``CancelRequested`` keeps it; ``recover`` and lookups return it in ``TaskRecord.lease``.
- A ``TaskUpdated`` to running sets the row's ``started_ns`` to its ``at_ns`` (its attempt's
  start); every other mutation keeps it, so that a finished row still says when its last
  attempt began. ``recover`` and lookups return it.
- A ``TaskRetried`` makes a finished row live again: status, message and update time as
  given, attempt kept, the spec's options rewritten (its retry policy may allow more attempts),
  finish time, due time, output, lease and cancellation request cleared; it is no longer
  finished, so it is not pruned. The lease is cleared even when the finished row kept it for
  an attempt the engine stopped that may still run: the engine writes a ``TaskUpdated`` with
  that lease after the retry (in the same batch) when it still waits for the attempt.
- A ``PoolPaused`` is kept by pool name (a pause replaces the pool's earlier one, a resume
  clears it), names compared exactly: it pauses or resumes that pool and no other, whatever
  else its batch pauses or resumes. ``recover`` returns the paused pools' names in
  ``RecoveredState.paused_pools``.
- An ``AttemptEnded`` is written once per (task id, attempt): a repeated one (a commit
  retried after it landed) changes nothing. A store keeps the latest ``ATTEMPTS_KEPT`` of a
  task (by attempt number), returns them from ``get_attempts`` in attempt order, and deletes
  them with the task's row when it prunes it.
- ``commit`` with an epoch other than the current leader's raises ``Fenced`` and changes
  nothing, also when the instance does not know yet that it was replaced (the fence is read
  in the commit's transaction, for every mutation of the batch). Transient failures raise
  ``Unavailable``; anything else ``StoreFatal``.
- Times are engine nanoseconds; convert them with the ``TimeBase`` given to ``recover``.
- NUL in messages is stored as U+FFFD.
- ``recover`` returns live tasks, terminal tasks finished within ``retention_ns``, terminal tasks
  a live task depends on (however old), every schedule, and the highest task id ever committed,
  even if its row was pruned since. A row it cannot decode is quarantined: marked failed in the
  store and reported in ``RecoveredState.quarantined``; it never makes ``recover`` fail.
- A finished row that keeps a lease (an attempt the engine stopped, which may still run on its
  worker) is returned by ``recover`` however long ago it finished, and not pruned, until an
  update clears the lease: the engine writes that update when the attempt ends, and a new
  leader must see the lease to wait for the attempt.
- An ``OutboxTaken`` deletes the store's own outbox rows it names, in the transaction of its
  batch: a batch that lands takes them, one that fails or is fenced leaves every one of them
  in the outbox (a store whose ``outbox`` is transactional; a store without an outbox never
  receives one). An id no longer in the outbox (a retried commit that landed) is skipped.
- A store's transactional outbox (``store.outbox``, an ``OutboxSource``) reads only
  committed rows, oldest id first, never one a batch of this leader whose outcome it did not
  learn may still take; ``quarantine`` moves rows with their reasons in one transaction,
  fenced like a commit; ``requeue`` and ``discard`` move or delete quarantined rows.
- An ``OccurrenceRecorded`` is written once per (schedule, ``due_ns``): a repeated one (a
  commit retried after it landed) changes nothing. ``get_occurrences`` returns a schedule's
  records newest first (by ``due_ns``, names compared exactly), whether or not the schedule
  still exists; a store prunes them when it prunes finished tasks, a record whose
  ``until_ns`` (the end of its span) is older than the same horizon.
- A store that upgrades a schema of an earlier version of itself keeps everything written
  under it: after the upgrade, every row (its lease and start included), pause, schedule,
  ended attempt and the id high-water mark read back as they were written; only what the
  earlier version had no place for reads as absent (no lease, no start, no attempts, no
  paused pool).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from cronoq._collapse import CollapsedBatch, NewTask, TaskChange, collapse_batch
from cronoq._columns import NEW_TASK_COLUMNS, new_task_columns, varies
from cronoq._model import (
    OccurrenceOutcome,
    RetryPolicy,
    ScheduleSpec,
    Status,
    TaskSpec,
    TaskTemplate,
)
from cronoq._mutations import (
    ATTEMPTS_KEPT,
    AttemptEnded,
    AttemptLease,
    CancelRequested,
    Mutation,
    OccurrenceRecorded,
    OutboxTaken,
    PoolPaused,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    TaskRecord,
    TaskRetried,
    TaskSubmitted,
    TaskUpdated,
    quarantine_message,
    sanitize_message,
)
from cronoq._outbox import (
    MAX_OUTBOX_PAGE,
    OutboxRow,
    OutboxSource,
    OutboxStats,
    QuarantinedRow,
    decode_outbox_options,
    encode_outbox_options,
)
from cronoq._rows import (
    RECOVERY_COLUMNS,
    TASK_COLUMNS,
    decode_looked_up_record,
    decode_schedule_spec,
    decode_task_record,
    decode_task_spec,
    encode_schedule_spec,
    encode_task_options,
    undecodable_reason,
)
from cronoq.errors import CronoqError, Fenced, StoreError, StoreFatal, Unavailable

__all__ = [
    "ATTEMPTS_KEPT",
    "MAX_OCCURRENCE_PAGE",
    "MAX_OUTBOX_PAGE",
    "NEW_TASK_COLUMNS",
    "RECOVERY_COLUMNS",
    "TASK_COLUMNS",
    "AttemptEnded",
    "AttemptLease",
    "CancelRequested",
    "CollapsedBatch",
    "Fenced",
    "LeadershipLoss",
    "Lease",
    "Mutation",
    "NewTask",
    "OccurrenceOutcome",
    "OccurrenceRecorded",
    "OutboxRow",
    "OutboxSource",
    "OutboxStats",
    "OutboxTaken",
    "PoolPaused",
    "QuarantinedRow",
    "RecoveredState",
    "RetryPolicy",
    "ScheduleRecord",
    "ScheduleRemoved",
    "ScheduleSaved",
    "ScheduleSpec",
    "Status",
    "Store",
    "StoreError",
    "StoreFatal",
    "TaskChange",
    "TaskRecord",
    "TaskRetried",
    "TaskSpec",
    "TaskSubmitted",
    "TaskTemplate",
    "TaskUpdated",
    "TimeBase",
    "Unavailable",
    "collapse_batch",
    "decode_looked_up_record",
    "decode_outbox_options",
    "decode_schedule_spec",
    "decode_task_record",
    "decode_task_spec",
    "encode_outbox_options",
    "encode_schedule_spec",
    "encode_task_options",
    "new_task_columns",
    "prune_in_batches",
    "quarantine_message",
    "sanitize_message",
    "shielded",
    "undecodable_reason",
    "varies",
]

_T = TypeVar("_T")

MAX_OCCURRENCE_PAGE = 1000
"""The most ledger records ``Store.get_occurrences`` is asked for at once."""


async def prune_in_batches(delete_batch: Callable[[], Awaitable[int]], batch_size: int) -> int:
    """Call ``delete_batch`` (one short transaction deleting at most ``batch_size`` finished
    rows) until it deletes fewer; return the total. Commits get the store between batches."""
    deleted = 0
    while True:
        count = await delete_batch()
        deleted += count
        if count < batch_size:
            return deleted
        await asyncio.sleep(0)


async def shielded(operation: Coroutine[Any, Any, _T]) -> _T:
    """Run a store operation to its end even if the caller is cancelled.

    The driver cancels a commit that outlives ``commit_timeout`` and then rebuilds its memory
    from the store. A store that runs its operations shielded, one at a time (behind a lock,
    or in order on one connection's thread), guarantees that the cancelled commit has finished
    (landed or not) before that rebuild reads anything, so memory never misses a batch that
    landed late. It also keeps a driver that cannot take back a statement it queued from
    leaving a transaction open.
    """
    task = asyncio.ensure_future(operation)
    # Nobody may be left to read its outcome: do not warn about an unretrieved exception.
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return await asyncio.shield(task)


class LeadershipLoss:
    """What a store's ``leadership_lost()`` waits for: set once, keeping the first reason
    given (a later step-down, say the release that follows a takeover, does not replace it)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._reason: CronoqError | None = None

    def lose(self, reason: CronoqError | None = None) -> None:
        """Leadership is lost (None: released, no loss to explain)."""
        if not self._event.is_set():
            self._reason = reason
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    @property
    def reason(self) -> CronoqError | None:
        return self._reason

    async def wait(self) -> CronoqError | None:
        """Once lost: the reason, as ``Store.leadership_lost`` returns it."""
        await self._event.wait()
        return self._reason


@dataclass(frozen=True, slots=True)
class TimeBase:
    """Maps engine time onto Unix nanoseconds: ``unix = engine + unix_nanos_at_zero``.

    The runtime always passes ``unix_nanos_at_zero = 0``; simulations may not.
    """

    unix_nanos_at_zero: int = 0

    def to_unix(self, engine_ns: int) -> int:
        return engine_ns + self.unix_nanos_at_zero

    def to_engine(self, unix_ns: int) -> int:
        return unix_ns - self.unix_nanos_at_zero


@dataclass(frozen=True, slots=True)
class Lease:
    """Leadership held by one store instance, stamped with its fencing epoch."""

    epoch: int


# --- what recovery and lookups return --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecoveredState:
    max_task_id: int
    """Highest task id ever committed to this cluster (survives pruning); 0 if none."""
    tasks: Sequence[TaskRecord]
    """In id order."""
    schedules: Sequence[ScheduleRecord]
    quarantined: Sequence[tuple[int, str]] = ()
    """(task id, reason) of rows that could not be decoded and were marked failed, with
    ``quarantine_message(reason)`` as their message. The reason says what went wrong
    (``undecodable_reason(exc)`` for a row ``decode_task_record`` refused), without the
    ``quarantined:`` prefix that the message adds."""
    paused_pools: frozenset[str] = frozenset()
    """The names of the pools an operator paused and did not resume (``PoolPaused``), whether
    or not the scheduler still configures them."""


@runtime_checkable
class Store(Protocol):
    """What the driver needs from a durable store. All methods are coroutines."""

    async def acquire_leadership(self) -> Lease:
        """Block until this instance leads the cluster; return a new, strictly larger epoch."""
        ...

    async def leadership_lost(self) -> CronoqError | None:
        """Return once leadership, after being acquired, is lost (or released), with why if
        the store knows: ``Fenced`` (another instance took over, a lease ran out) or
        ``StoreFatal`` (the store failed for good). The scheduler stops with it as its
        ``failure`` (None: a generic ``Fenced``)."""
        ...

    async def release_leadership(self) -> None:
        """Give leadership up at once so a standby takes over without waiting for a timeout."""
        ...

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        """Load what the engine is rebuilt from (see the module docstring)."""
        ...

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        """Persist one step's mutations atomically, fenced by ``epoch``."""
        ...

    async def load_output(self, task_id: int) -> bytes | None:
        """The output of a succeeded task, or None."""
        ...

    async def get_task(self, task_id: int) -> TaskRecord | None:
        """The persisted task with its output, or None if unknown or pruned."""
        ...

    async def get_task_by_key(self, key: str) -> TaskRecord | None:
        """The most recent task submitted with ``key``, or None."""
        ...

    async def get_attempts(self, task_id: int) -> Sequence[AttemptEnded]:
        """The ended attempts the store keeps of the task (the latest ``ATTEMPTS_KEPT``), in
        attempt order, in engine time; empty if it has none or is unknown or pruned."""
        ...

    async def get_occurrences(
        self, schedule: str, before_ns: int | None, limit: int
    ) -> Sequence[OccurrenceRecorded]:
        """The schedule's ledger records whose ``due_ns`` is before ``before_ns`` (None: all),
        newest first, at most ``limit`` (1 to ``MAX_OCCURRENCE_PAGE``), in engine time."""
        ...

    async def close(self) -> None:
        """Release connections and files (and leadership, if still held)."""
        ...
