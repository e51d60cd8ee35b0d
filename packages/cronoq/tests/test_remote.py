"""Remote pools: attempts leased to workers through ``Scheduler.attach``, on a real store."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator

import pytest

from cronoq import (
    AttemptToken,
    CancelRequested,
    InvalidArgument,
    LeasedAttempt,
    MemoryStore,
    Pool,
    RemotePool,
    RetryPolicy,
    Scheduler,
    SchedulerStopped,
    StaleAttempt,
    Status,
    TaskRequest,
    UnknownPool,
    WorkerDetached,
)
from cronoq._engine import (
    AttemptReport,
    AttemptSucceeded,
    Engine,
    EngineConfig,
    OfferSlots,
    PoolConfig,
    StepResult,
    SubmitTasks,
)
from cronoq._model import TaskSpec
from cronoq.store import TaskUpdated

FAST = RetryPolicy(max_attempts=3, initial_ns=0, max_ns=0, jitter=0.0)


async def _local(ctx: object, payload: object) -> str:
    return "local"


@pytest.fixture
async def sched() -> AsyncIterator[Scheduler]:
    pools: list[Pool | RemotePool] = [
        RemotePool("remote", lease=5.0),
        RemotePool("other"),
        Pool("local", _local),
    ]
    scheduler = Scheduler(pools, store=MemoryStore())
    await scheduler.start()
    yield scheduler
    await scheduler.close(timeout=0.1)  # attempts a test leaves leased are abandoned


async def _attempt(link: object) -> LeasedAttempt:
    event = await asyncio.wait_for(link.next(), 5)  # type: ignore[attr-defined]
    assert isinstance(event, LeasedAttempt), event
    return event


async def test_an_attempt_is_leased_reported_and_its_output_kept(sched: Scheduler) -> None:
    link = sched.attach(["remote"], slots=1)
    task_id = await sched.submit("job", b"in", pool="remote", key="k", tags=["t"], timeout=9)
    attempt = await _attempt(link)
    assert attempt.token == AttemptToken(sched.epoch or 0, task_id, 1)
    assert (attempt.kind, attempt.payload, attempt.key, attempt.tags) == ("job", b"in", "k", ("t",))
    assert attempt.timeout == 9
    renewed = await sched.heartbeat(attempt.token, lease_id=attempt.lease_id)
    assert renewed.cancel_reason is None
    assert renewed.lease_expires_at >= attempt.lease_expires_at
    await sched.report_success(attempt.token, b"out", lease_id=attempt.lease_id)
    info = await sched.wait(task_id, timeout=5)
    assert (info.status, info.output, info.attempt) == (Status.SUCCEEDED, b"out", 1)
    # The same report again changes nothing and says why.
    with pytest.raises(StaleAttempt) as stale:
        await sched.report_success(attempt.token, b"other", lease_id=attempt.lease_id)
    assert stale.value.reason == "finished"
    assert (await sched.get(task_id)).output == b"out"


async def test_no_attempt_starts_without_a_free_worker_slot(sched: Scheduler) -> None:
    first = await sched.submit("a", pool="remote")
    second = await sched.submit("b", pool="remote")
    assert [t.status for t in await sched.list(pool="remote")] == [Status.READY, Status.READY]
    link = sched.attach(["remote"], slots=1)
    attempt = await _attempt(link)
    assert attempt.token.task_id == first
    summaries = {t.task_id: t.status for t in await sched.list(pool="remote")}
    assert summaries == {first: Status.RUNNING, second: Status.READY}
    await sched.report_success(attempt.token, lease_id=attempt.lease_id)
    assert (await _attempt(link)).token.task_id == second  # the freed slot takes the next


async def test_a_failure_retries_on_a_new_attempt_and_an_old_token_is_stale(
    sched: Scheduler,
) -> None:
    link = sched.attach(["remote"], slots=2)
    task_id = await sched.submit("job", pool="remote", retry=FAST)
    first = await _attempt(link)
    await sched.report_failure(first.token, "boom", retry_after=0, lease_id=first.lease_id)
    second = await _attempt(link)
    assert second.token.attempt == 2
    for call in (
        sched.heartbeat(first.token, lease_id=first.lease_id),
        sched.report_success(first.token, lease_id=first.lease_id),
    ):
        with pytest.raises(StaleAttempt) as stale:
            await call
        assert stale.value.reason == "attempt"
    await sched.report_failure(second.token, "fatal", retryable=False, lease_id=second.lease_id)
    info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.FAILED
    assert "fatal" in info.message


async def test_an_attempt_whose_lease_expires_is_lost_and_retried() -> None:
    pools = [RemotePool("remote", lease=0.2)]
    async with Scheduler(pools, store=MemoryStore()) as sched:
        gone = sched.attach(["remote"], slots=1)
        task_id = await sched.submit("job", pool="remote", retry=FAST)
        lost = await _attempt(gone)
        gone.close()  # the worker vanished without a word
        again = sched.attach(["remote"], slots=1)
        retried = await _attempt(again)
        assert retried.token.attempt == 2
        for call in (
            sched.heartbeat(lost.token, lease_id=lost.lease_id),
            sched.report_success(lost.token, b"late", lease_id=lost.lease_id),
        ):
            with pytest.raises(StaleAttempt) as stale:
                await call
            assert stale.value.reason == "attempt"
        await sched.report_success(retried.token, b"ok", lease_id=retried.lease_id)
        info = await sched.wait(task_id, timeout=5)
        assert (info.status, info.output, info.attempt) == (Status.SUCCEEDED, b"ok", 2)
        assert sched.metrics().attempts_lost == {"remote": 1}


async def test_a_cancel_reaches_the_worker_and_its_report_ends_the_task(sched: Scheduler) -> None:
    link = sched.attach(["remote"], slots=1)
    task_id = await sched.submit("job", pool="remote")
    attempt = await _attempt(link)
    assert await sched.cancel(task_id, "not needed") is Status.RUNNING
    event = await asyncio.wait_for(link.next(), 5)
    assert event == CancelRequested(attempt.token, "not needed")
    assert (
        await sched.heartbeat(attempt.token, lease_id=attempt.lease_id)
    ).cancel_reason == "not needed"
    await sched.report_failure(attempt.token, "cancelled by the worker", lease_id=attempt.lease_id)
    info = await sched.wait(task_id, timeout=5)
    assert (info.status, info.message) == (Status.CANCELLED, "not needed")


async def test_an_attempt_not_taken_from_a_closed_link_goes_back_uncounted(
    sched: Scheduler,
) -> None:
    link = sched.attach(["remote"], slots=2)
    # One step leases both to the link: once the worker took the first, the second waits in it.
    first_id, second_id = await sched.submit_many(
        [TaskRequest("a", pool="remote"), TaskRequest("b", pool="remote")]
    )
    taken = await _attempt(link)
    assert taken.token.task_id == first_id
    link.close()
    with pytest.raises(WorkerDetached):
        await link.next()
    other = sched.attach(["remote"], slots=1)
    attempt = await _attempt(other)
    assert attempt.token == AttemptToken(taken.token.epoch, second_id, 1)  # never counted
    # An attempt taken but never sent (the stream broke first) goes back the same way.
    other.unsent(attempt)
    other.close()
    third = sched.attach(["remote"], slots=1)
    again = await _attempt(third)
    assert again.token == attempt.token
    await sched.report_success(again.token, lease_id=again.lease_id)
    assert (await sched.wait(second_id, timeout=5)).attempt == 1
    # The first attempt, taken before the close, is still the worker's to report.
    await sched.report_success(taken.token, lease_id=taken.lease_id)
    assert (await sched.wait(first_id, timeout=5)).status is Status.SUCCEEDED


async def test_a_worker_serving_two_pools_shares_its_slots(sched: Scheduler) -> None:
    for pool in ("remote", "other", "remote", "other"):
        await sched.submit("job", pool=pool)
    link = sched.attach(["remote", "other"], slots=2)
    first, second = await _attempt(link), await _attempt(link)
    # Every call runs a step, which would lease a third attempt if a slot were offered.
    running = await sched.list(status="running")
    assert {first.token.task_id, second.token.task_id} == {t.task_id for t in running}
    assert (
        sched.metrics().queue_depth.get(("remote", "ready"), 0)
        + sched.metrics().queue_depth.get(("other", "ready"), 0)
        == 2
    )


async def test_a_reconnecting_worker_keeps_the_slots_of_what_it_runs(sched: Scheduler) -> None:
    link = sched.attach(["remote"], slots=1)
    await sched.submit("job", pool="remote")
    attempt = await _attempt(link)
    link.close()
    await sched.submit("next", pool="remote")
    back = sched.attach(["remote"], slots=1, running=[(attempt.token, attempt.lease_id)])
    await sched.list()  # a step: it would lease "next" if the slot were offered
    assert back.free == 0  # the slot is still taken by the attempt it runs
    await sched.report_success(attempt.token, lease_id=attempt.lease_id)
    assert (await _attempt(back)).kind == "next"


async def test_a_token_named_twice_at_reattach_takes_one_slot(sched: Scheduler) -> None:
    """Issue 19 item 7: duplicate tokens in ``running`` took a slot each, and the report of
    the attempt freed only one: the link's slot leaked for good."""
    link = sched.attach(["remote"], slots=2)
    await sched.submit("job", pool="remote")
    attempt = await _attempt(link)
    link.close()
    back = sched.attach(
        ["remote"],
        slots=2,
        running=[(attempt.token, attempt.lease_id), (attempt.token, attempt.lease_id)],
    )
    assert back.free == 1
    await sched.report_success(attempt.token, lease_id=attempt.lease_id)
    assert back.free == 2


