"""MemoryStore: the default store. Nothing survives the process, but it behaves like a real one.

Several ``MemoryStore`` instances opened on one cluster (``store.connect_another()``) act like
processes sharing a database: one leads, the others wait; ``simulate_crash()`` drops an
instance's leadership without releasing it, so a second ``Scheduler`` can take over and recover,
and the first is fenced. ``set_available(False)`` makes every call fail with ``Unavailable``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from itertools import count

from cronoq._model import NS_PER_S
from cronoq.errors import Fenced, Unavailable
from cronoq.store import (
    CancelRequested,
    Lease,
    Mutation,
    RecoveredState,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    TaskRecord,
    TaskSubmitted,
    TaskUpdated,
    TimeBase,
    sanitize_message,
)

__all__ = ["MemoryStore"]

_PRUNE_EVERY = 1024


class MemoryCluster:
    """The shared "database" of every MemoryStore instance opened on it."""

    def __init__(self, keep_finished_ns: int) -> None:
        self.keep_finished_ns = keep_finished_ns
        self.epoch = 0
        self.leader: int | None = None
        self.tasks: dict[int, TaskRecord] = {}
        self.finished: dict[int, int] = {}  # id -> finish time (unix ns), in finish order
        self.keys: dict[str, int] = {}
        self.schedules: dict[str, ScheduleRecord] = {}
        self.max_task_id = 0
        self.available = True
        self.commits = 0
        self.instance_ids = count(1)
        self.released = asyncio.Condition()

    def apply(self, batch: Sequence[Mutation], time_base: TimeBase) -> None:
        """Apply one committed batch. Synchronous, so it is atomic for every coroutine."""
        to_unix = time_base.to_unix
        tasks = self.tasks
        for mutation in batch:
            match mutation:
                case TaskSubmitted(task_id, spec, status, submitted_ns):
                    at = to_unix(submitted_ns)
                    tasks[task_id] = TaskRecord(task_id, spec, status, 0, "submitted", at, at)
                    if spec.key is not None:
                        self.keys[spec.key] = task_id
                    self.max_task_id = max(self.max_task_id, task_id)
                case TaskUpdated(task_id, status, attempt, message, at_ns, due_ns, output):
                    at = to_unix(at_ns)
                    tasks[task_id] = dataclasses.replace(
                        tasks[task_id],
                        status=status,
                        attempt=attempt,
                        message=sanitize_message(message),
                        updated_ns=at,
                        due_ns=None if due_ns is None else to_unix(due_ns),
                        output=output,
                    )
                    if status.is_terminal:
                        self.finished[task_id] = at
                case CancelRequested(task_id, at_ns, message):
                    tasks[task_id] = dataclasses.replace(
                        tasks[task_id],
                        cancel_requested=True,
                        message=sanitize_message(message),
                        updated_ns=to_unix(at_ns),
                    )
                case ScheduleSaved(record):
                    self.schedules[record.spec.name] = dataclasses.replace(
                        record, next_ns=to_unix(record.next_ns)
                    )
                case ScheduleRemoved(name):
                    self.schedules.pop(name, None)
        self.commits += 1
        if self.commits % _PRUNE_EVERY == 0:
            self.prune(time.time_ns() - self.keep_finished_ns)

    def recover(self, time_base: TimeBase, horizon_unix_ns: int) -> RecoveredState:
        """What a new leader loads: live tasks, those finished after the horizon, finished
        parents of live tasks, every schedule, and the id high-water mark."""
        live = [r for r in self.tasks.values() if not r.status.is_terminal]
        parents = {p for r in live for p in r.spec.after}
        wanted = [
            r
            for r in self.tasks.values()
            if not r.status.is_terminal or r.updated_ns >= horizon_unix_ns or r.task_id in parents
        ]
        wanted.sort(key=lambda r: r.task_id)
        to_engine = time_base.to_engine
        return RecoveredState(
            max_task_id=self.max_task_id,
            tasks=[_shift(r, to_engine) for r in wanted],
            schedules=[_shift_schedule(s, to_engine) for s in self.schedules.values()],
        )

    def prune(self, horizon_unix_ns: int) -> None:
        """Forget tasks finished before the horizon; the id high-water mark stays."""
        while self.finished:
            task_id, finished_at = next(iter(self.finished.items()))
            if finished_at >= horizon_unix_ns:
                break
            del self.finished[task_id]
            record = self.tasks.pop(task_id)
            key = record.spec.key
            if key is not None and self.keys.get(key) == task_id:
                del self.keys[key]


class MemoryStore:
    """An in-process store (see the module docstring)."""

    def __init__(
        self, *, keep_finished: float = 3600.0, _cluster: MemoryCluster | None = None
    ) -> None:
        self._cluster = _cluster or MemoryCluster(int(keep_finished * NS_PER_S))
        self._id = next(self._cluster.instance_ids)
        self._epoch: int | None = None
        self._lost = asyncio.Event()
        self._time_base = TimeBase()

    def connect_another(self) -> MemoryStore:
        """A new instance on the same cluster, as a second process would open the database."""
        return MemoryStore(_cluster=self._cluster)

    def simulate_crash(self) -> None:
        """Lose leadership as a dead process would: nothing released, nothing notified."""
        if self._cluster.leader == self._id:
            self._cluster.leader = None
            self._notify_released()

    def set_available(self, available: bool) -> None:
        self._cluster.available = available

    def _check_available(self) -> None:
        if not self._cluster.available:
            raise Unavailable("memory store made unavailable by set_available(False)")

    def _notify_released(self) -> None:
        async def notify() -> None:
            async with self._cluster.released:
                self._cluster.released.notify_all()

        asyncio.get_running_loop().create_task(notify())

    async def acquire_leadership(self) -> Lease:
        cluster = self._cluster
        async with cluster.released:
            await cluster.released.wait_for(lambda: cluster.leader is None)
            cluster.leader = self._id
            cluster.epoch += 1
            self._epoch = cluster.epoch
            self._lost = asyncio.Event()
            return Lease(cluster.epoch)

    async def leadership_lost(self) -> None:
        await self._lost.wait()

    async def release_leadership(self) -> None:
        if self._cluster.leader == self._id:
            self._cluster.leader = None
            self._lost.set()
            async with self._cluster.released:
                self._cluster.released.notify_all()

    async def close(self) -> None:
        await self.release_leadership()

    def _fence(self, epoch: int) -> None:
        if epoch != self._cluster.epoch or self._cluster.leader != self._id:
            self._lost.set()
            raise Fenced(f"epoch {epoch} is stale; the cluster is at {self._cluster.epoch}")

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        self._check_available()
        self._fence(epoch)
        self._time_base = time_base
        return self._cluster.recover(time_base, time.time_ns() - retention_ns)

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        self._check_available()
        self._fence(epoch)
        self._cluster.apply(batch, self._time_base)

    async def load_output(self, task_id: int) -> bytes | None:
        self._check_available()
        record = self._cluster.tasks.get(task_id)
        return None if record is None else record.output

    async def get_task(self, task_id: int) -> TaskRecord | None:
        self._check_available()
        record = self._cluster.tasks.get(task_id)
        return None if record is None else _shift(record, self._time_base.to_engine)

    async def get_task_by_key(self, key: str) -> TaskRecord | None:
        task_id = self._cluster.keys.get(key)
        return None if task_id is None else await self.get_task(task_id)


def _shift(record: TaskRecord, convert: Callable[[int], int]) -> TaskRecord:
    if convert(0) == 0:
        return record
    return dataclasses.replace(
        record,
        submitted_ns=convert(record.submitted_ns),
        updated_ns=convert(record.updated_ns),
        due_ns=None if record.due_ns is None else convert(record.due_ns),
    )


def _shift_schedule(record: ScheduleRecord, convert: Callable[[int], int]) -> ScheduleRecord:
    return dataclasses.replace(record, next_ns=convert(record.next_ns))
