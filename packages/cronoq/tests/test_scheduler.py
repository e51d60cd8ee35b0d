"""End to end through Scheduler: real asyncio executors over MemoryStore, crash and recovery."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from standbys import waiting_standby

from cronoq import (
    AdmissionRejected,
    JsonCodec,
    MemoryStore,
    Pool,
    RemotePool,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    SchedulerStopped,
    Status,
    TaskContext,
    TaskError,
    TaskRequest,
)
from cronoq.errors import InvalidArgument, PermissionDenied, StoreFatal
from cronoq.store import RecoveredState, TimeBase

FAST_RETRY = RetryPolicy.exponential(3, initial=0.01, maximum=0.05, jitter=0.0)


class Recorder:
    """An executor that records its calls and can be told how each kind behaves."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, str, int]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.fail_first: dict[str, int] = {}
        self.second_tick = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        self.calls.append((ctx.task_id, ctx.kind, ctx.attempt))
        if sum(1 for call in self.calls if call[1] == "tick") == 2:
            self.second_tick.set()
        if ctx.kind == "block":
            self.started.set()
            await self.release.wait()
        if ctx.attempt <= self.fail_first.get(ctx.kind, 0):
            raise TaskError(f"planned failure {ctx.attempt}")
        if ctx.kind == "fatal":
            raise TaskError("bad input", retryable=False)
        if ctx.kind == "boom":
            raise RuntimeError("unexpected")
        return payload


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def sched(recorder: Recorder) -> AsyncIterator[Scheduler]:
    async with Scheduler(
        [Pool("default", recorder, concurrency=4)], codec=JsonCodec(), seed=7
    ) as scheduler:
        yield scheduler


async def test_submit_runs_the_task_and_wait_returns_its_output(sched: Scheduler) -> None:
    task_id = await sched.submit("echo", {"n": 1})
    info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.SUCCEEDED
    assert info.output == {"n": 1}
    assert info.payload == {"n": 1}
    assert info.attempt == 1
    assert info.finished_at is not None


async def test_retryable_failures_retry_then_succeed(sched: Scheduler, recorder: Recorder) -> None:
    recorder.fail_first["flaky"] = 2
    task_id = await sched.submit("flaky", None, retry=FAST_RETRY)
    info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.SUCCEEDED
    assert [c[2] for c in recorder.calls if c[0] == task_id] == [1, 2, 3]


async def test_attempts_run_out_and_the_task_is_dead_lettered(
    sched: Scheduler, recorder: Recorder
) -> None:
    recorder.fail_first["flaky"] = 5
    task_id = await sched.submit("flaky", None, retry=FAST_RETRY)
    info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.FAILED
    assert info.attempt == 3
    assert "no attempts left" in info.message


async def test_non_retryable_and_unexpected_errors(sched: Scheduler) -> None:
    fatal = await sched.submit("fatal", None, retry=FAST_RETRY)
    boom = await sched.submit("boom", None, retry=RetryPolicy.exponential(1))
    fatal_info = await sched.wait(fatal, timeout=5)
    boom_info = await sched.wait(boom, timeout=5)
    assert (fatal_info.status, fatal_info.attempt) == (Status.FAILED, 1)
    assert "not retryable" in fatal_info.message
    assert boom_info.status is Status.FAILED
    assert "RuntimeError: unexpected" in boom_info.message


