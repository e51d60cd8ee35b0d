"""Procrastinate: ``defer_async`` / ``batch_defer_async``, worker ``App.run_worker_async``.

Settings (see README.md): ``App(connector=PsycopgConnector(conninfo=DSN))`` with the
connector's default pool (psycopg_pool defaults: 4 connections); schema applied with
``schema_manager.apply_schema_async()``. Worker: ``run_worker_async(concurrency=50)``, every
other option at its default (listen_notify on, fetch_job_polling_interval 5 s, delete_jobs
never, so finished jobs stay with status ``succeeded``), on asyncio like ``procrastinate
worker``; signal handlers off (the harness ends the process).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from procrastinate import App, PsycopgConnector

from ._harness import probe
from ._peer import PeerSystem

TASK = "noop"


async def noop(i: int) -> None:
    probe.started(i)


def _app(dsn: str) -> tuple[App, Any]:
    app = App(connector=PsycopgConnector(conninfo=dsn))
    task = app.task(name=TASK)(noop)
    return app, task


class _Enqueuer:
    def __init__(self, app: App, task: Any) -> None:
        self.app = app
        self.task = task

    async def one(self, index: int) -> None:
        await self.task.defer_async(i=index)

    async def many(self, indexes: list[int]) -> None:
        await self.task.batch_defer_async(*({"i": i} for i in indexes))

    async def close(self) -> None:
        await self.app.close_async()


class _Procrastinate:
    name = "procrastinate"
    batch_api = True
    worker_loop: Literal["asyncio", "uvloop"] = "asyncio"
    pending_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"

    async def install(self, dsn: str) -> None:
        app, _ = _app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    async def open(self, dsn: str) -> _Enqueuer:
        app, task = _app(dsn)
        await app.open_async()
        return _Enqueuer(app, task)

    async def serve(self, dsn: str, concurrency: int) -> None:
        app, _ = _app(dsn)
        async with app.open_async():
            await app.run_worker_async(concurrency=concurrency, install_signal_handlers=False)
        await asyncio.Event().wait()


PEER = _Procrastinate()
SYSTEM = PeerSystem(PEER)
