"""What the PostgreSQL fault tests share: configs, looks into the database, a steady submit load."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg
from pg_harness import DSN, FAST

from cronoq import Pool, Scheduler, SchedulerError, Status, TaskContext
from cronoq.store import TaskSpec, TaskSubmitted
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._schema import lock_key, quote_ident

__all__ = [
    "SubmitLoad",
    "assert_synchronous_commit",
    "close_all",
    "config",
    "current_epoch",
    "ids_in_db",
    "lock_holders",
    "noop",
    "query",
    "rows_with_key",
    "scheduler",
    "submission",
    "wait_until",
]


def config(schema: str, **changes: Any) -> PgStoreConfig:
    """The fast test timings (session_timeout 2 s, keepalive 0.2 s, lock_poll 0.05 s)."""
    return dataclasses.replace(FAST, schema=schema, **changes)


async def query(sql: str, *args: object, dsn: str = DSN) -> list[asyncpg.Record]:
    """Rows of one statement, run on a session of its own (as an administrator's would be)."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return list(await conn.fetch(sql, *args, timeout=10))
    finally:
        await conn.close()


async def assert_synchronous_commit(dsn: str = DSN) -> None:
    """With synchronous_commit off, an immediate stop can lose acknowledged rows, and the
    fault tests would prove nothing."""
    rows = await query("SELECT setting FROM pg_settings WHERE name = 'synchronous_commit'", dsn=dsn)
    assert rows[0]["setting"] == "on", f"synchronous_commit is {rows[0]['setting']!r} on {dsn}"


async def lock_holders(schema: str, dsn: str = DSN) -> list[asyncpg.Record]:
    """(pid, application_name) of every session holding the schema's leader lock."""
    key = lock_key("leader", schema) & 0xFFFFFFFFFFFFFFFF
    return await query(
        """SELECT l.pid, a.application_name FROM pg_locks l
           LEFT JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE l.locktype = 'advisory' AND l.granted AND l.database = (
               SELECT oid FROM pg_database WHERE datname = current_database())
             AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 1""",
        key >> 32,
        key & 0xFFFFFFFF,
        dsn=dsn,
    )


async def ids_in_db(schema: str, ids: Iterable[int], dsn: str = DSN) -> set[int]:
    rows = await query(
        f"SELECT id FROM {quote_ident(schema)}.cronoq_tasks WHERE id = ANY($1::bigint[])",
        list(ids),
        dsn=dsn,
    )
    return {row["id"] for row in rows}


async def rows_with_key(schema: str, key: str, dsn: str = DSN) -> list[int]:
    s = quote_ident(schema)
    rows = await query(f"SELECT id FROM {s}.cronoq_tasks WHERE key = $1 ORDER BY id", key, dsn=dsn)
    return [row["id"] for row in rows]


async def current_epoch(schema: str, dsn: str = DSN) -> int:
    rows = await query(f"SELECT epoch FROM {quote_ident(schema)}.cronoq_leader", dsn=dsn)
    return int(rows[0]["epoch"])


async def noop(ctx: TaskContext, payload: bytes) -> None:
    return None


def scheduler(store: PgStore, commit_timeout: float = 5.0) -> Scheduler:
    pools = [Pool("default", noop, concurrency=100)]
    return Scheduler(pools, store=store, commit_timeout=commit_timeout)


def submission(epoch: int, key: str) -> TaskSubmitted:
    """A task row as the engine would submit it (ids carry the epoch in their upper bits)."""
    spec = TaskSpec("default", "job", b"payload", key=key)
    return TaskSubmitted(epoch << 40 | 999_999, spec, Status.READY, time.time_ns())


async def close_all(
    schedulers: list[Scheduler], stores: list[PgStore], starts: list[asyncio.Future[Any]]
) -> None:
    """Cancel pending starts, then close the schedulers, then the stores."""
    for start in starts:
        start.cancel()
    await asyncio.gather(*starts, return_exceptions=True)
    for sched in schedulers:
        await sched.close(timeout=1.0)
    for store in stores:
        await store.close()


async def wait_until(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool],
    timeout: float,
    what: str,
    pause: float = 0.01,
) -> None:
    """Poll a condition that has no event to await, up to a bounded deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(pause)


class SubmitLoad:
    """Concurrent submitters on one scheduler; each acknowledged id is recorded.

    Every submission carries a key ``<prefix>-<n>``, so the rows of unacknowledged ones can be
    looked for too; ``options`` go to every ``submit``. The submitters end when the scheduler
    stops serving, or on ``stop()``.
    """

    def __init__(
        self, scheduler: Scheduler, prefix: str, submitters: int = 4, **options: Any
    ) -> None:
        self.scheduler = scheduler
        self.prefix = prefix
        self.options = options
        self.acked: list[int] = []
        self.acked_keys: list[str] = []
        self.failed_keys: list[str] = []
        self.errors: list[BaseException] = []
        self._counter = 0
        self._changed = asyncio.Condition()
        self._tasks = [asyncio.ensure_future(self._submit()) for _ in range(submitters)]

    async def _submit(self) -> None:
        while self.scheduler.running:
            self._counter += 1
            key = f"{self.prefix}-{self._counter}"
            try:
                task_id = await self.scheduler.submit("load", b"x", key=key, **self.options)
            except SchedulerError as exc:
                self.errors.append(exc)
                self.failed_keys.append(key)
            else:
                self.acked.append(task_id)
                self.acked_keys.append(key)
            async with self._changed:
                self._changed.notify_all()
            await asyncio.sleep(0)

    async def wait_acks(self, count: int, timeout: float = 10.0) -> None:
        """Until ``count`` submissions were acknowledged in all."""
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: len(self.acked) >= count)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def finished(self, timeout: float = 10.0) -> None:
        """Until every submitter ended by itself (the scheduler stopped serving)."""
        async with asyncio.timeout(timeout):
            await asyncio.gather(*self._tasks)