async def test_a_graceful_close_waits_for_remote_reports() -> None:
    async with Scheduler([RemotePool("remote")], store=MemoryStore()) as sched:
        link = sched.attach(["remote"], slots=1)
        task_id = await sched.submit("job", pool="remote")
        attempt = await _attempt(link)

        async def worker_finishes() -> None:
            await asyncio.sleep(0.1)
            await sched.report_success(attempt.token, b"done", lease_id=attempt.lease_id)

        finishing = asyncio.create_task(worker_finishes())
        await sched.close(timeout=5)
        await finishing
        assert sched.store is not None
    # The report landed before the close released leadership.
    store = sched.store
    record = await store.get_task(task_id)
    assert record is not None and record.status is Status.SUCCEEDED


async def test_links_end_when_the_scheduler_stops(sched: Scheduler) -> None:
    link = sched.attach(["remote"], slots=1)
    waiting = asyncio.create_task(link.next())
    await asyncio.sleep(0)
    sched.abort()
    with pytest.raises(SchedulerStopped):
        await waiting
    with pytest.raises(SchedulerStopped):
        sched.attach(["remote"], slots=1)


async def test_bad_worker_input_is_refused(sched: Scheduler) -> None:
    with pytest.raises(UnknownPool):
        sched.attach(["nope"], slots=1)
    with pytest.raises(InvalidArgument, match="runs in this process"):
        sched.attach(["local"], slots=1)
    with pytest.raises(InvalidArgument, match="slots"):
        sched.attach(["remote"], slots=0)
    with pytest.raises(InvalidArgument, match="at least one pool"):
        sched.attach([], slots=1)
    with pytest.raises(InvalidArgument):
        sched.attach("remote", slots=1)
    token = AttemptToken(sched.epoch or 0, 1, 1)
    lease_id = bytes(16)
    with pytest.raises(InvalidArgument):
        await sched.heartbeat((1, 2, 3), lease_id=lease_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await sched.report_success(AttemptToken(0, 1, 1), lease_id=lease_id)
    with pytest.raises(InvalidArgument):
        await sched.report_success(token, "text", lease_id=lease_id)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await sched.report_failure(token, "x", lease_id=lease_id, retry_after=float("inf"))
    with pytest.raises(InvalidArgument):
        await sched.report_failure(token, "x" * 70_000, lease_id=lease_id)
    for bad_lease in (b"short", "0" * 16, None, bytes(17)):
        with pytest.raises(InvalidArgument, match="lease_id"):
            await sched.heartbeat(token, lease_id=bad_lease)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="lease_id"):
            await sched.report_success(token, lease_id=bad_lease)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="pair"):
        sched.attach(["remote"], slots=1, running=[token])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="lease_id"):
        sched.attach(["remote"], slots=1, running=[(token, b"x")])
    endless = itertools.repeat((token, lease_id))
    with pytest.raises(InvalidArgument, match="running: more than 100000 items given"):
        sched.attach(["remote"], slots=1, running=endless)
    with pytest.raises(StaleAttempt) as stale:
        await sched.report_success(token, lease_id=lease_id)
    assert stale.value.reason == "unknown"


