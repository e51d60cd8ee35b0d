"""The operator calls of Scheduler (issue 21), end to end over MemoryStore with real executors:
pause_pool, resume_pool, list_pools, retry, trigger_schedule; their input checks; a pause and a
retry that survive a crash of the leader."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cronoq import (
    MemoryStore,
    NotRetryable,
    Pool,
    PoolInfo,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    TaskError,
)
from cronoq.errors import InvalidArgument, ScheduleNotFound, TaskNotFound, UnknownPool

ONCE = RetryPolicy.exponential(1, initial=0.01, jitter=0.0)


class Runs:
    """Records each attempt; a task fails while ``failing`` holds its kind."""

    def __init__(self) -> None:
        self.attempts: list[tuple[int, int]] = []
        self.failing: set[str] = set()
        self.ran = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: Any) -> None:
        self.attempts.append((ctx.task_id, ctx.attempt))
        self.ran.set()
        if ctx.kind in self.failing:
            raise TaskError("broken", retryable=False)


async def test_a_paused_pool_starts_nothing_until_resumed_and_list_pools_shows_it() -> None:
    runs = Runs()
    async with Scheduler([Pool("default", runs, concurrency=3)]) as sched:
        paused = await sched.pause_pool("default")
        assert paused == PoolInfo("default", 3, True, 0, dict.fromkeys(_LIVE, 0), remote=False)
        task_id = await sched.submit("job")
        (pool,) = await sched.list_pools()
        assert pool.paused and pool.depth[Status.READY] == 1 and runs.attempts == []
        resumed = await sched.resume_pool("default")
        assert not resumed.paused
        assert (await sched.wait(task_id, timeout=5)).status is Status.SUCCEEDED
        assert runs.attempts == [(task_id, 1)]


_LIVE = [Status.WAITING, Status.SCHEDULED, Status.READY, Status.RUNNING, Status.RETRYING]


async def test_pool_calls_check_their_input() -> None:
    async with Scheduler([Pool("default", Runs())]) as sched:
        with pytest.raises(UnknownPool, match=r"^unknown pool 'nope'; configured: default$"):
            await sched.pause_pool("nope")
        with pytest.raises(InvalidArgument, match="pool must be a str"):
            await sched.resume_pool(3)  # type: ignore[arg-type]


async def test_a_pause_and_a_retry_survive_a_crash_of_the_leader() -> None:
    runs = Runs()
    runs.failing.add("job")
    store = MemoryStore()
    first = Scheduler([Pool("default", runs)], store=store)
    await first.start()
    task_id = await first.submit("job", retry=ONCE)
    assert (await first.wait(task_id, timeout=5)).status is Status.FAILED
    await first.pause_pool("default")
    retried = await first.retry(task_id)
    assert (retried.status, retried.attempt, retried.message) == (
        Status.READY,
        1,
        "retried by request",
    )
    store.simulate_crash()
    runs.failing.clear()
    async with Scheduler([Pool("default", runs)], store=store.connect_another()) as second:
        (pool,) = await second.list_pools()
        assert pool.paused and pool.depth[Status.READY] == 1
        await second.resume_pool("default")
        done = await second.wait(task_id, timeout=5)
        assert (done.status, done.attempt) == (Status.SUCCEEDED, 2)
    assert runs.attempts == [(task_id, 1), (task_id, 2)]
    first.abort()


async def test_retry_refuses_live_succeeded_and_unknown_tasks() -> None:
    runs = Runs()
    async with Scheduler([Pool("default", runs)]) as sched:
        task_id = await sched.submit("job")
        await sched.wait(task_id, timeout=5)
        with pytest.raises(
            NotRetryable, match=f"^task {task_id} succeeded: rerun it to run it again as a new task"
        ):
            await sched.retry(task_id)
        with pytest.raises(TaskNotFound, match=r"^no task 99$"):
            await sched.retry(99)
        with pytest.raises(InvalidArgument, match="task_id"):
            await sched.retry(0)


async def test_a_trigger_runs_the_schedule_now_through_its_overlap_policy() -> None:
    runs = Runs()
    async with Scheduler([Pool("default", runs)]) as sched:
        await sched.add_schedule("yearly", "0 0 1 1 *", kind="report")
        await sched.pause_pool("default")  # its task stays live: the overlap guard holds
        task_id = await sched.trigger_schedule("yearly")
        assert task_id is not None
        assert await sched.trigger_schedule("yearly") is None
        (schedule,) = await sched.list_schedules()
        assert schedule.last_task_id == task_id
        with pytest.raises(ScheduleNotFound, match=r"^no schedule named 'weekly'$"):
            await sched.trigger_schedule("weekly")
        await sched.resume_pool("default")
        assert (await sched.wait(task_id, timeout=5)).status is Status.SUCCEEDED
