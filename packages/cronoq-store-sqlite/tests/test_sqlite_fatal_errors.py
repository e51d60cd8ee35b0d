"""Fatal and transient errors: only contention and a full disk are retried; a read-only,
unreachable or corrupt file stops the scheduler with an error that says so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import sqlite_unprivileged
from sqlite_harness import FAST

from cronoq import Pool, Scheduler, SchedulerError, TaskContext
from cronoq.errors import Fenced, StoreFatal, Unavailable
from cronoq.store import Mutation, Status, TaskSpec, TaskSubmitted, TaskUpdated
from cronoq_store_sqlite import SqliteStore
from cronoq_store_sqlite._errors import classify

DAY_NS = 24 * 3600 * 1_000_000_000
# Long enough that a fatal error retried as if transient would be seen to hang.
COMMIT_TIMEOUT = 30.0
PROMPTLY = 5.0
# Nothing here is old enough to be pruned: a deletion writes pages the tests smash, and
# make_database's finished rows must stay.
KEEP = replace(FAST, keep_finished=365 * 24 * 3600.0)


async def make_database(db: Path, tasks: int = 300) -> None:
    """A real cronoq database: live tasks and tasks that finished long ago (prunable)."""
    store = await SqliteStore.open(db, KEEP)
    try:
        epoch = (await store.acquire_leadership()).epoch
        old = time.time_ns() - 30 * DAY_NS
        spec = TaskSpec("default", "job", b"p" * 500)
        batch: list[Mutation] = []
        for task_id in range(1, tasks + 1):
            batch.append(TaskSubmitted(task_id, spec, Status.READY, old))
            if task_id % 2:
                batch.append(TaskUpdated(task_id, Status.SUCCEEDED, 1, "ok", old, output=b"o"))
        await store.commit(epoch, batch)
    finally:
        await store.close()


def root_page(db: Path, name: str) -> tuple[int, int]:
    """(page size, root page number) of a table or index."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        [(size,)] = conn.execute("PRAGMA page_size").fetchall()
        [(page,)] = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (name,)
        ).fetchall()
    return size, page


def smash_page(db: Path, name: str) -> None:
    """Overwrite the root page of a table or index in the file with garbage."""
    size, page = root_page(db, name)
    with open(db, "r+b") as file:
        file.seek((page - 1) * size)
        file.write(b"\xa5" * size)


def smash_header(db: Path) -> None:
    with open(db, "r+b") as file:
        file.write(b"this is not a SQLite header".ljust(100, b"\x00"))


def smash_behind_the_store(db: Path, name: str) -> None:
    """Smash a page of a file the store has open, so that its next read of the page fails.

    The page must be in the file, not in the WAL (a checkpoint moves it there), and no writer
    may put a sound copy of it in the WAL before the store reads it again: the smashing happens
    under SQLite's write lock, into an empty WAL, and a write then makes every connection drop
    its page cache at its next transaction.
    """
    size, page = root_page(db, name)
    with contextlib.closing(sqlite3.connect(db, isolation_level=None, timeout=5)) as conn:
        for _ in range(100):
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("BEGIN IMMEDIATE")
            if os.stat(f"{db}-wal").st_size == 0:
                break
            conn.execute("ROLLBACK")  # a writer came between the checkpoint and the lock
        else:
            raise AssertionError("the WAL never emptied: a reader holds an old snapshot")
        with open(db, "r+b") as file:
            file.seek((page - 1) * size)
            file.write(b"\xa5" * size)
        conn.execute("UPDATE cronoq_schema_version SET version = version")
        conn.execute("COMMIT")


async def smash_while_open(db: Path, name: str) -> None:
    await asyncio.to_thread(smash_behind_the_store, db, name)


def says_fatal(error: BaseException, db: Path, code: str) -> None:
    message = str(error)
    assert str(db) in message and code in message, message


