"""``Scheduler.explain``: each hold in a test that puts a task behind exactly that hold, on a
real MemoryStore (the property machine of test_engine_properties.py checks, over random
histories, that the hold named is always true)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from standbys import waiting_standby

from cronoq import (
    Explanation,
    Hold,
    LeasedAttempt,
    Limit,
    MemoryStore,
    Pool,
    RemotePool,
    RetryPolicy,
    Scheduler,
    StaleAttempt,
    Status,
    TaskContext,
)
from cronoq._engine import Engine, EngineConfig, ExplainTask, PoolConfig, SubmitTasks
from cronoq._model import NS_PER_S, TaskSpec
from cronoq.errors import TaskNotFound

S = NS_PER_S
LATER = RetryPolicy(max_attempts=3, initial_ns=3600 * S, max_ns=3600 * S, jitter=0.0)
AT_ONCE = RetryPolicy(max_attempts=3, initial_ns=0, max_ns=0, jitter=0.0)


class Gate:
    """A task function that runs until released, and says when each attempt started."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.failed = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: object) -> None:
        if payload == b"fail":
            # Set before the raise: the attempt's report reaches the scheduler before the
            # waiter runs (no await lies between the raise and the report).
            self.failed.set()
            raise RuntimeError("boom")
        self.started.set()
        await self.release.wait()


@pytest.fixture
async def gate() -> AsyncIterator[Gate]:
    gate = Gate()
    yield gate
    gate.release.set()


def _scheduler(gate: Gate, **options: object) -> Scheduler:
    pools = [
        Pool("default", gate, concurrency=1),
        Pool("wide", gate, concurrency=10),
        RemotePool("remote", lease=5.0),
    ]
    return Scheduler(pools, store=MemoryStore(), **options)  # type: ignore[arg-type]


async def _explained(sched: Scheduler, task_id: int, hold: Hold) -> Explanation:
    found = await sched.explain(task_id)
    assert found.hold is hold, found
    assert found.task_id == task_id
    return found


async def test_a_child_waits_for_its_unfinished_parents(gate: Gate) -> None:
    async with _scheduler(gate) as sched:
        await sched.pause_pool("wide")
        parent = await sched.submit("job", pool="wide")
        done = await sched.submit("job", pool="default")
        gate.release.set()
        await sched.wait(done, timeout=5)
        child = await sched.submit("job", pool="wide", after=[parent, done])
        found = await _explained(sched, child, Hold.DEPENDENCIES)
        assert found.parents == (parent,), "the parent that succeeded holds nothing"
        assert found.status is Status.WAITING
        assert str(parent) in found.summary


async def test_a_fixed_start_holds_a_task_until_it(gate: Gate) -> None:
    async with _scheduler(gate) as sched:
        start = datetime.now(UTC) + timedelta(hours=2)
        task_id = await sched.submit("job", start_at=start)
        found = await _explained(sched, task_id, Hold.START_TIME)
        assert found.until is not None and abs(found.until - start) < timedelta(milliseconds=1)
        assert "its start time comes in 2h" in found.summary


async def test_a_failed_attempt_waits_for_its_backoff(gate: Gate) -> None:
    async with _scheduler(gate) as sched:
        task_id = await sched.submit("job", b"fail", retry=LATER)
        await asyncio.wait_for(gate.failed.wait(), 5)
        found = await _explained(sched, task_id, Hold.RETRY_BACKOFF)
        assert found.attempt == 1
        assert found.until is not None
        assert found.until - datetime.now(UTC) > timedelta(minutes=59)


async def test_a_paused_pool_holds_its_ready_tasks(gate: Gate) -> None:
    async with _scheduler(gate) as sched:
        await sched.pause_pool("wide")
        task_id = await sched.submit("job", pool="wide")
        found = await _explained(sched, task_id, Hold.POOL_PAUSED)
        assert "'wide' is paused" in found.summary
        await sched.resume_pool("wide")
        assert (await sched.explain(task_id)).hold in (Hold.RUNNING, Hold.FINISHED)
        gate.release.set()


async def test_a_full_pool_holds_the_next_task(gate: Gate) -> None:
    async with _scheduler(gate) as sched:
        first = await sched.submit("job")
        await gate.started.wait()
        second = await sched.submit("job")
        found = await _explained(sched, second, Hold.POOL_FULL)
        assert (found.running, found.concurrency) == (1, 1)
        running = await _explained(sched, first, Hold.RUNNING)
        assert running.attempt == 1 and running.worker is None
        gate.release.set()


async def test_a_limit_without_room_names_itself_and_its_key(gate: Gate) -> None:
    limits = [Limit("tenant", concurrency=1, per_key=True), Limit("api", rate=1, per=3600)]
    async with _scheduler(gate, limits=limits) as sched:
        await sched.submit("job", pool="wide", limits={"tenant": "acme"})
        await gate.started.wait()
        held = await sched.submit("job", pool="wide", limits={"tenant": "acme"})
        other = await sched.submit("job", pool="wide", limits={"tenant": "globex"})
        found = await _explained(sched, held, Hold.LIMIT)
        assert (found.limit, found.limit_key, found.until) == ("tenant", "acme", None)
        assert "1 of 1 running" in found.summary
        assert (await sched.explain(other)).hold is Hold.RUNNING
        # A rate limit says when it lets the next start.
        await sched.submit("job", pool="wide", limits={"api": None})
        rated = await sched.submit("job", pool="wide", limits={"api": None})
        found = await _explained(sched, rated, Hold.LIMIT)
        assert found.limit == "api" and found.until is not None
        assert found.until - datetime.now(UTC) > timedelta(minutes=59)
        gate.release.set()


