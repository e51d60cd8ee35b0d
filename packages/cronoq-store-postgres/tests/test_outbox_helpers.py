"""The outbox helpers on every driver an application may hold, against the real server.

For asyncpg, psycopg (sync and async), SQLAlchemy (a sync engine on psycopg, an async one on
asyncpg) and Django (psycopg backend), a transaction writes an order through the framework's
own API and a task through ``enqueue`` on the driver connection of that transaction; a
Scheduler on the same schema ingests the outbox. Then:

- committed, the task runs (and the order is there);
- rolled back, neither the order nor the task ever exists: a marker task written after it, in a
  committed transaction, is ingested and runs, and the rolled-back one is still nowhere;
- ``enqueue_many`` of 10,000 tasks in one transaction makes 10,000 tasks, each run once.

Each waits for the scheduler's own signal (the executor's record of a run), never a sleep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import psycopg
import pytest
import pytest_asyncio
from pg_harness import DSN, drop_schema
from pg_outbox_cluster import (
    ingesting,
    orders,
    outbox_ids,
    quarantined_ids,
    task_rows,
)
from pg_outbox_drivers import DRIVERS, Driver, Rollback, open_driver, sqlalchemy_url
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from cronoq import JsonCodec, Status, TaskRequest
from cronoq_store_postgres import enqueue, enqueue_many

BULK = 10_000


@pytest_asyncio.fixture(params=DRIVERS)
async def driver(request: pytest.FixtureRequest) -> AsyncIterator[Driver]:
    opened = open_driver(request.param)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_committed_transactions_task_runs(schema: str, driver: Driver) -> None:
    async with ingesting(schema) as cluster:
        done = await driver.transact(
            schema,
            "order 1",
            lambda conn: enqueue(conn, "confirm", b"order 1", schema=schema, key="order-1"),
        )
        assert done.app_txid == done.driver_txid, "the helper wrote in another transaction"
        assert isinstance(done.result, int) and done.result > 0
        await cluster.runs.ran("confirm", b"order 1")

        assert await orders(schema) == ["order 1"]
        info = await cluster.sched.get_by_key("order-1")
        assert info is not None
        assert (info.kind, info.pool, info.payload) == ("confirm", "default", b"order 1")
        await cluster.sched.wait(info.task_id, timeout=5)
        assert (await cluster.sched.get(info.task_id)).status is Status.SUCCEEDED
        assert cluster.runs.of_kind("confirm") == {b"order 1": 1}
        # The row became the task in the commit that made it durable: it is gone.
        assert await outbox_ids(schema) == []
        assert await quarantined_ids(schema) == []


async def test_a_rolled_back_transactions_task_never_exists(schema: str, driver: Driver) -> None:
    async with ingesting(schema) as cluster:
        undone = await driver.transact(
            schema,
            "order 1",
            lambda conn: enqueue(conn, "confirm", b"order 1", schema=schema),
            rollback=True,
        )
        assert undone.app_txid == undone.driver_txid, "the helper wrote in another transaction"
        # A marker, written after it in a committed transaction: its row's id is higher, and
        # the outbox is ingested in id order, so once the marker ran, the rolled-back row would
        # have been ingested before it had it ever committed.
        marker = await driver.transact(
            schema,
            "order 2",
            lambda conn: enqueue(conn, "confirm", b"order 2", schema=schema),
        )
        assert marker.result > undone.result
        await cluster.runs.ran("confirm", b"order 2")

        assert await orders(schema) == ["order 2"]
        assert [payload for _, payload in await task_rows(schema, "confirm")] == [b"order 2"]
        assert [t.kind for t in await cluster.sched.list()] == ["confirm"]
        assert cluster.runs.of_kind("confirm") == {b"order 2": 1}
        assert await outbox_ids(schema) == []
        assert await quarantined_ids(schema) == []


async def test_enqueue_many_of_ten_thousand_tasks_makes_each_a_task_once(
    schema: str, driver: Driver
) -> None:
    requests = [TaskRequest("bulk", b"%d" % n, tags=("bulk",)) for n in range(BULK)]
    async with ingesting(schema) as cluster:
        done = await driver.transact(
            schema, "bulk order", lambda conn: enqueue_many(conn, requests, schema=schema)
        )
        assert done.app_txid == done.driver_txid, "the helper wrote in another transaction"
        ids = done.result
        assert isinstance(ids, list) and len(ids) == len(set(ids)) == BULK
        assert ids == sorted(ids)
        await cluster.runs.until(lambda: cluster.runs.distinct["bulk"] == BULK, timeout=60)
        # A marker after them: ingested only after every row before it, so that a row made
        # into a second task would be in the table by the time the marker runs.
        await driver.transact(
            schema, "marker", lambda conn: enqueue(conn, "marker", None, schema=schema)
        )
        await cluster.runs.ran("marker", None)

        ran = cluster.runs.of_kind("bulk")
        assert set(ran) == {b"%d" % n for n in range(BULK)}
        assert set(ran.values()) == {1}
        rows = await task_rows(schema, "bulk")
        assert len(rows) == BULK
        assert sorted(payload for _, payload in rows) == sorted(r.payload for r in requests)
        assert await orders(schema) == ["bulk order", "marker"]
        assert await outbox_ids(schema) == []
        assert await quarantined_ids(schema) == []
        stats = await cluster.sched.outbox_stats()
        assert (stats.depth, stats.quarantined) == (0, 0)


@pytest.mark.parametrize("name", [d for d in DRIVERS if d != "sqlalchemy-async"])
async def test_an_enqueue_before_any_other_statement_is_in_the_transaction(
    schema: str, name: str
) -> None:
    """The helper's statement may be the transaction's first: psycopg begins a transaction
    at the first statement of a connection that is not in autocommit (as SQLAlchemy's and
    Django's are inside their transactions), and asyncpg's ``transaction()`` begins at once."""
    driver = open_driver(name)
    try:
        async with ingesting(schema) as cluster:
            undone = await driver.transact(
                schema,
                "order 1",
                lambda conn: enqueue(conn, "confirm", b"order 1", schema=schema),
                rollback=True,
                write_first=True,
            )
            assert undone.app_txid == undone.driver_txid
            await driver.transact(
                schema,
                "order 2",
                lambda conn: enqueue(conn, "confirm", b"order 2", schema=schema),
                write_first=True,
            )
            await cluster.runs.ran("confirm", b"order 2")
            assert await orders(schema) == ["order 2"]
            assert [p for _, p in await task_rows(schema, "confirm")] == [b"order 2"]
    finally:
        await driver.close()


async def test_sqlalchemy_asyncpg_begins_at_the_first_statement_so_enqueue_after_one(
    schema: str,
) -> None:
    """What docs/outbox.md warns of: SQLAlchemy's asyncpg dialect sends BEGIN with the first
    statement SQLAlchemy itself runs, so an ``enqueue`` on the driver connection before any is
    outside the transaction (committed at once, and kept by a rollback). After one, it is in."""
    engine = create_async_engine(sqlalchemy_url("asyncpg"))

    async def rolled_back(payload: bytes, *, first: bool) -> None:
        async with AsyncSession(engine) as session, session.begin():
            if not first:
                await session.execute(text("SELECT 1"))
            conn = await session.connection()
            raw = (await conn.get_raw_connection()).driver_connection
            assert isinstance(raw, asyncpg.Connection)
            assert raw.is_in_transaction() is not first
            await enqueue(raw, "early", payload, schema=schema)
            raise Rollback

    try:
        async with ingesting(schema) as cluster:
            with pytest.raises(Rollback):
                await rolled_back(b"too early", first=True)
            with pytest.raises(Rollback):
                await rolled_back(b"in time", first=False)
            await cluster.runs.ran("early", b"too early")
            await enqueue_marker(schema)
            await cluster.runs.ran("marker", None)
            assert cluster.runs.of_kind("early") == {b"too early": 1}
    finally:
        await engine.dispose()


async def enqueue_marker(schema: str) -> None:
    conn = await asyncpg.connect(DSN)
    try:
        await enqueue(conn, "marker", None, schema=schema)
    finally:
        await conn.close()


async def test_a_codecs_payload_reaches_the_task_function_decoded(schema: str) -> None:
    """With the scheduler's codec, the helper writes what the scheduler decodes: the function
    gets the value, and the row's bytes are those ``submit`` would store."""
    payload = {"order": 1, "items": ["\u00e9t\u00e9", "\x00"], "total": 12.5}
    async with ingesting(schema, codec=JsonCodec()) as cluster:
        conn = await asyncpg.connect(DSN)
        try:
            async with conn.transaction():
                await enqueue(conn, "confirm", payload, schema=schema, codec=JsonCodec())
                await enqueue(conn, "confirm", None, schema=schema, codec=JsonCodec())
        finally:
            await conn.close()
        await cluster.runs.ran("confirm", payload)
        await cluster.runs.ran("confirm", None)
        rows = await task_rows(schema, "confirm")
        assert [p for _, p in rows] == [JsonCodec().encode(payload), b""]


async def test_the_helpers_write_the_outbox_of_the_schema_they_are_given(schema: str) -> None:
    """``schema`` is quoted: a schema name needing quotes (capitals, a space, a quote) works,
    and the rows land in its outbox only."""
    odd = f'{schema} Odd "Name"'
    try:
        async with ingesting(odd) as cluster:
            conn = await asyncpg.connect(DSN)
            try:
                async with conn.transaction():
                    await enqueue(conn, "confirm", b"odd", schema=odd)
                    await enqueue_many(conn, [TaskRequest("confirm", b"odd many")], schema=odd)
            finally:
                await conn.close()
            await cluster.runs.ran("confirm", b"odd")
            await cluster.runs.ran("confirm", b"odd many")
            assert await outbox_ids(odd) == []
    finally:
        await drop_schema(odd)


class AppConnection(asyncpg.Connection):
    """An application's own connection class (``asyncpg.connect(connection_class=...)``)."""


class AppAsyncConnection(psycopg.AsyncConnection[Any]):
    """An application's own subclass of psycopg's."""


async def test_subclassed_and_pooled_connections_are_driver_connections(schema: str) -> None:
    async with ingesting(schema) as cluster:
        conn = await asyncpg.connect(DSN, connection_class=AppConnection)
        try:
            async with conn.transaction():
                await enqueue(conn, "confirm", b"subclass", schema=schema)
        finally:
            await conn.close()
        pool = await asyncpg.create_pool(DSN, min_size=1, max_size=1)
        try:
            async with pool.acquire() as pooled, pooled.transaction():
                await enqueue(pooled, "confirm", b"pooled", schema=schema)
        finally:
            await pool.close()
        async with await AppAsyncConnection.connect(DSN) as aconn, aconn.transaction():
            await enqueue(aconn, "confirm", b"psycopg subclass", schema=schema)
        for payload in (b"subclass", b"pooled", b"psycopg subclass"):
            await cluster.runs.ran("confirm", payload)


async def test_a_row_for_a_pool_the_scheduler_lacks_is_quarantined_and_blocks_nothing(
    schema: str,
) -> None:
    """The one check the helpers cannot make: whether the pool exists. The ingest quarantines
    the row with the reason, and the rows after it become tasks."""
    async with ingesting(schema) as cluster:
        conn = await asyncpg.connect(DSN)
        try:
            async with conn.transaction():
                row_id = await enqueue(conn, "confirm", b"lost", schema=schema, pool="nowhere")
                await enqueue(conn, "confirm", b"after it", schema=schema)
        finally:
            await conn.close()
        await cluster.runs.ran("confirm", b"after it")
        [row] = await cluster.sched.outbox_quarantine()
        assert (row.row_id, row.kind, row.payload) == (row_id, "confirm", b"lost")
        assert row.reason.startswith("UnknownPool: unknown pool 'nowhere'"), row.reason


async def test_an_applications_own_jsonb_codec_and_row_factory_do_not_change_the_rows(
    schema: str,
) -> None:
    """asyncpg with the usual ``set_type_codec('jsonb', ...)`` and psycopg with
    ``row_factory=dict_row``: the options are bound as text, the ids read as tuples."""
    import json

    from psycopg.rows import dict_row

    async with ingesting(schema) as cluster:
        conn = await asyncpg.connect(DSN)
        try:
            await conn.set_type_codec(
                "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
            )
            async with conn.transaction():
                await enqueue(conn, "confirm", b"codec", schema=schema, key="codec-1")
                await enqueue_many(
                    conn, [TaskRequest("confirm", b"codec many", key="codec-2")], schema=schema
                )
        finally:
            await conn.close()
        with psycopg.connect(DSN, row_factory=dict_row) as sync:
            assert isinstance(enqueue(sync, "confirm", b"dict", schema=schema), int)
            assert len(enqueue_many(sync, [TaskRequest("confirm", b"dicts")], schema=schema)) == 1
        async with await psycopg.AsyncConnection.connect(DSN, row_factory=dict_row) as aconn:
            assert isinstance(await enqueue(aconn, "confirm", b"adict", schema=schema), int)
        for payload in (b"codec", b"codec many", b"dict", b"dicts", b"adict"):
            await cluster.runs.ran("confirm", payload)
        info = await cluster.sched.get_by_key("codec-1")
        assert info is not None and info.key == "codec-1"
