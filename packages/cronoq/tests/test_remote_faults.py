"""Remote attempts under faults: each test failed on the first version of the remote pools
(an independent review found them); each says what must hold."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from cronoq import (
    AttemptToken,
    CancelRequested,
    LeasedAttempt,
    MemoryStore,
    RemotePool,
    RetryPolicy,
    Scheduler,
    SchedulerStopped,
    StaleAttempt,
    Status,
    TaskRequest,
)

FAST = RetryPolicy(max_attempts=5, initial_ns=0, max_ns=0, jitter=0.0)


@contextlib.asynccontextmanager
async def _serving(sched: Scheduler) -> AsyncIterator[Scheduler]:
    """Started; closed without waiting for attempts a test leaves leased."""
    await sched.start()
    try:
        yield sched
    finally:
        await sched.close(timeout=0.1)


async def _attempt(link: object, timeout: float = 5) -> LeasedAttempt:
    event = await asyncio.wait_for(link.next(), timeout)  # type: ignore[attr-defined]
    assert isinstance(event, LeasedAttempt), event
    return event


async def test_a_report_queued_when_the_scheduler_halts_is_answered() -> None:
    sched = Scheduler([RemotePool("remote")], store=MemoryStore())
    await sched.start()
    link = sched.attach(["remote"], slots=1)
    await sched.submit("job", pool="remote")
    attempt = await _attempt(link)
    report = asyncio.create_task(
        sched.report_success(attempt.token, b"out", lease_id=attempt.lease_id)
    )
    beat = asyncio.create_task(sched.heartbeat(attempt.token, lease_id=attempt.lease_id))
    await asyncio.sleep(0)  # both are in the driver's inbox now
    sched.abort()  # or: fenced, leadership lost, close() timing out
    for call in (report, beat):
        with pytest.raises(SchedulerStopped):
            await asyncio.wait_for(call, 2)


async def test_a_lapsed_attempt_keeps_its_slot_until_its_worker_reports_it() -> None:
    # Issue 19, item 3: a stale heartbeat freed the slot while the function still ran, and
    # the retry was leased into it: a slots=1 worker ran two attempts of one task at once.
    async with _serving(Scheduler([RemotePool("remote", lease=0.2)], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=1)
        await sched.submit("job", pool="remote", retry=FAST)
        first = await _attempt(link)
        cancel = await asyncio.wait_for(link.next(), 2)  # it lapsed: the engine stops it
        assert isinstance(cancel, CancelRequested) and cancel.token == first.token
        with pytest.raises(StaleAttempt) as stale:
            await sched.heartbeat(first.token, lease_id=first.lease_id)
        assert stale.value.reason == "lease"
        await sched.list()  # a step: it would lease the retry if a slot were offered
        assert link.queued == 0, "the retry must not go to a worker whose slot is still taken"
        with pytest.raises(StaleAttempt):
            await sched.report_failure(first.token, "cancelled", lease_id=first.lease_id)
        second = await _attempt(link)  # the function returned: the slot is free again
        assert second.token.attempt == 2


async def test_a_link_whose_attempt_lapsed_gets_nothing_new_until_its_worker_speaks() -> None:
    # Issue 19, item 7: a wedged worker (it never heartbeats nor reports) with free slots kept
    # receiving attempts, each lost after its lease, until every task was dead-lettered.
    async with _serving(Scheduler([RemotePool("remote", lease=0.2)], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=2)
        await sched.submit("first", pool="remote", retry=FAST)
        first = await _attempt(link)
        cancel = await asyncio.wait_for(link.next(), 2)  # it lapsed
        assert isinstance(cancel, CancelRequested) and cancel.token == first.token
        await sched.submit("second", pool="remote")
        await sched.list()  # a step: it would lease "second" (or the retry) to a free slot
        assert link.queued == 0, "a link whose attempt lapsed unheard gets no new attempt"
        with pytest.raises(StaleAttempt):  # late, but alive: the link may lease again
            await sched.heartbeat(first.token, lease_id=first.lease_id)
        assert (await _attempt(link)).kind in {"first", "second"}


async def test_a_stopped_attempt_heartbeats_as_stopped_and_holds_its_task() -> None:
    async with _serving(Scheduler([RemotePool("remote", lease=5)], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=2)
        task_id = await sched.submit("job", pool="remote", retry=FAST, timeout=0.2)
        first = await _attempt(link)
        cancel = await asyncio.wait_for(link.next(), 2)  # timed out
        assert isinstance(cancel, CancelRequested)
        for _ in range(2):
            renewed = await sched.heartbeat(first.token, lease_id=first.lease_id)
            assert renewed.stopped and renewed.cancel_reason is not None
            await sched.list()
            assert link.queued == 0, "no retry while the stopped attempt still runs"
        # Its backoff is over (FAST): ready, and held back only by its running attempt.
        assert (await sched.get(task_id)).status is Status.READY
        with pytest.raises(StaleAttempt):
            await sched.report_success(first.token, lease_id=first.lease_id)
        assert (await _attempt(link)).token.attempt == 2


async def test_a_report_whose_caller_is_cancelled_still_frees_the_slot() -> None:
    # gRPC cancels the Report handler when the worker's call deadline passes / its
    # connection drops while the commit is under way; the report is applied anyway.
    async with _serving(Scheduler([RemotePool("remote")], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=1)
        first_id = await sched.submit("a", pool="remote")
        first = await _attempt(link)
        call = asyncio.create_task(sched.report_success(first.token, b"x", lease_id=first.lease_id))
        await asyncio.sleep(0)
        call.cancel()
        assert (await sched.wait(first_id, timeout=2)).status is Status.SUCCEEDED
        await sched.submit("b", pool="remote")
        await _attempt(link, timeout=2)  # the slot came back


async def test_cancel_while_disconnected_keeps_the_slot_on_reattach() -> None:
    async with _serving(Scheduler([RemotePool("remote")], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=1)
        t1 = await sched.submit("a", pool="remote")
        first = await _attempt(link)
        link.close()  # the stream broke; the worker goes on running the attempt
        assert await sched.cancel(t1) is Status.RUNNING  # still running until it reports
        await sched.submit("b", pool="remote")
        back = sched.attach(["remote"], slots=1, running=[(first.token, first.lease_id)])
        await sched.list()  # a step: it would lease "b" if a slot were offered
        # The cancellation its broken link never delivered comes on the new one; no attempt
        # does (a slots=1 worker still running attempt 1 is not sent a second).
        assert back.queued == 1
        event = await back.next()
        assert isinstance(event, CancelRequested) and event.token == first.token


@pytest.mark.parametrize("lost", ["queued", "taken", "queued, re-attached first"])
async def test_a_cancel_undelivered_when_the_stream_broke_still_reaches_the_worker(
    lost: str,
) -> None:
    """Issue 19 audit gap 2: a CancelRequested still queued in the link when the worker's
    Attach stream broke ("queued": the server's Attach closes the link with it), or taken
    from the link but never sent ("taken": carried to the next message), reaches the worker
    on its new link as soon as it re-attaches naming the attempt (or at once, if it did so
    before the old link closed), and again in its next heartbeat's reply. The attempt ends
    cancelled, though retries were left, and its task never runs again."""
    async with _serving(Scheduler([RemotePool("remote")], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=1)
        t1 = await sched.submit("a", pool="remote", retry=FAST)
        first = await _attempt(link)
        assert await sched.cancel(t1, "stop a") is Status.RUNNING
        await sched.list()  # a step: the cancellation went to the link
        assert link.queued == 1
        if lost == "taken":
            taken = await link.next()
            assert isinstance(taken, CancelRequested)
            link.unsent(taken)  # as the server's Attach does with an event it never wrote
        await sched.submit("b", pool="remote")
        if lost == "queued, re-attached first":
            # The worker's new stream came before the old one's handler closed its link.
            back = sched.attach(["remote"], slots=1, running=[(first.token, first.lease_id)])
            link.close()
        else:
            link.close()  # the stream broke; the worker goes on running the attempt
            back = sched.attach(["remote"], slots=1, running=[(first.token, first.lease_id)])
        await sched.list()  # a step: it would lease "b" if a slot were offered
        told = []
        while back.queued:  # nothing but the cancellation of what it runs
            event = await back.next()
            assert isinstance(event, CancelRequested) and event.token == first.token, event
            told.append(event.reason)
        renewed = await sched.heartbeat(first.token, lease_id=first.lease_id)
        assert (renewed.cancel_reason, renewed.stopped) == ("stop a", False)
        assert told == ["stop a"]  # at once on the new link, not a heartbeat later
        await sched.report_failure(first.token, "interrupted", lease_id=first.lease_id)
        done = await sched.wait(t1, timeout=5)
        assert (done.status, done.attempt, done.message) == (Status.CANCELLED, 1, "stop a")
        assert (await _attempt(back)).kind == "b"  # its slot came back, for the other task
        assert (await sched.get(t1)).attempt == 1


async def test_a_worker_running_more_than_its_slots_can_reattach() -> None:
    # A worker may run more attempts than it now asks slots for: naming them all on its
    # reconnect must not be refused (the Worker takes INVALID_ARGUMENT on Attach for good).
    async with _serving(Scheduler([RemotePool("remote")], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=2)
        await sched.submit_many([TaskRequest("a", pool="remote"), TaskRequest("b", pool="remote")])
        first, second = await _attempt(link), await _attempt(link)
        link.close()
        await sched.submit("c", pool="remote")
        back = sched.attach(
            ["remote"],
            slots=1,
            running=[(first.token, first.lease_id), (second.token, second.lease_id)],
        )
        await sched.list()  # a step: nothing may be leased to it while it runs two
        assert back.queued == 0
        await sched.report_success(first.token, lease_id=first.lease_id)
        await sched.list()
        assert back.queued == 0  # still one running: its one slot is taken
        await sched.report_success(second.token, lease_id=second.lease_id)
        assert (await _attempt(back)).kind == "c"


async def test_executor_picks_the_link_the_engine_counted() -> None:
    # The executor must put each attempt on a link of the slot group the engine counted it
    # against, or an attempt it placed is withdrawn ("its worker left").
    async with _serving(
        Scheduler([RemotePool("a"), RemotePool("b"), RemotePool("c")], store=MemoryStore())
    ) as sched:
        await sched.submit("jb", pool="b")
        await sched.submit("jc1", pool="c")
        await sched.submit("jc2", pool="c")
        l1 = sched.attach(["a", "b"], slots=1)
        l2 = sched.attach(["b", "c"], slots=2)
        await sched.list()  # a step with both links' slots offered
        got = []
        for link in (l1, l2):
            while link.queued:
                event = await link.next()
                assert isinstance(event, LeasedAttempt)
                got.append(event.kind)
        summaries = await sched.list()
        withdrawn = [s for s in summaries if s.status is Status.READY]
        # 3 tasks, 3 slots that can take them: all three should be leased in the first step.
        assert sorted(got) == ["jb", "jc1", "jc2"], (got, withdrawn)


async def test_graceful_close_is_not_held_by_a_dead_worker_whose_lease_expired() -> None:
    async with _serving(Scheduler([RemotePool("remote", lease=0.2)], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=1)
        await sched.submit("job", pool="remote", retry=RetryPolicy(max_attempts=1))
        await _attempt(link)
        await asyncio.sleep(0.4)  # lease expired while the link is still open (half-open TCP)
        link.close()  # the server notices later
        loop = asyncio.get_running_loop()
        began = loop.time()
        await sched.close(timeout=3)
        assert loop.time() - began < 1, "close waited its whole drain for an attempt already lost"


@pytest.mark.parametrize("spins", range(3))
async def test_an_attempt_taken_by_a_cancelled_next_goes_back(spins: int) -> None:
    # The Attach handler is cancelled (the worker's stream ends) while link.next() waits.
    async with _serving(Scheduler([RemotePool("remote", lease=30)], store=MemoryStore())) as sched:
        link = sched.attach(["remote"], slots=1)
        waiting = asyncio.create_task(link.next())
        await asyncio.sleep(0)
        task_id = await sched.submit("job", pool="remote")
        # Yield to the loop step by step, to land in the window where the attempt arrived.
        while link.free:  # noqa: ASYNC110  # the driver handed the attempt to the link
            await asyncio.sleep(0)
        for _ in range(spins):
            await asyncio.sleep(0)
        if waiting.done():
            pytest.skip("next() already returned")
        waiting.cancel()
        link.close()  # the handler's finally
        other = sched.attach(["remote"], slots=1)
        # Never sent: it must come back uncounted (attempt 1) at once, not after 30 s.
        again = await _attempt(other, timeout=2)
        assert again.token.attempt == 1 and again.token.task_id == task_id
        await sched.report_success(again.token, lease_id=again.lease_id)


async def test_a_withdraw_during_a_failing_rebuild_is_not_lost() -> None:
    store = MemoryStore()
    async with _serving(
        Scheduler([RemotePool("remote", lease=30)], store=store, commit_timeout=0.3)
    ) as sched:
        link = sched.attach(["remote"], slots=2)
        _, second_id = await sched.submit_many(
            [TaskRequest("a", pool="remote"), TaskRequest("b", pool="remote")]
        )
        await _attempt(link)  # the worker took "a"; "b" waits in the link
        store.set_available(False)
        failing = asyncio.create_task(sched.submit("c", pool="remote", key="c"))
        await asyncio.sleep(0.6)  # the commit gave up; the rebuild is retrying recover()
        link.close()  # the worker's stream ends: "b" was never sent -> withdraw
        await asyncio.sleep(0.3)  # ... and one more failed recover() drops that withdraw
        store.set_available(True)
        await asyncio.gather(failing, return_exceptions=True)
        other = sched.attach(["remote"], slots=1)
        again = await _attempt(other, timeout=3)
        assert again.token.task_id == second_id and again.token.attempt == 1


async def test_a_heartbeat_sent_in_time_is_not_judged_late_because_a_commit_stalled() -> None:
    store = MemoryStore()
    async with _serving(
        Scheduler([RemotePool("remote", lease=0.5)], store=store, commit_timeout=5)
    ) as sched:
        link = sched.attach(["remote"], slots=1)
        await sched.submit("a", pool="remote", retry=FAST)
        attempt = await _attempt(link)
        store.set_available(False)  # a slow commit (within commit_timeout): no rebuild
        slow = asyncio.create_task(sched.submit("b", pool="remote", key="b"))
        await asyncio.sleep(0.2)
        beat = asyncio.create_task(
            sched.heartbeat(attempt.token, lease_id=attempt.lease_id)
        )  # 0.2 s into a 0.5 s lease
        await asyncio.sleep(0.6)
        store.set_available(True)
        await slow
        renewed = await beat
        assert renewed.cancel_reason is None


async def test_a_stopped_remote_attempt_holds_its_task_until_it_reports() -> None:
    # Worker A is alive and heartbeating, but its function ignores the cancellation of its
    # timeout for a while (a thread, say): attempt 2 must not start on worker B before A
    # reports (or its lease ends), as a local pool's stopped attempts hold their task.
    sched = Scheduler([RemotePool("remote", lease=30)], store=MemoryStore())
    async with _serving(sched):
        a = sched.attach(["remote"], slots=1)
        b = sched.attach(["remote"], slots=1)
        task_id = await sched.submit("job", pool="remote", timeout=0.2, retry=FAST)
        first = await _attempt(a)
        assert isinstance(await asyncio.wait_for(a.next(), 5), CancelRequested)  # timed out
        await sched.list()  # a step after the timeout: it would lease attempt 2 to B
        assert b.queued == 0  # held back, although its backoff is over and B is free
        assert (await sched.get(task_id)).status is Status.READY
        with pytest.raises(StaleAttempt):
            await sched.report_failure(
                first.token, "stopped", lease_id=first.lease_id
            )  # A ends it at last
        second = await _attempt(b)  # now the retry starts
        assert second.token.attempt == 2


async def test_a_stopped_remote_attempt_lets_go_when_its_lease_ends() -> None:
    sched = Scheduler([RemotePool("remote", lease=0.3)], store=MemoryStore())
    async with _serving(sched):
        a = sched.attach(["remote"], slots=1)
        task_id = await sched.submit("job", pool="remote", timeout=0.1, retry=FAST)
        await _attempt(a)
        a.close()  # its worker is gone for good: nothing will report attempt 1
        b = sched.attach(["remote"], slots=1)
        second = await _attempt(b, timeout=3)  # after attempt 1's lease, not never
        assert second.token == AttemptToken(second.token.epoch, task_id, 2)


async def test_an_attempt_lost_with_its_worker_is_forgotten_by_the_driver() -> None:
    # A long-lived server whose workers come and go must not keep every attempt they lost.
    sched = Scheduler([RemotePool("remote", lease=0.2)], store=MemoryStore())
    async with _serving(sched):
        a = sched.attach(["remote"], slots=1)
        await sched.submit("job", pool="remote", retry=FAST)
        first = await _attempt(a)
        a.close()  # its worker vanished: nothing will report attempt 1
        b = sched.attach(["remote"], slots=1)
        second = await _attempt(b, timeout=3)
        assert second.token.attempt == 2
        executing = sched._driver._executing  # white box: the driver's attempts in flight
        assert first.token not in executing
        assert second.token in executing
        leased = sched._remote._leased  # and the remote executor's
        assert first.token not in leased and second.token in leased
