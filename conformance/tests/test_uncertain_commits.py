"""The driver under faults (issue 9): commits that fail but land, reports that arrive while a
commit fails, stops while callers wait. Each test is deterministic: faults are injected by
``FaultyStore`` around a real ``MemoryStore``, and every wait is on an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import pytest

from cronoq import (
    AttemptToken,
    CancelRequested,
    LeasedAttempt,
    MemoryStore,
    Pool,
    RemotePool,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    SchedulerStopped,
    Status,
    TaskContext,
    WaitTimedOut,
)
from cronoq.errors import Fenced, StaleAttempt, StoreFatal, Unavailable
from cronoq.store import (
    Mutation,
    RecoveredState,
    ScheduleRecord,
    ScheduleSaved,
    ScheduleSpec,
    TaskSubmitted,
    TaskTemplate,
    TaskUpdated,
    TimeBase,
)
from cronoq_conformance import CommitFault, FaultyStore
from cronoq_conformance._faults import DelegatingStore

ONCE = RetryPolicy(max_attempts=1)
TWICE = RetryPolicy.exponential(2, initial=0.01, maximum=0.01, jitter=0.0)
COMMIT_TIMEOUT = 0.3
LANDING = [CommitFault.LANDS_AFTER_TIMEOUT, CommitFault.LANDS_THEN_UNAVAILABLE]
ANY_FAULT = [*LANDING, CommitFault.UNAVAILABLE]
T = TypeVar("T")


class Executor:
    """Records every attempt; kind "block" waits for ``release``; tracks overlap per task."""

    def __init__(self) -> None:
        self.entered: list[tuple[int, int]] = []
        self.running: dict[int, int] = {}
        self.max_overlap = 0
        self.blocked = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled: list[tuple[int, int]] = []
        self.ended = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: bytes) -> bytes:
        self.entered.append((ctx.task_id, ctx.attempt))
        self.running[ctx.task_id] = self.running.get(ctx.task_id, 0) + 1
        self.max_overlap = max(self.max_overlap, self.running[ctx.task_id])
        try:
            if ctx.kind == "block" or (ctx.kind == "block-once" and ctx.attempt == 1):
                self.blocked.set()
                await self.release.wait()
            return payload
        except asyncio.CancelledError:
            self.cancelled.append((ctx.task_id, ctx.attempt))
            raise
        finally:
            self.running[ctx.task_id] -= 1
            self.ended.set()

    def attempts_of(self, task_id: int) -> list[int]:
        return [attempt for tid, attempt in self.entered if tid == task_id]


@pytest.fixture
def executor() -> Executor:
    return Executor()


@pytest.fixture
async def faulty(executor: Executor) -> AsyncIterator[tuple[Scheduler, FaultyStore]]:
    store = FaultyStore(MemoryStore())
    sched = Scheduler(
        [Pool("default", executor, concurrency=1)],
        store=store,
        commit_timeout=COMMIT_TIMEOUT,
        seed=3,
    )
    await sched.start()
    try:
        yield sched, store
    finally:
        executor.release.set()
        await sched.close(timeout=1.0)


def landed_kinds(store: FaultyStore) -> list[str]:
    return [type(m).__name__ for batch in store.landed_uncertainly for m in batch]


# --- 1. a report that arrives while a commit fails is applied ------------------------------


@pytest.mark.parametrize("fault", ANY_FAULT)
async def test_a_success_reported_while_a_commit_fails_is_applied(
    faulty: tuple[Scheduler, FaultyStore], executor: Executor, fault: CommitFault
) -> None:
    sched, store = faulty
    running = await sched.submit("block", b"done", retry=ONCE)
    await executor.blocked.wait()
    store.arm(fault)
    other = asyncio.ensure_future(sched.submit("other", b"", key="other"))
    await store.faulted.wait()  # that step's commit is failing now
    executor.release.set()  # the running attempt succeeds meanwhile: its report queues
    await executor.ended.wait()
    [outcome] = await asyncio.gather(other, return_exceptions=True)
    # The caller learns what the store shows: applied if it landed, not applied otherwise.
    assert isinstance(outcome, SchedulerError if fault is CommitFault.UNAVAILABLE else int)
    info = await sched.wait(running, timeout=5)
    assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 1, b"done")
    assert executor.attempts_of(running) == [1]


# --- 2. a commit that lands late does not burn the attempts it dispatched -------------------


@pytest.mark.parametrize("fault", LANDING)
async def test_a_commit_that_lands_late_does_not_burn_the_attempt_it_dispatched(
    faulty: tuple[Scheduler, FaultyStore], executor: Executor, fault: CommitFault
) -> None:
    sched, store = faulty
    store.arm(fault)
    # The step that submits the task also starts its only attempt; its commit lands although
    # the store never confirms it. The caller learns it landed, and the attempt runs once.
    task_id = await sched.submit("job", b"ran", retry=ONCE)
    assert "TaskSubmitted" in landed_kinds(store)
    info = await sched.wait(task_id, timeout=5)
    assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 1, b"ran")
    assert executor.attempts_of(task_id) == [1]


async def test_a_caller_whose_commit_did_not_land_is_told_it_was_not_applied(
    faulty: tuple[Scheduler, FaultyStore],
) -> None:
    sched, store = faulty
    store.arm(CommitFault.UNAVAILABLE)
    with pytest.raises(SchedulerError, match="was not applied and may be retried") as error:
        await sched.submit("job", b"", key="k")
    assert error.value.applied is False  # what a remote client needs to retry on its own
    assert await sched.get_by_key("k") is None


# --- 3. cancellations of a step that landed late reach the attempt ---------------------------


@pytest.mark.parametrize("fault", LANDING)
async def test_a_timeout_that_lands_late_stops_the_attempt_before_its_retry(
    faulty: tuple[Scheduler, FaultyStore], executor: Executor, fault: CommitFault
) -> None:
    sched, store = faulty
    task_id = await sched.submit("block-once", b"second", retry=TWICE, timeout=0.2)
    await executor.blocked.wait()
    store.arm(fault)  # the next commit is the timeout's
    info = await sched.wait(task_id, timeout=10)
    assert "TaskUpdated" in landed_kinds(store)
    assert (info.status, info.attempt) == (Status.SUCCEEDED, 2)
    assert executor.cancelled == [(task_id, 1)], "the timed-out attempt was never told to stop"
    assert executor.max_overlap == 1, "two attempts of one task ran at once"


@pytest.mark.parametrize("fault", LANDING)
async def test_a_cancel_that_lands_late_reaches_the_attempt(
    faulty: tuple[Scheduler, FaultyStore], executor: Executor, fault: CommitFault
) -> None:
    sched, store = faulty
    task_id = await sched.submit("block", b"", retry=TWICE)
    await executor.blocked.wait()
    store.arm(fault)
    assert await sched.cancel(task_id) is Status.RUNNING  # it landed: the caller is told so
    info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.CANCELLED
    assert executor.cancelled == [(task_id, 1)]


# --- 4. waiters survive a rebuild, fail on a stop, and leave nothing behind -----------------


async def test_a_waiter_survives_a_rebuild(
    faulty: tuple[Scheduler, FaultyStore], executor: Executor
) -> None:
    sched, store = faulty
    task_id = await sched.submit("block", b"out")
    await executor.blocked.wait()
    waiting = asyncio.ensure_future(sched.wait(task_id))
    await asyncio.sleep(0)  # let the wait register
    store.arm(CommitFault.UNAVAILABLE)
    with pytest.raises(SchedulerError):
        await sched.submit("other", b"")  # fails, and the engine is rebuilt
    executor.release.set()
    assert (await asyncio.wait_for(waiting, 5)).output == b"out"


@pytest.mark.parametrize("stop", ["close", "abort", "fence"])
async def test_waiters_fail_with_scheduler_stopped_when_the_scheduler_stops(
    executor: Executor, stop: str
) -> None:
    store = MemoryStore()
    sched = Scheduler([Pool("default", executor)], store=store, commit_timeout=COMMIT_TIMEOUT)
    await sched.start()
    task_id = await sched.submit("block", b"")
    await executor.blocked.wait()
    waiting = asyncio.ensure_future(sched.wait(task_id))
    await asyncio.sleep(0)
    if stop == "close":
        await sched.close(timeout=0.05)
    elif stop == "abort":
        sched.abort()
    else:
        store.simulate_crash()
        successor = store.connect_another()
        await successor.acquire_leadership()
        with pytest.raises(SchedulerStopped):
            await sched.cancel(task_id)  # its commit is fenced
        await sched.leadership_lost()
    with pytest.raises(SchedulerStopped):
        await asyncio.wait_for(waiting, 5)
    await sched.close(timeout=0.1)


class FencedAfterUncertain(DelegatingStore):
    """Once armed: the next commit lands but its reply is lost, and every later one is
    fenced (a newer leader took over between the tries)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.memory = inner
        self.armed = False
        self.fenced = False

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        if self.fenced:
            raise Fenced(f"injected: epoch {epoch} was superseded")
        if self.armed:
            self.armed, self.fenced = False, True
            await self.inner.commit(epoch, batch)
            raise Unavailable("injected: the commit landed but its reply was lost")
        await self.inner.commit(epoch, batch)


