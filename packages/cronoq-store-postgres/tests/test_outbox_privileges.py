"""What an application's role needs to enqueue, proven on the real server (docs/outbox.md,
"Privileges"): USAGE on the schema, INSERT on ``cronoq_outbox`` and SELECT on its ``id``
column (the helpers and ``cronoq_enqueue()`` return the new row's id: ``INSERT ... RETURNING
id`` needs it). EXECUTE on ``cronoq_enqueue()`` is PUBLIC's by default; the identity column's
sequence needs no grant. With that, the role can read no row's contents, delete or change
none, and touch none of the scheduler's other tables."""

from __future__ import annotations

import asyncpg
import psycopg
import pytest
from pg_fault_helpers import query
from pg_harness import DSN
from pg_outbox_cluster import Cluster, ingesting, outbox_ids

from cronoq import TaskRequest
from cronoq_store_postgres import enqueue, enqueue_many

DENIED = asyncpg.InsufficientPrivilegeError

SCHEDULER_TABLES = (
    "cronoq_tasks",
    "cronoq_schedules",
    "cronoq_attempts",
    "cronoq_occurrences",
    "cronoq_pools",
    "cronoq_leader",
    "cronoq_schema_version",
    "cronoq_outbox_quarantine",
)


async def grant_enqueue(cluster: Cluster, role: str, *, select_id: bool = True) -> None:
    """The grants of docs/outbox.md ("Privileges"), as its owner would run them."""
    s = cluster.s
    await query(f"GRANT USAGE ON SCHEMA {s} TO {role}")
    await query(f"GRANT INSERT ON {s}.cronoq_outbox TO {role}")
    if select_id:
        await query(f"GRANT SELECT (id) ON {s}.cronoq_outbox TO {role}")


async def test_an_application_role_enqueues_every_way_and_can_do_nothing_else(
    schema: str, role: str
) -> None:
    async with ingesting(schema) as cluster:
        s = cluster.s
        await grant_enqueue(cluster, role)
        # An order table of the application's, whose trigger enqueues (docs/outbox.md): the
        # trigger's function runs with the privileges of the role inserting the order.
        await query(f"GRANT INSERT ON {s}.orders TO {role}")
        await query(
            f"""CREATE FUNCTION {s}.order_placed() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    PERFORM {s}.cronoq_enqueue('confirm', convert_to(NEW.item, 'UTF8'));
                    RETURN NEW;
                END $$"""
        )
        await query(
            f"CREATE TRIGGER order_placed AFTER INSERT ON {s}.orders "
            f"FOR EACH ROW EXECUTE FUNCTION {s}.order_placed()"
        )
        # No grant on the identity's sequence: INSERT on the table is enough for its values.
        [granted] = await query(
            "SELECT has_sequence_privilege($1, pg_get_serial_sequence($2, 'id'), "
            "'USAGE, SELECT, UPDATE')",
            role,
            f"{s}.cronoq_outbox",
        )
        assert granted[0] is False

        conn = await asyncpg.connect(DSN, user=role)
        try:
            assert await conn.fetchval("SELECT current_user") == role
            async with conn.transaction():
                by_helper = await enqueue(conn, "confirm", b"helper", schema=schema)
                many = await enqueue_many(conn, [TaskRequest("confirm", b"many")], schema=schema)
            by_sql = await conn.fetchval(
                f"SELECT {s}.cronoq_enqueue('confirm', 'sql'::bytea, "
                """'{"key": "sql", "priority": 3}'::jsonb)"""
            )
            await conn.execute(f"INSERT INTO {s}.orders (item) VALUES ('trigger')")
            assert isinstance(by_helper, int) and isinstance(by_sql, int)
            assert len(many) == 1

            # Refused: reading what rows hold, and changing or deleting any.
            for statement in (
                f"SELECT * FROM {s}.cronoq_outbox",
                f"SELECT kind FROM {s}.cronoq_outbox",
                f"SELECT payload FROM {s}.cronoq_outbox",
                f"SELECT options FROM {s}.cronoq_outbox",
                f"DELETE FROM {s}.cronoq_outbox",
                f"DELETE FROM {s}.cronoq_outbox WHERE id = {by_helper}",
                f"UPDATE {s}.cronoq_outbox SET kind = 'x'",
                f"TRUNCATE {s}.cronoq_outbox",
                *(f"SELECT 1 FROM {s}.{table} LIMIT 1" for table in SCHEDULER_TABLES),
                *(f"DELETE FROM {s}.{table}" for table in SCHEDULER_TABLES),
                f"UPDATE {s}.cronoq_tasks SET status = 'failed'",
                f"INSERT INTO {s}.cronoq_tasks (id) VALUES (1)",
                f"INSERT INTO {s}.cronoq_outbox_quarantine (id) VALUES (1)",
            ):
                with pytest.raises(DENIED):
                    await conn.execute(statement)
        finally:
            await conn.close()

        # Through psycopg too (the same statements; its own parameter passing).
        with psycopg.connect(DSN, user=role) as pconn:
            with pconn.transaction():
                by_psycopg = enqueue(pconn, "confirm", b"psycopg", schema=schema)
                many_psycopg = enqueue_many(pconn, [TaskRequest("confirm", b"psy")], schema=schema)
            assert isinstance(by_psycopg, int) and len(many_psycopg) == 1
            with pytest.raises(psycopg.errors.InsufficientPrivilege), pconn.transaction():
                pconn.execute(f"SELECT kind FROM {s}.cronoq_outbox")

        for payload in (b"helper", b"many", b"sql", b"trigger", b"psycopg", b"psy"):
            await cluster.runs.ran("confirm", payload)
        info = await cluster.sched.get_by_key("sql")
        assert info is not None and (info.payload, info.priority) == (b"sql", 3)
        assert await outbox_ids(schema) == []


async def test_insert_alone_writes_rows_but_the_helpers_need_select_on_id(
    schema: str, role: str
) -> None:
    """Why the grant includes ``SELECT (id)``: without it, a plain INSERT works, but the
    ``RETURNING id`` of the helpers and of ``cronoq_enqueue()`` is refused."""
    async with ingesting(schema) as cluster:
        s = cluster.s
        await grant_enqueue(cluster, role, select_id=False)
        conn = await asyncpg.connect(DSN, user=role)
        try:
            await conn.execute(f"INSERT INTO {s}.cronoq_outbox (kind) VALUES ('confirm')")
            with pytest.raises(DENIED):
                await enqueue(conn, "confirm", b"helper", schema=schema)
            with pytest.raises(DENIED):
                await enqueue_many(conn, [TaskRequest("confirm", b"m")], schema=schema)
            with pytest.raises(DENIED):
                await conn.execute(f"SELECT {s}.cronoq_enqueue('confirm')")
        finally:
            await conn.close()
        await cluster.runs.ran("confirm", None)
        assert cluster.runs.of_kind("confirm") == {None: 1}
