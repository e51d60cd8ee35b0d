"""MemoryStore: the default store. Nothing survives the process, but it behaves like a real one.

Several ``MemoryStore`` instances opened on one cluster (``store.connect_another()``) act like
processes sharing a database: one leads, the others wait; ``simulate_crash()`` drops an
instance's leadership without releasing it, so a second ``Scheduler`` can take over and recover,
and the first is fenced. ``set_available(False)`` and ``fail_next_commit_midway()`` inject
faults; ``prune(horizon)`` prunes at once. ``pause()``/``resume()`` freeze an instance as
SIGSTOP would (its leadership lapses, as a lease does), and ``fail_commits_fatally()`` makes its
commits meet an error that retrying cannot fix.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from itertools import count
from typing import TypeVar

from cronoq import _validate as check
from cronoq._memory_outbox import MemoryOutbox, OutboxTables
from cronoq._outbox import OutboxRow
from cronoq.errors import CronoqError, Fenced, StoreFatal, Unavailable
from cronoq.store import (
    ATTEMPTS_KEPT,
    AttemptEnded,
    CancelRequested,
    LeadershipLoss,
    Lease,
    Mutation,
    OccurrenceRecorded,
    OutboxTaken,
    PoolPaused,
    RecoveredState,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    Status,
    TaskRecord,
    TaskRetried,
    TaskSubmitted,
    TaskUpdated,
    TimeBase,
    sanitize_message,
)

__all__ = ["MemoryStore"]

_PRUNE_EVERY = 1024
_K = TypeVar("_K")
_V = TypeVar("_V")


class MemoryCluster:
    """The shared "database" of every MemoryStore instance opened on it."""

    def __init__(self, keep_finished_ns: int) -> None:
        self.keep_finished_ns = keep_finished_ns
        self.epoch = 0
        self.leader: int | None = None
        self.tasks: dict[int, TaskRecord] = {}
        self.finished: dict[int, int] = {}  # id -> finish time (unix ns), in finish order
        self.keys: dict[str, int] = {}
        # Per task, its ended attempts (times in unix ns) by attempt number.
        self.attempts: dict[int, dict[int, AttemptEnded]] = {}
        self.schedules: dict[str, ScheduleRecord] = {}
        # Per schedule, its occurrence records (times in unix ns) by due time.
        self.occurrences: dict[str, dict[int, OccurrenceRecorded]] = {}
        self.paused_pools: set[str] = set()
        self.max_task_id = 0
        self.available = True
        self.fail_midway = False
        self.commits = 0
        self.instance_ids = count(1)
        # Futures of instances waiting for leadership; plain futures, so that no loop-bound
        # primitive outlives the event loop a test or simulation example runs in.
        self.waiting: list[asyncio.Future[None]] = []
        self.outbox = OutboxTables()

    def wake_waiting(self) -> None:
        waiting, self.waiting = self.waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)

    def apply(self, batch: Sequence[Mutation], time_base: TimeBase) -> None:
        """Apply one batch, all or nothing. Synchronous, so no coroutine sees it half-done."""
        undo = _Undo(self)
        try:
            for index, mutation in enumerate(batch):
                if self.fail_midway and index == len(batch) // 2:
                    self.fail_midway = False
                    raise Unavailable("injected fault in the middle of a batch")
                self._apply_one(mutation, time_base.to_unix, undo)
        except BaseException:
            undo.roll_back()
            raise
        self.commits += 1
        if self.commits % _PRUNE_EVERY == 0 and self.finished:
            # Prune in the time of the batches, not of the wall clock, so simulations with
            # made-up times keep what they should.
            latest = next(reversed(self.finished.values()))
            self.prune(latest - self.keep_finished_ns)

    def _apply_one(self, mutation: Mutation, to_unix: Callable[[int], int], undo: _Undo) -> None:
        tasks = self.tasks
        match mutation:
            case TaskSubmitted(task_id, spec, status, submitted_ns):
                at = to_unix(submitted_ns)
                undo.task(task_id)
                tasks[task_id] = TaskRecord(task_id, spec, status, 0, "submitted", at, at)
                if spec.key is not None:
                    undo.key(spec.key)
                    self.keys[spec.key] = task_id
                self.max_task_id = max(self.max_task_id, task_id)
            case TaskUpdated(task_id, status, attempt, message, at_ns, due_ns, output, lease):
                at = to_unix(at_ns)
                undo.task(task_id)
                existing = self._existing(task_id)
                tasks[task_id] = dataclasses.replace(
                    existing,
                    status=status,
                    attempt=attempt,
                    message=sanitize_message(message),
                    updated_ns=at,
                    due_ns=None if due_ns is None else to_unix(due_ns),
                    output=output,
                    lease=lease,
                    started_ns=at if status is Status.RUNNING else existing.started_ns,
                )
                if status.is_terminal:
                    undo.finished(task_id)
                    self.finished[task_id] = at
            case TaskRetried(task_id, spec, status, attempt, message, at_ns):
                undo.task(task_id)
                undo.finished(task_id)
                tasks[task_id] = dataclasses.replace(
                    self._existing(task_id),
                    spec=spec,
                    status=status,
                    attempt=attempt,
                    message=sanitize_message(message),
                    updated_ns=to_unix(at_ns),
                    due_ns=None,
                    cancel_requested=False,
                    output=None,
                    lease=None,
                )
                # Live again: not pruned, and its next finish is ordered by its new time.
                self.finished.pop(task_id, None)
            case CancelRequested(task_id, _, message):
                undo.task(task_id)
                tasks[task_id] = dataclasses.replace(
                    self._existing(task_id),
                    cancel_requested=True,
                    message=sanitize_message(message),
                )
            case ScheduleSaved(record):
                undo.schedule(record.spec.name)
                self.schedules[record.spec.name] = dataclasses.replace(
                    record, next_ns=to_unix(record.next_ns)
                )
            case ScheduleRemoved(name):
                undo.schedule(name)
                self.schedules.pop(name, None)
            case AttemptEnded(task_id, attempt, started_ns, ended_ns, message):
                undo.attempts(task_id)
                kept = self.attempts.setdefault(task_id, {})
                if attempt not in kept:  # a repeated commit changes nothing
                    kept[attempt] = AttemptEnded(
                        task_id,
                        attempt,
                        to_unix(started_ns),
                        to_unix(ended_ns),
                        sanitize_message(message),
                    )
                    if len(kept) > ATTEMPTS_KEPT:
                        del kept[min(kept)]
            case OccurrenceRecorded(schedule, due_ns, until_ns, _, _, at_ns, message):
                due = to_unix(due_ns)
                undo.occurrences(schedule)
                ledger = self.occurrences.setdefault(schedule, {})
                if due not in ledger:  # a repeated commit changes nothing
                    ledger[due] = dataclasses.replace(
                        mutation,
                        due_ns=due,
                        until_ns=to_unix(until_ns),
                        at_ns=to_unix(at_ns),
                        message=sanitize_message(message),
                    )
            case OutboxTaken(row_ids):
                for row_id in row_ids:
                    taken = self.outbox.rows.pop(row_id, None)
                    if taken is not None:
                        undo.outbox_rows.append(taken)
            case PoolPaused(name, paused):
                undo.pools()
                if paused:
                    self.paused_pools.add(name)
                else:
                    self.paused_pools.discard(name)

    def _existing(self, task_id: int) -> TaskRecord:
        record = self.tasks.get(task_id)
        if record is None:
            raise StoreFatal(f"update of task {task_id}, which was never submitted")
        return record

    def recover(self, time_base: TimeBase, horizon_unix_ns: int) -> RecoveredState:
        """What a new leader loads: live tasks, those finished after the horizon or keeping a
        lease, finished parents of live tasks, every schedule, and the id high-water mark."""
        live = [r for r in self.tasks.values() if not r.status.is_terminal]
        parents = {p for r in live for p in r.spec.after}
        wanted = [
            r
            for r in self.tasks.values()
            if not r.status.is_terminal
            or r.updated_ns >= horizon_unix_ns
            or r.lease is not None
            or r.task_id in parents
        ]
        wanted.sort(key=lambda r: r.task_id)
        to_engine = time_base.to_engine
        return RecoveredState(
            max_task_id=self.max_task_id,
            tasks=[_shift(r, to_engine, keep_output=False) for r in wanted],
            schedules=[_shift_schedule(s, to_engine) for s in self.schedules.values()],
            paused_pools=frozenset(self.paused_pools),
        )

    def prune(self, horizon_unix_ns: int) -> None:
        """Forget tasks finished before the horizon, but a row that keeps the lease of an
        attempt that may still run (see ``cronoq.store``); the id high-water mark stays."""
        gone: list[int] = []
        for task_id, finished_at in self.finished.items():
            if finished_at >= horizon_unix_ns:
                break
            if self.tasks[task_id].lease is None:
                gone.append(task_id)
        for task_id in gone:
            del self.finished[task_id]
            self.attempts.pop(task_id, None)
            key = self.tasks.pop(task_id).spec.key
            if key is not None and self.keys.get(key) == task_id:
                del self.keys[key]
        for name, kept in list(self.occurrences.items()):
            for due in [due for due, record in kept.items() if record.until_ns < horizon_unix_ns]:
                del kept[due]
            if not kept:
                del self.occurrences[name]


class _Undo:
    """Remembers the first value of every entry a batch touches, to restore them on failure."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self._cluster = cluster
        self._max_task_id = cluster.max_task_id
        self._tasks: dict[int, TaskRecord | None] = {}
        self._keys: dict[str, int | None] = {}
        self._finished: dict[int, int | None] = {}
        self._attempts: dict[int, dict[int, AttemptEnded] | None] = {}
        self._schedules: dict[str, ScheduleRecord | None] = {}
        self._occurrences: dict[str, dict[int, OccurrenceRecorded] | None] = {}
        self._paused_pools: set[str] | None = None
        self.outbox_rows: list[OutboxRow] = []
        """Outbox rows the batch took."""

    def pools(self) -> None:
        if self._paused_pools is None:
            self._paused_pools = set(self._cluster.paused_pools)

    def task(self, task_id: int) -> None:
        if task_id not in self._tasks:
            self._tasks[task_id] = self._cluster.tasks.get(task_id)

    def key(self, key: str) -> None:
        if key not in self._keys:
            self._keys[key] = self._cluster.keys.get(key)

    def finished(self, task_id: int) -> None:
        if task_id not in self._finished:
            self._finished[task_id] = self._cluster.finished.get(task_id)

    def attempts(self, task_id: int) -> None:
        if task_id not in self._attempts:
            kept = self._cluster.attempts.get(task_id)
            self._attempts[task_id] = None if kept is None else dict(kept)

    def occurrences(self, schedule: str) -> None:
        if schedule not in self._occurrences:
            kept = self._cluster.occurrences.get(schedule)
            self._occurrences[schedule] = None if kept is None else dict(kept)

    def schedule(self, name: str) -> None:
        if name not in self._schedules:
            self._schedules[name] = self._cluster.schedules.get(name)

    def roll_back(self) -> None:
        cluster = self._cluster
        cluster.max_task_id = self._max_task_id
        _restore(cluster.tasks, self._tasks)
        _restore(cluster.keys, self._keys)
        _restore(cluster.finished, self._finished)
        _restore(cluster.attempts, self._attempts)
        _restore(cluster.schedules, self._schedules)
        _restore(cluster.occurrences, self._occurrences)
        if self._paused_pools is not None:
            cluster.paused_pools = self._paused_pools
        for row in self.outbox_rows:
            cluster.outbox.rows[row.row_id] = row