async def test_a_worker_cannot_end_a_local_attempt() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(ctx: object, payload: object) -> None:
        started.set()
        await release.wait()

    async with Scheduler([Pool("local", slow), RemotePool("remote")], store=MemoryStore()) as sched:
        task_id = await sched.submit("job", pool="local")
        await asyncio.wait_for(started.wait(), 5)
        forged = AttemptToken(sched.epoch or 0, task_id, 1)
        with pytest.raises(StaleAttempt, match="unknown with this lease id"):
            await sched.report_success(forged, b"forged", lease_id=bytes(16))
        release.set()
        assert (await sched.wait(task_id, timeout=5)).status is Status.SUCCEEDED


async def test_metrics_count_what_happened(sched: Scheduler) -> None:
    link = sched.attach(["remote"], slots=1)
    ok = await sched.submit("job", pool="remote", retry=FAST)
    attempt = await _attempt(link)
    await sched.report_failure(attempt.token, "again", retry_after=0, lease_id=attempt.lease_id)
    attempt = await _attempt(link)
    await sched.report_success(attempt.token, lease_id=attempt.lease_id)
    await sched.wait(ok, timeout=5)
    dead = await sched.submit("job", pool="remote")
    attempt = await _attempt(link)
    await sched.report_failure(attempt.token, "no", retryable=False, lease_id=attempt.lease_id)
    await sched.wait(dead, timeout=5)
    await sched.submit("queued", pool="other")
    metrics = sched.metrics()
    assert metrics.leading and metrics.epoch == sched.epoch
    assert metrics.submitted == {"remote": 2, "other": 1}
    assert metrics.finished == {("remote", "succeeded"): 1, ("remote", "failed"): 1}
    assert metrics.retries == {"remote": 1}
    assert metrics.dead_lettered == {"remote": 1}
    assert metrics.queue_depth == {("other", "ready"): 1}
    assert metrics.running == {"remote": 0, "other": 0, "local": 0}
    assert metrics.start_delay_seconds.count == 3
    assert sum(metrics.start_delay_seconds.counts) == 3
    assert metrics.commit_seconds.count == sum(metrics.commit_seconds.counts) > 0
    assert metrics.commit_batch_size.total >= metrics.commit_batch_size.count


