"""Interleavings of uncertain commits with stops, reads and schedules (found by a review of
the issue 9 rework; each failed before its fix).

Each test is deterministic: faults come from ``FaultyStore`` around a real ``MemoryStore`` and
every wait is on an event or on a bounded ``wait_for`` whose expiry is the failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from datetime import timedelta
from typing import Any, TypeVar

import pytest

from cronoq import (
    MemoryStore,
    Pool,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    SchedulerStopped,
    Status,
    TaskContext,
    WaitTimedOut,
)
from cronoq.errors import StoreFatal
from cronoq.store import RecoveredState, TimeBase
from cronoq_conformance import CommitFault, FaultyStore

T = TypeVar("T")
ONCE = RetryPolicy(max_attempts=1)
COMMIT_TIMEOUT = 0.3
ANY_FAULT = [
    CommitFault.LANDS_AFTER_TIMEOUT,
    CommitFault.LANDS_THEN_UNAVAILABLE,
    CommitFault.UNAVAILABLE,
]
# Long enough for the driver to give up on a commit and rebuild, far from a hang's "forever".
ANSWER_WITHIN = 3.0


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """A caller in the background whose outcome the test may never look at (when it fails
    first): its exception counts as retrieved, so asyncio does not log it at teardown."""
    future = asyncio.ensure_future(coro)
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    return future


class Blocking:
    """Kind "block" waits for ``release``; every attempt is recorded."""

    def __init__(self) -> None:
        self.entered: list[tuple[int, int]] = []
        self.blocked = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: bytes) -> bytes:
        self.entered.append((ctx.task_id, ctx.attempt))
        if ctx.kind == "block":
            self.blocked.set()
            await self.release.wait()
        return payload


class HookedStore(FaultyStore):
    """FaultyStore whose ``recover`` can hang (until cancelled) or fail fatally once armed."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.hang_recover = False
        self.fatal_recover = False
        self.recovering = asyncio.Event()

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        self.recovering.set()
        if self.fatal_recover:
            raise StoreFatal("injected: the database file is corrupt")
        if self.hang_recover:
            await asyncio.Event().wait()  # a recovery that outlives the caller's patience
        return await super().recover(epoch, time_base, retention_ns)


@pytest.fixture
def executor() -> Blocking:
    return Blocking()


@pytest.fixture
async def faulty(executor: Blocking) -> AsyncIterator[tuple[Scheduler, HookedStore, MemoryStore]]:
    memory = MemoryStore()
    store = HookedStore(memory)
    sched = Scheduler(
        [Pool("default", executor, concurrency=1)],
        store=store,
        commit_timeout=COMMIT_TIMEOUT,
        seed=3,
    )
    await sched.start()
    try:
        yield sched, store, memory
    finally:
        executor.release.set()
        store.hang_recover = store.fatal_recover = False
        memory.set_available(True)
        await sched.close(timeout=1.0)


# --- a waiter answered by the failed step itself ---------------------------------------------


@pytest.mark.parametrize("fault", ANY_FAULT)
async def test_a_waiter_of_a_task_that_the_failed_step_finished_is_answered(
    faulty: tuple[Scheduler, HookedStore, MemoryStore], executor: Blocking, fault: CommitFault
) -> None:
    sched, store, _ = faulty
    task_id = await sched.submit("block", b"out")
    await executor.blocked.wait()
    waiting = spawn(sched.wait(task_id))
    await sched.get(task_id)  # queued after the wait: once answered, the wait is registered
    store.arm(fault)
    executor.release.set()  # the step that applies the success (and answers the wait) fails
    info = await asyncio.wait_for(waiting, ANSWER_WITHIN)
    assert (info.status, info.output) == (Status.SUCCEEDED, b"out")


# --- writers of the failed step when the rebuild ends in a stop -------------------------------


@pytest.mark.parametrize("stop", ["fatal", "abort", "close"])
async def test_a_writer_of_the_failed_step_is_answered_when_the_rebuild_stops(
    faulty: tuple[Scheduler, HookedStore, MemoryStore], stop: str
) -> None:
    sched, store, _ = faulty
    store.arm(CommitFault.UNAVAILABLE)
    if stop == "fatal":
        store.fatal_recover = True
    elif stop == "abort":
        store.hang_recover = True
        store.recovering.clear()  # set by the start's recovery
    submitting = spawn(sched.submit("job", b""))
    await store.faulted.wait()  # the submit's commit is failing now
    if stop == "close":
        # The close drains at once (nothing runs); the commit then gives up and the rebuild
        # sees the scheduler stopping.
        await sched.close(timeout=0.05)
    elif stop == "abort":
        await store.recovering.wait()  # the rebuild waits for the store
        sched.abort()
    with pytest.raises((SchedulerStopped, SchedulerError)):
        await asyncio.wait_for(submitting, ANSWER_WITHIN)