@pytest.mark.parametrize("first_try", ["fenced", "landed, reply lost"])
async def test_a_fenced_commit_tells_its_callers_whether_anything_was_applied(
    executor: Executor, first_try: str
) -> None:
    # A fenced commit writes nothing (the Store contract), so its callers learn "not applied"
    # and may retry without a key; only an earlier try that failed in flight makes it "maybe".
    memory = MemoryStore()
    store = FencedAfterUncertain(memory)
    sched = Scheduler([Pool("default", executor)], store=store, commit_timeout=5.0)
    await sched.start()
    if first_try == "fenced":
        store.fenced = True
    else:
        store.armed = True
    with pytest.raises(SchedulerStopped) as error:
        await asyncio.wait_for(sched.submit("job", b"", key="probe"), ANSWER_WITHIN)
    landed = await memory.get_task_by_key("probe")
    await sched.close(timeout=0.1)
    assert error.value.applied is (False if first_try == "fenced" else None), error.value
    assert (landed is None) is (first_try == "fenced")


async def test_a_wait_that_timed_out_leaves_nothing_behind(
    faulty: tuple[Scheduler, FaultyStore], executor: Executor
) -> None:
    sched, _ = faulty
    task_id = await sched.submit("block", b"")
    await executor.blocked.wait()
    for _ in range(200):
        with pytest.raises(WaitTimedOut, match=f"task {task_id} did not finish within 0.001s"):
            await sched.wait(task_id, timeout=0.001)
    for _ in range(200):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.001):
                await sched.wait(task_id)
    engine = sched._driver._engine  # white box: what the engine still holds for callers
    assert engine is not None
    assert engine.take_waiters() == []


