"""APScheduler 4 (pre-release): ``AsyncScheduler.add_job`` on the SQLAlchemy PostgreSQL store.

Settings (see README.md): ``SQLAlchemyDataStore(create_async_engine("postgresql+asyncpg://..."))``
with SQLAlchemy's default pool (5 connections + 10 overflow) and
``AsyncpgEventBroker.from_async_sqla_engine`` (LISTEN/NOTIFY), as its separate-worker example
does. The enqueuer is an ``AsyncScheduler(role=scheduler)``; the task is declared with
``@task(max_running_jobs=None)`` (the default, 1, would run one job at a time). APScheduler has no
batch API: row 2 is not applicable, and row 3 enqueues by single calls from 100 submitters.
Worker: ``AsyncScheduler(role=worker, max_concurrent_jobs=50)``, ``run_until_stopped()``,
every other option at its default (lease 30 s, job results not kept), on asyncio.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Literal

from apscheduler import AsyncScheduler, SchedulerRole, task
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ._harness import probe
from ._peer import PeerSystem


async def noop(i: int) -> None:
    probe.started(i)


# Not with decorator syntax: without APScheduler installed, mypy would see an untyped decorator.
task(max_running_jobs=None)(noop)


def _engine(dsn: str) -> AsyncEngine:
    return create_async_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1))


def _scheduler(
    engine: AsyncEngine, role: SchedulerRole, max_concurrent_jobs: int = 100
) -> AsyncScheduler:
    return AsyncScheduler(
        SQLAlchemyDataStore(engine),
        AsyncpgEventBroker.from_async_sqla_engine(engine),
        role=role,
        max_concurrent_jobs=max_concurrent_jobs,
    )


class _Enqueuer:
    def __init__(self, engine: AsyncEngine, stack: AsyncExitStack, sched: AsyncScheduler) -> None:
        self.engine = engine
        self.stack = stack
        self.sched = sched

    async def one(self, index: int) -> None:
        await self.sched.add_job(noop, kwargs={"i": index})

    async def many(self, indexes: list[int]) -> None:
        raise NotImplementedError("APScheduler 4 has no batch API")

    async def close(self) -> None:
        await self.stack.aclose()
        await self.engine.dispose()


class _APScheduler:
    name = "apscheduler"
    batch_api = False
    worker_loop: Literal["asyncio", "uvloop"] = "asyncio"
    # A released job is deleted from ``jobs`` (no result row: result_expiration_time is 0).
    pending_sql = "SELECT count(*) FROM jobs"

    async def install(self, dsn: str) -> None:
        """Starting a scheduler creates the tables."""
        engine = _engine(dsn)
        try:
            async with _scheduler(engine, SchedulerRole.scheduler):
                pass
        finally:
            await engine.dispose()

    async def open(self, dsn: str) -> _Enqueuer:
        engine = _engine(dsn)
        stack = AsyncExitStack()
        sched = await stack.enter_async_context(_scheduler(engine, SchedulerRole.scheduler))
        return _Enqueuer(engine, stack, sched)

    async def serve(self, dsn: str, concurrency: int) -> None:
        engine = _engine(dsn)
        sched = _scheduler(engine, SchedulerRole.worker, max_concurrent_jobs=concurrency)
        await sched.run_until_stopped()
        await asyncio.Event().wait()


PEER = _APScheduler()
SYSTEM = PeerSystem(PEER)