async def test_a_key_scope_refuses_a_key_held_outside_it_and_applies_nothing() -> None:
    """``submit_specs(key_pools=, key_kinds=)``: a key held by a live or finished task of
    another pool or kind refuses the whole call without naming that task (issue 29)."""
    pools = [RemotePool("a"), RemotePool("b")]
    async with Scheduler(pools, seed=7) as sched:
        now = time.time_ns()
        held = await sched.submit("k", None, pool="b", key="in-b")
        done = await sched.submit("k", None, pool="b", key="done-in-b")
        await sched.cancel(done)
        own = await sched.submit("k", None, pool="a", key="in-a")
        scope = {"key_pools": ["a"], "key_kinds": ["k"]}
        for key in ("in-b", "done-in-b"):
            batch = [
                sched.task_spec(now, "k", pool="a"),
                sched.task_spec(now, "k", key=key, pool="a"),
            ]
            with pytest.raises(PermissionDenied) as raised:
                await sched.submit_specs(batch, **scope)
            assert raised.value.permission == "submit"
            message = str(raised.value)
            assert f"the key {key!r} is held by a task outside" in message
            assert str(held) not in message and str(done) not in message and "'b'" not in message
        # Of another kind in an allowed pool: outside too.
        other_kind = await sched.submit("other", None, pool="a", key="other-kind")
        with pytest.raises(PermissionDenied):
            await sched.submit_specs(
                [sched.task_spec(now, "k", pool="a", key="other-kind")], **scope
            )
        listed = [t.task_id for t in await sched.list(pool="a")]
        assert listed == [own, other_kind]  # nothing applied
        # A key inside the scope, or held by nobody, or no scope at all: deduplicated as ever.
        mine = [sched.task_spec(now, "k", pool="a", key="in-a")]
        assert await sched.submit_specs(mine, **scope) == [own]
        theirs = [sched.task_spec(now, "k", pool="a", key="in-b")]
        assert await sched.submit_specs(theirs) == [held]
        assert await sched.submit_specs(theirs, key_pools=["a", "b"]) == [held]
        [fresh] = await sched.submit_specs(
            [sched.task_spec(now, "k", pool="a", key="new")], **scope
        )
        assert fresh > own
        with pytest.raises(InvalidArgument):
            await sched.submit_specs(mine, key_pools=[""])


async def test_dependency_runs_after_its_parent(sched: Scheduler, recorder: Recorder) -> None:
    parent = await sched.submit("block", None)
    child = await sched.submit("echo", 2, after=[parent])
    await recorder.started.wait()
    assert (await sched.get(child)).status is Status.WAITING
    recorder.release.set()
    assert (await sched.wait(child, timeout=5)).status is Status.SUCCEEDED
    order = [c[0] for c in recorder.calls]
    assert order.index(parent) < order.index(child)


async def test_failed_parent_fails_its_dependent(sched: Scheduler) -> None:
    parent = await sched.submit("fatal", None)
    child = await sched.submit("echo", 1, after=[parent])
    info = await sched.wait(child, timeout=5)
    assert info.status is Status.FAILED
    assert f"dependency {parent} failed" in info.message


async def test_key_returns_the_existing_task(sched: Scheduler) -> None:
    first = await sched.submit("echo", 1, key="order-17")
    second = await sched.submit("echo", 2, key="order-17")
    assert first == second
    await sched.wait(first, timeout=5)
    assert await sched.submit("echo", 3, key="order-17") == first
    found = await sched.get_by_key("order-17")
    assert found is not None
    assert found.task_id == first
    assert await sched.get_by_key("unknown") is None


async def test_submit_many_is_one_step_and_returns_ids_in_order(sched: Scheduler) -> None:
    ids = await sched.submit_many([TaskRequest("echo", i) for i in range(50)])
    assert ids == sorted(ids)
    assert len(set(ids)) == 50
    outputs = [(await sched.wait(i, timeout=5)).output for i in ids]
    assert outputs == list(range(50))


async def test_cancel_a_queued_task(sched: Scheduler) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    task_id = await sched.submit("echo", 1, start_at=later)
    assert (await sched.get(task_id)).status is Status.SCHEDULED
    assert await sched.cancel(task_id) is Status.CANCELLED
    info = await sched.get(task_id)
    assert (info.status, info.message) == (Status.CANCELLED, "cancelled by request")


async def test_cancel_a_running_task_is_cooperative(sched: Scheduler, recorder: Recorder) -> None:
    task_id = await sched.submit("block", None)
    await recorder.started.wait()
    assert await sched.cancel(task_id, "no longer needed") is Status.RUNNING
    info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.CANCELLED
    assert info.message == "no longer needed"


async def test_per_attempt_timeout_fails_the_attempt(sched: Scheduler) -> None:
    retry = RetryPolicy.exponential(2, initial=0.01, jitter=0.0)
    task_id = await sched.submit("block", None, timeout=0.05, retry=retry)
    info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.FAILED
    assert info.attempt == 2
    assert "timed out after 0.05s" in info.message


async def test_thread_functions_run_outside_the_loop() -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []

    def blocking(ctx: TaskContext, payload: bytes) -> bytes:
        seen.append(threading.get_ident())
        return payload.upper()

    async with Scheduler([Pool("default", blocking)]) as sched:
        info = await sched.wait(await sched.submit("upper", b"abc"), timeout=5)
    assert info.output == b"ABC"
    assert seen
    assert seen[0] != loop_thread