async def test_list_pages_through_ascending_ids(sched: Scheduler) -> None:
    ids = [await sched.submit("job", pool="other") for _ in range(7)]
    pages: list[list[int]] = []
    after = 0
    while page := await sched.list(pool="other", limit=3, after=after):
        pages.append([t.task_id for t in page])
        after = page[-1].task_id
    assert pages == [ids[0:3], ids[3:6], ids[6:7]]
    pages = []
    before = None
    while page := await sched.list(pool="other", limit=3, before=before, newest_first=True):
        pages.append([t.task_id for t in page])
        before = page[-1].task_id
    assert pages == [ids[6:3:-1], ids[3:0:-1], ids[0:1]]


@contextlib.asynccontextmanager
async def _failover(lease: float = 30.0) -> AsyncIterator[tuple[Scheduler, int, LeasedAttempt]]:
    """A leader leases a task's attempt to a worker and stops without waiting for it; yields
    the leader after it (started, on the same store), the task and the attempt its worker
    still runs."""
    store = MemoryStore()
    first = Scheduler([RemotePool("remote", lease=lease)], store=store)
    await first.start()
    link = first.attach(["remote"], slots=1)
    task_id = await first.submit("job", pool="remote", retry=FAST)
    attempt = await _attempt(link)
    await first.close(timeout=0)
    second = Scheduler([RemotePool("remote", lease=lease)], store=store)
    await second.start()
    try:
        yield second, task_id, attempt
    finally:
        await second.close(timeout=0)


