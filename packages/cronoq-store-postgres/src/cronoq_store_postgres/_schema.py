"""Names, lock keys and migrations of one cluster's schema."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from cronoq.errors import StoreFatal

# A plain connection or one borrowed from a pool: both run the statements alike.
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"

SCHEMA_VERSION = 7


def quote_ident(name: str) -> str:
    """A safely quoted identifier: the schema name is never interpolated raw."""
    return '"' + name.replace('"', '""') + '"'


def lock_key(purpose: str, schema: str) -> int:
    """A 64-bit advisory lock key derived from the schema, so clusters share no lock."""
    digest = hashlib.sha256(f"cronoq:{purpose}:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _migrations(s: str) -> list[list[str]]:
    """Entry i moves the schema from version i to i + 1; ``s`` is the quoted schema."""
    return [
        [
            f"""CREATE TABLE {s}.cronoq_leader (
                id integer PRIMARY KEY CHECK (id = 1),
                epoch bigint NOT NULL,
                max_task_id bigint NOT NULL
            )""",
            f"INSERT INTO {s}.cronoq_leader VALUES (1, 0, 0)",
            f"""CREATE TABLE {s}.cronoq_tasks (
                id bigint PRIMARY KEY,
                pool text NOT NULL,
                kind text NOT NULL,
                key text,
                payload bytea NOT NULL,
                options text NOT NULL,
                after_ids bigint[] NOT NULL,
                status text NOT NULL,
                attempt integer NOT NULL,
                message text NOT NULL,
                submitted_ns bigint NOT NULL,
                updated_ns bigint NOT NULL,
                due_ns bigint,
                finished_ns bigint,
                cancel_requested boolean NOT NULL DEFAULT false,
                output bytea
            )""",
            f"CREATE INDEX cronoq_tasks_key ON {s}.cronoq_tasks (key, id) WHERE key IS NOT NULL",
            f"CREATE INDEX cronoq_tasks_live ON {s}.cronoq_tasks (id) WHERE finished_ns IS NULL",
            f"""CREATE INDEX cronoq_tasks_finished ON {s}.cronoq_tasks (finished_ns)
                WHERE finished_ns IS NOT NULL""",
            f"""CREATE TABLE {s}.cronoq_schedules (
                name text PRIMARY KEY,
                spec text NOT NULL,
                next_ns bigint NOT NULL,
                paused boolean NOT NULL,
                last_task_id bigint
            )""",
        ],
        [
            # A leader's fencing token within its epoch, bumped before it trusts the tables
            # again after a write whose outcome it did not learn (see PgStore._settle).
            f"ALTER TABLE {s}.cronoq_leader ADD COLUMN generation bigint NOT NULL DEFAULT 0",
        ],
        [
            # The lease of a running remote attempt (cronoq.store.AttemptLease): the epoch
            # that started it and the SHA-256 of its lease id, both NULL when the row has
            # none. Nullable columns without a default rewrite no row (a catalog change
            # only), so the migration is instant however large the table; the rows of
            # version 2 read as having no lease.
            f"""ALTER TABLE {s}.cronoq_tasks ADD COLUMN lease_epoch bigint,
                ADD COLUMN lease_hash bytea""",
        ],
        [
            # Pools an operator paused (cronoq.store.PoolPaused), by name, so that a pause
            # outlives the leader that took it. A new table: no existing row is touched.
            f"""CREATE TABLE {s}.cronoq_pools (
                name text PRIMARY KEY,
                paused boolean NOT NULL
            )""",
        ],
        [
            # The start of each task's latest attempt, kept once it ends: a nullable column
            # without a default, a catalog change that rewrites no row.
            f"ALTER TABLE {s}.cronoq_tasks ADD COLUMN started_ns bigint",
            # The attempts that ended without success (cronoq.store.AttemptEnded), the
            # latest ATTEMPTS_KEPT of each task, deleted with its row. A new table: no
            # existing row is touched.
            f"""CREATE TABLE {s}.cronoq_attempts (
                task_id bigint NOT NULL,
                attempt integer NOT NULL,
                started_ns bigint NOT NULL,
                ended_ns bigint NOT NULL,
                message text NOT NULL,
                PRIMARY KEY (task_id, attempt)
            )""",
        ],
        _outbox_migration(s, outbox_channel(s)),
        [
            # The occurrence ledger (cronoq.store.OccurrenceRecorded): a record per schedule
            # and due time, kept whether or not the schedule still exists, and pruned by its
            # due time (the index) with the finished tasks. A new table: no row is touched.
            f"""CREATE TABLE {s}.cronoq_occurrences (
                schedule text NOT NULL,
                due_ns bigint NOT NULL,
                until_ns bigint NOT NULL,
                outcome text NOT NULL,
                task_id bigint,
                at_ns bigint NOT NULL,
                message text NOT NULL,
                PRIMARY KEY (schedule, due_ns)
            )""",
            f"CREATE INDEX cronoq_occurrences_until ON {s}.cronoq_occurrences (until_ns)",
        ],
    ]


def outbox_channel(quoted_schema: str) -> str:
    """The NOTIFY channel of a schema's outbox (a name of at most 63 bytes, whatever the
    schema's)."""
    return "cronoq_outbox_" + hashlib.sha256(quoted_schema.encode()).hexdigest()[:16]