async def test_schedule_creates_tasks_on_its_cron(sched: Scheduler, recorder: Recorder) -> None:
    info = await sched.add_schedule("every-second", "* * * * * *", kind="tick", payload=0)
    assert info.next_run_at > datetime.now(UTC) - timedelta(seconds=1)
    async with asyncio.timeout(5):
        await recorder.second_tick.wait()
    ran = {task_id for task_id, kind, _ in recorder.calls if kind == "tick"}
    listed = {t.task_id for t in await sched.list(kind="tick")}
    assert len(ran) >= 2, "each occurrence creates a task of its own"
    assert ran <= listed
    [schedule] = await sched.list_schedules()
    assert schedule.last_task_id in listed
    await sched.remove_schedule("every-second")
    assert await sched.list_schedules() == []


async def test_admission_control_rejects_beyond_the_bound(recorder: Recorder) -> None:
    pool = Pool("default", recorder, max_live=2)
    later = timedelta(hours=1)
    async with Scheduler([pool], codec=JsonCodec()) as sched:
        await sched.submit_many([TaskRequest("echo", 1, start_at=later)] * 2)
        with pytest.raises(AdmissionRejected, match="max_live=2"):
            await sched.submit("echo", 3, start_at=later)
        assert len(await sched.list()) == 2


async def test_crash_and_recovery_keep_every_acknowledged_task(recorder: Recorder) -> None:
    store = MemoryStore()
    first = Scheduler([Pool("default", recorder)], store=store, codec=JsonCodec())
    await first.start()
    blocked = await first.submit("block", None, retry=FAST_RETRY)
    await recorder.started.wait()
    later = await first.submit("echo", 1, start_at=timedelta(hours=1), key="k")
    first.abort()
    store.simulate_crash()

    recorder.release.set()
    second_store = store.connect_another()
    async with Scheduler(
        [Pool("default", recorder)], store=second_store, codec=JsonCodec()
    ) as second:
        retried = await second.wait(blocked, timeout=5)
        assert retried.status is Status.SUCCEEDED
        assert retried.attempt == 2, "the attempt lost in the crash counts as used"
        kept = await second.get(later)
        assert kept.status is Status.SCHEDULED
        assert await second.submit("echo", 2, key="k") == later
        new_id = await second.submit("echo", 3)
        assert new_id > later


async def test_fenced_scheduler_stops_and_reports_leadership_lost(recorder: Recorder) -> None:
    store = MemoryStore()
    first = Scheduler([Pool("default", recorder)], store=store)
    await first.start()
    store.simulate_crash()
    async with Scheduler([Pool("default", recorder)], store=store.connect_another()):
        with pytest.raises(SchedulerStopped):
            await first.submit("echo", b"x")
        await asyncio.wait_for(first.leadership_lost(), 5)
        assert not first.running


async def test_unavailable_store_fails_callers_then_recovers(recorder: Recorder) -> None:
    store = MemoryStore()
    async with Scheduler(
        [Pool("default", recorder)], store=store, codec=JsonCodec(), commit_timeout=0.2
    ) as sched:
        store.set_available(False)
        with pytest.raises(SchedulerError, match="did not confirm the commit"):
            await sched.submit("echo", 1)
        store.set_available(True)
        task_id = await sched.submit("echo", 2)
        assert (await sched.wait(task_id, timeout=5)).output == 2
        assert sched.running


async def test_close_lets_a_standby_take_over_at_once(recorder: Recorder) -> None:
    store = MemoryStore()
    first = Scheduler([Pool("default", recorder)], store=store)
    await first.start()
    task_id = await first.submit("echo", b"a", start_at=timedelta(hours=1))
    standby = Scheduler([Pool("default", recorder)], store=store.connect_another())
    takeover = asyncio.create_task(standby.start())
    await asyncio.sleep(0)
    assert not takeover.done(), "the standby must wait while the first instance leads"
    await first.close()
    await asyncio.wait_for(takeover, 5)
    assert (await standby.get(task_id)).status is Status.SCHEDULED
    await standby.close()


async def test_calls_after_close_raise_scheduler_stopped(recorder: Recorder) -> None:
    sched = Scheduler([Pool("default", recorder)])
    with pytest.raises(SchedulerStopped, match="not running"):
        await sched.submit("echo", b"x")
    await sched.start()
    await sched.close()
    with pytest.raises(SchedulerStopped):
        await sched.submit("echo", b"x")


