"""The PostgreSQL outbox as a leader ingests it: a transaction held open a minute delays only
its own rows; ingest wakes on NOTIFY and, with the trigger disabled, still on its poll; an
outbox in another database is ingested with keys derived from its rows; a store configured
without an outbox ingests nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio
from pg_harness import DSN

from cronoq import MemoryStore, Pool, Scheduler, TaskContext
from cronoq_store_postgres import PgOutbox, PgStore, PgStoreConfig, enqueue

HELD_S = 60.0
"""How long the slow transaction stays open (issue 30: "a transaction held open 60 s")."""
WAIT_S = 15.0


class Ran:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.at: dict[bytes, float] = {}
        self._changed = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: bytes) -> None:
        self.payloads.append(payload)
        self.at[payload] = time.monotonic()
        self._changed.set()

    async def until(self, *payloads: bytes, timeout: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout):
            while not set(payloads) <= set(self.payloads):
                self._changed.clear()
                await self._changed.wait()


@pytest_asyncio.fixture
async def app(schema: str) -> AsyncIterator[asyncpg.Connection]:
    """The application's own connection."""
    conn = await asyncpg.connect(DSN)
    try:
        yield conn
    finally:
        await conn.close()


async def test_a_transaction_held_open_a_minute_delays_only_its_own_rows(
    schema: str, app: asyncpg.Connection
) -> None:
    store = await PgStore.connect(DSN, PgStoreConfig(schema=schema, outbox_poll=0.5))
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=store):
        slow = await asyncpg.connect(DSN)
        try:
            holding = slow.transaction()
            await holding.start()
            await enqueue(slow, "k", b"slow", schema=schema)  # its id comes before the others'
            opened = time.monotonic()
            fast: list[float] = []
            while time.monotonic() - opened < HELD_S:
                payload = f"fast-{len(fast)}".encode()
                async with app.transaction():
                    await enqueue(app, "k", payload, schema=schema)
                committed = time.monotonic()
                await ran.until(payload)
                fast.append(ran.at[payload] - committed)
                await asyncio.sleep(1.0)  # about one committed row a second, for the minute
            await holding.commit()
            committed = time.monotonic()
            await ran.until(b"slow")
        finally:
            await slow.close()
        slow_delay = ran.at[b"slow"] - committed
    await store.close()
    fast.sort()
    print(
        f"\nheld {HELD_S:.0f} s open: {len(fast)} rows committed meanwhile, each running "
        f"{fast[len(fast) // 2] * 1000:.1f} ms (median) and at most {fast[-1] * 1000:.1f} ms "
        f"after its commit; the held row {slow_delay * 1000:.1f} ms after its own"
    )
    assert len(fast) >= HELD_S / 2
    assert fast[-1] < 2.0, fast[-5:]  # a poll at most, never the held minute
    assert slow_delay < 2.0
    assert ran.payloads.count(b"slow") == 1


async def test_ingest_wakes_on_notify_and_without_the_trigger_on_its_poll(
    schema: str, app: asyncpg.Connection
) -> None:
    poll = 2.0
    store = await PgStore.connect(DSN, PgStoreConfig(schema=schema, outbox_poll=poll))
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=store):
        await enqueue(app, "k", b"first", schema=schema)  # wakes the listener's first read
        await ran.until(b"first")
        began = time.monotonic()
        await enqueue(app, "k", b"notified", schema=schema)
        await ran.until(b"notified")
        notified = time.monotonic() - began
        await app.execute(
            f'ALTER TABLE "{schema}".cronoq_outbox DISABLE TRIGGER cronoq_outbox_notify'
        )
        began = time.monotonic()
        await enqueue(app, "k", b"polled", schema=schema)
        await ran.until(b"polled", timeout=3 * poll)
        polled = time.monotonic() - began
    await store.close()
    print(f"\nnotified: {notified * 1000:.1f} ms; polled (every {poll} s): {polled * 1000:.0f} ms")
    assert notified < poll / 2
    assert polled <= 2 * poll + 1.0  # a poll, not a notification (slack for a loaded machine)


async def test_a_store_configured_without_an_outbox_ingests_nothing(
    schema: str, app: asyncpg.Connection
) -> None:
    store = await PgStore.connect(DSN, PgStoreConfig(schema=schema, outbox=False))
    assert store.outbox is None
    async with Scheduler([Pool("default", Ran())], store=store) as sched:
        await enqueue(app, "k", b"x", schema=schema)
        await sched.submit("marker", b"")  # a commit the ingest would have ridden along
        assert sched.metrics().outbox_ingested == 0
    waiting = await app.fetchval(f'SELECT count(*) FROM "{schema}".cronoq_outbox')
    await store.close()
    assert waiting == 1


async def test_an_outbox_beside_another_store_is_ingested_once_by_derived_keys(
    schema: str, app: asyncpg.Connection
) -> None:
    """A scheduler on another store ingests a PostgreSQL outbox: not in one transaction with
    its tasks, so each row gets a key of its own, and a row read twice finds its task."""
    outbox = await PgOutbox.connect(DSN, schema=schema, poll=0.5)
    store = MemoryStore()
    ran = Ran()
    try:
        async with Scheduler([Pool("default", ran)], store=store, outbox=outbox) as sched:
            async with app.transaction():
                for i in range(20):
                    await enqueue(app, "k", str(i).encode(), schema=schema)
                await enqueue(app, "k", b"own-key", schema=schema, key="mine")
            await ran.until(*(str(i).encode() for i in range(20)), b"own-key")
            async with asyncio.timeout(WAIT_S):  # the rows go after their tasks committed
                while (await sched.outbox_stats()).depth:  # noqa: ASYNC110 (a read, no event)
                    await asyncio.sleep(0.01)
            keys = sorted([str((await sched.get(t.task_id)).key) for t in await sched.list()])
    finally:
        await outbox.close()
    assert sorted(ran.payloads) == sorted([*(str(i).encode() for i in range(20)), b"own-key"])
    assert keys[0] == "mine"
    assert all(k.startswith("outbox:") for k in keys[1:]) and len(set(keys)) == 21


async def test_a_read_returns_a_few_megabytes_of_payload_at_most_and_one_row_at_least(
    schema: str, app: asyncpg.Connection
) -> None:
    store = await PgStore.connect(DSN, PgStoreConfig(schema=schema))
    try:
        epoch = (await store.acquire_leadership()).epoch
        for _ in range(5):
            await enqueue(app, "k", bytes(1000), schema=schema)
        outbox = store.outbox
        assert outbox is not None
        outbox._max_read_bytes = 2500  # READ_BYTES, scaled down
        assert len(await outbox.read(epoch, 1000)) == 3  # 0, 1,000 and 2,000 bytes before it
        outbox._max_read_bytes = 10
        assert len(await outbox.read(epoch, 1000)) == 1
    finally:
        await store.close()