async def test_callers_held_by_the_failed_step_are_answered_when_the_rebuild_fails(
    faulty: tuple[Scheduler, HookedStore, MemoryStore], executor: Blocking
) -> None:
    sched, store, _ = faulty
    task_id = await sched.submit("block", b"out")
    await executor.blocked.wait()
    waiting = spawn(sched.wait(task_id))
    await sched.get(task_id)  # queued after the wait: once answered, the wait is registered
    store.arm(CommitFault.UNAVAILABLE)
    store.fatal_recover = True
    executor.release.set()  # the step that ends the task, and answers the wait, fails
    await store.faulted.wait()
    getting = spawn(sched.get(task_id))  # the next step's read
    with pytest.raises(SchedulerStopped):
        await asyncio.wait_for(waiting, ANSWER_WITHIN)
    with pytest.raises((SchedulerStopped, SchedulerError)):
        await asyncio.wait_for(getting, ANSWER_WITHIN)


# --- reads of the failed step while the store stays down --------------------------------------


async def test_reads_of_the_failed_step_are_answered_while_the_store_stays_down(
    faulty: tuple[Scheduler, HookedStore, MemoryStore], executor: Blocking
) -> None:
    sched, store, memory = faulty
    task_id = await sched.submit("block", b"")
    await executor.blocked.wait()
    store.arm(CommitFault.UNAVAILABLE)
    memory.set_available(False)  # recovery fails too, until the store comes back
    # One step: a write (so the step commits) and two reads.
    submitting = spawn(sched.submit("job", b""))
    getting = spawn(sched.get(task_id))
    waiting = spawn(sched.wait(task_id, timeout=0.2))
    with pytest.raises(SchedulerError):
        await asyncio.wait_for(submitting, ANSWER_WITHIN)  # answered: "may have applied"
    with pytest.raises(SchedulerError):
        await asyncio.wait_for(getting, ANSWER_WITHIN)
    # wait(timeout=0.2) promises an answer 0.2 s after the task is known live (WaitTimedOut,
    # itself a TimeoutError, hence asyncio.wait rather than wait_for here).
    await asyncio.wait({waiting}, timeout=ANSWER_WITHIN)
    assert waiting.done(), "wait(timeout=0.2) is still waiting for the store to come back"
    assert isinstance(waiting.exception(), SchedulerError | WaitTimedOut)


# --- batch_landed decided by a no-op mutation -------------------------------------------------


async def test_an_unchanged_schedule_save_does_not_acknowledge_a_lost_submission(
    faulty: tuple[Scheduler, HookedStore, MemoryStore],
) -> None:
    sched, store, memory = faulty
    # A yearly cron: its next occurrence is the same for both registrations below.
    await sched.add_schedule("yearly", "0 0 1 1 *", kind="job")
    store.arm(CommitFault.UNAVAILABLE)
    # One step: a submission (not started: its start is an hour away), then the redeploy's
    # re-registration of the same schedule. The step does not reach the store.
    submitting = spawn(sched.submit("job", b"", start_at=timedelta(hours=1)))
    replacing = spawn(sched.add_schedule("yearly", "0 0 1 1 *", kind="job", replace=True))
    outcome, _ = await asyncio.gather(submitting, replacing, return_exceptions=True)
    assert not store.landed_uncertainly
    if isinstance(outcome, int):
        stored = await memory.get_task(outcome)
        later = await sched.submit("job", b"later")
        assert stored is not None, (
            f"task {outcome} was acknowledged but never stored; the next submission got id {later}"
        )
    assert isinstance(outcome, SchedulerError)


# --- close gives up on its reports at the first failed commit ----------------------------------


async def test_close_commits_a_report_whose_first_commit_failed(executor: Blocking) -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    sched = Scheduler(
        [Pool("default", executor)], store=store, commit_timeout=COMMIT_TIMEOUT, seed=3
    )
    await sched.start()
    task_id = await sched.submit("block", b"out", retry=ONCE)
    await executor.blocked.wait()
    store.arm(CommitFault.UNAVAILABLE)  # one failed commit; the store is fine at the next recover
    closing = spawn(sched.close(timeout=5.0))
    executor.release.set()  # the attempt succeeds; its report's commit fails once
    await closing
    record = await memory.get_task(task_id)
    assert record is not None
    assert (record.status, record.output) == (Status.SUCCEEDED, b"out")


# --- a start that fails keeps the store's leadership ------------------------------------------


async def test_a_start_that_fails_gives_leadership_up(executor: Blocking) -> None:
    first = MemoryStore()
    store = HookedStore(first)
    store.fatal_recover = True
    sched = Scheduler([Pool("default", executor)], store=store)
    with pytest.raises(StoreFatal):
        await sched.start()
    await sched.close(timeout=0.1)
    await asyncio.wait_for(first.connect_another().acquire_leadership(), ANSWER_WITHIN)