async def test_wait_with_a_zero_timeout_returns_a_finished_task(
    faulty: tuple[Scheduler, FaultyStore], executor: Executor
) -> None:
    sched, _ = faulty
    done = await sched.submit("job", b"x")
    await sched.wait(done, timeout=5)
    assert (await sched.wait(done, timeout=0)).status is Status.SUCCEEDED
    live = await sched.submit("block", b"")
    with pytest.raises(WaitTimedOut):
        await sched.wait(live, timeout=0)


# --- 5. close and abort are bounded and give leadership up ---------------------------------


async def test_close_returns_while_the_store_is_down(executor: Executor) -> None:
    store = MemoryStore()
    sched = Scheduler([Pool("default", executor)], store=store, commit_timeout=0.1)
    await sched.start()
    store.set_available(False)
    with pytest.raises(SchedulerError):
        await sched.submit("job", b"")  # the engine is now rebuilding, retrying the store
    started = time.monotonic()
    await sched.close(timeout=0.2)
    assert time.monotonic() - started < 0.2 + 1.5
    assert not sched.running


async def test_close_timeout_holds_for_an_attempt_that_ignores_cancellation() -> None:
    stubborn_started = asyncio.Event()

    async def stubborn(ctx: TaskContext, payload: bytes) -> None:
        stubborn_started.set()
        for _ in range(100):
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                continue  # ignores every cancellation for 10 s

    sched = Scheduler([Pool("default", stubborn)])
    await sched.start()
    await sched.submit("job", b"")
    await stubborn_started.wait()
    started = time.monotonic()
    await sched.close(timeout=0.3)
    assert time.monotonic() - started < 0.3 + 1.0


class FatalStore(FaultyStore):
    """Fails the next commit with StoreFatal once armed."""

    fatal = False

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        if self.fatal:
            raise StoreFatal("injected: the database file is corrupt")
        await super().commit(epoch, batch)


