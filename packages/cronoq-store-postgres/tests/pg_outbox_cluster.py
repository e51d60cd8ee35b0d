"""What the outbox helpers' tests share: a Scheduler ingesting a schema's outbox that records
what it runs, the application's own table (``orders``), and looks into both."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pg_fault_helpers import config, query
from pg_harness import DSN

from cronoq import Codec, Pool, RemotePool, Scheduler, TaskContext
from cronoq_store_postgres import PgStore
from cronoq_store_postgres._schema import quote_ident

__all__ = [
    "WAIT_S",
    "Cluster",
    "Runs",
    "ingesting",
    "orders",
    "outbox_ids",
    "quarantined_ids",
    "task_rows",
]

WAIT_S = 10.0
"""The longest a test waits for one thing the scheduler does (it takes milliseconds)."""


class Runs:
    """Every attempt the scheduler ran, as (kind, payload) counts, and a way to await some."""

    def __init__(self) -> None:
        self.counts: Counter[tuple[str, Any]] = Counter()
        self.distinct: Counter[str] = Counter()
        """Per kind, how many distinct payloads ran (for a cheap wait on thousands)."""
        self._changed = asyncio.Condition()

    async def run(self, ctx: TaskContext, payload: Any) -> None:
        """The executor of every pool (the function gets None for no payload)."""
        key = (ctx.kind, _hashable(payload))
        async with self._changed:
            self.counts[key] += 1
            if self.counts[key] == 1:
                self.distinct[ctx.kind] += 1
            self._changed.notify_all()

    async def until(self, done: Callable[[], bool], timeout: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(done)

    async def ran(self, kind: str, payload: Any, timeout: float = WAIT_S) -> None:
        """Until the task of this kind and payload ran (once or more)."""
        key = (kind, _hashable(payload))
        await self.until(lambda: self.counts[key] > 0, timeout)

    def of_kind(self, kind: str) -> dict[Any, int]:
        return {payload: n for (k, payload), n in self.counts.items() if k == kind}


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value


@dataclasses.dataclass
class Cluster:
    schema: str
    store: PgStore
    sched: Scheduler
    runs: Runs

    @property
    def s(self) -> str:
        """The schema, quoted for SQL."""
        return quote_ident(self.schema)


@contextlib.asynccontextmanager
async def ingesting(
    schema: str,
    *,
    codec: Codec | None = None,
    pools: Sequence[str] = ("default",),
    remote_pools: Sequence[str] = (),
) -> AsyncIterator[Cluster]:
    """A started Scheduler on ``schema`` (which it migrates, outbox included), every pool's
    executor recording into ``runs``, and the application's table ``orders`` beside the
    scheduler's (an application keeps its tables where it likes: here, the same schema)."""
    runs = Runs()
    store = await PgStore.connect(DSN, config(schema))
    sched = Scheduler(
        [
            *(Pool(name, runs.run, concurrency=200) for name in pools),
            *(RemotePool(name) for name in remote_pools),
        ],
        store=store,
        codec=codec,
        commit_timeout=5.0,
    )
    try:
        async with asyncio.timeout(WAIT_S):
            await sched.start()
        s = quote_ident(schema)
        await query(
            f"CREATE TABLE {s}.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "item text NOT NULL)"
        )
        yield Cluster(schema, store, sched, runs)
    finally:
        await sched.close(timeout=1.0)
        await store.close()


async def orders(schema: str) -> list[str]:
    """The items of the application's committed orders, in id order."""
    rows = await query(f"SELECT item FROM {quote_ident(schema)}.orders ORDER BY id")
    return [row["item"] for row in rows]


async def outbox_ids(schema: str) -> list[int]:
    rows = await query(f"SELECT id FROM {quote_ident(schema)}.cronoq_outbox ORDER BY id")
    return [row["id"] for row in rows]


async def quarantined_ids(schema: str) -> list[int]:
    rows = await query(f"SELECT id FROM {quote_ident(schema)}.cronoq_outbox_quarantine")
    return [row["id"] for row in rows]


async def task_rows(schema: str, kind: str) -> list[tuple[int, bytes]]:
    """(id, payload) of the scheduler's task rows of this kind, in id order."""
    rows = await query(
        f"SELECT id, payload FROM {quote_ident(schema)}.cronoq_tasks WHERE kind = $1 ORDER BY id",
        kind,
    )
    return [(row["id"], bytes(row["payload"])) for row in rows]
