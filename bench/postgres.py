"""Benchmarks of PgStore against the local PostgreSQL, each run in a fresh schema.

Run:  uv run python bench/postgres.py            (full sizes; medians of 3 rounds)
      uv run python bench/postgres.py --quick    (smaller sizes, one round)
      uv run python bench/postgres.py --ceiling  (the raw loops alone: the store's ceiling)

Measures end-to-end throughput (submit_many, and single submits from 100 submitters, pool
concurrency 1,000), submit-to-start latency at a steady 200 tasks/s, failover time (SIGKILL of
the leader process to the standby's first committed step), recovery time for many live tasks,
and the raw ceiling: a bare asyncpg loop of one-row commits and of 1,000-row commits.
DSN: CRONOQ_BENCH_PG_DSN, default postgresql://postgres@127.0.0.1:5432/test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from _common import end_to_end, latency, median_of, row

from cronoq import Pool, Scheduler, TaskContext
from cronoq.store import Status, Store, TaskSpec, TaskSubmitted, TimeBase
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._schema import quote_ident

DSN = os.environ.get("CRONOQ_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
NODE = Path(__file__).with_name("_pg_node.py")


@asynccontextmanager
async def fresh_schema() -> AsyncIterator[str]:
    schema = f"cronoq_bench_{uuid.uuid4().hex[:10]}"
    try:
        yield schema
    finally:
        conn = await asyncpg.connect(DSN)
        await conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")
        await conn.close()


async def check_synchronous_commit() -> str:
    conn = await asyncpg.connect(DSN)
    try:
        value = await conn.fetchval("SHOW synchronous_commit")
    finally:
        await conn.close()
    assert value == "on", f"synchronous_commit is {value}: the figures would prove nothing"
    return str(value)


async def raw_commits(rows_per_commit: int, rows: int) -> float:
    """Rows per second of a bare asyncpg loop: one transaction per ``rows_per_commit`` rows."""
    async with fresh_schema() as schema:
        conn = await asyncpg.connect(DSN)
        try:
            table = f"{quote_ident(schema)}.t"
            await conn.execute(f"CREATE SCHEMA {quote_ident(schema)}")
            await conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, payload bytea)")
            insert = f"INSERT INTO {table} SELECT * FROM unnest($1::bigint[], $2::bytea[])"
            start = time.perf_counter()
            for first in range(0, rows, rows_per_commit):
                ids = list(range(first, first + rows_per_commit))
                async with conn.transaction():
                    await conn.execute(insert, ids, [b""] * len(ids))
            return rows / (time.perf_counter() - start)
        finally:
            await conn.close()


async def in_schema(measure: str, n: int) -> float:
    async with fresh_schema() as schema:
        config = PgStoreConfig(schema=schema)

        async def open_store() -> Store:
            return await PgStore.connect(DSN, config)

        return await end_to_end(open_store, n, batch=measure == "batch")


async def steady_latency(seconds: float) -> dict[str, float]:
    async with fresh_schema() as schema:

        async def open_store() -> Store:
            return await PgStore.connect(DSN, PgStoreConfig(schema=schema))

        return await latency(open_store, 200, seconds)


async def recovery_seconds(live: int) -> float:
    """Time for a new Scheduler to lead, load ``live`` live tasks and serve."""
    async with fresh_schema() as schema:
        config = PgStoreConfig(schema=schema)
        seed = await PgStore.connect(DSN, config)
        lease = await seed.acquire_leadership()
        await seed.recover(lease.epoch, TimeBase(), 3600 * 10**9)
        later = time.time_ns() + 3600 * 10**9
        spec = TaskSpec("default", "noop", b"", start_at_ns=later)
        now = time.time_ns()
        first = (lease.epoch << 40) + 1
        for offset in range(0, live, 20_000):
            batch = [
                TaskSubmitted(first + i, spec, Status.SCHEDULED, now)
                for i in range(offset, min(live, offset + 20_000))
            ]
            await seed.commit(lease.epoch, batch)
        await seed.close()

        async def noop(ctx: TaskContext, payload: bytes) -> None:
            return None

        store = await PgStore.connect(DSN, config)
        sched = Scheduler([Pool("default", noop)], store=store)
        start = time.perf_counter()
        await sched.start()
        elapsed = time.perf_counter() - start
        assert len(await sched.list(limit=live + 1)) == live
        await sched.close()
        await store.close()
        return elapsed


async def failovers(count: int) -> list[float]:
    """Seconds from SIGKILL of the leader to the standby's first committed step."""
    times: list[float] = []
    async with fresh_schema() as schema:
        leader = await _node(schema)
        await _expect(leader, "LEADING")
        for _ in range(count):
            standby = await _node(schema)
            await asyncio.sleep(0.3)  # let the standby connect and start polling the lock
            killed_at = time.time()
            leader.send_signal(signal.SIGKILL)
            await leader.wait()
            line = await _expect(standby, "COMMITTED")
            times.append(float(line.split()[1]) - killed_at)
            leader = standby
        leader.send_signal(signal.SIGKILL)
        await leader.wait()
    return times


async def _node(schema: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(NODE), DSN, schema, stdout=asyncio.subprocess.PIPE
    )


async def _expect(process: asyncio.subprocess.Process, word: str) -> str:
    assert process.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = (await process.stdout.readline()).decode()
            if not line:
                raise RuntimeError(f"node exited before printing {word}")
            if line.startswith(word):
                return line


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--ceiling", action="store_true", help="the raw commit loops alone")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    n = 10_000 if args.quick else 100_000
    sizes = [10_000] if args.quick else [100_000, 1_000_000]

    setting = asyncio.run(check_synchronous_commit())
    print(f"python {sys.version.split()[0]}, synchronous_commit={setting}, {rounds} rounds")
    one_row, values = median_of(rounds, lambda: asyncio.run(raw_commits(1, 2_000)))
    row("raw asyncpg, 1-row commits", one_row, "rows/s", values)
    median, values = median_of(rounds, lambda: asyncio.run(raw_commits(1000, 200_000)))
    row("raw asyncpg, 1,000-row commits", median, "rows/s", values)
    if args.ceiling:
        return 0
    median, values = median_of(rounds, lambda: asyncio.run(in_schema("batch", n)))
    row(f"end to end, submit_many, {n:,} tasks", median, "tasks/s", values)
    median, values = median_of(rounds, lambda: asyncio.run(in_schema("single", n)))
    ratio = f"  ({median / one_row:.1f}x the 1-row commit loop)"
    row(f"end to end, single submits x100, {n:,} tasks", median, "tasks/s", values, ratio)
    figures = asyncio.run(steady_latency(3.0 if args.quick else 10.0))
    print(
        f"{'latency at 200 tasks/s':<58} submit-to-start p50 {figures['start_p50']:.2f} ms, "
        f"p99 {figures['start_p99']:.2f} ms; ack p50 {figures['ack_p50']:.2f} ms, "
        f"p99 {figures['ack_p99']:.2f} ms",
        flush=True,
    )
    times = asyncio.run(failovers(5 if args.quick else 20))
    print(
        f"{f'failover after SIGKILL, {len(times)} failovers':<58} "
        f"p50 {statistics.median(times):.2f} s, p99 {_percentile(times, 99):.2f} s",
        flush=True,
    )
    for size in sizes:
        seconds = asyncio.run(recovery_seconds(size))
        print(f"{f'recovery of {size:,} live tasks':<58} {seconds:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