@pytest.mark.parametrize("stop", ["abort", "fatal"])
async def test_a_stop_without_close_gives_leadership_up_for_a_standby(
    executor: Executor, stop: str
) -> None:
    first = MemoryStore()
    store = FatalStore(first)
    sched = Scheduler([Pool("default", executor)], store=store)
    await sched.start()
    standby = asyncio.ensure_future(first.connect_another().acquire_leadership())
    await asyncio.sleep(0)
    assert not standby.done()
    if stop == "abort":
        sched.abort()
    else:
        store.fatal = True
        with pytest.raises(SchedulerStopped, match="corrupt"):
            await sched.submit("job", b"")
    await asyncio.wait_for(standby, 2)  # without the release it would wait forever
    assert isinstance(sched.failure, SchedulerStopped | StoreFatal)


async def test_fenced_logs_one_warning_line(
    executor: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    sched = Scheduler([Pool("default", executor)], store=store)
    await sched.start()
    store.simulate_crash()
    await store.connect_another().acquire_leadership()
    with caplog.at_level(logging.WARNING, logger="cronoq"), pytest.raises(SchedulerStopped):
        await sched.submit("job", b"")
    records = [r for r in caplog.records if r.name == "cronoq"]
    assert [r.levelno for r in records] == [logging.WARNING], records
    assert records[0].exc_info is None
    assert "another instance leads" in records[0].getMessage()


# --- 6. no attempt starts during a graceful close -------------------------------------------


class GatedStore(FaultyStore):
    """Holds the next commit until ``gate`` opens (a slow commit that succeeds)."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.hold = False
        self.held = asyncio.Event()
        self.gate = asyncio.Event()

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        if self.hold:
            self.hold = False
            self.held.set()
            await self.gate.wait()
        await super().commit(epoch, batch)


async def test_no_attempt_starts_during_a_graceful_close(executor: Executor) -> None:
    memory = MemoryStore()
    store = GatedStore(memory)
    sched = Scheduler([Pool("default", executor, concurrency=1)], store=store)
    await sched.start()
    first = await sched.submit("block", b"")
    queued = await sched.submit("job", b"")
    await executor.blocked.wait()
    store.hold = True
    executor.release.set()  # the first succeeds; the step that starts the queued one commits
    await store.held.wait()
    closing = asyncio.ensure_future(sched.close(timeout=1.0))
    await asyncio.sleep(0)  # close() has begun draining: nothing runs
    store.gate.set()
    await closing
    assert executor.attempts_of(first) == [1]
    assert executor.attempts_of(queued) == [], "an attempt started during the close"
    record = await memory.get_task(queued)
    assert record is not None and (record.status, record.attempt) == (Status.READY, 0)
    # The next leader starts it as its first attempt.
    successor = Scheduler([Pool("default", executor)], store=memory.connect_another())
    async with successor:
        assert (await successor.wait(queued, timeout=5)).attempt == 1


# --- 7. thread functions have threads of their own -----------------------------------------


async def test_thread_tasks_run_beside_a_saturated_default_executor() -> None:
    loop = asyncio.get_running_loop()
    hold = threading.Event()
    # Every thread of asyncio's default executor is stuck in someone else's work.
    stuck = [loop.run_in_executor(None, hold.wait) for _ in range(64)]
    barrier = threading.Barrier(10, timeout=5)

    def work(ctx: TaskContext, payload: bytes) -> bytes:
        barrier.wait()  # all ten run at once: each pool thread is its own
        return payload

    store = FaultyStore(MemoryStore())
    try:
        async with Scheduler(
            [Pool("default", work, concurrency=10)], store=store, commit_timeout=COMMIT_TIMEOUT
        ) as sched:
            ids = [await sched.submit("job", b"ok", timeout=5) for _ in range(10)]
            infos = [await sched.wait(i, timeout=10) for i in ids]
            assert [(i.status, i.attempt) for i in infos] == [(Status.SUCCEEDED, 1)] * 10
            # Recovery after a store blip needs no default-executor thread either.
            store.arm(CommitFault.UNAVAILABLE)
            with pytest.raises(SchedulerError):
                await sched.submit("job", b"")
            again = await sched.submit("job", b"again", key="after-blip")
            barrier.reset()
            barrier = threading.Barrier(1)
            assert (await sched.wait(again, timeout=10)).status is Status.SUCCEEDED
    finally:
        hold.set()
        await asyncio.gather(*stuck)


async def test_a_timed_out_thread_keeps_its_slot_until_it_returns() -> None:
    loop = asyncio.get_running_loop()
    saw_cancel = asyncio.Event()
    release = threading.Event()
    overlap: list[int] = []
    running = 0
    lock = threading.Lock()

    def work(ctx: TaskContext, payload: bytes) -> bytes:
        nonlocal running
        with lock:
            running += 1
            overlap.append(running)
        try:
            if payload == b"ok" and ctx.attempt == 1:
                while not ctx.cancelled:
                    time.sleep(0.002)
                loop.call_soon_threadsafe(saw_cancel.set)
                release.wait(5)  # far past its timeout
            return payload
        finally:
            with lock:
                running -= 1

    async with Scheduler([Pool("default", work, concurrency=1)]) as sched:
        task_id = await sched.submit("job", b"ok", retry=TWICE, timeout=0.05)
        other = await sched.submit("job", b"other")
        await saw_cancel.wait()
        # The retry is due 10 ms after the timeout; an absence takes time to show.
        await asyncio.sleep(0.2)
        # Due, but held back: attempt 2 waits for attempt 1's thread, and so does the slot.
        assert [(await sched.get(t)).attempt for t in (task_id, other)] == [1, 0]
        release.set()
        assert (await sched.wait(task_id, timeout=5)).attempt == 2
        assert (await sched.wait(other, timeout=5)).status is Status.SUCCEEDED
    assert max(overlap) == 1


async def test_a_thread_that_sees_cancelled_and_returns_ends_cancelled() -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()

    def work(ctx: TaskContext, payload: bytes) -> bytes:
        loop.call_soon_threadsafe(started.set)
        while not ctx.cancelled:
            time.sleep(0.002)
        return b"returned normally"

    async with Scheduler([Pool("default", work)]) as sched:
        task_id = await sched.submit("job", b"")
        await started.wait()
        assert await sched.cancel(task_id, "stop it") is Status.RUNNING
        info = await sched.wait(task_id, timeout=5)
        assert (info.status, info.message) == (Status.CANCELLED, "stop it")


# --- 11. lookups past the in-memory retention fall back to the store ------------------------


async def test_get_wait_and_cancel_find_a_task_past_the_retention(executor: Executor) -> None:
    async with Scheduler([Pool("default", executor)], retention=0) as sched:
        task_id = await sched.submit("job", b"kept")
        await sched.wait(task_id, timeout=5)
        await sched.submit("job", b"")  # a later step prunes it from memory
        assert (await sched.get(task_id)).output == b"kept"
        assert (await sched.wait(task_id, timeout=0)).status is Status.SUCCEEDED
        assert await sched.cancel(task_id) is Status.SUCCEEDED


# === interleavings of uncertain commits with stops, reads and schedules (found by an
# independent review of the rework; each failed before its fix) ===========================

# Long enough for the driver to give up on a commit and rebuild, far from a hang's "forever".
ANSWER_WITHIN = 3.0


def spawn(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """A caller in the background whose outcome the test may never look at (when it fails
    first): its exception counts as retrieved, so asyncio does not log it at teardown."""
    future = asyncio.ensure_future(coro)
    future.add_done_callback(lambda done: done.cancelled() or done.exception())
    return future


class HookedStore(FaultyStore):
    """FaultyStore whose ``recover`` can hang (until cancelled) or fail fatally once armed."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.memory = inner
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


@contextlib.asynccontextmanager
async def serving(
    store: HookedStore, executor: Executor, commit_timeout: float = COMMIT_TIMEOUT
) -> AsyncIterator[Scheduler]:
    """A started scheduler on ``store`` (over a MemoryStore), one slot for ``executor``."""
    sched = Scheduler(
        [Pool("default", executor, concurrency=1)],
        store=store,
        commit_timeout=commit_timeout,
        seed=3,
    )
    await sched.start()
    try:
        yield sched
    finally:
        executor.release.set()
        store.hang_recover = store.fatal_recover = False
        store.memory.set_available(True)
        await sched.close(timeout=1.0)


@pytest.fixture
async def hooked(
    executor: Executor,
) -> AsyncIterator[tuple[Scheduler, HookedStore, MemoryStore]]:
    memory = MemoryStore()
    store = HookedStore(memory)
    async with serving(store, executor) as sched:
        yield sched, store, memory


# --- a waiter answered by the failed step itself ---------------------------------------------


@pytest.mark.parametrize("fault", ANY_FAULT)
async def test_a_waiter_of_a_task_that_the_failed_step_finished_is_answered(
    hooked: tuple[Scheduler, HookedStore, MemoryStore], executor: Executor, fault: CommitFault
) -> None:
    sched, store, _ = hooked
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
    hooked: tuple[Scheduler, HookedStore, MemoryStore], stop: str
) -> None:
    sched, store, _ = hooked
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
    with pytest.raises((SchedulerStopped, SchedulerError)) as error:
        await asyncio.wait_for(submitting, ANSWER_WITHIN)
    # Its commit may have landed: unless the store showed it did not (the close lets the
    # rebuild read it), the caller must not take the stop for "nothing applied".
    assert error.value.applied is (False if stop == "close" else None), error.value