async def test_a_remote_pool_without_worker_slots_and_a_worker_named_on_its_attempt(
    gate: Gate,
) -> None:
    async with _scheduler(gate) as sched:
        task_id = await sched.submit("job", pool="remote")
        found = await _explained(sched, task_id, Hold.NO_WORKER_SLOTS)
        assert "'remote'" in found.summary
        link = sched.attach(["remote"], slots=1, name="host-7:1234")
        attempt = await asyncio.wait_for(link.next(), 5)
        assert isinstance(attempt, LeasedAttempt)
        running = await _explained(sched, task_id, Hold.RUNNING)
        assert running.worker == "host-7:1234"
        assert running.until is not None, "a leased attempt's lease end"
        await sched.cancel(task_id, "not needed")
        cancelling = await _explained(sched, task_id, Hold.CANCELLING)
        assert "not needed" in cancelling.summary
        await sched.report_failure(attempt.token, "stopped", lease_id=attempt.lease_id)
        await sched.wait(task_id, timeout=5)
        finished = await _explained(sched, task_id, Hold.FINISHED)
        assert finished.status is Status.CANCELLED and "not needed" in finished.summary


async def test_a_stopped_remote_attempt_holds_its_slot_until_it_reports(gate: Gate) -> None:
    async with _scheduler(gate) as sched:
        link = sched.attach(["remote"], slots=1, name="w")
        task_id = await sched.submit("job", pool="remote", timeout=0.05, retry=AT_ONCE)
        attempt = await asyncio.wait_for(link.next(), 5)
        assert isinstance(attempt, LeasedAttempt)
        # Its timeout stops it; it may still run on its worker, so the task, ready for its
        # next attempt at once, waits for that one to report (or its lease to end).
        stop = await asyncio.wait_for(link.next(), 5)
        assert not isinstance(stop, LeasedAttempt)
        found = await _explained(sched, task_id, Hold.STOPPED_ATTEMPT)
        assert found.status is Status.READY and found.until is not None
        # The report of a stopped attempt is stale, but frees its slot: the next one starts.
        with pytest.raises(StaleAttempt):
            await sched.report_failure(attempt.token, "timed out", lease_id=attempt.lease_id)
        second = await asyncio.wait_for(link.next(), 5)
        assert isinstance(second, LeasedAttempt) and second.token.attempt == 2
        await sched.report_success(second.token, lease_id=second.lease_id)


async def test_a_standby_says_no_leader_holds_the_task(gate: Gate) -> None:
    store = MemoryStore()
    pools = [Pool("default", gate)]
    async with Scheduler(pools, store=store) as leader:
        task_id = await leader.submit("job", start_at=timedelta(hours=1))
        standby, takeover = await waiting_standby(store, pools)
        try:
            assert standby.running and not standby.leading
            assert not standby.metrics().leading
            found = await _explained(standby, task_id, Hold.LEADER_CHANGE)
            assert "is taking over" in found.summary
            assert found.status is Status.SCHEDULED
        finally:
            takeover.cancel()
            await asyncio.gather(takeover, return_exceptions=True)
            await standby.close()


async def test_a_finished_task_says_how_it_ended_also_once_memory_forgot_it(gate: Gate) -> None:
    store = MemoryStore(keep_finished=3600)
    pools = [Pool("default", gate)]
    async with Scheduler(pools, store=store) as first:
        task_id = await first.submit("job", b"fail", retry=RetryPolicy(max_attempts=1))
        await first.wait(task_id, timeout=5)
        found = await _explained(first, task_id, Hold.FINISHED)
        assert found.status is Status.FAILED and "boom" in found.summary
    await asyncio.sleep(0.01)  # time, not an event: the task must be older than the retention
    # A leader whose retention the task is past recovers it into no memory: the row answers.
    async with Scheduler(pools, store=store.connect_another(), retention=0.001) as second:
        found = await _explained(second, task_id, Hold.FINISHED)
        assert found.status is Status.FAILED and "boom" in found.summary
        with pytest.raises(TaskNotFound):
            await second.explain(task_id + 1000)


def test_a_ready_task_nothing_holds_is_about_to_start() -> None:
    """Only between a step's inputs and its dispatch, which a read made in the same step as
    the submission sees."""
    engine = Engine(EngineConfig([PoolConfig("p", 1)], retention_ns=60 * S), epoch=1)
    result = engine.step(
        1_700_000_000 * S,
        [SubmitTasks([TaskSpec("p", "job", b"")], "s"), ExplainTask(1 << 40 | 1, "e")],
    )
    [found] = [value for tag, value in result.replies if tag == "e"]
    assert isinstance(found, Explanation) and found.hold is Hold.DISPATCHING, found
    assert [d.token.task_id for d in result.dispatches] == [1 << 40 | 1]
