"""The PostgreSQL store's conformance harness: each test gets a schema of its own.

PostgreSQL is found at ``CRONOQ_TEST_PG_DSN`` (default: the local server, database ``test``).
When it is unreachable the tests skip with a one-line reason, unless
``CRONOQ_REQUIRE_POSTGRES=1`` (set by CI), which turns that into a failure.
"""

from __future__ import annotations

import dataclasses
import os
import uuid

import asyncpg
import pytest
from pg_proxy import Link, PgProxy, upstream_of, writes_a_batch

import cronoq_store_postgres._schema
from cronoq.store import Store, encode_schedule_spec
from cronoq_conformance import (
    Capability,
    ClusterRows,
    DatabaseCondition,
    PendingOutboxRow,
    StoreHarness,
    run_in_python,
    task_row,
)
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._schema import quote_ident

DSN = os.environ.get("CRONOQ_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
FAST = PgStoreConfig(
    lock_poll=0.05, keepalive=0.2, session_timeout=2.0, lock_timeout=0.2, command_timeout=5.0
)


async def require_postgres() -> None:
    """Skip (or, with CRONOQ_REQUIRE_POSTGRES=1, fail) when PostgreSQL is unreachable."""
    try:
        conn = await asyncpg.connect(DSN, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL unreachable at {DSN}: {exc}"
        if os.environ.get("CRONOQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    await conn.close()


def new_schema() -> str:
    return f"cronoq_test_{uuid.uuid4().hex[:12]}"


async def drop_schema(schema: str) -> None:
    conn = await asyncpg.connect(DSN)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
    finally:
        await conn.close()


# What the server raises for each permanent condition (SQLSTATE, message). The harness
# connects as a superuser, whom neither REVOKE nor a read-only setting stops for good: a
# trigger raises the server's own error for the condition on every write to the task and
# schedule tables (the leader row, and so leadership, stays writable).
_PERMANENT = {
    DatabaseCondition.READ_ONLY: (
        "read_only_sql_transaction",
        "'cannot execute ' || TG_OP || ' in a read-only transaction'",
    ),
    DatabaseCondition.PERMISSION_DENIED: (
        "insufficient_privilege",
        "'permission denied for table ' || TG_TABLE_NAME",
    ),
    DatabaseCondition.CANNOT_OPEN: (
        "undefined_file",
        "'could not open file \"base/' || TG_RELID || '\": No such file or directory'",
    ),
}
"""Each condition's SQLSTATE, and its message as a SQL expression in a trigger."""


def _is_batch(link: Link, text: str) -> bool:
    return not link.is_lock_session and writes_a_batch(link, text)


class PgHarness(StoreHarness):
    # PAUSE: the lock session is held by the server for as long as it lives, so a frozen
    # leader cannot be taken over until its session ends, and then it is told at once
    # (test_pg_faults freezes a real process); SUPERSEDE replaces a leader behind its back
    # instead. PRIVATE_FILES, FOREIGN_PATHS: the store owns no file. Each instance reaches the
    # server through a proxy of its own (pg_proxy), which can hold a commit's statement in
    # flight.
    capabilities = frozenset(Capability) - {
        Capability.PAUSE,
        Capability.PRIVATE_FILES,
        Capability.FOREIGN_PATHS,
    }
    conditions = frozenset(DatabaseCondition)
    # Every version a schema of an earlier cronoq-store-postgres may still be at.
    earlier_schema_versions = tuple(range(1, cronoq_store_postgres._schema.SCHEMA_VERSION))
    leadership_timeout = 3.0
    handover_timeout = 0.5

    def __init__(
        self, schema: str, config: PgStoreConfig = FAST, store_class: type[PgStore] = PgStore
    ) -> None:
        self.schema = schema
        self.config = dataclasses.replace(config, schema=schema)
        self.store_class = store_class
        self.opened: list[PgStore] = []
        self.proxies: dict[PgStore, PgProxy] = {}
        self._blocker: asyncpg.Connection | None = None
        self._upgraded: list[str] = []
        """The schemas of ``open_upgraded_from``, dropped by ``close_all``."""
        self._application: asyncpg.Connection | None = None
        """The connection ``put_outbox_row`` writes on, as an application's own."""
        self._pending: list[PendingPgRow] = []

    async def open(self) -> Store:
        upstream = upstream_of(DSN)
        assert upstream is not None, f"the harness needs a TCP DSN, not {DSN}"
        proxy = await PgProxy(upstream).start()
        try:
            store = await self.store_class.connect(proxy.dsn(DSN), self.config)
        except BaseException:
            await proxy.close()
            raise
        self.opened.append(store)
        self.proxies[store] = proxy
        return store

    @staticmethod
    def _pg(instance: Store) -> PgStore:
        assert isinstance(instance, PgStore)
        return instance

    async def crash(self, instance: Store) -> None:
        self._pg(instance).abandon()

    async def _outside(self, *statements: str) -> None:
        """Statements from another session, as an administrator's would be."""
        conn = await asyncpg.connect(DSN)
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            await conn.close()

    async def set_available(self, instance: Store, available: bool) -> None:
        # Another session holding the leader row makes every commit wait for it until the
        # store's lock_timeout: the server is reachable but cannot serve, as under contention.
        if not available and self._blocker is None:
            blocker = await asyncpg.connect(DSN)
            await blocker.execute("BEGIN")
            await blocker.execute(
                f"SELECT * FROM {quote_ident(self.schema)}.cronoq_leader FOR UPDATE"
            )
            self._blocker = blocker
        elif available and self._blocker is not None:
            await self._blocker.close()
            self._blocker = None

    async def fail_next_commit_midway(self, instance: Store) -> None:
        # A sequence is not transactional: the trigger fires once even though the failed
        # transaction (and anything else it did) is rolled back. It fires at the first update
        # of a task row or deletion of an outbox row (a batch of new tasks and taken rows
        # alone fails at the rows), each written after part of the batch. Armed again, it
        # starts over.
        s = quote_ident(self.schema)
        await self._outside(
            f"DROP FUNCTION IF EXISTS {s}.cronoq_test_fault() CASCADE",
            f"DROP SEQUENCE IF EXISTS {s}.cronoq_test_fault",
            f"CREATE SEQUENCE {s}.cronoq_test_fault",
            f"""CREATE FUNCTION {s}.cronoq_test_fault() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF nextval('{s}.cronoq_test_fault') = 1 THEN
                        RAISE EXCEPTION 'injected fault in the middle of a batch';
                    END IF;
                    IF TG_OP = 'DELETE' THEN
                        RETURN OLD;
                    END IF;
                    RETURN NEW;
                END $$""",
            f"""CREATE TRIGGER cronoq_test_fault BEFORE UPDATE ON {s}.cronoq_tasks
                FOR EACH ROW EXECUTE FUNCTION {s}.cronoq_test_fault()""",
            f"""CREATE TRIGGER cronoq_test_fault BEFORE DELETE ON {s}.cronoq_outbox
                FOR EACH ROW EXECUTE FUNCTION {s}.cronoq_test_fault()""",
        )

    async def fail_commits_fatally(self, instance: Store) -> None:
        # The harness connects as a superuser, whom REVOKE does not stop: a trigger raises the
        # error a revoked privilege would (SQLSTATE 42501) on every write to the task and
        # schedule tables; the leader row, and so leadership, stays writable.
        s = quote_ident(self.schema)
        await self._outside(
            f"""CREATE FUNCTION {s}.cronoq_test_denied() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    RAISE EXCEPTION 'permission denied for table %', TG_TABLE_NAME
                        USING ERRCODE = 'insufficient_privilege';
                END $$""",
            *(
                f"""CREATE TRIGGER cronoq_test_denied BEFORE INSERT OR UPDATE OR DELETE
                    ON {s}.{table} FOR EACH STATEMENT EXECUTE FUNCTION {s}.cronoq_test_denied()"""
                for table in ("cronoq_tasks", "cronoq_schedules")
            ),
        )

    async def hold_next_commit(self, instance: Store) -> None:
        self.proxies[self._pg(instance)].hold(_is_batch)

    async def release_held_commit(self, instance: Store) -> None:
        statement = await self.proxies[self._pg(instance)].release_held()
        assert writes_a_batch(Link(0, None), statement), statement  # type: ignore[arg-type]

    async def supersede(self, instance: Store) -> None:
        # What a takeover writes (the advisory lock is another matter: the instance has not
        # noticed it lost it, as while its keepalive still waits).
        await self._outside(
            f"UPDATE {quote_ident(self.schema)}.cronoq_leader SET epoch = epoch + 1"
        )

    async def meet_condition(self, instance: Store, condition: DatabaseCondition) -> None:
        if condition is DatabaseCondition.BUSY:
            await self.set_available(instance, False)  # lock_timeout: LockNotAvailable
            return
        if condition is DatabaseCondition.CONNECTION_REFUSED:
            # The server stops accepting connections and the pool's are gone (the lock
            # session stays: that is leadership, not a commit's connection).
            proxy = self.proxies[self._pg(instance)]
            proxy.stop_listening()
            proxy.cut(lambda link: not link.is_lock_session)
            return
        sqlstate, message = _PERMANENT[condition]
        s = quote_ident(self.schema)
        await self._outside(
            f"""CREATE FUNCTION {s}.cronoq_test_condition() RETURNS trigger LANGUAGE plpgsql
                AS $$ BEGIN
                    RAISE EXCEPTION USING MESSAGE = {message}, ERRCODE = '{sqlstate}';
                END $$""",
            *(
                f"""CREATE TRIGGER cronoq_test_condition BEFORE INSERT OR UPDATE OR DELETE
                    ON {s}.{table} FOR EACH STATEMENT
                    EXECUTE FUNCTION {s}.cronoq_test_condition()"""
                for table in ("cronoq_tasks", "cronoq_schedules")
            ),
        )

    async def lift_condition(self, instance: Store) -> None:
        await self.set_available(instance, True)
        proxy = self.proxies[self._pg(instance)]
        if proxy._server is not None and not proxy._server.is_serving():
            await proxy.listen_again()
        s = quote_ident(self.schema)
        await self._outside(f"DROP FUNCTION IF EXISTS {s}.cronoq_test_condition() CASCADE")

    async def corrupt_task(self, instance: Store, task_id: int) -> None:
        await self._outside(
            f"UPDATE {quote_ident(self.schema)}.cronoq_tasks SET options = '{{broken' "
            f"WHERE id = {int(task_id)}"
        )

    async def set_schema_newer(self, instance: Store) -> None:
        await self._outside(
            f"UPDATE {quote_ident(self.schema)}.cronoq_schema_version SET version = version + 100"
        )

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        await self._pg(instance).prune(horizon_unix_ns)

    async def open_upgraded_from(
        self, version: int, rows: ClusterRows
    ) -> tuple[Store, ClusterRows]:
        schema = f"{self.schema}_from_{version}"
        self._upgraded.append(schema)
        kept = await schema_at_version(schema, version, rows)
        store = await self.store_class.connect(DSN, dataclasses.replace(self.config, schema=schema))
        self.opened.append(store)
        return store, kept

    async def put_outbox_row(self, kind: str, payload: bytes, options_json: str) -> int:
        # As an application writes a row: cronoq_enqueue() on a connection of its own.
        if self._application is None:
            self._application = await asyncpg.connect(DSN)
        return int(await self._application.fetchval(self._enqueue, kind, payload, options_json))

    async def begin_outbox_row(
        self, kind: str, payload: bytes, options_json: str
    ) -> PendingOutboxRow:
        conn = await asyncpg.connect(DSN)
        try:
            await conn.execute("BEGIN")
            row_id = int(await conn.fetchval(self._enqueue, kind, payload, options_json))
        except BaseException:
            await conn.close()
            raise
        pending = PendingPgRow(conn, row_id)
        self._pending.append(pending)
        return pending

    @property
    def _enqueue(self) -> str:
        return f"SELECT {quote_ident(self.schema)}.cronoq_enqueue($1, $2, $3::jsonb)"

    async def run_in_other_process(self, code: str) -> str:
        return await run_in_python(
            "from cronoq_store_postgres import PgStore, PgStoreConfig\n"
            "async def open_store():\n"
            f"    return await PgStore.connect({DSN!r}, {self.config!r})\n",
            code,
        )

    async def close_all(self) -> None:
        for pending in self._pending:
            await pending.rollback()
        if self._application is not None:
            await self._application.close()
            self._application = None
        if self._blocker is not None:
            await self._blocker.close()
            self._blocker = None
        for store in self.opened:
            await store.close()
        for proxy in self.proxies.values():
            await proxy.close()
        for schema in self._upgraded:
            await drop_schema(schema)


class PendingPgRow(PendingOutboxRow):
    """An outbox row written by cronoq_enqueue() in a transaction still open on its own
    connection."""

    def __init__(self, conn: asyncpg.Connection, row_id: int) -> None:
        self._conn = conn
        self._row_id = row_id

    async def commit(self) -> int:
        await self._end("COMMIT")
        return self._row_id

    async def rollback(self) -> None:
        await self._end("ROLLBACK")

    async def _end(self, statement: str) -> None:
        if not self._conn.is_closed():
            try:
                await self._conn.execute(statement)
            finally:
                await self._conn.close()


async def create_at_version(conn: asyncpg.Connection, schema: str, version: int) -> None:
    """Create ``schema`` at ``version``, empty, as cronoq-store-postgres of that version did:
    the store's own first ``version`` migration steps."""
    s = quote_ident(schema)
    await conn.execute(f"CREATE SCHEMA {s}")
    await conn.execute(f"CREATE TABLE {s}.cronoq_schema_version (version integer NOT NULL)")
    await conn.execute(f"INSERT INTO {s}.cronoq_schema_version VALUES ($1)", version)
    for step in cronoq_store_postgres._schema._migrations(s)[:version]:
        for statement in step:
            await conn.execute(statement)


async def schema_at_version(schema: str, version: int, rows: ClusterRows) -> ClusterRows:
    """A schema as cronoq-store-postgres of schema ``version`` left it, holding ``rows``: that
    version's migrations (the store's own first ``version`` steps), and the rows written in
    the tables and columns they made; returns the rows as that version keeps them."""
    s = quote_ident(schema)
    conn = await asyncpg.connect(DSN)
    try:
        async with conn.transaction():
            await create_at_version(conn, schema, version)
            tables = {
                r[0]
                for r in await conn.fetch(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
                    schema,
                )
            }
            columns = {
                r[0]
                for r in await conn.fetch(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = $1 AND table_name = 'cronoq_tasks'",
                    schema,
                )
            }
            await conn.execute(
                f"UPDATE {s}.cronoq_leader SET epoch = $1, max_task_id = $2",
                rows.epoch,
                rows.max_task_id,
            )
            for record in rows.tasks:
                row = task_row(record) | {"after_ids": list(record.spec.after)}
                values = {name: v for name, v in row.items() if name in columns}
                numbers = ", ".join(f"${i}" for i in range(1, len(values) + 1))
                await conn.execute(
                    f"INSERT INTO {s}.cronoq_tasks ({', '.join(values)}) VALUES ({numbers})",
                    *values.values(),
                )
            await conn.executemany(
                f"INSERT INTO {s}.cronoq_schedules VALUES ($1, $2, $3, $4, $5)",
                [
                    (r.spec.name, encode_schedule_spec(r.spec), r.next_ns, r.paused, r.last_task_id)
                    for r in rows.schedules
                ],
            )
            if "cronoq_pools" in tables:
                await conn.executemany(f"INSERT INTO {s}.cronoq_pools VALUES ($1, $2)", rows.pools)
            if "cronoq_attempts" in tables:
                await conn.executemany(
                    f"INSERT INTO {s}.cronoq_attempts VALUES ($1, $2, $3, $4, $5)",
                    [
                        (a.task_id, a.attempt, a.started_ns, a.ended_ns, a.message)
                        for a in rows.attempts
                    ],
                )
    finally:
        await conn.close()
    return rows.keeping(
        leases="lease_hash" in columns,
        starts="started_ns" in columns,
        pools="cronoq_pools" in tables,
        attempts="cronoq_attempts" in tables,
    )