async def test_callers_held_by_the_failed_step_are_answered_when_the_rebuild_fails(
    hooked: tuple[Scheduler, HookedStore, MemoryStore], executor: Executor
) -> None:
    sched, store, _ = hooked
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
    hooked: tuple[Scheduler, HookedStore, MemoryStore], executor: Executor
) -> None:
    sched, store, memory = hooked
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
    hooked: tuple[Scheduler, HookedStore, MemoryStore],
) -> None:
    sched, store, memory = hooked
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


async def test_close_commits_a_report_whose_first_commit_failed(executor: Executor) -> None:
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


async def test_a_start_that_fails_gives_leadership_up(executor: Executor) -> None:
    first = MemoryStore()
    store = HookedStore(first)
    store.fatal_recover = True
    sched = Scheduler([Pool("default", executor)], store=store)
    with pytest.raises(StoreFatal):
        await sched.start()
    await sched.close(timeout=0.1)
    await asyncio.wait_for(first.connect_another().acquire_leadership(), ANSWER_WITHIN)


@pytest.mark.parametrize("fault", LANDING)
async def test_a_remote_attempt_stopped_in_a_commit_that_landed_late_still_holds_its_task(
    fault: CommitFault,
) -> None:
    # As for a local pool: the rebuild after the uncertain commit re-holds the stopped remote
    # attempt, so its retry does not start on another worker while the first may still run.
    store = FaultyStore(MemoryStore())
    retry = RetryPolicy(max_attempts=2, initial_ns=0, max_ns=0, jitter=0.0)
    sched = Scheduler([RemotePool("remote", lease=30)], store=store, commit_timeout=COMMIT_TIMEOUT)
    await sched.start()
    try:
        a = sched.attach(["remote"], slots=1)
        b = sched.attach(["remote"], slots=1)
        task_id = await sched.submit("job", pool="remote", timeout=0.2, retry=retry)
        first = await asyncio.wait_for(a.next(), 5)
        assert isinstance(first, LeasedAttempt)
        store.arm(fault)  # the next commit is the timeout's
        cancel = await asyncio.wait_for(a.next(), 5)  # told to stop, by the rebuild
        assert isinstance(cancel, CancelRequested) and cancel.token == first.token
        assert "TaskUpdated" in landed_kinds(store)
        await sched.list()  # a step after the rebuild: it would lease attempt 2 to B
        assert b.queued == 0, "the retry started beside the stopped attempt"
        assert (await sched.get(task_id)).status is Status.READY
        with pytest.raises(StaleAttempt):
            await sched.report_failure(first.token, "stopped", lease_id=first.lease_id)  # A ends it
        second = await asyncio.wait_for(b.next(), 5)
        assert isinstance(second, LeasedAttempt) and second.token.attempt == 2
    finally:
        await sched.close(timeout=0.1)


