"""Random histories: a Scheduler over the store, crashed at commit boundaries, checked against a
model of what was acknowledged.

Each crash happens at one of three points: before a step's commit reaches the store, after the
store committed it but before any caller was answered, or between steps. Calls whose outcome the
caller never learned may or may not be durable, but never half: a batch is all there or absent.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cronoq import Pool, RetryPolicy, Scheduler, SchedulerError, Status, TaskContext, TaskRequest
from cronoq.errors import TaskError
from cronoq.store import Lease, Mutation, RecoveredState, Store, TaskRecord, TimeBase
from cronoq_conformance._harness import StoreHarness

__all__ = ["SimulationSuite"]

_T = TypeVar("_T")
_RETRY = RetryPolicy.exponential(2, initial=0.001, maximum=0.002, jitter=0.0)


class CrashPoint(enum.Enum):
    BEFORE_COMMIT = "before the commit reaches the store"
    AFTER_COMMIT = "after the store committed, before any caller is answered"


class CrashingStore:
    """Wraps a store; when armed, the next commit kills the scheduler at the chosen point."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.armed: CrashPoint | None = None
        self.on_crash: Any = None

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        point, self.armed = self.armed, None
        if point is CrashPoint.AFTER_COMMIT:
            await self.inner.commit(epoch, batch)
        if point is not None:
            self.on_crash()
            await asyncio.sleep(0)  # the driver task was cancelled: this raises CancelledError
            raise AssertionError("the crash did not stop the driver")
        await self.inner.commit(epoch, batch)

    async def acquire_leadership(self) -> Lease:
        return await self.inner.acquire_leadership()

    async def leadership_lost(self) -> None:
        await self.inner.leadership_lost()

    async def release_leadership(self) -> None:
        await self.inner.release_leadership()

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        return await self.inner.recover(epoch, time_base, retention_ns)

    async def load_output(self, task_id: int) -> bytes | None:
        return await self.inner.load_output(task_id)

    async def get_task(self, task_id: int) -> TaskRecord | None:
        return await self.inner.get_task(task_id)

    async def get_task_by_key(self, key: str) -> TaskRecord | None:
        return await self.inner.get_task_by_key(key)

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Model:
    """What callers were told."""

    acknowledged: dict[int, bytes] = field(default_factory=dict)
    """Task id -> payload, for every submission that returned."""
    keys: dict[str, int] = field(default_factory=dict)
    uncertain_batches: list[list[str]] = field(default_factory=list)
    """Keys of submit_many calls that failed without an answer: all durable or none."""
    cancelled: set[int] = field(default_factory=set)
    """Tasks whose cancel() returned 'cancelled'."""
    issued: list[int] = field(default_factory=list)
    """Every id ever returned, in order."""


async def _noop(ctx: TaskContext, payload: bytes) -> bytes:
    if payload.startswith(b"fail"):
        raise TaskError("planned failure")
    return payload


class SchedulerMachine(RuleBasedStateMachine):
    harness: StoreHarness

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.model = Model()
        self.names = itertools.count()
        self.run_id = uuid.uuid4().hex[:12]
        self.sched: Scheduler | None = None
        self.store: CrashingStore | None = None
        self.run(self._start())

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coro)

    async def _start(self) -> None:
        self.store = store = CrashingStore(await self.harness.open())
        self.sched = sched = Scheduler(
            [Pool("default", _noop, concurrency=4)], store=store, commit_timeout=30.0, seed=5
        )
        store.on_crash = sched.abort
        await asyncio.wait_for(sched.start(), self.harness.leadership_timeout + 5)

    def teardown(self) -> None:
        try:
            if self.sched is not None and self.sched.running:
                self.run(self.sched.close(timeout=1.0))
            self.run(self.harness.close_all())
        finally:
            self.loop.close()

    def _next_key(self) -> str:
        # Unique across examples: hypothesis runs them all on the one cluster of the test.
        return f"{self.run_id}-{next(self.names)}"

    # --- operations -----------------------------------------------------------------------

    @rule(size=st.integers(1, 4), failing=st.booleans(), crash=st.sampled_from([None, *CrashPoint]))
    def submit_many(self, size: int, failing: bool, crash: CrashPoint | None) -> None:
        assert self.sched is not None
        assert self.store is not None
        keys = [self._next_key() for _ in range(size)]
        payloads = [(b"fail-" if failing else b"ok-") + k.encode() for k in keys]
        self.store.armed = crash
        requests = [
            TaskRequest("job", p, key=k, retry=_RETRY) for k, p in zip(keys, payloads, strict=True)
        ]
        try:
            ids = self.run(self.sched.submit_many(requests))
        except SchedulerError:
            self.model.uncertain_batches.append(keys)
            if crash is not None:
                self._recover()
            return
        assert crash is None or self.store.armed is None
        for task_id, key, payload in zip(ids, keys, payloads, strict=True):
            self.model.acknowledged[task_id] = payload
            self.model.keys[key] = task_id
            self.model.issued.append(task_id)

    @precondition(lambda self: bool(self.model.acknowledged))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        assert self.sched is not None
        task_id = data.draw(st.sampled_from(sorted(self.model.acknowledged)))
        try:
            status = self.run(self.sched.cancel(task_id))
        except SchedulerError:
            return
        if status is Status.CANCELLED:
            self.model.cancelled.add(task_id)

    @rule()
    def crash_between_steps(self) -> None:
        assert self.sched is not None
        self.sched.abort()
        self._recover()

    @rule()
    def let_tasks_run(self) -> None:
        self.run(asyncio.sleep(0.01))

    def _recover(self) -> None:
        assert self.store is not None
        self.run(self.harness.crash(self.store.inner))
        self.run(self._start())

    # --- invariants -----------------------------------------------------------------------

    @invariant()
    def every_acknowledged_task_is_durable_and_unchanged(self) -> None:
        assert self.sched is not None
        for task_id, payload in self.model.acknowledged.items():
            info = self.run(self.sched.get(task_id))
            assert info.payload == payload, f"task {task_id} changed its payload"
            if task_id in self.model.cancelled:
                assert info.status is Status.CANCELLED, f"task {task_id} lost its cancellation"

    @invariant()
    def uncertain_batches_are_all_there_or_absent(self) -> None:
        assert self.sched is not None
        for keys in self.model.uncertain_batches:
            found = [self.run(self.sched.get_by_key(k)) is not None for k in keys]
            assert all(found) or not any(found), f"batch {keys} half-applied: {found}"

    @invariant()
    def ids_are_never_reused_and_keep_increasing(self) -> None:
        issued = self.model.issued
        assert len(set(issued)) == len(issued), "an id was issued twice"
        assert issued == sorted(issued), "ids must grow in submission order"


class SimulationSuite:
    """Random histories with crashes against a model. Needs the ``harness`` fixture."""

    simulation_settings = settings(max_examples=12, stateful_step_count=12, deadline=None)

    def test_random_histories_with_crashes_keep_every_acknowledged_operation(
        self, harness: StoreHarness
    ) -> None:
        machine = type("Machine", (SchedulerMachine,), {"harness": harness})
        run_state_machine_as_test(machine, settings=self.simulation_settings)
