"""The lease columns of schema version 2 (issue 19): a database of version 1 is migrated (to the
latest version: 3 adds the pools table of issue 21, 4 the attempts table of issue 22, 5 the
occurrence ledger of issue 32) and its running rows recover without a lease and no pool paused;
a malformed lease is quarantined, not read as None."""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import time
from pathlib import Path

import pytest
from sqlite_harness import SqliteHarness

from cronoq.store import (
    AttemptEnded,
    AttemptLease,
    PoolPaused,
    Status,
    TaskSpec,
    TaskSubmitted,
    TaskUpdated,
    TimeBase,
)
from cronoq_store_sqlite._schema import _MIGRATIONS, SCHEMA_VERSION

LEASE = AttemptLease(7, hashlib.sha256(b"lease id").digest())


def version_1_database(path: Path, now: int) -> None:
    """A file as cronoq-store-sqlite of schema version 1 left it: one task running (the
    attempt of a remote worker, of which version 1 kept nothing) and one ready."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("CREATE TABLE cronoq_schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO cronoq_schema_version VALUES (1)")
        conn.executescript(_MIGRATIONS[0])
        conn.execute("UPDATE cronoq_leader SET epoch = 3, max_task_id = 2")
        for task_id, status, attempt in ((1, "running", 1), (2, "ready", 0)):
            conn.execute(
                "INSERT INTO cronoq_tasks (id, pool, kind, key, payload, options, status, "
                "attempt, message, submitted_ns, updated_ns) "
                "VALUES (?, 'default', 'job', NULL, x'01', '{}', ?, ?, 'm', ?, ?)",
                (task_id, status, attempt, now, now),
            )


def schema_version(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT version FROM cronoq_schema_version").fetchone()[0])


async def test_a_version_1_database_is_migrated_and_its_running_rows_have_no_lease(
    tmp_path: Path,
) -> None:
    assert SCHEMA_VERSION == 5
    path = tmp_path / "old.db"
    now = time.time_ns()
    version_1_database(path, now)
    harness = SqliteHarness(path)
    try:
        store = await harness.open()
        assert schema_version(path) == 5
        lease = await store.acquire_leadership()
        assert lease.epoch == 4
        state = await store.recover(lease.epoch, TimeBase(), 3600 * 10**9)
        assert [(r.task_id, r.status, r.lease) for r in state.tasks] == [
            (1, Status.RUNNING, None),
            (2, Status.READY, None),
        ]
        assert state.quarantined == []
        assert state.paused_pools == frozenset()
        # The migrated tables take leases and pauses like new ones.
        await store.commit(
            lease.epoch,
            [
                TaskUpdated(2, Status.RUNNING, 1, "started", 5, lease=LEASE),
                PoolPaused("default", paused=True),
                AttemptEnded(1, 1, 3, 6, "timed out"),
            ],
        )
        assert (record := await store.get_task(2)) is not None
        assert record.lease == LEASE
        assert await store.get_attempts(1) == [AttemptEnded(1, 1, 3, 6, "timed out")]
        await harness.crash(store)
        other = await harness.open()
        taken = await other.acquire_leadership()
        recovered = await other.recover(taken.epoch, TimeBase(), 3600 * 10**9)
        assert recovered.paused_pools == {"default"}
    finally:
        await harness.close_all()


@pytest.mark.parametrize(
    ("lease_epoch", "lease_hash"),
    [(7, b"short"), (None, b"h" * 32), (7, None), (7, "text, not bytes"), ("seven", b"h" * 32)],
)
async def test_a_malformed_lease_quarantines_its_row(
    tmp_path: Path, lease_epoch: object, lease_hash: object
) -> None:
    path = tmp_path / "cronoq.db"
    harness = SqliteHarness(path)
    try:
        store = await harness.open()
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), 3600 * 10**9)
        await store.commit(lease.epoch, [submitted(1), submitted(2)])
        await store.commit(
            lease.epoch,
            [
                TaskUpdated(1, Status.RUNNING, 1, "started", 5, lease=LEASE),
                TaskUpdated(2, Status.RUNNING, 1, "started", 5, lease=LEASE),
            ],
        )
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute(
                "UPDATE cronoq_tasks SET lease_epoch = ?, lease_hash = ? WHERE id = 1",
                (lease_epoch, lease_hash),
            )
        await harness.crash(store)
        other = await harness.open()
        taken = await other.acquire_leadership()
        state = await other.recover(taken.epoch, TimeBase(), 3600 * 10**9)
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
        await harness.close_all()


def submitted(task_id: int) -> TaskSubmitted:
    return TaskSubmitted(task_id, TaskSpec("default", "job", b""), Status.READY, 1)
