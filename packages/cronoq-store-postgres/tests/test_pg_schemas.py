"""Two schemas in one database are two independent clusters: separate tables, separate
advisory lock keys, separate epochs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio
from pg_fault_helpers import close_all, config, current_epoch, lock_holders, query, scheduler
from pg_harness import DSN, drop_schema, new_schema, require_postgres

from cronoq import Scheduler
from cronoq_store_postgres import PgStore
from cronoq_store_postgres._schema import quote_ident


@pytest_asyncio.fixture
async def schemas() -> AsyncIterator[tuple[str, str]]:
    await require_postgres()
    names = (new_schema(), new_schema())
    try:
        yield names
    finally:
        for name in names:
            await drop_schema(name)


async def table_keys(schema: str) -> dict[int, str | None]:
    rows = await query(f"SELECT id, key FROM {quote_ident(schema)}.cronoq_tasks")
    return {row["id"]: row["key"] for row in rows}


async def test_two_schemas_have_a_leader_each_at_once_and_share_no_rows(
    schemas: tuple[str, str],
) -> None:
    x, y = schemas
    store_x = await PgStore.connect(DSN, config(x))
    store_y = await PgStore.connect(DSN, config(y))
    standby_x = await PgStore.connect(DSN, config(x))
    sched_x, sched_y, sched_x2 = scheduler(store_x), scheduler(store_y), scheduler(standby_x)
    schedulers: list[Scheduler] = [sched_x, sched_y, sched_x2]
    starts: list[asyncio.Future[None]] = []
    try:
        # Two leaders at the same time, one per schema, each holding its own lock.
        async with asyncio.timeout(5.0):
            await asyncio.gather(sched_x.start(), sched_y.start())
        assert sched_x.running and sched_y.running
        [holder_x] = await lock_holders(x)
        [holder_y] = await lock_holders(y)
        assert holder_x["pid"] != holder_y["pid"]
        assert await current_epoch(x) == await current_epoch(y) == 1

        # The same key in both: two tasks, each visible only in its own cluster.
        id_x = await sched_x.submit("job", b"from-x", key="same-key")
        id_y = await sched_y.submit("job", b"from-y", key="same-key")
        only_x = await sched_x.submit("job", b"x", key="only-x")
        only_y = await sched_y.submit("job", b"y", key="only-y")
        found_x, found_y = (
            await sched_x.get_by_key("same-key"),
            await sched_y.get_by_key("same-key"),
        )
        assert found_x is not None and (found_x.task_id, found_x.payload) == (id_x, b"from-x")
        assert found_y is not None and (found_y.task_id, found_y.payload) == (id_y, b"from-y")
        assert await sched_y.get_by_key("only-x") is None
        assert await store_y.get_task_by_key("only-x") is None
        assert await sched_x.get_by_key("only-y") is None
        assert await store_x.get_task_by_key("only-y") is None
        assert await table_keys(x) == {id_x: "same-key", only_x: "only-x"}
        assert await table_keys(y) == {id_y: "same-key", only_y: "only-y"}

        # A takeover in one cluster leaves the other's leader alone.
        starting = asyncio.ensure_future(sched_x2.start())
        starts.append(starting)
        await sched_x.close(timeout=1.0)
        async with asyncio.timeout(3.0):
            await starting
        assert await current_epoch(x) == 2
        assert await current_epoch(y) == 1
        assert sched_y.running
        again_y = await sched_y.submit("job", b"y", key="after-x-failover")
        assert (await table_keys(y))[again_y] == "after-x-failover"
        found = await sched_x2.get_by_key("only-x")
        assert found is not None and found.task_id == only_x
        assert await sched_x2.get_by_key("after-x-failover") is None
    finally:
        await close_all(schedulers, [store_x, store_y, standby_x], starts)
