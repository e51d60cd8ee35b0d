"""The file, its pragmas and its schema. Migrations are applied under SQLite's write lock."""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import time
from typing import Any

from cronoq.errors import StoreFatal
from cronoq_store_sqlite._errors import classify
from cronoq_store_sqlite._ownership import refuse_unless_ours

SCHEMA_VERSION = 5

# Each entry moves the schema from version i to i + 1.
_MIGRATIONS = [
    """
    CREATE TABLE cronoq_leader (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        epoch INTEGER NOT NULL,
        holder TEXT,
        expires_ns INTEGER NOT NULL,
        max_task_id INTEGER NOT NULL
    );
    INSERT INTO cronoq_leader VALUES (1, 0, NULL, 0, 0);
    CREATE TABLE cronoq_tasks (
        id INTEGER PRIMARY KEY,
        pool TEXT NOT NULL,
        kind TEXT NOT NULL,
        key TEXT,
        payload BLOB NOT NULL,
        options TEXT NOT NULL,
        status TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        message TEXT NOT NULL,
        submitted_ns INTEGER NOT NULL,
        updated_ns INTEGER NOT NULL,
        due_ns INTEGER,
        finished_ns INTEGER,
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        output BLOB
    );
    CREATE INDEX cronoq_tasks_key ON cronoq_tasks (key, id) WHERE key IS NOT NULL;
    CREATE INDEX cronoq_tasks_live ON cronoq_tasks (id) WHERE finished_ns IS NULL;
    CREATE INDEX cronoq_tasks_finished ON cronoq_tasks (finished_ns)
        WHERE finished_ns IS NOT NULL;
    CREATE TABLE cronoq_schedules (
        name TEXT PRIMARY KEY,
        spec TEXT NOT NULL,
        next_ns INTEGER NOT NULL,
        paused INTEGER NOT NULL,
        last_task_id INTEGER
    );
    """,
    # The lease of a running remote attempt (cronoq.store.AttemptLease): the epoch that
    # started it and the SHA-256 of its lease id, both NULL when the row has none. Adding a
    # nullable column rewrites no row: the rows of version 1 read as having no lease.
    """
    ALTER TABLE cronoq_tasks ADD COLUMN lease_epoch INTEGER;
    ALTER TABLE cronoq_tasks ADD COLUMN lease_hash BLOB;
    """,
    # Pools an operator paused (cronoq.store.PoolPaused), by name: a row per pool ever paused
    # or resumed, so that a pause outlives the leader that took it.
    """
    CREATE TABLE cronoq_pools (
        name TEXT PRIMARY KEY,
        paused INTEGER NOT NULL
    );
    """,
    # The attempts that ended without success (cronoq.store.AttemptEnded), the latest
    # ATTEMPTS_KEPT of each task, deleted with its row: a new table. And the start of each
    # task's latest attempt, kept once it ends: a nullable column rewrites no row (the rows of
    # version 3 read as having none).
    """
    ALTER TABLE cronoq_tasks ADD COLUMN started_ns INTEGER;
    CREATE TABLE cronoq_attempts (
        task_id INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        started_ns INTEGER NOT NULL,
        ended_ns INTEGER NOT NULL,
        message TEXT NOT NULL,
        PRIMARY KEY (task_id, attempt)
    ) WITHOUT ROWID;
    """,
    # The occurrence ledger (cronoq.store.OccurrenceRecorded): a record per schedule and due
    # time, kept whether or not the schedule still exists, and pruned by its due time (the
    # index) with the finished tasks. A new table: no existing row is touched.
    """
    CREATE TABLE cronoq_occurrences (
        schedule TEXT NOT NULL,
        due_ns INTEGER NOT NULL,
        until_ns INTEGER NOT NULL,
        outcome TEXT NOT NULL,
        task_id INTEGER,
        at_ns INTEGER NOT NULL,
        message TEXT NOT NULL,
        PRIMARY KEY (schedule, due_ns)
    ) WITHOUT ROWID;
    CREATE INDEX cronoq_occurrences_until ON cronoq_occurrences (until_ns);
    """,
]
assert len(_MIGRATIONS) == SCHEMA_VERSION