async def test_a_new_leader_adopts_a_remote_attempt_whose_worker_proves_its_lease() -> None:
    # Issue 19, item 1: a failover re-ran every in-flight remote attempt at once.
    async with _failover() as (second, task_id, attempt):
        back = second.attach(["remote"], slots=1, running=[(attempt.token, attempt.lease_id)])
        await second.submit("other", pool="remote")
        renewed = await second.heartbeat(attempt.token, lease_id=attempt.lease_id)
        assert not renewed.stopped and renewed.cancel_reason is None
        assert back.queued == 0, "the worker's one slot is its adopted attempt's"
        await second.report_success(attempt.token, b"done", lease_id=attempt.lease_id)
        record = await second.wait(task_id, timeout=2)
        assert (record.status, record.attempt, record.output) == (Status.SUCCEEDED, 1, b"done")
        assert second.metrics().attempts_lost == {}
        assert (await _attempt(back)).kind == "other"  # its slot came back with the report


async def test_the_pool_of_an_adopted_attempt_is_known_to_the_worker_that_proves_its_lease() -> (
    None
):
    # Issue 29 review: a server authorizes a heartbeat, report or re-Attach by the attempt's
    # pool; the new leader knew only the pools of the attempts it leased itself, so any
    # identity holding an adopted attempt's lease id passed.
    async with _failover() as (second, task_id, attempt):
        assert second.remote_attempt_pool(attempt.token, lease_id=attempt.lease_id) == "remote"
        assert second.remote_attempt_pool(attempt.token, lease_id=bytes(16)) is None
        stranger = AttemptToken(attempt.token.epoch, task_id + 1000, 1)
        assert second.remote_attempt_pool(stranger, lease_id=attempt.lease_id) is None
        await second.cancel(task_id)  # stopped, not reported: it still holds its lease
        assert second.remote_attempt_pool(attempt.token, lease_id=attempt.lease_id) == "remote"
        await second.report_failure(attempt.token, "cancelled", lease_id=attempt.lease_id)
        assert second.remote_attempt_pool(attempt.token, lease_id=attempt.lease_id) is None


async def test_an_impostor_cannot_speak_for_an_adopted_attempt() -> None:
    # Issue 19, item 2: a token is visible through List/Get; the lease id is not.
    async with _failover() as (second, task_id, attempt):
        impostor = second.attach(["remote"], slots=1, running=[(attempt.token, bytes(16))])
        for call in (
            second.heartbeat(attempt.token, lease_id=bytes(16)),
            second.report_success(attempt.token, b"forged", lease_id=bytes(16)),
        ):
            with pytest.raises(StaleAttempt) as stale:
                await call
            assert stale.value.reason == "unknown"
        assert (await second.get(task_id)).status is Status.RUNNING
        worker = second.attach(["remote"], slots=1, running=[(attempt.token, attempt.lease_id)])
        await second.heartbeat(attempt.token, lease_id=attempt.lease_id)
        await second.cancel(task_id)
        event = await asyncio.wait_for(worker.next(), 2)
        assert isinstance(event, CancelRequested), "the cancel goes to the real worker"
        assert impostor.queued == 0
        await second.report_failure(attempt.token, "cancelled", lease_id=attempt.lease_id)
        assert (await second.wait(task_id, timeout=2)).output is None