@pytest.mark.parametrize("fault", LANDING)
async def test_a_forged_report_does_not_make_a_rebuild_take_an_unsent_attempt_for_one_that_ran(
    fault: CommitFault,
) -> None:
    # Issue 19 review: a rebuild took the token of every report queued as an attempt that had
    # run, lease id or not: a guessed report for an attempt whose start was never sent (its
    # commit uncertain) made the rebuild keep it running, and the task sat until the lease.
    store = FaultyStore(MemoryStore())
    sched = Scheduler([RemotePool("remote", lease=30)], store=store, commit_timeout=COMMIT_TIMEOUT)
    await sched.start()
    try:
        task_id = await sched.submit("job", pool="remote")  # ready: no worker yet
        store.arm(fault)  # the next commit is the one that starts its attempt
        link = sched.attach(["remote"], slots=1)
        # Epoch, task id and attempt number are no secret (Get and List show them).
        guessed = AttemptToken(sched.epoch or 0, task_id, 1)
        forged = asyncio.ensure_future(sched.report_success(guessed, lease_id=bytes(16)))
        attempt = await asyncio.wait_for(link.next(), 5)
        assert isinstance(attempt, LeasedAttempt) and attempt.token == guessed
        with pytest.raises(StaleAttempt):
            await forged
        await sched.report_success(attempt.token, b"ran", lease_id=attempt.lease_id)
        info = await sched.wait(task_id, timeout=5)
        assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 1, b"ran")
    finally:
        await sched.close(timeout=0.1)


