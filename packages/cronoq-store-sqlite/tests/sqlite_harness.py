"""The SQLite store's conformance harness, with short timings, for every test module here."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import cronoq_store_sqlite._schema
from cronoq.store import Store, encode_schedule_spec
from cronoq_conformance import (
    Capability,
    ClusterRows,
    DatabaseCondition,
    StoreHarness,
    run_in_python,
    task_row,
)
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig

# Short timings: a crashed leader's lease runs out in 1 s; a held write lock is reported as
# Unavailable after 0.1 s.
FAST = SqliteStoreConfig(lock_poll=0.05, lease_renew=0.25, lease_ttl=1.0, busy_timeout=0.1)


class SqliteHarness(StoreHarness):
    # LATE_STATEMENT: an instance runs its transactions one after the other on its data
    # connection's thread, on a local file, so no statement of a failed commit can reach the
    # database after a later recovery of that instance (docs/stores/writing-a-store.md).
    # SUPERSEDE: PAUSE replaces a leader behind its back for real (its lease runs out).
    # OUTBOX: SqliteStore offers no outbox; the kit checks that it has none.
    capabilities = frozenset(Capability) - {
        Capability.LATE_STATEMENT,
        Capability.SUPERSEDE,
        Capability.OUTBOX,
    }
    # CANNOT_OPEN and CONNECTION_REFUSED: an open connection keeps its files open, and there
    # is no server to refuse it; test_sqlite_fatal_errors classifies SQLITE_CANTOPEN.
    conditions = frozenset(
        {DatabaseCondition.READ_ONLY, DatabaseCondition.PERMISSION_DENIED, DatabaseCondition.BUSY}
    )
    # Every version a file of an earlier cronoq-store-sqlite may still be at.
    earlier_schema_versions = tuple(range(1, cronoq_store_sqlite._schema.SCHEMA_VERSION))
    leadership_timeout = FAST.lease_ttl + FAST.lock_poll + 2.0
    # Well under the lease: a release that leaves the lease to run out takes about 1 s.
    handover_timeout = 0.5

    def __init__(self, path: Path, config: SqliteStoreConfig = FAST) -> None:
        self.path = path
        self.config = config
        self.opened: list[SqliteStore] = []
        self._blocker: sqlite3.Connection | None = None
        self._paused: dict[SqliteStore, tuple[threading.Event, list[asyncio.Task[bool]]]] = {}
        self._foreign: list[sqlite3.Connection] = []

    async def open(self) -> Store:
        store = await SqliteStore.open(self.path, self.config)
        self.opened.append(store)
        return store

    @staticmethod
    def _sqlite(instance: Store) -> SqliteStore:
        assert isinstance(instance, SqliteStore)
        return instance

    async def crash(self, instance: Store) -> None:
        await self._sqlite(instance).abandon()

    def _backdoor(self) -> sqlite3.Connection:
        """A connection outside the store, as another program editing the file would be.

        Use it from a thread (``_outside``): blocking the event loop on SQLite's lock while the
        store's own transaction needs the loop to finish would deadlock.
        """
        return sqlite3.connect(self.path, isolation_level=None, timeout=5, check_same_thread=False)

    async def _outside(self, sql: str, *params: object) -> None:
        def run() -> None:
            with contextlib.closing(self._backdoor()) as conn:
                conn.execute(sql, params)

        await asyncio.to_thread(run)

    async def set_available(self, instance: Store, available: bool) -> None:
        # Holding SQLite's write lock from elsewhere makes the store's writes time out BUSY.
        if not available and self._blocker is None:
            blocker = self._backdoor()
            await asyncio.to_thread(blocker.execute, "BEGIN IMMEDIATE")
            self._blocker = blocker
        elif available and self._blocker is not None:
            self._blocker.close()  # closing rolls the transaction back and frees the lock
            self._blocker = None

    async def fail_next_commit_midway(self, instance: Store) -> None:
        # A temporary trigger on the store's own connection aborts the first task update of
        # the next batch, after its inserts ran; a Python flag makes it fire only once.
        armed = [True]

        def fire() -> bool:
            fired, armed[0] = armed[0], False
            return fired

        def arm(db: sqlite3.Connection) -> None:
            db.create_function("cronoq_test_fault", 0, fire)
            db.execute(
                "CREATE TEMP TRIGGER IF NOT EXISTS cronoq_test_fault BEFORE UPDATE ON "
                "main.cronoq_tasks WHEN cronoq_test_fault() "
                "BEGIN SELECT RAISE(ABORT, 'injected fault in the middle of a batch'); END"
            )

        await self._sqlite(instance)._conn.run(arm)

    async def corrupt_task(self, instance: Store, task_id: int) -> None:
        await self._outside("UPDATE cronoq_tasks SET options = '{broken' WHERE id = ?", task_id)

    async def set_schema_newer(self, instance: Store) -> None:
        await self._outside("UPDATE cronoq_schema_version SET version = version + 100")

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        await self._sqlite(instance).prune(horizon_unix_ns)

    async def pause(self, instance: Store) -> None:
        # Holding the threads of the instance's connections (data and lease) freezes it as
        # SIGSTOP would: its lease renewal and everything else wait, the lease runs out, a
        # standby may take over.
        store = self._sqlite(instance)
        gate = threading.Event()
        started = [threading.Event(), threading.Event()]

        def hold(running: threading.Event) -> Callable[[sqlite3.Connection], bool]:
            def held(_: sqlite3.Connection) -> bool:
                running.set()
                return gate.wait()

            return held

        holds = [
            asyncio.create_task(conn.run(hold(running)))
            for conn, running in zip((store._conn, store._lease_conn), started, strict=True)
        ]
        self._paused[store] = (gate, holds)
        # Frozen once both threads hold: what was running before has finished.
        assert await asyncio.to_thread(lambda: all(e.wait(10) for e in started))

    async def resume(self, instance: Store) -> None:
        gate, holds = self._paused.pop(self._sqlite(instance))
        gate.set()
        await asyncio.gather(*holds)

    async def fail_commits_fatally(self, instance: Store) -> None:
        # An authorizer refusing writes to the task and schedule tables fails each commit with
        # SQLITE_AUTH, as a file the process may no longer write would; the lease row stays
        # writable, so the failure is the commit's, not a lost lease.
        def authorize(action: int, table: str | None, *_: object) -> int:
            writes = (sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE)
            if action in writes and table in ("cronoq_tasks", "cronoq_schedules"):
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK

        await self._sqlite(instance)._conn.run(lambda db: db.set_authorizer(authorize))

    async def meet_condition(self, instance: Store, condition: DatabaseCondition) -> None:
        store = self._sqlite(instance)
        if condition is DatabaseCondition.READ_ONLY:
            # SQLite's own read-only mode on the store's data connection: every write fails
            # with SQLITE_READONLY (an OperationalError, like SQLITE_BUSY), as on a file this
            # process may only read.
            await store._conn.run(lambda db: db.execute("PRAGMA query_only = ON"))
        elif condition is DatabaseCondition.PERMISSION_DENIED:
            await self.fail_commits_fatally(instance)
        else:
            assert condition is DatabaseCondition.BUSY, condition
            await self.set_available(instance, False)

    async def lift_condition(self, instance: Store) -> None:
        store = self._sqlite(instance)
        await store._conn.run(lambda db: db.execute("PRAGMA query_only = OFF"))
        await store._conn.run(lambda db: db.set_authorizer(None))
        await self.set_available(instance, True)

    def store_directory(self) -> Path:
        return self.path.parent

    async def open_at(self, path: Path) -> Store:
        store = await SqliteStore.open(path, self.config)
        self.opened.append(store)
        return store

    def foreign_files(self, directory: Path) -> list[Path]:
        """Other applications' SQLite databases: one in rollback-journal mode, and one in WAL
        mode, whose table is still only in its WAL (its program is running: the connection
        stays open until ``close_all``)."""
        plain = directory / "other-app.db"
        with contextlib.closing(sqlite3.connect(plain)) as conn:
            conn.execute("CREATE TABLE notes (body TEXT)")
            conn.execute("INSERT INTO notes VALUES ('keep me')")
            conn.commit()
        live = directory / "running-app.db"
        running = sqlite3.connect(live, isolation_level=None, check_same_thread=False)
        running.execute("PRAGMA journal_mode = WAL")
        running.execute("CREATE TABLE events (at INTEGER)")
        self._foreign.append(running)
        return [plain, live]

    async def open_upgraded_from(
        self, version: int, rows: ClusterRows
    ) -> tuple[Store, ClusterRows]:
        path = self.path.with_name(f"{self.path.stem}-from-version-{version}.db")
        kept = await asyncio.to_thread(database_at_version, path, version, rows)
        return await self.open_at(path), kept

    async def run_in_other_process(self, code: str) -> str:
        return await run_in_python(
            "from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig\n"
            "async def open_store():\n"
            f"    return await SqliteStore.open({str(self.path)!r}, {self.config!r})\n",
            code,
        )

    async def close_all(self) -> None:
        for store in list(self._paused):
            await self.resume(store)
        if self._blocker is not None:
            self._blocker.close()
            self._blocker = None
        for store in self.opened:
            await store.close()
        for conn in self._foreign:
            conn.close()
        self._foreign.clear()


def database_at_version(path: Path, version: int, rows: ClusterRows) -> ClusterRows:
    """A file as cronoq-store-sqlite of schema ``version`` left it, holding ``rows``: that
    version's migrations (the store's own first ``version`` steps), and the rows written in
    the tables and columns they made; returns the rows as that version keeps them."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE cronoq_schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO cronoq_schema_version VALUES (?)", (version,))
        for step in cronoq_store_sqlite._schema._MIGRATIONS[:version]:
            for statement in step.split(";"):
                if statement.strip():
                    conn.execute(statement)
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        columns = {row[1] for row in conn.execute("PRAGMA table_info(cronoq_tasks)")}
        conn.execute(
            "UPDATE cronoq_leader SET epoch = ?, max_task_id = ?", (rows.epoch, rows.max_task_id)
        )
        for record in rows.tasks:
            values = {name: v for name, v in task_row(record).items() if name in columns}
            conn.execute(
                f"INSERT INTO cronoq_tasks ({', '.join(values)}) "
                f"VALUES ({', '.join('?' * len(values))})",
                tuple(values.values()),
            )
        conn.executemany(
            "INSERT INTO cronoq_schedules VALUES (?, ?, ?, ?, ?)",
            [
                (r.spec.name, encode_schedule_spec(r.spec), r.next_ns, r.paused, r.last_task_id)
                for r in rows.schedules
            ],
        )
        if "cronoq_pools" in tables:
            conn.executemany("INSERT INTO cronoq_pools VALUES (?, ?)", rows.pools)
        if "cronoq_attempts" in tables:
            conn.executemany(
                "INSERT INTO cronoq_attempts VALUES (?, ?, ?, ?, ?)",
                [
                    (a.task_id, a.attempt, a.started_ns, a.ended_ns, a.message)
                    for a in rows.attempts
                ],
            )
        conn.execute("COMMIT")
    return rows.keeping(
        leases="lease_hash" in columns,
        starts="started_ns" in columns,
        pools="cronoq_pools" in tables,
        attempts="cronoq_attempts" in tables,
    )