async def test_a_pending_cancel_goes_only_to_the_worker_that_proves_its_lease() -> None:
    # Review finding: a re-attach naming a token with any lease id was sent the attempt's
    # pending cancellation (its reason included).
    async with _failover() as (second, task_id, attempt):
        assert await second.cancel(task_id, "secret reason") is Status.RUNNING
        impostor = second.attach(["remote"], slots=1, running=[(attempt.token, bytes(16))])
        worker = second.attach(["remote"], slots=1, running=[(attempt.token, attempt.lease_id)])
        await second.list()  # a step
        assert impostor.queued == 0 and worker.queued == 0  # unproven yet: nothing sent
        renewed = await second.heartbeat(attempt.token, lease_id=attempt.lease_id)
        assert renewed.cancel_reason == "secret reason"
        event = await asyncio.wait_for(worker.next(), 2)
        assert isinstance(event, CancelRequested) and event.reason == "secret reason"
        assert impostor.queued == 0


async def test_an_attempt_claimed_on_two_links_holds_one_slot_once_proven() -> None:
    # A worker that re-attaches before its old link closed names its attempt on both: once
    # its heartbeat proves the attempt, the new link holds it (the old one is about to close)
    # and the old one's claim lets go (its slot leaked before).
    async with _failover() as (second, _task_id, attempt):
        running = [(attempt.token, attempt.lease_id)]
        old = second.attach(["remote"], slots=1, running=running)
        new = second.attach(["remote"], slots=1, running=running)
        await second.heartbeat(attempt.token, lease_id=attempt.lease_id)
        old.close()
        await second.submit("other", pool="remote")
        await second.list()  # a step: "other" would be leased to a free slot
        assert new.queued == 0, "the new link's one slot is its running attempt's"
        await second.report_success(attempt.token, lease_id=attempt.lease_id)
        assert (await _attempt(new)).kind == "other"


async def test_a_new_leader_retries_a_remote_attempt_whose_worker_never_returns() -> None:
    async with _failover(lease=0.3) as (second, task_id, attempt):
        again = await _attempt(second.attach(["remote"], slots=1))  # after one lease
        assert again.token == AttemptToken(second.epoch or 0, task_id, 2)
        assert second.metrics().attempts_lost == {"remote": 1}
        with pytest.raises(StaleAttempt) as stale:
            await second.report_success(attempt.token, lease_id=attempt.lease_id)
        assert stale.value.reason == "attempt"


@pytest.mark.parametrize("ending", ["out of attempts", "cancelled while it waits"])
async def test_a_retry_after_a_failover_waits_for_the_stopped_attempt_of_a_finished_task(
    ending: str,
) -> None:
    # Issue 19 review: the engine stopped an attempt at its timeout while its worker still ran
    # it, and the task ended (no attempts left; or cancelled while its retry waited for that
    # attempt); the next leader, asked to retry the task, must not lease a second attempt
    # until the first one ends.
    store = MemoryStore()
    first = Scheduler([RemotePool("remote", lease=30.0)], store=store)
    await first.start()
    attempts = 1 if ending == "out of attempts" else 2
    task_id = await first.submit("job", pool="remote", timeout=0.1, retry=RetryPolicy(attempts))
    link = first.attach(["remote"], slots=1)
    attempt = await _attempt(link)
    cancel = await asyncio.wait_for(link.next(), 5)  # timed out: told to stop
    assert isinstance(cancel, CancelRequested)
    if ending != "out of attempts":
        await first.cancel(task_id)
    expected = Status.FAILED if ending == "out of attempts" else Status.CANCELLED
    assert (await first.wait(task_id, timeout=5)).status is expected
    await first.close(timeout=0)
    second = Scheduler([RemotePool("remote", lease=30.0)], store=store)
    await second.start()
    try:
        other = second.attach(["remote"], slots=1)
        assert (await second.retry(task_id)).status is Status.READY
        await second.get(task_id)  # a step after the retry's: its dispatches are out
        assert other.queued == 0, "a second attempt was leased beside the stopped one"
        renewed = await second.heartbeat(attempt.token, lease_id=attempt.lease_id)
        assert renewed.stopped, "the stopped attempt is known to the new leader"
        with pytest.raises(StaleAttempt):
            await second.report_failure(attempt.token, "ended", lease_id=attempt.lease_id)
        again = await _attempt(other)  # its end lets the retry run
        assert again.token == AttemptToken(second.epoch or 0, task_id, 2)
        with pytest.raises(StaleAttempt) as late:  # its worker, with the id, is told why
            await second.heartbeat(attempt.token, lease_id=attempt.lease_id)
        assert late.value.reason == "attempt"
        record = await store.get_task(task_id)
        assert record is not None and record.lease is not None  # attempt 2's own
        assert record.lease.epoch == second.epoch
    finally:
        await second.close(timeout=0)