def _restore(target: dict[_K, _V], saved: dict[_K, _V | None]) -> None:
    for name, value in saved.items():
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value


class MemoryStore:
    """An in-process store (see the module docstring)."""

    # State of the test hooks, as class defaults: the constructor knows nothing about them.
    _fatal: str | None = None
    _paused_epoch: int | None = None

    def __init__(
        self,
        *,
        keep_finished: float | timedelta = 3600.0,
        outbox: bool = False,
        _cluster: MemoryCluster | None = None,
    ) -> None:
        """``keep_finished``: seconds (or a timedelta, up to ten years) before finished tasks
        are pruned. ``outbox``: give the store an outbox (``store.outbox``, its ``put``
        standing for an application's transaction), which a Scheduler then ingests."""
        if _cluster is None:
            # Checked like every duration: "a" * 1e9 would build a 1.9 GB string, inf overflows.
            _cluster = MemoryCluster(check.duration_ns(keep_finished, "keep_finished"))
        self._cluster = _cluster
        self._id = next(self._cluster.instance_ids)
        self._epoch: int | None = None
        self._lost = LeadershipLoss()
        self._time_base = TimeBase()
        self.outbox = (
            MemoryOutbox(self, self._cluster.outbox) if check.flag(outbox, "outbox") else None
        )

    def connect_another(self) -> MemoryStore:
        """A new instance on the same cluster, as a second process would open the database."""
        return MemoryStore(outbox=self.outbox is not None, _cluster=self._cluster)

    def simulate_crash(self) -> None:
        """Lose leadership as a dead process would: nothing released, nothing notified."""
        if self._cluster.leader == self._id:
            self._cluster.leader = None
            self._cluster.wake_waiting()

    def set_available(self, available: bool) -> None:
        """False: every call raises ``Unavailable`` until set back to True."""
        self._cluster.available = available

    def fail_next_commit_midway(self) -> None:
        """Make the next commit fail halfway through its batch (it must roll back)."""
        self._cluster.fail_midway = True

    def prune(self, horizon_unix_ns: int) -> None:
        """Forget tasks finished before the horizon now, as the periodic pruning would."""
        self._cluster.prune(horizon_unix_ns)

    def pause(self) -> None:
        """Freeze this instance as SIGSTOP would: a leader renews nothing, so its leadership
        lapses (as a lease runs out) and a waiting instance takes over; nothing tells it."""
        if self._cluster.leader == self._id:
            self._paused_epoch = self._epoch
            self._cluster.leader = None
            self._cluster.wake_waiting()

    def resume(self) -> None:
        """Run again, as after SIGCONT: the first renewal finds out whether another instance
        took over meanwhile (then leadership is lost) or nobody did (then it still leads)."""
        epoch, self._paused_epoch = self._paused_epoch, None
        if epoch is None:
            return
        cluster = self._cluster
        if cluster.leader is None and cluster.epoch == epoch:
            cluster.leader = self._id
        else:
            self._lost.lose(Fenced(f"epoch {epoch} was taken over while this instance was paused"))

    def fail_commits_fatally(self) -> None:
        """Make every later commit of this instance fail as a revoked privilege would."""
        self._fatal = "injected: permission denied for the task table (fail_commits_fatally)"

    def check_available(self) -> None:
        if not self._cluster.available:
            raise Unavailable("memory store made unavailable by set_available(False)")

    def check_leading(self, epoch: int) -> None:
        """Available, and leading as ``epoch`` (else ``Fenced``), as a commit checks."""
        self.check_available()
        self._fence(epoch)

    async def acquire_leadership(self) -> Lease:
        cluster = self._cluster
        while cluster.leader is not None:
            waiter = asyncio.get_running_loop().create_future()
            cluster.waiting.append(waiter)
            await waiter
        cluster.leader = self._id
        cluster.epoch += 1
        self._epoch = cluster.epoch
        self._lost = LeadershipLoss()
        return Lease(cluster.epoch)

    async def leadership_lost(self) -> CronoqError | None:
        return await self._lost.wait()

    async def release_leadership(self) -> None:
        if self._cluster.leader == self._id:
            self._cluster.leader = None
            self._lost.lose()
            self._cluster.wake_waiting()

    async def close(self) -> None:
        await self.release_leadership()

    def _fence(self, epoch: int) -> None:
        if epoch != self._cluster.epoch or self._cluster.leader != self._id:
            fenced = Fenced(f"epoch {epoch} is stale; the cluster is at {self._cluster.epoch}")
            self._lost.lose(fenced)
            raise fenced

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        self.check_available()
        self._fence(epoch)
        self._time_base = time_base
        return self._cluster.recover(time_base, time.time_ns() - retention_ns)

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        self.check_available()
        self._fence(epoch)
        if self._fatal is not None:
            raise StoreFatal(self._fatal)
        self._cluster.apply(batch, self._time_base)

    async def load_output(self, task_id: int) -> bytes | None:
        self.check_available()
        record = self._cluster.tasks.get(task_id)
        return None if record is None else record.output

    async def get_task(self, task_id: int) -> TaskRecord | None:
        self.check_available()
        record = self._cluster.tasks.get(task_id)
        return None if record is None else _shift(record, self._time_base.to_engine)

    async def get_task_by_key(self, key: str) -> TaskRecord | None:
        task_id = self._cluster.keys.get(key)
        return None if task_id is None else await self.get_task(task_id)

    async def get_attempts(self, task_id: int) -> Sequence[AttemptEnded]:
        self.check_available()
        kept = self._cluster.attempts.get(task_id, {})
        to_engine = self._time_base.to_engine
        return [
            dataclasses.replace(
                kept[attempt],
                started_ns=to_engine(kept[attempt].started_ns),
                ended_ns=to_engine(kept[attempt].ended_ns),
            )
            for attempt in sorted(kept)
        ]

    async def get_occurrences(
        self, schedule: str, before_ns: int | None, limit: int
    ) -> Sequence[OccurrenceRecorded]:
        self.check_available()
        kept = self._cluster.occurrences.get(schedule, {})
        to_engine = self._time_base.to_engine
        dues = sorted(kept, reverse=True)
        if before_ns is not None:
            before = self._time_base.to_unix(before_ns)
            dues = [due for due in dues if due < before]
        return [
            dataclasses.replace(
                kept[due],
                due_ns=to_engine(due),
                until_ns=to_engine(kept[due].until_ns),
                at_ns=to_engine(kept[due].at_ns),
            )
            for due in dues[:limit]
        ]


def _shift(
    record: TaskRecord, convert: Callable[[int], int], *, keep_output: bool = True
) -> TaskRecord:
    """The record in engine time; recovery leaves outputs in the store (``load_output``)."""
    if convert(0) == 0 and (keep_output or record.output is None):
        return record
    return dataclasses.replace(
        record,
        submitted_ns=convert(record.submitted_ns),
        updated_ns=convert(record.updated_ns),
        due_ns=None if record.due_ns is None else convert(record.due_ns),
        started_ns=None if record.started_ns is None else convert(record.started_ns),
        output=record.output if keep_output else None,
    )


def _shift_schedule(record: ScheduleRecord, convert: Callable[[int], int]) -> ScheduleRecord:
    return dataclasses.replace(record, next_ns=convert(record.next_ns))
