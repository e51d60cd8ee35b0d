"""The lease columns of schema version 3 (issue 19): a schema of version 2 is migrated (to the
latest: 4 adds the pools table, 5 the attempts table of issue 22, 6 the outbox, 7 the occurrence
ledger of issue 32) and its running rows recover without a lease; a malformed lease is
quarantined, not read as None."""

from __future__ import annotations

import hashlib
import time

import asyncpg
import pytest
from pg_fault_helpers import config, query
from pg_harness import DSN, create_at_version

from cronoq.store import (
    AttemptEnded,
    AttemptLease,
    Status,
    TaskSpec,
    TaskSubmitted,
    TaskUpdated,
    TimeBase,
)
from cronoq_store_postgres import PgStore
from cronoq_store_postgres._schema import SCHEMA_VERSION, quote_ident

LEASE = AttemptLease(7, hashlib.sha256(b"lease id").digest())
HOUR_NS = 3600 * 10**9


async def version_2_schema(schema: str, now: int) -> None:
    """A schema as cronoq-store-postgres of version 2 left it: one task running (a remote
    worker's attempt, of which version 2 kept nothing) and one ready."""
    s = quote_ident(schema)
    conn = await asyncpg.connect(DSN)
    try:
        async with conn.transaction():
            await create_at_version(conn, schema, 2)
            await conn.execute(f"UPDATE {s}.cronoq_leader SET epoch = 3, max_task_id = 2")
            for task_id, status, attempt in ((1, "running", 1), (2, "ready", 0)):
                await conn.execute(
                    f"INSERT INTO {s}.cronoq_tasks (id, pool, kind, payload, options, after_ids, "
                    "status, attempt, message, submitted_ns, updated_ns) "
                    "VALUES ($1, 'default', 'job', '\\x01', '{}', '{}', $2, $3, 'm', $4, $4)",
                    task_id, status, attempt, now,
                )  # fmt: skip
    finally:
        await conn.close()


async def test_a_version_2_schema_is_migrated_and_its_running_rows_have_no_lease(
    schema: str,
) -> None:
    assert SCHEMA_VERSION == 7  # what this test knows the upgrade leads to (issue 32: 7)
    await version_2_schema(schema, time.time_ns())
    store = await PgStore.connect(DSN, config(schema))
    try:
        rows = await query(f"SELECT version FROM {quote_ident(schema)}.cronoq_schema_version")
        assert [r["version"] for r in rows] == [SCHEMA_VERSION]
        lease = await store.acquire_leadership()
        assert lease.epoch == 4
        state = await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        assert [(r.task_id, r.status, r.lease) for r in state.tasks] == [
            (1, Status.RUNNING, None),
            (2, Status.READY, None),
        ]
        assert state.quarantined == []
        assert state.paused_pools == frozenset()
        # The migrated tables take leases and attempts like new ones.
        ended = AttemptEnded(1, 1, 3, 6, "timed out")
        await store.commit(
            lease.epoch, [TaskUpdated(2, Status.RUNNING, 1, "started", 5, lease=LEASE), ended]
        )
        assert (record := await store.get_task(2)) is not None
        assert record.lease == LEASE
        assert await store.get_attempts(1) == [ended]
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("lease_epoch", "lease_hash"), [(7, b"short"), (None, b"h" * 32), (7, None), (-1, b"h" * 32)]
)
async def test_a_malformed_lease_quarantines_its_row(
    schema: str, lease_epoch: int | None, lease_hash: bytes | None
) -> None:
    store = await PgStore.connect(DSN, config(schema))
    other: PgStore | None = None
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        spec = TaskSpec("default", "job", b"")
        await store.commit(lease.epoch, [TaskSubmitted(i, spec, Status.READY, 1) for i in (1, 2)])
        await store.commit(
            lease.epoch,
            [TaskUpdated(i, Status.RUNNING, 1, "started", 5, lease=LEASE) for i in (1, 2)],
        )
        await query(
            f"UPDATE {quote_ident(schema)}.cronoq_tasks SET lease_epoch = $1, lease_hash = $2 "
            "WHERE id = 1",
            lease_epoch, lease_hash,
        )  # fmt: skip
        await store.close()
        other = await PgStore.connect(DSN, config(schema))
        taken = await other.acquire_leadership()
        state = await other.recover(taken.epoch, TimeBase(), HOUR_NS)
        assert [task_id for task_id, _ in state.quarantined] == [1]
        assert "lease" in state.quarantined[0][1]
        assert [(r.task_id, r.lease) for r in state.tasks if not r.status.is_terminal] == [
            (2, LEASE)
        ]
        # Quarantined: failed, and a failed row holds no lease, so lookups decode it again.
        assert (record := await other.get_task(1)) is not None
        assert (record.status, record.lease) == (Status.FAILED, None)
        assert record.message.startswith("quarantined: ")
    finally:
        await store.close()
        if other is not None:
            await other.close()