def prepare_file(path: str) -> None:
    """Create the database owner-only (0600), or tighten an existing one and its journals
    once it is known to be the store's (``refuse_unless_ours``).

    SQLite gives the -wal and -shm files the database file's mode, so a 0600 database keeps
    its journals private too; under the usual umask a file SQLite created itself is 0644.
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:  # a directory too: checked here, so that no race skips the check
        refuse_unless_ours(path)
        for name in (path, f"{path}-wal", f"{path}-shm"):
            try:
                mode = stat.S_IMODE(os.stat(name).st_mode)
                if mode & 0o077:
                    os.chmod(name, mode & 0o700)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StoreFatal(
                    f"cannot restrict {name!r} to its owner (mode 0600): {exc.strerror}"
                ) from exc
    except OSError as exc:
        raise StoreFatal(f"cannot create the SQLite database {path!r}: {exc.strerror}") from exc
    else:
        os.close(fd)
    # SQLite must write the file and create its -wal and -shm files beside it; without that it
    # only says "unable to open database file".
    directory = os.path.dirname(os.path.abspath(path))
    for target in (path, directory):
        if not os.access(target, os.W_OK):
            read_only = os.statvfs(target).f_flag & os.ST_RDONLY
            why = os.strerror(errno.EROFS if read_only else errno.EACCES)
            raise StoreFatal(
                f"cannot use the SQLite database {path!r}: {target!r} is not writable ({why})"
            )


def configure(
    conn: sqlite3.Connection, *, full_sync: bool, busy_timeout_ms: int, journal_size_limit: int
) -> None:
    """Per-connection settings; ``synchronous`` is read back, since a wrong one loses data."""
    conn.execute(f"PRAGMA busy_timeout = {busy_timeout_ms:d}")
    # Opening waits its turn longer than a commit waits for the lock (which the scheduler retries).
    row = _switch_to_wal(conn, max(5.0, 10 * busy_timeout_ms / 1000))
    if row is None or str(row[0]).lower() != "wal":
        raise StoreFatal(f"SQLite refused WAL journaling (journal_mode is {row!r})")
    wanted = 2 if full_sync else 1  # FULL: the WAL is synced at every commit; NORMAL: not
    conn.execute(f"PRAGMA synchronous = {wanted:d}")
    row = conn.execute("PRAGMA synchronous").fetchone()
    if row is None or row[0] != wanted:
        raise StoreFatal(f"PRAGMA synchronous is {row!r}, expected {wanted}")
    conn.execute(f"PRAGMA journal_size_limit = {journal_size_limit:d}")
    conn.execute("PRAGMA foreign_keys = OFF")


MIN_SQLITE = (3, 24, 0)
"""The first SQLite with upserts (``INSERT ... ON CONFLICT``), which commits use."""


def check_features(conn: sqlite3.Connection) -> None:
    """Refuse, with what is missing, a SQLite library the store's statements would fail on:
    one older than MIN_SQLITE, or one built without the JSON functions (recovery uses them)."""
    version = str(conn.execute("SELECT sqlite_version()").fetchone()[0])
    numbers = tuple(int(part) if part.isdigit() else 0 for part in version.split(".")[:3])
    if numbers + (0,) * (3 - len(numbers)) < MIN_SQLITE:
        raise StoreFatal(
            f"this Python's SQLite is {version}; cronoq-store-sqlite needs "
            f"{'.'.join(map(str, MIN_SQLITE))} or newer"
        )
    try:
        conn.execute("SELECT json_valid('{}')").fetchone()
    except sqlite3.OperationalError as exc:
        raise StoreFatal(
            f"this Python's SQLite ({version}) lacks the JSON functions ({exc}); "
            "cronoq-store-sqlite needs a build with them (built in since 3.38)"
        ) from exc


def _switch_to_wal(conn: sqlite3.Connection, timeout: float) -> Any:
    """``PRAGMA journal_mode = WAL``, retried while another connection switches a new file too.

    The switch upgrades a read lock to a write lock; when two connections try it at once, SQLite
    answers one of them SQLITE_BUSY at once, without the busy handler (waiting could deadlock).
    It runs on the connection's own thread, which may sleep.
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            return conn.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.OperationalError as exc:
            busy = getattr(exc, "sqlite_errorname", "") == "SQLITE_BUSY"
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def migrate(conn: sqlite3.Connection, path: str | None = None) -> None:
    """Bring the schema to SCHEMA_VERSION under the write lock, or refuse a newer one."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _version(conn)
            if version > SCHEMA_VERSION:
                raise StoreFatal(
                    f"the database schema is version {version}, newer than this build of "
                    f"cronoq-store-sqlite supports ({SCHEMA_VERSION}); upgrade it"
                )
            if version == 0:
                conn.execute("CREATE TABLE cronoq_schema_version (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO cronoq_schema_version VALUES (0)")
            for step in range(version, SCHEMA_VERSION):
                for statement in _MIGRATIONS[step].split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute("UPDATE cronoq_schema_version SET version = ?", (step + 1,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise classify(exc, "migrating the schema", path) from exc


def _version(conn: sqlite3.Connection) -> int:
    found = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'cronoq_schema_version'"
    ).fetchone()
    if found is None:
        return 0
    row = conn.execute("SELECT version FROM cronoq_schema_version").fetchone()
    if row is None or not isinstance(row[0], int):
        raise StoreFatal(f"cronoq_schema_version holds {row!r}, not a version number")
    return int(row[0])