def _outbox_migration(s: str, channel: str) -> list[str]:
    """The outbox (docs/outbox.md): rows applications write in their own transactions, and
    the quarantine of rows that could not become tasks. New tables: no row is touched."""
    q = "$cronoq$"  # the functions' dollar quotes: a tag the schema's name does not hold
    while q in s:
        q = q[:-1] + "_$"
    return [
        # An identity, not a serial: an application role needs no grant on its sequence (INSERT
        # on the table, and SELECT on id for RETURNING id: docs/outbox.md, "Privileges").
        # Only the primary key is indexed: the leader reads the oldest ids and deletes by id.
        f"""CREATE TABLE {s}.cronoq_outbox (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            kind text NOT NULL CHECK (length(kind) BETWEEN 1 AND 255),
            payload bytea NOT NULL DEFAULT '\\x',
            options jsonb NOT NULL DEFAULT '{{}}' CHECK (jsonb_typeof(options) = 'object'),
            enqueued_at timestamptz NOT NULL DEFAULT now()
        )""",
        f"""CREATE TABLE {s}.cronoq_outbox_quarantine (
            id bigint PRIMARY KEY,
            kind text NOT NULL,
            payload bytea NOT NULL,
            options text NOT NULL,
            enqueued_at timestamptz NOT NULL,
            reason text NOT NULL,
            quarantined_at timestamptz NOT NULL DEFAULT now()
        )""",
        # For application SQL and triggers. SECURITY INVOKER (the default): its caller needs
        # INSERT on the outbox and SELECT on its id (RETURNING id), as the helpers' callers do.
        f"""CREATE FUNCTION {s}.cronoq_enqueue(
            kind text, payload bytea DEFAULT '\\x', options jsonb DEFAULT '{{}}'
        ) RETURNS bigint LANGUAGE sql AS {q}
            INSERT INTO {s}.cronoq_outbox (kind, payload, options)
            VALUES (kind, payload, options) RETURNING id
        {q}""",
        # Once per statement, not per row (a transaction's identical notifications fold into
        # one): the leader wakes at once instead of at its next poll. Under a heavy write load
        # an operator may disable the trigger; the poll still ingests everything.
        f"""CREATE FUNCTION {s}.cronoq_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS {q}
            BEGIN PERFORM pg_notify('{channel}', ''); RETURN NULL; END
        {q}""",
        f"""CREATE TRIGGER cronoq_outbox_notify AFTER INSERT ON {s}.cronoq_outbox
            FOR EACH STATEMENT EXECUTE FUNCTION {s}.cronoq_outbox_notify()""",
    ]


@dataclass(frozen=True, slots=True)
class SchemaMigration:
    """What ``PgStore.migrate`` did: the schema's version before (0: it had no cronoq tables)
    and after (this build's)."""

    schema: str
    before: int
    after: int


async def schema_version(conn: Connection, schema: str) -> int | None:
    """The schema's version, None if it holds no cronoq tables: reads only, so a role with
    read and write alone may ask (``CREATE ... IF NOT EXISTS`` needs the right to create,
    even when everything exists)."""
    s = quote_ident(schema)
    if await conn.fetchval("SELECT to_regclass($1) IS NULL", f"{s}.cronoq_schema_version"):
        return None
    version = await conn.fetchval(f"SELECT version FROM {s}.cronoq_schema_version")
    return 0 if version is None else int(version)


async def ensure_schema(conn: Connection, schema: str, mode: str) -> None:
    """Check the schema is at SCHEMA_VERSION; if it is missing or older, migrate it
    (``mode="auto"``) or refuse saying what to do (``"never"``)."""
    version = await schema_version(conn, schema)
    if version == SCHEMA_VERSION:
        return
    if version is not None and version > SCHEMA_VERSION:
        raise _newer(schema, version)
    if mode == "auto":
        await migrate(conn, schema)
        return
    found = "holds no cronoq tables" if version is None else f"is at version {version}"
    raise StoreFatal(
        f"the schema {schema!r} {found}, this build needs version {SCHEMA_VERSION}, and the "
        f"store's migrate setting is 'never': run `cronoq-server migrate` (PgStore.migrate) "
        "as the role that owns the schema, then start again"
    )


def _newer(schema: str, version: int) -> StoreFatal:
    return StoreFatal(
        f"the schema {schema!r} is at version {version}, newer than this build of "
        f"cronoq-store-postgres supports ({SCHEMA_VERSION}); upgrade it"
    )


async def migrate(conn: Connection, schema: str) -> int:
    """Create or upgrade the schema under a transaction-scoped advisory lock, so instances
    that connect at once migrate one after the other; refuse a newer schema. Returns the
    version it found (0: none)."""
    s = quote_ident(schema)
    migrations = _migrations(s)
    assert len(migrations) == SCHEMA_VERSION
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", lock_key("migrate", schema))
        # Not CREATE SCHEMA IF NOT EXISTS: PostgreSQL asks for CREATE on the database before
        # it looks whether the schema exists, and the owner of a schema a DBA created for it
        # need not have that.
        if not await conn.fetchval(
            "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema
        ):
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.cronoq_schema_version (version integer NOT NULL)"
        )
        version = await conn.fetchval(f"SELECT version FROM {s}.cronoq_schema_version")
        if version is None:
            await conn.execute(f"INSERT INTO {s}.cronoq_schema_version VALUES (0)")
            version = 0
        if version > SCHEMA_VERSION:
            raise _newer(schema, version)
        for step in range(version, SCHEMA_VERSION):
            for statement in migrations[step]:
                await conn.execute(statement)
            await conn.execute(f"UPDATE {s}.cronoq_schema_version SET version = $1", step + 1)
    return int(version)
