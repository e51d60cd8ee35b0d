"""PgQueuer: enqueue with ``Queries.enqueue`` over an asyncpg pool, work with ``PgQueuer.run``.

Settings (see README.md): schema installed with ``Queries.install()`` (durability ``durable``,
its default: every table logged, asserted here); enqueuer ``Queries.from_asyncpg_pool`` over
``asyncpg.create_pool`` defaults (10 connections); the batch API is ``enqueue`` with lists.
Worker: ``PgQueuer.from_asyncpg_connection`` on one connection, as its consumer example does,
``run(batch_size=10, max_concurrent_tasks=50)`` with every other argument at its default
(dequeue_timeout 30 s, heartbeat_timeout 30 s), on uvloop like ``pgq run``.
"""

from __future__ import annotations

import asyncio
from typing import Literal

import asyncpg
from pgqueuer import PgQueuer, Queries
from pgqueuer.models import Job

from ._harness import probe
from ._peer import PeerSystem

ENTRYPOINT = "noop"
BATCH_SIZE = 10


class _Enqueuer:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = Queries.from_asyncpg_pool(pool)

    async def one(self, index: int) -> None:
        await self.queries.enqueue(ENTRYPOINT, str(index).encode())

    async def many(self, indexes: list[int]) -> None:
        await self.queries.enqueue(
            [ENTRYPOINT] * len(indexes), [str(i).encode() for i in indexes], [0] * len(indexes)
        )

    async def close(self) -> None:
        await self.pool.close()


class _PgQueuer:
    name = "pgqueuer"
    batch_api = True
    worker_loop: Literal["asyncio", "uvloop"] = "uvloop"
    # Completed jobs are moved from the queue table to the log table (one statement).
    pending_sql = "SELECT count(*) FROM pgqueuer"

    async def install(self, dsn: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await Queries.from_asyncpg_connection(conn).install()
            unlogged = await conn.fetch(
                "SELECT relname FROM pg_class WHERE relname LIKE 'pgqueuer%'"
                " AND relkind = 'r' AND relpersistence <> 'p'"
            )
            assert not unlogged, f"pgqueuer tables not logged: {unlogged}"
        finally:
            await conn.close()

    async def open(self, dsn: str) -> _Enqueuer:
        return _Enqueuer(await asyncpg.create_pool(dsn))

    async def serve(self, dsn: str, concurrency: int) -> None:
        conn = await asyncpg.connect(dsn)
        pgq = PgQueuer.from_asyncpg_connection(conn)

        async def noop(job: Job) -> None:
            probe.started(int(job.payload or b"0"))

        pgq.entrypoint(ENTRYPOINT)(noop)
        await pgq.run(batch_size=BATCH_SIZE, max_concurrent_tasks=concurrency)
        await asyncio.Event().wait()


PEER = _PgQueuer()
SYSTEM = PeerSystem(PEER)
