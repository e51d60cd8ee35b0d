"""Every write of PgStore is fenced, in its own transaction, against what happened since the
caller last knew the state: a takeover (the epoch) and, within one leadership, a write of its own
whose outcome it never learned (the generation, bumped by ``recover()`` and by the first write
after a failed one).

Run against the real server, each test in a schema of its own.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from pg_fault_helpers import (
    config,
    query,
    rows_with_key,
    wait_until,
)
from pg_harness import DSN
from pg_proxy import Link, PgProxy, writes_a_batch

from cronoq import Status
from cronoq.errors import Fenced, StoreFatal, Unavailable
from cronoq.store import TaskSpec, TaskSubmitted, TaskUpdated, TimeBase
from cronoq_store_postgres import PgStore
from cronoq_store_postgres._schema import quote_ident

HOUR_NS = 3600 * 1_000_000_000
DAY_NS = 24 * HOUR_NS


def task(task_id: int, key: str, submitted_ns: int | None = None) -> TaskSubmitted:
    spec = TaskSpec("default", "job", b"payload", key=key)
    at = time.time_ns() if submitted_ns is None else submitted_ns
    return TaskSubmitted(task_id, spec, Status.READY, at)


def finished(task_id: int, at_ns: int) -> TaskUpdated:
    return TaskUpdated(task_id, Status.SUCCEEDED, 1, "done", at_ns, output=b"out")


async def lock_leader_row(schema: str) -> asyncpg.Connection:
    """Another session holding the leader row: every write of the store queues behind it."""
    blocker = await asyncpg.connect(DSN)
    await blocker.execute("BEGIN")
    await blocker.execute(f"SELECT * FROM {quote_ident(schema)}.cronoq_leader FOR UPDATE")
    return blocker


async def running_statements(schema: str, waiting_for_a_lock: bool = False) -> int:
    """How many statements of the store on the schema's tables are running (or waiting for a
    lock: here, the leader row). Other tests may use the same server: only this schema's
    statements count."""
    rows = await query(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = 'cronoq' "
        "AND state = 'active' AND strpos(query, $1) > 0 "
        "AND (NOT $2 OR wait_event_type IS NOT DISTINCT FROM 'Lock')",
        quote_ident(schema) + ".cronoq_",
        waiting_for_a_lock,
    )
    return int(rows[0]["n"])


async def test_a_commit_whose_connection_broke_cannot_land_after_recovery_has_read(
    schema: str, proxy: PgProxy
) -> None:
    """Issue 9, item 12. A batch's statement reaches the server and waits there (here on the
    leader row, which another session holds; in life on a slow disk or a busy server); then its
    connection breaks. The store reports Unavailable, the driver rebuilds with recover(), and
    the server still runs the orphaned statement, which commits once it gets the row. Had
    recovery read before that, the rebuilt engine would hand out the orphan's task id again,
    and the orphan's row would make the next acknowledged submission vanish (ON CONFLICT DO
    NOTHING). Recovery must first settle every write of its own whose outcome is unknown: it
    reads after the orphan committed (and sees its task), or the orphan writes nothing."""
    cfg = config(schema, lock_timeout=10.0)
    store = await PgStore.connect(proxy.dsn(DSN), cfg)
    blocker: asyncpg.Connection | None = None
    try:
        lease = await store.acquire_leadership()
        # Not the leader's first prune, which would race the blocker for the leader row and,
        # losing, hold the commit back behind it (the store runs its writes one at a time).
        assert store._pruning is not None
        store._pruning.cancel()
        state = await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        first_id = max(state.max_task_id, lease.epoch << 40) + 1  # what the engine issues next
        blocker = await lock_leader_row(schema)

        orphan = asyncio.ensure_future(store.commit(lease.epoch, [task(first_id, "orphan")]))

        async def waiting(count: int) -> bool:
            return await running_statements(schema, waiting_for_a_lock=True) >= count

        async def none_running() -> bool:
            return await running_statements(schema) == 0

        def runs_the_batch(link: Link) -> bool:
            return not link.is_lock_session and writes_a_batch(link, link.last_statement)

        async def batch_waits() -> bool:
            # The server shows it waiting, and the proxy knows the link that sent it (both
            # seen, in this order, before the cut: a statement of the store's pool waiting on
            # the row is not proof enough that it is the batch's).
            return await waiting(1) and any(
                runs_the_batch(link) for link in proxy.links if not link.closed
            )

        await wait_until(batch_waits, 5.0, "the batch waits on the row")
        cut = proxy.cut(runs_the_batch)
        assert cut == 1, [(link.application_name, link.last_statement[:80]) for link in proxy.links]
        with pytest.raises(Unavailable):
            await orphan

        recovering = asyncio.ensure_future(store.recover(lease.epoch, TimeBase(), HOUR_NS))

        async def recovery_read_or_queued() -> bool:
            # Either recovery reads at once (the orphan still waiting), or it waits for the
            # orphan's outcome behind the same row.
            return recovering.done() or await waiting(2)

        await wait_until(recovery_read_or_queued, 5.0, "recovery either read or queued")
        await blocker.close()  # the orphan gets the row now: it commits, or is fenced out
        blocker = None
        state = await recovering
        await wait_until(none_running, 5.0, "the orphaned statement is over")

        landed = await rows_with_key(schema, "orphan")
        recovered = [t.task_id for t in state.tasks]
        # What recovery returned is what the database holds, now and for good.
        assert recovered == landed, (recovered, landed)
        next_id = max(state.max_task_id, lease.epoch << 40) + 1
        await store.commit(lease.epoch, [task(next_id, "acknowledged")])
        assert await rows_with_key(schema, "acknowledged") == [next_id]
        assert await rows_with_key(schema, "orphan") == landed
    finally:
        if blocker is not None:
            await blocker.close()
        await proxy.close()
        await store.close()


async def test_a_task_id_taken_by_another_task_fails_the_batch_loudly(schema: str) -> None:
    """Ids are never reused; if one were (a bug, a restored backup), the batch that reuses it
    must not be acknowledged with its submission silently dropped: it fails, writing nothing.
    The same batch applied twice (the driver retries a batch whose outcome it did not learn)
    is no conflict."""
    store = await PgStore.connect(DSN, config(schema))
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        first = task(lease.epoch << 40 | 1, "first")
        await store.commit(lease.epoch, [first])
        await store.commit(lease.epoch, [first])  # re-applied as it was: harmless
        assert await rows_with_key(schema, "first") == [first.task_id]

        other = task(lease.epoch << 40 | 2, "other")
        reuse = task(first.task_id, "reuse")
        with pytest.raises(StoreFatal, match=f"task id {first.task_id}"):
            await store.commit(lease.epoch, [other, reuse])
        assert await rows_with_key(schema, "reuse") == []
        assert await rows_with_key(schema, "other") == []  # nothing of that batch was written
        state = await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        assert [t.spec.key for t in state.tasks] == ["first"]
    finally:
        await store.close()


async def test_a_fenced_leader_prunes_nothing(schema: str) -> None:
    """Issue 9, item 8. A leader that has not noticed yet that another instance took over (its
    lock session may look alive for up to session_timeout) keeps pruning on its own timer.
    Its prune is gated on its epoch in the same statement: it raises Fenced and deletes
    nothing; the current leader's prune deletes."""
    cfg = config(schema)
    old = time.time_ns() - 30 * DAY_NS
    store = await PgStore.connect(DSN, cfg)
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        done = task(lease.epoch << 40 | 1, "done", submitted_ns=old)
        await store.commit(lease.epoch, [done, finished(done.task_id, old)])
        # What a takeover writes: the epoch bump (the advisory lock is another matter; the
        # store has not noticed it lost it, as while its keepalive is still waiting).
        await query(f"UPDATE {quote_ident(schema)}.cronoq_leader SET epoch = epoch + 1")

        with pytest.raises(Fenced):
            await store.prune(time.time_ns())
        assert await rows_with_key(schema, "done") == [done.task_id]
    finally:
        await store.close()

    successor = await PgStore.connect(DSN, cfg)
    try:
        lease = await successor.acquire_leadership()
        await successor.recover(lease.epoch, TimeBase(), HOUR_NS)
        # Its own pruning starts with its leadership, and may have been first.
        assert await successor.prune(time.time_ns()) in (0, 1)
        assert await rows_with_key(schema, "done") == []
    finally:
        await successor.close()


async def test_a_store_that_does_not_lead_prunes_nothing(schema: str) -> None:
    cfg = config(schema)
    old = time.time_ns() - 30 * DAY_NS
    leader = await PgStore.connect(DSN, cfg)
    standby = await PgStore.connect(DSN, cfg)
    try:
        lease = await leader.acquire_leadership()
        await leader.recover(lease.epoch, TimeBase(), HOUR_NS)
        done = task(lease.epoch << 40 | 1, "done", submitted_ns=old)
        await leader.commit(lease.epoch, [done, finished(done.task_id, old)])
        with pytest.raises(Fenced):
            await standby.prune(time.time_ns())
        assert await rows_with_key(schema, "done") == [done.task_id]
    finally:
        await standby.close()
        await leader.close()