# --- the engine's side: pure steps ------------------------------------------------------------

S = 1_000_000_000
T0 = 1_000_000 * S


def _engine(*pools: PoolConfig) -> Engine:
    return Engine(EngineConfig(pools), epoch=1)


def _submit(engine: Engine, now: int, *pools: str, offer: OfferSlots) -> StepResult:
    specs = [TaskSpec(pool, "job", b"") for pool in pools]
    return engine.step(now, [offer, SubmitTasks(specs, object())])


def test_a_leased_pool_starts_only_into_offered_slots() -> None:
    engine = _engine(PoolConfig("r", 10, lease_ns=30 * S))
    result = _submit(engine, T0, "r", "r", "r", offer=OfferSlots([(frozenset({"r"}), 2)]))
    assert len(result.dispatches) == 2
    assert all(d.lease_expires_ns == T0 + 30 * S for d in result.dispatches)
    # Unused offers do not accumulate: each step's offer replaces the last.
    assert engine.step(T0 + 1, [OfferSlots([])]).dispatches == []
    assert len(engine.step(T0 + 2, [OfferSlots([(frozenset({"r"}), 5)])]).dispatches) == 1


def test_a_worker_of_one_pool_is_used_before_a_shared_one() -> None:
    engine = _engine(PoolConfig("a", 10, lease_ns=S), PoolConfig("b", 10, lease_ns=S))
    offer = OfferSlots([(frozenset({"a", "b"}), 1), (frozenset({"a"}), 1)])
    result = _submit(engine, T0, "a", "b", offer=offer)
    # "a" took the slot of the worker serving only "a", which left the shared one for "b".
    assert sorted(d.spec.pool for d in result.dispatches) == ["a", "b"]


def test_a_report_after_the_lease_is_stale_even_before_the_timer_fired() -> None:
    engine = _engine(PoolConfig("r", 1, lease_ns=10 * S))
    [dispatch] = _submit(engine, T0, "r", offer=OfferSlots([(frozenset({"r"}), 1)])).dispatches
    reply_to = object()
    late = AttemptReport(
        dispatch.token,
        AttemptSucceeded(b"late"),
        reply_to,
        remote=True,
        lease_id=dispatch.lease_id,
    )
    result = engine.step(T0 + 10 * S, [late])
    [value] = [v for to, v in result.replies if to is reply_to]
    assert isinstance(value, StaleAttempt) and value.reason == "lease"
    statuses = [m.status for m in result.mutations if isinstance(m, TaskUpdated)]
    assert statuses == [Status.RETRYING]  # lost, as if the report never came


async def test_an_abort_ends_a_close_that_waits_for_a_remote_attempt() -> None:
    sched = Scheduler([RemotePool("remote")], store=MemoryStore())
    await sched.start()
    link = sched.attach(["remote"], slots=1)
    await sched.submit("job", pool="remote")
    await _attempt(link)  # held by a worker that never reports
    closing = asyncio.create_task(sched.close(timeout=30))
    await asyncio.sleep(0)  # the close is waiting for the attempt now
    sched.abort()
    await asyncio.wait_for(closing, 2)
