"""Oban for Python: ``Oban.enqueue`` / ``enqueue_many``, worker ``Oban(queues={"default": 50})``.

Oban needs Python 3.12+: on an older interpreter the runner runs this module's processes in a
second environment built from the same lock (see README.md).

Settings (see README.md): pools from ``Oban.create_pool(DSN)`` (its defaults: 1 to 10
connections); schema from ``oban.schema.install``. The enqueuer is an ``Oban(pool=...)`` in
client mode (no queues), as its docs show. Worker: ``Oban(pool=..., queues={"default": 50})``,
every other option at its default (leadership on, stager interval 1 s, producer debounce
5 ms, completed jobs kept), on uvloop like ``oban start``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import oban
import oban.schema

from ._harness import probe
from ._peer import PeerSystem

QUEUE = "default"


class _Noop:
    async def process(self, job: Any) -> None:
        probe.started(int(job.args["i"]))


# Not with decorator syntax: without Oban installed (Python < 3.12) mypy sees it as untyped.
Noop: Any = oban.worker(queue=QUEUE)(_Noop)


class _Enqueuer:
    def __init__(self, pool: Any, client: Any) -> None:
        self.pool = pool
        self.client = client

    async def one(self, index: int) -> None:
        await self.client.enqueue(Noop.new({"i": index}))

    async def many(self, indexes: list[int]) -> None:
        await self.client.enqueue_many([Noop.new({"i": i}) for i in indexes])

    async def close(self) -> None:
        await self.client.stop()
        await self.pool.close()


class _Oban:
    name = "oban"
    batch_api = True
    worker_loop: Literal["asyncio", "uvloop"] = "uvloop"
    pending_sql = (
        "SELECT count(*) FROM oban_jobs WHERE state NOT IN ('completed', 'cancelled', 'discarded')"
    )

    async def install(self, dsn: str) -> None:
        pool = await oban.Oban.create_pool(dsn)
        try:
            await oban.schema.install(pool)
        finally:
            await pool.close()

    async def open(self, dsn: str) -> _Enqueuer:
        pool = await oban.Oban.create_pool(dsn)
        client = oban.Oban(pool=pool)
        await client.start()
        return _Enqueuer(pool, client)

    async def serve(self, dsn: str, concurrency: int) -> None:
        pool = await oban.Oban.create_pool(dsn)
        async with oban.Oban(pool=pool, queues={QUEUE: concurrency}):
            await asyncio.Event().wait()


PEER = _Oban()
SYSTEM = PeerSystem(PEER)