def gave_up_for_corruption(
    reason: BaseException | None, db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The store stopped leading because the file is damaged, said so, and logged it as an
    error naming the file, not as a takeover."""
    assert isinstance(reason, StoreFatal), reason
    says_fatal(reason, db, "SQLITE_CORRUPT")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("SQLITE_CORRUPT" in m and str(db) in m for m in errors), caplog.text
    assert "taken over" not in caplog.text, "a damaged file is not a takeover"


async def noop(ctx: TaskContext, payload: bytes) -> None:
    return None


# --- the classification of real SQLite errors --------------------------------------------------


def wal_database(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(100)])
    return conn


def busy(db: Path) -> None:
    holder = wal_database(db)
    holder.execute("BEGIN IMMEDIATE")
    with contextlib.closing(sqlite3.connect(db, isolation_level=None, timeout=0)) as other:
        try:
            other.execute("BEGIN IMMEDIATE")
        finally:
            holder.close()


def busy_snapshot(db: Path) -> None:
    reader = wal_database(db)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM t").fetchall()  # the snapshot starts here
        with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as writer:
            writer.execute("INSERT INTO t VALUES (1)")
        reader.execute("INSERT INTO t VALUES (2)")  # a write on an outdated snapshot
    finally:
        reader.close()


def locked(db: Path) -> None:
    with contextlib.closing(wal_database(db)) as conn:
        reading = conn.execute("SELECT x FROM t")
        reading.fetchone()
        conn.execute("DROP TABLE t")  # while a statement of the same connection reads it


def full(db: Path) -> None:
    with contextlib.closing(wal_database(db)) as conn:
        [(pages,)] = conn.execute("PRAGMA page_count").fetchall()
        conn.execute(f"PRAGMA max_page_count = {pages + 1}")
        conn.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))


def read_only(db: Path) -> None:
    wal_database(db).close()
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        conn.execute("INSERT INTO t VALUES (1)")


def cannot_open(db: Path) -> None:
    sqlite3.connect(db.parent / "missing" / "x.db")


def not_a_database(db: Path) -> None:
    wal_database(db).close()
    smash_header(db)
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("SELECT * FROM t").fetchall()


def corrupt(db: Path) -> None:
    with contextlib.closing(wal_database(db)) as conn:
        conn.executemany("INSERT INTO t VALUES (?)", [(b"y" * 500,) for _ in range(200)])
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    smash_page(db, "t")
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("SELECT count(*) FROM t").fetchall()


def constraint(db: Path) -> None:
    with contextlib.closing(wal_database(db)) as conn:
        conn.execute("CREATE TABLE u (id INTEGER PRIMARY KEY)")
        conn.execute("INSERT INTO u VALUES (1)")
        conn.execute("INSERT INTO u VALUES (1)")


def closed(db: Path) -> None:
    conn = wal_database(db)
    conn.close()
    conn.execute("SELECT 1")


@pytest.mark.parametrize(
    ("make_error", "code", "kind"),
    [
        (busy, "SQLITE_BUSY", Unavailable),
        (busy_snapshot, "SQLITE_BUSY_SNAPSHOT", Unavailable),
        (locked, "SQLITE_LOCKED", Unavailable),
        (full, "SQLITE_FULL", Unavailable),
        (read_only, "SQLITE_READONLY", StoreFatal),
        (cannot_open, "SQLITE_CANTOPEN", StoreFatal),
        (not_a_database, "SQLITE_NOTADB", StoreFatal),
        (corrupt, "SQLITE_CORRUPT", StoreFatal),
        (constraint, "SQLITE_CONSTRAINT_PRIMARYKEY", StoreFatal),
        (closed, "ProgrammingError", StoreFatal),
    ],
    ids=lambda value: value.__name__ if callable(value) else None,
)
def test_only_contention_and_a_full_disk_are_transient(
    tmp_path: Path, make_error: Callable[[Path], None], code: str, kind: type[Exception]
) -> None:
    db = tmp_path / "errors.db"
    with pytest.raises(sqlite3.Error) as raised:
        make_error(db)
    name = getattr(raised.value, "sqlite_errorname", None) or type(raised.value).__name__
    assert name == code, f"the premise: {make_error.__name__} raised {name}, not {code}"
    error = classify(raised.value, "doing something", str(db))
    assert type(error) is kind, f"{code} is {type(error).__name__}: {error}"
    says_fatal(error, db, code)


# --- permissions --------------------------------------------------------------------------


def make_read_only_file(db: Path) -> None:
    db.chmod(0o400)


def make_read_only_directory(db: Path) -> None:
    db.parent.chmod(0o500)  # the closed database has no -wal: it cannot be created


@pytest.mark.skipif(os.name != "posix", reason="file modes are a Unix matter")
@pytest.mark.parametrize(
    "seal", [make_read_only_file, make_read_only_directory], ids=["file-0400", "directory-0500"]
)
async def test_a_file_this_process_may_not_write_is_fatal_with_the_reason(
    tmp_path: Path, seal: Callable[[Path], None]
) -> None:
    directory = tmp_path / "sealed"
    directory.mkdir()
    db = directory / "cronoq.db"
    await make_database(db)
    seal(db)
    try:
        # Root ignores modes: the check runs in a process without that privilege.
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, sqlite_unprivileged.__file__, str(db)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        directory.chmod(0o700)
        db.chmod(0o600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(f"cannot run a process that file modes apply to: {report['skip']}")
    assert report["denied"], "the premise: the process is refused writing there"
    kind, message = report["store"]
    assert kind == "StoreFatal", report
    assert str(db) in message and "Permission denied" in message, message
    # Past the store's own check, SQLite's error for the same write is fatal too.
    kind, code, _ = report["sqlite"]
    assert kind == "StoreFatal" and code.startswith("SQLITE_READONLY"), report


# --- corruption -------------------------------------------------------------------------------


async def test_a_file_with_a_corrupt_header_is_fatal_at_open(tmp_path: Path) -> None:
    db = tmp_path / "header.db"
    await make_database(db)
    smash_header(db)
    with pytest.raises(StoreFatal) as raised:
        async with asyncio.timeout(PROMPTLY):
            await SqliteStore.open(db, FAST)
    # Refused by the store's own look, before SQLite opens it: a smashed header cannot be
    # told from a file that never was a database, so the message says both.
    says_fatal(raised.value, db, "not a SQLite database")
    assert "backup" in str(raised.value)


async def test_a_corrupt_table_fails_the_start_instead_of_being_retried(tmp_path: Path) -> None:
    db = tmp_path / "table.db"
    await make_database(db)
    smash_page(db, "cronoq_tasks")
    store = await SqliteStore.open(db, KEEP)  # the schema is intact: opening works
    scheduler = Scheduler([Pool("default", noop)], store=store, commit_timeout=COMMIT_TIMEOUT)
    try:
        with pytest.raises(StoreFatal) as raised:
            async with asyncio.timeout(PROMPTLY):
                await scheduler.start()
        says_fatal(raised.value, db, "SQLITE_CORRUPT")
    finally:
        await scheduler.close()
        await store.close()


async def test_corruption_met_by_a_commit_stops_the_scheduler_with_that_error(
    tmp_path: Path,
) -> None:
    db = tmp_path / "running.db"
    await make_database(db)
    store = await SqliteStore.open(db, KEEP)
    scheduler = Scheduler([Pool("default", noop)], store=store, commit_timeout=COMMIT_TIMEOUT)
    try:
        await scheduler.start()
        await scheduler.wait(await scheduler.submit("job", b"before"))
        await smash_while_open(db, "cronoq_tasks")
        started = time.monotonic()
        with pytest.raises(SchedulerError) as raised:
            async with asyncio.timeout(PROMPTLY):
                await scheduler.submit("job", b"after")
        took = time.monotonic() - started
        assert took < PROMPTLY, f"the fatal error was retried for {took:.1f}s"
        assert "SQLITE_CORRUPT" in str(raised.value)
        assert isinstance(scheduler.failure, StoreFatal), scheduler.failure
        says_fatal(scheduler.failure, db, "SQLITE_CORRUPT")
        assert not scheduler.running
    finally:
        # Stopped already when the test passes; when it fails, a scheduler still retrying
        # might not close while its store is unusable: end it as a crash would.
        scheduler.abort()
        await store.close()


async def test_a_fatal_error_in_background_pruning_gives_up_leadership(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "prune.db"
    await make_database(db)
    # Prune often. Each pruning reads the index of finished tasks, which is what gets smashed
    # (commits of live tasks never read it); with KEEP it finds nothing to delete.
    config = replace(KEEP, prune_interval=0.05)
    store = await SqliteStore.open(db, config)
    try:
        epoch = (await store.acquire_leadership()).epoch
        with caplog.at_level(logging.WARNING, logger="cronoq.sqlite"):
            await smash_while_open(db, "cronoq_tasks_finished")
            # Not retried every prune_interval for ever: the store stops leading at once.
            async with asyncio.timeout(PROMPTLY):
                reason = await store.leadership_lost()
        # The scheduler is told why (it stops with this as its failure).
        gave_up_for_corruption(reason, db, caplog)
        # Though the lease row still names it, the instance that gave up writes nothing.
        with pytest.raises(Fenced):
            await store.commit(
                epoch, [TaskSubmitted(1001, TaskSpec("d", "j", b""), Status.READY, 1)]
            )
        assert await store.get_task(1001) is None
    finally:
        await store.close()


async def test_a_fatal_error_renewing_the_lease_gives_up_leadership_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "lease.db"
    await make_database(db)
    store = await SqliteStore.open(db, KEEP)
    try:
        await store.acquire_leadership()
        with caplog.at_level(logging.WARNING, logger="cronoq.sqlite"):
            await smash_while_open(db, "cronoq_leader")
            async with asyncio.timeout(FAST.lease_renew + PROMPTLY):
                reason = await store.leadership_lost()
        gave_up_for_corruption(reason, db, caplog)
    finally:
        await store.close()


async def test_a_scheduler_whose_store_gave_up_leadership_stops_with_the_stores_reason(
    tmp_path: Path,
) -> None:
    db = tmp_path / "reason.db"
    await make_database(db)
    store = await SqliteStore.open(db, KEEP)
    scheduler = Scheduler([Pool("default", noop)], store=store, commit_timeout=COMMIT_TIMEOUT)
    try:
        await scheduler.start()
        await smash_while_open(db, "cronoq_leader")  # the next lease renewal meets it
        async with asyncio.timeout(FAST.lease_renew + PROMPTLY):
            await scheduler.leadership_lost()
        # Not a generic "leadership was lost": the error the store gave up on.
        assert isinstance(scheduler.failure, StoreFatal), scheduler.failure
        says_fatal(scheduler.failure, db, "SQLITE_CORRUPT")
    finally:
        scheduler.abort()
        await store.close()