# --- the rebuild's own step lands uncertainly ---------------------------------------------------


class RecoveryStepStore(HookedStore):
    """HookedStore that arms ``fault_after_recover`` at the next ``recover``: the fault then
    hits the recovery step's commit. Keeps every batch it was asked to commit."""

    def __init__(self, inner: MemoryStore) -> None:
        super().__init__(inner)
        self.fault_after_recover: CommitFault | None = None
        self.asked: list[list[Mutation]] = []

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        self.asked.append(list(batch))
        await super().commit(epoch, batch)

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        state = await super().recover(epoch, time_base, retention_ns)
        if self.fault_after_recover is not None:
            self.arm(self.fault_after_recover)
            self.fault_after_recover = None
        return state


@pytest.mark.parametrize("fault", LANDING)
async def test_a_recovery_step_that_lands_uncertainly_does_not_decide_for_the_lost_step(
    executor: Executor, fault: CommitFault
) -> None:
    """A step with a report and a submission does not land; the rebuild's own step fires a
    schedule, whose task takes the id the lost submission had been given, and that commit
    lands uncertainly too. The second rebuild must not take the schedule's task for the
    submission, and so the step for landed: its report would never be applied again. Whether
    the lost step landed is read off the store before the rebuild writes anything."""
    memory = MemoryStore()
    store = RecoveryStepStore(memory)
    # The held commit below is released within the commit timeout, on a loaded machine too.
    async with serving(store, executor, commit_timeout=1.0) as sched:
        epoch = sched.epoch
        assert epoch is not None
        # A due schedule written behind the scheduler's back: only a rebuild (which reads the
        # store) sees it, and the rebuild's first step fires it.
        template = TaskTemplate("default", "from-schedule", b"")
        due = ScheduleSpec("due", "* * * * *", "UTC", template)
        await memory.commit(epoch, [ScheduleSaved(ScheduleRecord(due, time.time_ns() - 10**9))])
        running = await sched.submit("block", b"done", retry=ONCE)
        await executor.blocked.wait()
        # Hold a commit, so that the report and the submission below make one step.
        store.arm(CommitFault.HELD)
        holding = spawn(sched.submit("later", b"", start_at=timedelta(hours=1)))
        await store.faulted.wait()
        store.arm(CommitFault.UNAVAILABLE)  # for that next step
        store.fault_after_recover = fault  # for the rebuild's own step
        executor.release.set()
        await executor.ended.wait()  # the attempt returned: its report is queued
        lost = spawn(sched.submit("lost", b""))
        await asyncio.sleep(0)  # the spawned submission runs, and queues, before the release
        store.release_held()
        await holding
        with pytest.raises(SchedulerError):
            await lost
        # Set again by the second recovery (the first one's arm cleared it): from then on the
        # store answers, and calls reach the rebuilt engine.
        await store.recovered.wait()
        info = await sched.wait(running, timeout=ANSWER_WITHIN)
        assert (info.status, info.output) == (Status.SUCCEEDED, b"done")
        # The failed step (the driver tried it until it gave up) held the report and the
        # submission; the rebuild's step gave the schedule's task the submission's id.
        failed = next(b for b in store.asked if _submissions(b, "lost"))
        assert any(isinstance(m, TaskUpdated) and m.task_id == running for m in failed)
        fired = [m for batch in store.landed_uncertainly for m in batch]
        assert _submissions(fired, "from-schedule") == _submissions(failed, "lost")


def _submissions(batch: Sequence[Mutation], kind: str) -> list[int]:
    return [m.task_id for m in batch if isinstance(m, TaskSubmitted) and m.spec.kind == kind]
