"""Engine-level checks: a real ``Scheduler`` over the store, with crashes and store faults.

A crash is ``Scheduler.abort()`` (no commit, no release, attempts abandoned) followed by the
harness's ``crash`` of the store instance; a new ``Scheduler`` on a new instance then recovers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio

from cronoq import (
    Pool,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    Status,
    TaskContext,
    TaskError,
)
from cronoq.errors import CronoqError, StoreFatal
from cronoq_conformance._harness import Capability, StoreHarness

__all__ = ["EngineSuite"]

QUICK_RETRY = RetryPolicy.exponential(3, initial=0.01, maximum=0.05, jitter=0.0)
LATER = timedelta(hours=1)


class Gate:
    """An executor that records every attempt; kind "block" waits until released."""

    def __init__(self) -> None:
        self.attempts: list[tuple[int, str, int]] = []
        self.blocked = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: bytes) -> bytes:
        self.attempts.append((ctx.task_id, ctx.kind, ctx.attempt))
        if ctx.kind == "block":
            self.blocked.set()
            await self.release.wait()
        if ctx.kind == "fail":
            raise TaskError("planned failure")
        return payload

    def attempts_of(self, task_id: int) -> list[int]:
        return [attempt for tid, _, attempt in self.attempts if tid == task_id]


class EngineSuite:
    """Durability of a Scheduler over the store. Needs the ``harness`` fixture."""

    unavailable_commit_timeout = 0.5
    """Seconds: short, so that the unavailability tests take about a second. Other tests use
    a generous timeout, so that a loaded machine cannot fail them."""

    @pytest_asyncio.fixture
    async def schedulers(self, harness: StoreHarness) -> AsyncIterator[list[Scheduler]]:
        started: list[Scheduler] = []
        try:
            yield started
        finally:
            for sched in started:
                if sched.running:
                    await sched.close(timeout=1.0)
            await harness.close_all()

    async def start(
        self,
        harness: StoreHarness,
        schedulers: list[Scheduler],
        gate: Gate,
        commit_timeout: float = 30.0,
        **options: Any,
    ) -> Scheduler:
        store = await harness.open()
        sched = Scheduler(
            [Pool("default", gate, concurrency=8)],
            store=store,
            commit_timeout=commit_timeout,
            seed=3,
            **options,
        )
        await asyncio.wait_for(sched.start(), harness.leadership_timeout + 5)
        schedulers.append(sched)
        return sched

    @staticmethod
    async def crash(harness: StoreHarness, sched: Scheduler) -> None:
        sched.abort()
        await harness.crash(sched.store)

    # --- durable acknowledgement ----------------------------------------------------------

    async def test_every_call_that_returned_survives_a_crash(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        gate = Gate()
        first = await self.start(harness, schedulers, gate)
        scheduled = await first.submit("job", b"later", start_at=LATER, key="k1", tags=["x"])
        cancelled = await first.submit("job", b"c", start_at=LATER)
        await first.cancel(cancelled)
        done = await first.submit("job", b"out")
        await first.wait(done, timeout=5)
        await first.add_schedule("hourly", "0 * * * *", kind="tick")
        await first.pause_schedule("hourly")
        await self.crash(harness, first)

        second = await self.start(harness, schedulers, Gate())
        assert (await second.get(scheduled)).status is Status.SCHEDULED
        assert (await second.get(scheduled)).tags == ("x",)
        assert (await second.get(cancelled)).status is Status.CANCELLED
        finished = await second.get(done)
        assert (finished.status, finished.output) == (Status.SUCCEEDED, b"out")
        [schedule] = await second.list_schedules()
        assert (schedule.name, schedule.paused) == ("hourly", True)

    async def test_no_attempt_of_a_step_runs_when_its_commit_fails(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        if Capability.UNAVAILABLE not in harness.capabilities:
            pytest.skip("the harness does not declare Capability.UNAVAILABLE")
        gate = Gate()
        sched = await self.start(
            harness, schedulers, gate, commit_timeout=self.unavailable_commit_timeout
        )
        await harness.set_available(sched.store, False)
        with pytest.raises(SchedulerError, match=r"may be retried|retry it with a key"):
            await sched.submit("job", b"once", key="k")
        assert gate.attempts == [], "an attempt ran although its step was never committed"
        await harness.set_available(sched.store, True)
        # The failed commit's outcome is unknown to the caller: a retry with the key is safe.
        task_id = await sched.submit("job", b"once", key="k")
        assert (await sched.wait(task_id, timeout=5)).output == b"once"
        assert [tid for tid, _, _ in gate.attempts] == [task_id]

    # --- at-least-once --------------------------------------------------------------------

    async def test_a_task_running_at_a_crash_is_retried_with_that_attempt_used(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        gate = Gate()
        first = await self.start(harness, schedulers, gate)
        task_id = await first.submit("block", b"", retry=QUICK_RETRY)
        await gate.blocked.wait()
        await self.crash(harness, first)

        retry_gate = Gate()
        retry_gate.release.set()
        second = await self.start(harness, schedulers, retry_gate)
        info = await second.wait(task_id, timeout=10)
        assert info.status is Status.SUCCEEDED
        assert retry_gate.attempts_of(task_id) == [2]
        # The lost attempt is in the task's history, written by the new leader's recovery.
        [lost] = await second.attempts(task_id)
        assert lost.attempt == 1
        assert "lost: the scheduler stopped while it ran" in lost.message
        assert lost.started_at <= lost.ended_at

    async def test_the_history_of_failed_attempts_survives_a_crash(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        gate = Gate()
        first = await self.start(harness, schedulers, gate)
        task_id = await first.submit("fail", b"", retry=QUICK_RETRY)
        assert (await first.wait(task_id, timeout=10)).status is Status.FAILED
        before = await first.attempts(task_id)
        await self.crash(harness, first)

        second = await self.start(harness, schedulers, Gate())
        after = await second.attempts(task_id)
        assert after == before
        assert [a.attempt for a in after] == [1, 2, 3]
        assert all("planned failure" in a.message for a in after)
        assert "no attempts left" in after[-1].message

    async def test_a_task_running_at_a_crash_without_attempts_left_is_dead_lettered(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        gate = Gate()
        first = await self.start(harness, schedulers, gate)
        task_id = await first.submit("block", b"", retry=RetryPolicy.exponential(1))
        await gate.blocked.wait()
        await self.crash(harness, first)

        second = await self.start(harness, schedulers, Gate())
        info = await second.wait(task_id, timeout=10)
        assert info.status is Status.FAILED
        assert "lost" in info.message
        assert "no attempts left" in info.message

    async def test_fixed_starts_passed_during_downtime_apply_their_miss_policy(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        first = await self.start(harness, schedulers, Gate())
        soon = timedelta(milliseconds=200)
        skipped = await first.submit("job", b"", start_at=soon, grace=0, miss_policy="skip")
        late = await first.submit("job", b"", start_at=soon, grace=0)
        await self.crash(harness, first)
        await asyncio.sleep(0.4)  # the downtime itself: the starts pass while no leader runs

        second = await self.start(harness, schedulers, Gate())
        skipped_info = await second.wait(skipped, timeout=5)
        assert skipped_info.status is Status.CANCELLED
        assert "skipped: fixed start missed" in skipped_info.message
        assert (await second.wait(late, timeout=5)).status is Status.SUCCEEDED

    async def test_the_overlap_guard_of_a_schedule_holds_across_a_failover(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        gate = Gate()
        first = await self.start(harness, schedulers, gate)
        await first.add_schedule("every-second", "* * * * * *", kind="block", retry=QUICK_RETRY)
        await gate.blocked.wait()
        await self.crash(harness, first)

        still_blocked = Gate()
        second = await self.start(harness, schedulers, still_blocked)
        await still_blocked.blocked.wait()  # the lost attempt's retry runs, and blocks
        await asyncio.sleep(1.5)  # at least one more occurrence passes
        live = await second.list(status=["ready", "running", "retrying", "scheduled"])
        assert len(live) == 1, f"two live tasks of one skip-overlap schedule: {live}"
        assert len({tid for tid, _, _ in gate.attempts + still_blocked.attempts}) == 1
        still_blocked.release.set()

    async def test_a_parent_finished_before_the_retention_counts_as_satisfied(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        first = await self.start(harness, schedulers, Gate(), retention=0.05)
        parent = await first.submit("job", b"")
        await first.wait(parent, timeout=5)
        await self.crash(harness, first)
        await asyncio.sleep(0.1)  # let the parent fall out of the retention window

        second = await self.start(harness, schedulers, Gate(), retention=0.05)
        child = await second.submit("job", b"child", after=[parent])
        assert (await second.wait(child, timeout=5)).status is Status.SUCCEEDED

    async def test_keys_deduplicate_across_restarts(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        first = await self.start(harness, schedulers, Gate())
        live = await first.submit("job", b"", key="live", start_at=LATER)
        done = await first.submit("job", b"", key="done")
        await first.wait(done, timeout=5)
        await self.crash(harness, first)

        second = await self.start(harness, schedulers, Gate())
        assert await second.submit("job", b"", key="live") == live
        assert await second.submit("job", b"", key="done") == done
        assert await second.submit("job", b"", key="new") > max(live, done)

    async def test_every_lookup_of_a_quarantined_task_answers_it_failed_alike(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        # get_by_key is served by the store (memory cannot know the key of a row it could
        # not decode): it must answer as get, wait and cancel do, not raise a decoding error.
        if Capability.CORRUPT_ROW not in harness.capabilities:
            pytest.skip("the harness does not declare Capability.CORRUPT_ROW")
        first = await self.start(harness, schedulers, Gate())
        task_id = await first.submit("job", b"", key="damaged", start_at=LATER)
        await self.crash(harness, first)
        await harness.corrupt_task(first.store, task_id)

        second = await self.start(harness, schedulers, Gate())
        by_key = await second.get_by_key("damaged")
        assert by_key is not None, "the quarantined row still holds its key"
        answers = [await second.get(task_id), await second.wait(task_id, timeout=0), by_key]
        assert {(a.task_id, a.status) for a in answers} == {(task_id, Status.FAILED)}
        messages = {a.message for a in answers}
        assert len(messages) == 1, f"lookups disagree on why the task failed: {messages}"
        [message] = messages
        assert message.startswith("quarantined: "), message
        assert not message.startswith("quarantined: quarantined"), message
        assert await second.cancel(task_id) is Status.FAILED

    # --- store faults ---------------------------------------------------------------------

    async def test_unavailable_beyond_the_commit_timeout_fails_callers_then_recovers(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        if Capability.UNAVAILABLE not in harness.capabilities:
            pytest.skip("the harness does not declare Capability.UNAVAILABLE")
        gate = Gate()
        sched = await self.start(
            harness, schedulers, gate, commit_timeout=self.unavailable_commit_timeout
        )
        kept = await sched.submit("job", b"", start_at=LATER)
        await harness.set_available(sched.store, False)
        with pytest.raises(SchedulerError, match=r"may be retried|retry it with a key"):
            await sched.submit("job", b"payload", key="retry-me")
        await harness.set_available(sched.store, True)
        retried = await sched.submit("job", b"payload", key="retry-me")
        assert (await sched.wait(retried, timeout=5)).output == b"payload"
        assert (await sched.get(kept)).status is Status.SCHEDULED
        assert sched.running

    async def test_a_fatal_store_error_stops_the_scheduler_with_that_error(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        # Not retried until commit_timeout and then rebuilt, over and over: the scheduler
        # stops, tells the caller why, and lets a standby lead.
        if Capability.FATAL_COMMIT not in harness.capabilities:
            pytest.skip("the harness does not declare Capability.FATAL_COMMIT")
        sched = await self.start(
            harness, schedulers, Gate(), commit_timeout=self.unavailable_commit_timeout
        )
        await sched.submit("job", b"", start_at=LATER)
        await harness.fail_commits_fatally(sched.store)
        bound = self.unavailable_commit_timeout + 2.0
        with pytest.raises(CronoqError) as raised:
            await asyncio.wait_for(sched.submit("job", b"refused"), bound)
        await asyncio.wait_for(sched.leadership_lost(), bound)
        assert not sched.running
        assert isinstance(sched.failure, StoreFatal), f"stopped by {sched.failure!r}"
        assert str(sched.failure) in str(raised.value), "the caller must learn the cause"
        standby = await harness.open()
        try:
            await asyncio.wait_for(standby.acquire_leadership(), harness.leadership_timeout)
        except TimeoutError:
            raise AssertionError(
                "a scheduler stopped by a fatal store error still holds leadership: a standby "
                f"could not lead within {harness.leadership_timeout}s"
            ) from None

    async def test_a_replaced_leader_stops_and_fires_leadership_lost(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        first = await self.start(harness, schedulers, Gate())
        await harness.crash(first.store)
        second = await self.start(harness, schedulers, Gate())
        with pytest.raises(SchedulerError):
            await first.submit("job", b"from the old leader", key="old")
        await asyncio.wait_for(first.leadership_lost(), harness.leadership_timeout)
        assert not first.running
        assert await second.get_by_key("old") is None

    async def test_a_clean_close_hands_over_to_a_standby_at_once(
        self, harness: StoreHarness, schedulers: list[Scheduler]
    ) -> None:
        first = await self.start(harness, schedulers, Gate())
        task_id = await first.submit("job", b"", start_at=LATER)
        takeover = asyncio.ensure_future(self.start(harness, schedulers, Gate()))
        await asyncio.sleep(0.05)
        assert not takeover.done(), "a standby must wait while the leader runs"
        await first.close()
        second = await asyncio.wait_for(takeover, 2.0)
        assert (await second.get(task_id)).status is Status.SCHEDULED
