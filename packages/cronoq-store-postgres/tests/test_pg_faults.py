"""PgStore under faults, in one process: the advisory-lock stacking trap, a killed lock
session, a partition between a leader and PostgreSQL (a black-holing proxy, ``pg_proxy.py``)
between statements or in the middle of a commit, a lost reply to a commit (an ambiguous
commit), a session ended right after a commit's reply, a leader frozen in its recovery, and
the lookup of a quarantined row.

Every test runs against the real server, in a schema of its own, with the fast timings of the
test config (session_timeout 2 s, keepalive 0.2 s, lock_poll 0.05 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from pg_fault_helpers import (
    SubmitLoad,
    close_all,
    config,
    current_epoch,
    ids_in_db,
    lock_holders,
    query,
    rows_with_key,
    scheduler,
    submission,
    wait_until,
)
from pg_harness import DSN, require_postgres
from pg_proxy import (
    LOCK_SESSION,
    Link,
    PgProxy,
    makes_a_batch_durable,
    writes_a_batch,
)

from cronoq import SchedulerError, Status
from cronoq.errors import Fenced, StoreError, Unavailable
from cronoq.store import TaskRecord, TimeBase
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._schema import quote_ident

HOUR_NS = 3600 * 1_000_000_000


def not_lock(link: Link) -> bool:
    return not link.is_lock_session


async def standby_leads(starting: asyncio.Future[None], within: float, otherwise: str) -> None:
    """Wait for the standby's start; if it never leads, fail naming the sessions left idle in
    a transaction (what holds it back)."""
    try:
        async with asyncio.timeout(within):
            await starting
    except TimeoutError:
        stuck = await query(
            "SELECT pid, state, now() - state_change AS idle_for, left(query, 70) AS query "
            "FROM pg_stat_activity WHERE application_name = 'cronoq' "
            "AND state LIKE 'idle in transaction%'"
        )
        pytest.fail(f"the standby never led: {otherwise}. Sessions idle in a transaction: {stuck}")


async def test_database_runs_with_synchronous_commit_on() -> None:
    await require_postgres()
    rows = await query("SHOW synchronous_commit")
    assert rows[0]["synchronous_commit"] == "on"


async def test_leader_holds_its_lock_once_and_release_lets_a_standby_in_at_once(
    schema: str, proxy: PgProxy
) -> None:
    """Advisory locks stack: a leader that kept polling would hold the lock many times over,
    and one unlock would not free it. The leader (through the proxy, which counts what each
    session executes) tries the lock once, then only keeps its session alive."""
    cfg = config(schema)
    leader = await PgStore.connect(proxy.dsn(DSN), cfg)
    standby = await PgStore.connect(DSN, cfg)
    acquiring: list[asyncio.Future[Any]] = []
    try:
        lease = await leader.acquire_leadership()
        [lock_link] = proxy.lock_links()
        # Let the keepalive run three times: that spans a dozen lock_poll periods.
        await wait_until(lambda: lock_link.count("SELECT 1") >= 3, 5.0, "three keepalives")
        assert lock_link.count("pg_try_advisory_lock") == 1, lock_link.executed
        holders = await lock_holders(schema)
        assert len(holders) == 1, holders
        assert holders[0]["application_name"] == LOCK_SESSION
        leader_pid = holders[0]["pid"]

        acquired = asyncio.ensure_future(standby.acquire_leadership())
        acquiring.append(acquired)
        released = time.monotonic()
        await leader.release_leadership()
        async with asyncio.timeout(cfg.session_timeout):
            second = await acquired
        waited = time.monotonic() - released
        assert second.epoch == lease.epoch + 1
        # "At once": within a poll of the standby (and its epoch bump), not a timeout.
        assert waited < cfg.lock_poll + 0.5, waited
        async with asyncio.timeout(1.0):
            await leader.leadership_lost()
        holders = await lock_holders(schema)
        assert len(holders) == 1 and holders[0]["pid"] != leader_pid, holders
        assert lock_link.count("pg_try_advisory_lock") == 1
    finally:
        await close_all([], [leader, standby], acquiring)


async def test_killed_lock_session_steps_the_leader_down_at_once_and_loses_no_ack(
    schema: str,
) -> None:
    cfg = config(schema)
    store_a = await PgStore.connect(DSN, cfg)
    store_b = await PgStore.connect(DSN, cfg)
    sched_a, sched_b = scheduler(store_a), scheduler(store_b)
    starts: list[asyncio.Future[Any]] = []
    load: SubmitLoad | None = None
    try:
        await sched_a.start()
        epoch_a = await current_epoch(schema)
        starting_b = asyncio.ensure_future(sched_b.start())
        starts.append(starting_b)
        load = SubmitLoad(sched_a, "a")
        await load.wait_acks(50)
        [holder] = await lock_holders(schema)
        assert holder["application_name"] == LOCK_SESSION
        assert not starting_b.done()

        killed = time.monotonic()
        await query("SELECT pg_terminate_backend($1)", holder["pid"])
        async with asyncio.timeout(cfg.session_timeout):
            reason = await store_a.leadership_lost()
        stepped_down = time.monotonic() - killed
        assert stepped_down < cfg.session_timeout / 4, stepped_down  # at once, not on timeout
        async with asyncio.timeout(1.0):
            await sched_a.leadership_lost()
        assert isinstance(sched_a.failure, Fenced)
        # The scheduler stops with the store's reason, not a generic one: the session's end
        # (its listener), or, when the standby took the lock and raised the epoch before this
        # loaded event loop ran the listener, the fence of the next commit; then the
        # scheduler released the store's leadership itself (no reason of the store's).
        if reason is None:
            assert "superseded" in str(sched_a.failure), sched_a.failure
        else:
            assert "was terminated" in str(reason), reason
            assert "was terminated" in str(sched_a.failure), sched_a.failure
        await load.finished()

        async with asyncio.timeout(cfg.lock_poll + 3.0):
            await starting_b
        assert await current_epoch(schema) == epoch_a + 1
        assert len(load.acked) >= 50
        assert all(isinstance(e, SchedulerError) for e in load.errors), load.errors
        assert await ids_in_db(schema, load.acked) == set(load.acked)
        for task_id, key in zip(load.acked, load.acked_keys, strict=True):
            assert (await sched_b.get(task_id)).key == key
        with pytest.raises(Fenced):
            await store_a.commit(epoch_a, [submission(epoch_a, "after-kill")])
        assert await rows_with_key(schema, "after-kill") == []
    finally:
        if load is not None:
            await load.stop()
        await close_all([sched_a, sched_b], [store_a, store_b], starts)


async def _blackhole_scenario(schema: str, proxy: PgProxy, mid_commit: bool) -> None:
    """A leader whose traffic to PostgreSQL goes through the proxy, a standby connected
    directly, a steady submit load on the leader; then a black hole."""
    cfg = config(schema)
    store_a = await PgStore.connect(proxy.dsn(DSN), cfg)
    store_b = await PgStore.connect(DSN, cfg)
    sched_a, sched_b = scheduler(store_a), scheduler(store_b)
    starts: list[asyncio.Future[Any]] = []
    load: SubmitLoad | None = None
    try:
        await sched_a.start()
        epoch_a = await current_epoch(schema)
        starting_b = asyncio.ensure_future(sched_b.start())
        starts.append(starting_b)
        # Tasks due in an hour: every batch of the leader is then made of submissions only, so
        # the batch the black hole catches has callers waiting on it.
        load = SubmitLoad(sched_a, "a", start_at=timedelta(hours=1))
        await load.wait_acks(50)
        [lock_link] = proxy.lock_links()
        [old_holder] = await lock_holders(schema)

        if mid_commit:
            proxy.blackhole_after(writes_a_batch, not_lock)
        else:
            # Once the leader got the reply to a batch (and gave its connection back).
            proxy.blackhole_when_quiet(not_lock, not_after=writes_a_batch)
        async with asyncio.timeout(5.0):
            await proxy.became_blackholed.wait()
        assert proxy.blackholed_at is not None

        async with asyncio.timeout(cfg.session_timeout + 2.0):
            reason = await store_a.leadership_lost()
        stepped_down = time.monotonic() - proxy.blackholed_at
        assert stepped_down < cfg.session_timeout + 0.5, stepped_down
        async with asyncio.timeout(1.0):
            await sched_a.leadership_lost()
        assert isinstance(sched_a.failure, Fenced)
        assert "stopped answering" in str(reason), reason
        assert "stopped answering" in str(sched_a.failure), sched_a.failure
        await load.finished()

        # The standby leads once the server has dropped the old lock session (its
        # idle_session_timeout is session_timeout): not before, and not much later.
        await standby_leads(
            starting_b,
            2 * cfg.session_timeout + 2.0,
            "the frozen leader's transaction still holds the cronoq_leader row lock, so every "
            "epoch bump hits lock_timeout",
        )
        led = time.monotonic() - lock_link.last_forwarded
        assert led >= cfg.session_timeout - 0.05, led
        assert led < cfg.session_timeout + 1.5, led
        holders = await lock_holders(schema)
        assert [h["pid"] for h in holders] != [old_holder["pid"]]
        assert len(holders) == 1
        assert await current_epoch(schema) == epoch_a + 1

        # Nothing acknowledged is lost.
        assert len(load.acked) >= 50
        assert all(isinstance(e, SchedulerError) for e in load.errors), load.errors
        assert await ids_in_db(schema, load.acked) == set(load.acked)
        for task_id, key in zip(load.acked, load.acked_keys, strict=True):
            assert (await sched_b.get(task_id)).key == key
        # A submission that failed was not applied, unless its batch was the one the black
        # hole caught after it was sent: that one may have landed, and then the new leader,
        # which read the database after it, has it.
        landed = []
        for key in load.failed_keys:
            rows = await rows_with_key(schema, key)
            found = await sched_b.get_by_key(key)
            assert (found is None) == (not rows), key
            if rows:
                assert found is not None and [found.task_id] == rows
                landed.append(key)
        if not mid_commit:
            assert landed == []
        elif not proxy.blackholed_in_transaction:
            assert landed, "the batch sent as one autocommit statement did not land"

        # Whatever the old leader tries now is fenced and writes nothing.
        with pytest.raises(Fenced):
            await store_a.commit(epoch_a, [submission(epoch_a, "after-partition")])
        assert await rows_with_key(schema, "after-partition") == []
    finally:
        if load is not None:
            await load.stop()
        await proxy.close()  # ends the old leader's calls stuck in the black hole
        await close_all([sched_a, sched_b], [store_a, store_b], starts)


async def test_partitioned_leader_steps_down_and_standby_leads_once_server_drops_it(
    schema: str, proxy: PgProxy
) -> None:
    """The black hole falls between two statements of the leader (none in flight)."""
    await _blackhole_scenario(schema, proxy, mid_commit=False)


async def test_leader_partitioned_mid_commit_leaves_no_lock_and_the_standby_leads(
    schema: str, proxy: PgProxy
) -> None:
    """The black hole falls right after the leader sent the statement that writes a batch
    (its fence on the cronoq_leader row): the reply is lost. Had that statement opened an
    explicit transaction, PostgreSQL would now hold it open, with the leader row locked, and
    nothing (no idle_in_transaction_session_timeout is set) would end it while the frozen
    peer's TCP stays up: the standby's epoch bump would time out forever. With the batch as
    one autocommit statement the server finishes it alone, and the standby leads."""
    await _blackhole_scenario(schema, proxy, mid_commit=True)


async def test_commit_whose_reply_is_lost_is_unavailable_though_it_landed(
    schema: str, proxy: PgProxy
) -> None:
    cfg = config(schema)
    store = await PgStore.connect(proxy.dsn(DSN), cfg)
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        [holder] = await lock_holders(schema)
        batch = [submission(lease.epoch, "ambiguous")]
        proxy.drop_reply_to(makes_a_batch_durable, not_lock)
        with pytest.raises(Unavailable):
            await store.commit(lease.epoch, batch)
        assert proxy.reply_dropped.is_set()
        landed = await rows_with_key(schema, "ambiguous")
        assert landed == [batch[0].task_id]  # the outcome was unknown: it did land

        # The driver retries a batch as it is: doing so is harmless.
        await store.commit(lease.epoch, batch)
        assert await rows_with_key(schema, "ambiguous") == landed
        state = await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        assert [t.task_id for t in state.tasks] == landed
        assert await lock_holders(schema) == [holder]  # the lock session was never touched
    finally:
        await store.close()


async def test_ambiguous_commit_then_rebuild_retry_with_same_key_returns_landed_task(
    schema: str, proxy: PgProxy
) -> None:
    """The reply to a COMMIT is lost, then the store stays unreachable past commit_timeout
    (only the pool's connections are refused; the lock session stays up, so leadership holds).
    The caller gets SchedulerError, the scheduler rebuilds its memory from the store, and the
    caller's retry with the same key finds the task that did land: no duplicate."""
    commit_timeout = 0.5
    cfg: PgStoreConfig = config(schema)
    store = await PgStore.connect(proxy.dsn(DSN), cfg)
    sched = scheduler(store, commit_timeout=commit_timeout)
    try:
        await sched.start()
        before = [await sched.submit("job", b"p", key=f"before-{i}") for i in range(5)]

        def unreachable(dropped: Link) -> None:
            proxy.refuse = not_lock
            proxy.cut(lambda link: not_lock(link) and link is not dropped)

        proxy.drop_reply_to(makes_a_batch_durable, not_lock, then=unreachable)
        asked = time.monotonic()
        with pytest.raises(SchedulerError):
            await sched.submit("job", b"p", key="ambiguous")
        # The driver retried until the next pause would have passed commit_timeout.
        assert commit_timeout / 2 <= time.monotonic() - asked < commit_timeout + 1.0
        assert proxy.reply_dropped.is_set()
        landed = await rows_with_key(schema, "ambiguous")
        assert len(landed) == 1, landed
        assert sched.running

        proxy.refuse = None
        failures: list[SchedulerError] = []
        deadline = time.monotonic() + 10.0
        while True:
            try:
                again = await sched.submit("job", b"p", key="ambiguous")
                break
            except SchedulerError as exc:  # still rebuilding: retry, as a client would
                failures.append(exc)
                assert time.monotonic() < deadline, failures
        assert again == landed[0]
        assert await rows_with_key(schema, "ambiguous") == landed
        assert (await sched.wait(again, timeout=5.0)).status is Status.SUCCEEDED
        assert await ids_in_db(schema, before) == set(before)
        assert sched.running
        # It did rebuild: the recovery read (of the leader row) ran again after the start.
        assert sum(link.count("SELECT epoch, max_task_id FROM") for link in proxy.links) >= 2
    finally:
        await proxy.close()
        await close_all([sched], [store], [])


def quarantines(link: Link, text: str) -> bool:
    """Recovery's statement that marks undecodable rows failed."""
    return "message = u.reason" in text


async def test_leader_frozen_while_quarantining_does_not_keep_the_standby_out(
    schema: str, proxy: PgProxy
) -> None:
    """A leader freezes (or is partitioned) in its recovery, right after the statement that
    quarantines an undecodable row. Recovery runs in an explicit transaction, so PostgreSQL
    keeps it open, with that row locked, for as long as the frozen peer's TCP stays up (the
    pool's sessions have no idle_in_transaction_session_timeout). The server does end the lock
    session (idle_session_timeout), and a standby takes the lock and bumps the epoch; its own
    recovery must quarantine the same row, and must not wait on it forever."""
    cfg = config(schema)
    seed = await PgStore.connect(DSN, cfg)
    lease = await seed.acquire_leadership()
    await seed.recover(lease.epoch, TimeBase(), HOUR_NS)
    broken = submission(lease.epoch, "broken")
    await seed.commit(lease.epoch, [broken])
    await seed.close()
    await query(
        f"UPDATE {quote_ident(schema)}.cronoq_tasks SET options = '{{broken' WHERE id = $1",
        broken.task_id,
    )

    store_a = await PgStore.connect(proxy.dsn(DSN), cfg)
    store_b = await PgStore.connect(DSN, cfg)
    sched_a, sched_b = scheduler(store_a), scheduler(store_b)
    starts: list[asyncio.Future[Any]] = []
    try:
        proxy.blackhole_after(quarantines, not_lock)
        starts.append(asyncio.ensure_future(sched_a.start()))
        async with asyncio.timeout(5.0):
            await proxy.became_blackholed.wait()
        starting_b = asyncio.ensure_future(sched_b.start())
        starts.append(starting_b)
        async with asyncio.timeout(cfg.session_timeout + 2.0):
            await store_a.leadership_lost()
        await standby_leads(
            starting_b,
            2 * cfg.session_timeout + 2.0,
            "the frozen leader's recovery transaction still holds the quarantined row's lock, "
            "so the standby's recovery hits lock_timeout on it again and again",
        )
        [row] = await query(
            f"SELECT status, message FROM {quote_ident(schema)}.cronoq_tasks WHERE id = $1",
            broken.task_id,
        )
        assert row["status"] == "failed" and row["message"].startswith("quarantined"), row
        assert sched_b.running
    finally:
        await proxy.close()
        await close_all([sched_a, sched_b], [store_a, store_b], starts)


async def test_session_ended_right_after_a_commit_reply_is_no_fatal_store_error(
    schema: str, proxy: PgProxy
) -> None:
    """A server shutting down (or pg_terminate_backend) sends FATAL 57P01 to every session. If
    that reaches a pool connection right after the reply to a batch, asyncpg has the statement's
    result, and then the pool's reset of the connection on release fails. The batch landed; the
    store may say so, or report Unavailable (an unknown outcome), but not raise something the
    scheduler can only take for a fatal error. (The restart test met this at random.)"""
    store = await PgStore.connect(proxy.dsn(DSN), config(schema))
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        batch = [submission(lease.epoch, "then-fatal")]
        proxy.fatal_after_reply_to(makes_a_batch_durable, not_lock)
        with contextlib.suppress(Unavailable):
            await store.commit(lease.epoch, batch)
        assert proxy.fatal_sent.is_set()
        assert await rows_with_key(schema, "then-fatal") == [batch[0].task_id]
        await store.commit(lease.epoch, batch)  # and the store goes on
    finally:
        await store.close()


async def test_session_ended_right_after_a_commit_reply_keeps_the_scheduler_serving(
    schema: str, proxy: PgProxy
) -> None:
    store = await PgStore.connect(proxy.dsn(DSN), config(schema))
    sched = scheduler(store)
    try:
        await sched.start()
        await sched.submit("job", b"p", key="before")
        proxy.fatal_after_reply_to(makes_a_batch_durable, not_lock)
        try:
            first: int | None = await sched.submit("job", b"p", key="then-fatal")
        except SchedulerError:
            first = None  # "may be retried"
        assert proxy.fatal_sent.is_set()
        assert sched.running, f"the scheduler stopped: {sched.failure!r}"
        again = await sched.submit("job", b"p", key="then-fatal")
        assert first in (None, again)
        assert await rows_with_key(schema, "then-fatal") == [again]
    finally:
        await close_all([sched], [store], [])


async def test_lookup_of_a_quarantined_row_raises_no_decoding_error(schema: str) -> None:
    """Recovery quarantines an undecodable row (marks it failed) and goes on; looking that task
    up afterwards (``Scheduler.get`` falls back on ``store.get_task`` for a task memory does
    not hold) must not surface the decoder's ValueError: a record, None, or a StoreError."""
    cfg = config(schema)
    store = await PgStore.connect(DSN, cfg)
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        broken = submission(lease.epoch, "broken")
        await store.commit(lease.epoch, [broken])
        await query(
            f"UPDATE {quote_ident(schema)}.cronoq_tasks SET options = '{{broken' WHERE id = $1",
            broken.task_id,
        )
        state = await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        assert [task_id for task_id, _ in state.quarantined] == [broken.task_id]
        lookups: list[Callable[[], Awaitable[TaskRecord | None]]] = [
            lambda: store.get_task(broken.task_id),
            lambda: store.get_task_by_key("broken"),
        ]
        for lookup in lookups:
            try:
                record = await lookup()
            except StoreError:
                continue
            assert record is None or record.status is Status.FAILED, record
    finally:
        await store.close()