async def test_close_lets_running_attempts_finish_and_starts_no_new_ones(
    recorder: Recorder,
) -> None:
    store = MemoryStore()
    first = Scheduler([Pool("default", recorder, concurrency=1)], store=store, codec=JsonCodec())
    await first.start()
    running = await first.submit("block", None)
    queued = await first.submit("echo", 1)
    await recorder.started.wait()
    closing = asyncio.create_task(first.close(timeout=5))
    await asyncio.sleep(0)  # let close() begin: from here on, nothing new may start
    recorder.release.set()
    await closing
    assert [c[0] for c in recorder.calls] == [running]

    async with Scheduler(
        [Pool("default", recorder)], store=store.connect_another(), codec=JsonCodec()
    ) as second:
        finished = await second.get(running)
        assert (finished.status, finished.attempt) == (Status.SUCCEEDED, 1)
        assert (await second.wait(queued, timeout=5)).attempt == 1


async def test_metrics_without_gauges_keep_the_counters_and_skip_the_pass_over_live_tasks() -> None:
    async def work(ctx: TaskContext, payload: Any) -> None:
        return None

    async with Scheduler([Pool("default", work)]) as sched:
        await sched.wait(await sched.submit("k"), timeout=5)
        await sched.submit("later", start_at=timedelta(hours=1))
        full, light = sched.metrics(), sched.metrics(gauges=False)
    assert full.queue_depth == {("default", "scheduled"): 1} and full.running == {"default": 0}
    assert (light.queue_depth, light.running) == ({}, {})
    assert light.finished == full.finished == {("default", "succeeded"): 1}


async def test_a_scope_refuses_a_parent_outside_it_whose_output_would_reach_the_child() -> None:
    """A child gets its parents' outputs (issue 32): a submitter that may use only some pools
    and kinds may name as parents only tasks of those (still known), or it could read any
    other pool's outputs by guessing ids."""
    pools = [RemotePool("a"), RemotePool("b")]
    async with Scheduler(pools) as sched:
        now = time.time_ns()
        theirs = await sched.submit("k", None, pool="b")
        mine = await sched.submit("k", None, pool="a")
        scope = {"key_pools": ["a"], "key_kinds": ["k"]}
        before = [t.task_id for t in await sched.list()]
        for parents in ([theirs], [mine, theirs]):
            batch = [sched.task_spec(now, "k", pool="a", after=parents)]
            with pytest.raises(PermissionDenied) as raised:
                await sched.submit_specs(batch, **scope)
            assert raised.value.permission == "submit" and "'b'" not in str(raised.value)
        assert [t.task_id for t in await sched.list()] == before  # nothing applied
        [child] = await sched.submit_specs(
            [sched.task_spec(now, "k", pool="a", after=[mine])], **scope
        )
        assert (await sched.get(child)).after == (mine,)
        # Without a scope (an embedded caller, an admin), any parent.
        await sched.submit_specs([sched.task_spec(now, "k", pool="a", after=[theirs])])


class _UnreadableRows(MemoryStore):
    """Leads, then cannot read its rows: a recovery that fails for good."""

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        raise StoreFatal("the rows cannot be read")


async def test_a_start_that_fails_leaves_the_scheduler_stopped_saying_why(
    recorder: Recorder,
) -> None:
    store = _UnreadableRows()
    pools = [Pool("default", recorder)]
    failed = Scheduler(pools, store=store)
    with pytest.raises(StoreFatal, match="cannot be read"):
        await failed.start()
    assert not failed.running and not failed.leading and not failed.metrics().leading
    assert isinstance(failed.failure, StoreFatal)
    with pytest.raises(SchedulerStopped, match="cannot be read"):
        await failed.submit("echo")
    await asyncio.wait_for(failed.leadership_lost(), 5)  # not led: nothing to wait for
    await failed.close()
    # It gave the leadership back: another instance leads without waiting for this one.
    async with Scheduler(pools, store=store.connect_another()) as other:
        assert other.leading


async def test_a_cancelled_start_leaves_the_scheduler_stopped(recorder: Recorder) -> None:
    store = MemoryStore()
    pools = [Pool("default", recorder)]
    async with Scheduler(pools, store=store):
        standby, takeover = await waiting_standby(store, pools)
        takeover.cancel()
        with pytest.raises(asyncio.CancelledError):
            await takeover
        assert not standby.running and not standby.leading
        assert standby.failure is None
        with pytest.raises(SchedulerStopped, match="not running"):
            await standby.submit("echo")
        await standby.close()
