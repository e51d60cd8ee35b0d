"""The outbox (issue 30) beside the peers: what an enqueue adds to the application's own
transaction, and how fast cronoq's leader turns committed outbox rows into tasks.

Run from the repository root (the peers come with the ``bench`` dependency group):

    uv run --group bench python bench/outbox.py            # 3 rounds: 3.5 to 5 minutes
    uv run --group bench python bench/outbox.py --quick    # 1 round, small sizes: a smoke test

Options: ``--rounds N``, ``--systems cronoq,cronoq-psycopg,pgqueuer,procrastinate,oban``,
``--measures cost,ingest,latency``, ``--txns N``, ``--batches N`` and ``--concurrent-txns N``
(cost), ``--ingest-tasks N``, ``--rate R`` and ``--seconds S`` (latency), ``--timeout S`` (per
measurement), ``--json PATH`` (every value of every round). The exit status is 1 if a
measurement failed; failures are listed, never replaced by a number.

Every measurement runs in a fresh process (``--child``) on a fresh database
(``cronoq_peers_outbox_*``, dropped after; ``synchronous_commit`` and ``fsync`` asserted on), as
``bench/peers`` does; Oban's on the Python 3.12+ environment ``bench/peers/_envs.py`` builds.
Within a round each measurement is taken for every system before the next one, the systems'
order rotating from round to round; the tables give medians over the rounds. cronoq's tables
live in the schema ``cronoq`` of that database, the application's ``orders`` table in
``public``, the peers' tables where their installers put them.

1. **cost** (every system; ``cronoq-psycopg`` is cronoq's ``enqueue`` on psycopg 3): on one
   connection, ``--txns`` transactions of the application alone (one ``orders`` row) alternate
   with as many of the same transaction plus the enqueue of one task, then ``--batches`` of 100
   ``orders`` rows (one statement) alone and plus 100 tasks (the batch API), each timed from
   the BEGIN to the COMMIT's return. The added latency is the percentile with the enqueue
   minus the same percentile without, on that system's driver (asyncpg for cronoq and
   PgQueuer, psycopg 3 for ``cronoq-psycopg``, Procrastinate and Oban). Then 10 connections
   commit ``--concurrent-txns`` single-row transactions at once, alone and with one task each
   (two repetitions of each, alternated): commits per second; for cronoq, twice more with the
   outbox's NOTIFY trigger disabled (its leader then ingests at each poll, ``outbox_poll``).
   Nothing consumes the tasks.
2. **ingest** (cronoq): a ``Scheduler`` on a ``PgStore`` leads in a process of its own; the
   application (this process, 10 connections) commits ``--ingest-tasks`` outbox rows in
   transactions of 1 and of 100: tasks per second from the first BEGIN until the outbox is
   empty (polled every 2 ms once the last commit returned; a row leaves the outbox in the
   commit that makes its task durable). Then as many rows in one transaction: tasks per second
   from its commit until the outbox is empty. The tasks go to a paused pool, so that nothing
   runs: the figure is the ingest alone. The stored count is checked.
3. **latency** (cronoq and the peers): single-task transactions (one ``orders`` row and one
   enqueue) at ``--rate`` for ``--seconds``, an open loop over 8 connections, the consumer in a
   process of its own (cronoq's Scheduler with a pool of concurrency 50, or the peer's worker at
   concurrency 50, as ``bench/peers`` starts it), after 100 warm-up tasks. From the COMMIT's
   return to the task's start in the consumer (``time.monotonic()``, one clock for the
   machine), p50 and p99; for cronoq also to the return of the leader's commit that created
   the task. A peer's job is visible to its workers from the application's commit on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from peers._envs import python_for
from peers._harness import (
    ADMIN_DSN,
    check_durability,
    fresh_database,
    percentile,
    probe,
    wait_until_zero,
)
from peers._peer import REPO_ROOT, Worker, worker_timeout

SCRIPT = Path(__file__).resolve()
SYSTEMS = ("cronoq", "cronoq-psycopg", "pgqueuer", "procrastinate", "oban")
MEASURES = ("cost", "ingest", "latency")
SCHEMA = "cronoq"
"""cronoq's schema in each fresh database (the application's ``orders`` is in ``public``)."""
KIND = "noop"
PARKED = "parked"
"""The ingest measurement's pool, paused before the measurement starts."""
CONNECTIONS = 8
"""The application's connections in the latency measurement."""
CONCURRENT = 10
"""The application's connections committing at once in the cost measurement's last part."""
INGEST_CONNECTIONS = 10
OBAN_WORKER = "bench.peers.oban._Noop"
"""The name the worker process gives Oban's no-op worker (its module is ``bench.peers.oban``
there, ``peers.oban`` here)."""
ORDERS = """CREATE TABLE orders (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer bigint NOT NULL,
    amount_cents bigint NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)"""


@dataclass(frozen=True, slots=True)
class Sizes:
    txns: int = 1000
    """cost: single-task transactions of each variant (with and without the enqueue)."""
    batches: int = 100
    """cost: transactions of ``batch`` rows and tasks, of each variant."""
    batch: int = 100
    concurrent_txns: int = 1000
    """cost: single-task transactions over ``CONCURRENT`` connections at once, per repetition
    (two of each variant)."""
    ingest_tasks: int = 10_000
    rate: float = 200.0
    seconds: float = 5.0
    warmup: int = 100

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            txns=100, batches=10, concurrent_txns=200, ingest_tasks=1000, seconds=1.0, warmup=20
        )


# --- the application's connection ---------------------------------------------------------------


class AppConn:
    """One connection of the application, asyncpg or psycopg 3 (autocommit: ``transaction()``
    sends BEGIN and COMMIT, as asyncpg's does)."""

    def __init__(self, raw: Any, driver: Literal["asyncpg", "psycopg"]) -> None:
        self.raw = raw
        self.driver = driver
        self.state: dict[str, Any] = {}
        """What a system keeps per connection (PgQueuer's ``Queries``)."""

    @classmethod
    async def open(cls, dsn: str, driver: Literal["asyncpg", "psycopg"]) -> AppConn:
        if driver == "asyncpg":
            import asyncpg

            return cls(await asyncpg.connect(dsn), driver)
        import psycopg

        return cls(await psycopg.AsyncConnection.connect(dsn, autocommit=True), driver)

    def transaction(self) -> Any:
        return self.raw.transaction()

    async def order(self, index: int) -> None:
        if self.driver == "asyncpg":
            await self.raw.execute(
                "INSERT INTO orders (customer, amount_cents) VALUES ($1, $2)", index, 1999
            )
        else:
            await self.raw.execute(
                "INSERT INTO orders (customer, amount_cents) VALUES (%s, %s)", (index, 1999)
            )

    async def orders(self, indexes: list[int]) -> None:
        amounts = [1999] * len(indexes)
        if self.driver == "asyncpg":
            await self.raw.execute(
                "INSERT INTO orders (customer, amount_cents)"
                " SELECT * FROM unnest($1::bigint[], $2::bigint[])",
                indexes,
                amounts,
            )
        else:
            await self.raw.execute(
                "INSERT INTO orders (customer, amount_cents)"
                " SELECT * FROM unnest(%s::bigint[], %s::bigint[])",
                (indexes, amounts),
            )

    async def close(self) -> None:
        await self.raw.close()


# --- the systems: install, enqueue in the caller's transaction, consume -------------------------


class System(Protocol):
    name: str
    driver: Literal["asyncpg", "psycopg"]
    how: str
    """The call that enqueues on the caller's connection (shown in the output)."""
    pending_sql: str
    """Counts the tasks not yet finished (rows waiting to become tasks included)."""

    async def setup(self, dsn: str) -> None:
        """Install the schema in a fresh database and open what enqueuing needs."""
        ...

    async def one(self, conn: AppConn, index: int) -> None: ...

    async def many(self, conn: AppConn, indexes: list[int]) -> None: ...

    def consumer(self, dsn: str, target: int, record: Path | None) -> Worker:
        """The consumer's process (not started), reporting starts as bench/peers' workers do."""
        ...

    async def close(self) -> None: ...


class Cronoq:
    how = "enqueue(conn, kind, payload, schema=...) / enqueue_many"
    pending_sql = (
        f"SELECT (SELECT count(*) FROM {SCHEMA}.cronoq_outbox) + (SELECT count(*) FROM"
        f" {SCHEMA}.cronoq_tasks WHERE status NOT IN ('succeeded', 'failed', 'cancelled'))"
    )

    def __init__(self, driver: Literal["asyncpg", "psycopg"]) -> None:
        self.driver = driver
        self.name = "cronoq" if driver == "asyncpg" else "cronoq-psycopg"

    async def setup(self, dsn: str) -> None:
        from cronoq_store_postgres import PgStore, PgStoreConfig

        await PgStore.migrate(dsn, PgStoreConfig(schema=SCHEMA))

    async def one(self, conn: AppConn, index: int) -> None:
        from cronoq_store_postgres import enqueue

        await enqueue(conn.raw, KIND, str(index).encode(), schema=SCHEMA)

    async def many(self, conn: AppConn, indexes: list[int]) -> None:
        from cronoq import TaskRequest
        from cronoq_store_postgres import enqueue_many

        requests = [TaskRequest(KIND, str(i).encode()) for i in indexes]
        await enqueue_many(conn.raw, requests, schema=SCHEMA)

    def consumer(self, dsn: str, target: int, record: Path | None) -> Worker:
        worker = Worker("cronoq", dsn, 50, target=target, record=record)
        commits = "-" if record is None else str(record.with_suffix(".commits"))
        worker.args = [
            sys.executable, str(SCRIPT), "--serve", dsn, str(target),
            str(record) if record else "-", commits,
        ]  # fmt: skip
        return worker

    async def close(self) -> None:
        return None


class PgQueuer:
    name = "pgqueuer"
    driver: Literal["asyncpg", "psycopg"] = "asyncpg"
    how = "Queries.from_asyncpg_connection(conn).enqueue(...) (lists for a batch)"

    def __init__(self) -> None:
        from peers import pgqueuer

        self.peer: Any = pgqueuer.PEER
        self.pending_sql: str = self.peer.pending_sql

    async def setup(self, dsn: str) -> None:
        await self.peer.install(dsn)

    def _queries(self, conn: AppConn) -> Any:
        if "queries" not in conn.state:
            from pgqueuer import Queries

            conn.state["queries"] = Queries.from_asyncpg_connection(conn.raw)
        return conn.state["queries"]

    async def one(self, conn: AppConn, index: int) -> None:
        await self._queries(conn).enqueue(KIND, str(index).encode())

    async def many(self, conn: AppConn, indexes: list[int]) -> None:
        await self._queries(conn).enqueue(
            [KIND] * len(indexes), [str(i).encode() for i in indexes], [0] * len(indexes)
        )

    def consumer(self, dsn: str, target: int, record: Path | None) -> Worker:
        return Worker(self.name, dsn, 50, target=target, record=record)

    async def close(self) -> None:
        return None


class Procrastinate:
    name = "procrastinate"
    driver: Literal["asyncpg", "psycopg"] = "psycopg"
    how = "task.configure(connection=conn).defer_async(...) / .batch_defer_async(...)"

    def __init__(self) -> None:
        from peers import procrastinate

        self.module: Any = procrastinate
        self.pending_sql: str = procrastinate.PEER.pending_sql
        self.app: Any = None
        self.task: Any = None

    async def setup(self, dsn: str) -> None:
        await self.module.PEER.install(dsn)
        self.app, self.task = self.module._app(dsn)
        await self.app.open_async()

    async def one(self, conn: AppConn, index: int) -> None:
        await self.task.configure(connection=conn.raw).defer_async(i=index)

    async def many(self, conn: AppConn, indexes: list[int]) -> None:
        deferrer = self.task.configure(connection=conn.raw)
        await deferrer.batch_defer_async(*({"i": i} for i in indexes))

    def consumer(self, dsn: str, target: int, record: Path | None) -> Worker:
        return Worker(self.name, dsn, 50, target=target, record=record)

    async def close(self) -> None:
        if self.app is not None:
            await self.app.close_async()


class Oban:
    name = "oban"
    driver: Literal["asyncpg", "psycopg"] = "psycopg"
    how = "oban.enqueue(job, conn=conn) / enqueue_many(jobs, conn=conn)"

    def __init__(self) -> None:
        from peers import oban

        self.module: Any = oban
        self.pending_sql: str = oban.PEER.pending_sql
        self.pool: Any = None
        self.client: Any = None

    async def setup(self, dsn: str) -> None:
        import oban

        await self.module.PEER.install(dsn)
        self.pool = await oban.Oban.create_pool(dsn)
        self.client = oban.Oban(pool=self.pool)
        await self.client.start()

    def _job(self, index: int) -> Any:
        job = self.module.Noop.new({"i": index})
        job.worker = OBAN_WORKER
        return job

    async def one(self, conn: AppConn, index: int) -> None:
        await self.client.enqueue(self._job(index), conn=conn.raw)

    async def many(self, conn: AppConn, indexes: list[int]) -> None:
        await self.client.enqueue_many([self._job(i) for i in indexes], conn=conn.raw)

    def consumer(self, dsn: str, target: int, record: Path | None) -> Worker:
        return Worker(self.name, dsn, 50, target=target, record=record)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.stop()
            await self.pool.close()


def make_system(name: str) -> System:
    if name == "cronoq":
        return Cronoq("asyncpg")
    if name == "cronoq-psycopg":
        return Cronoq("psycopg")
    if name == "pgqueuer":
        return PgQueuer()
    if name == "procrastinate":
        return Procrastinate()
    if name == "oban":
        return Oban()
    raise ValueError(f"unknown system {name!r}; systems: {', '.join(SYSTEMS)}")


@asynccontextmanager
async def application(system: System) -> AsyncIterator[str]:
    """A fresh database with the system's schema and the application's ``orders``; its DSN."""
    async with fresh_database("outbox_" + system.name.replace("-", "_")) as dsn:
        await system.setup(dsn)
        try:
            conn = await AppConn.open(dsn, system.driver)
            try:
                await conn.raw.execute(ORDERS)
            finally:
                await conn.close()
            yield dsn
        finally:
            await system.close()


# --- 1. the cost added to the application's transaction ----------------------------------------


async def measure_cost(system: System, sizes: Sizes) -> dict[str, Any]:
    async with application(system) as dsn:
        conns = [await AppConn.open(dsn, system.driver) for _ in range(CONCURRENT)]
        conn = conns[0]
        times: dict[str, list[float]] = {"alone": [], "one": [], "alone100": [], "many": []}
        rates: dict[str, list[float]] = {"alone": [], "one": []}
        index = 0
        enqueued = 0

        def single(enqueue: bool) -> Callable[[AppConn, int], Awaitable[int]]:
            async def body(conn: AppConn, i: int) -> int:
                await conn.order(i)
                if not enqueue:
                    return 0
                await system.one(conn, i)
                return 1

            return body

        def batch(enqueue: bool) -> Callable[[AppConn, int], Awaitable[int]]:
            async def body(conn: AppConn, first: int) -> int:
                indexes = list(range(first, first + sizes.batch))
                await conn.orders(indexes)
                if not enqueue:
                    return 0
                await system.many(conn, indexes)
                return len(indexes)

            return body

        async def run(
            variants: list[tuple[str, Callable[[AppConn, int], Awaitable[int]]]],
            count: int,
            step: int,
        ) -> None:
            """``count`` transactions of each variant on one connection, alternating."""
            nonlocal index, enqueued
            for n in range(count):
                # Alternate which variant goes first: drift and caches hit both alike.
                for name, body in variants if n % 2 == 0 else variants[::-1]:
                    start = time.perf_counter()
                    async with conn.transaction():
                        enqueued += await body(conn, index)
                    elapsed = time.perf_counter() - start
                    index += step
                    if name:
                        times[name].append(elapsed)

        async def concurrently(name: str, body: Callable[[AppConn, int], Awaitable[int]]) -> None:
            """``sizes.concurrent_txns`` transactions over the connections at once: commits/s."""
            nonlocal index, enqueued
            per_conn = sizes.concurrent_txns // len(conns)

            async def writer(c: AppConn, first: int) -> int:
                done = 0
                for i in range(first, first + per_conn):
                    async with c.transaction():
                        done += await body(c, i)
                return done

            start = time.perf_counter()
            done = await asyncio.gather(
                *(writer(c, index + k * per_conn) for k, c in enumerate(conns))
            )
            elapsed = time.perf_counter() - start
            index += per_conn * len(conns)
            enqueued += sum(done)
            if name:
                rates[name].append(per_conn * len(conns) / elapsed)

        try:
            # Warm-up (not counted): prepared statements, caches, the first pages.
            warm = max(10, sizes.warmup // 2)
            await run([("", single(False)), ("", single(True))], warm, 1)
            await run([("", batch(False)), ("", batch(True))], max(2, warm // 10), sizes.batch)
            await concurrently("", single(True))
            await run([("alone", single(False)), ("one", single(True))], sizes.txns, 1)
            await run(
                [("alone100", batch(False)), ("many", batch(True))], sizes.batches, sizes.batch
            )
            for name in ("alone", "one", "one", "alone"):
                await concurrently(name, single(name == "one"))
            if isinstance(system, Cronoq):
                # What an operator gains by disabling the NOTIFY trigger (the poll still ingests).
                rates["quiet"] = []
                await conn.raw.execute(
                    f"ALTER TABLE {SCHEMA}.cronoq_outbox DISABLE TRIGGER cronoq_outbox_notify"
                )
                for _ in range(2):
                    await concurrently("quiet", single(True))
        finally:
            for c in conns:
                await c.close()
        checker = await AppConn.open(dsn, "asyncpg")
        try:
            stored = await checker.raw.fetchval(system.pending_sql)
        finally:
            await checker.close()
        assert stored == enqueued, f"{system.name}: {stored} tasks stored, expected {enqueued}"
    result: dict[str, Any] = {
        name: {"p50": percentile(values, 50) * 1000, "p99": percentile(values, 99) * 1000}
        for name, values in times.items()
    }
    result["commits_per_s"] = {name: statistics.fmean(values) for name, values in rates.items()}
    return result


# --- 2. the ingest rate (cronoq) ----------------------------------------------------------------


async def measure_ingest(sizes: Sizes) -> dict[str, Any]:
    import asyncpg

    from cronoq import TaskRequest
    from cronoq_store_postgres import enqueue, enqueue_many

    system = Cronoq("asyncpg")
    n = sizes.ingest_tasks
    results: dict[str, Any] = {}
    async with application(system) as dsn:
        pool = await asyncpg.create_pool(
            dsn, min_size=INGEST_CONNECTIONS, max_size=INGEST_CONNECTIONS
        )
        poller = await asyncpg.connect(dsn)
        outbox_sql = f"SELECT count(*) FROM {SCHEMA}.cronoq_outbox"
        try:
            async with system.consumer(dsn, 0, None) as leader:
                await _expect_line(leader, "LEADING")
                for per_txn in (1, 100):
                    txns = n // per_txn
                    per_conn = txns // INGEST_CONNECTIONS

                    async def writer(per_txn: int = per_txn, per_conn: int = per_conn) -> None:
                        async with pool.acquire() as conn:
                            for _ in range(per_conn):
                                async with conn.transaction():
                                    if per_txn == 1:
                                        await enqueue(conn, KIND, None, schema=SCHEMA, pool=PARKED)
                                    else:
                                        requests = [TaskRequest(KIND, pool=PARKED)] * per_txn
                                        await enqueue_many(conn, requests, schema=SCHEMA)

                    start = time.perf_counter()
                    await asyncio.gather(*(writer() for _ in range(INGEST_CONNECTIONS)))
                    written = time.perf_counter()
                    end = await wait_until_zero(
                        poller, outbox_sql, interval=0.002, timeout=120, check=leader.check
                    )
                    count = per_conn * INGEST_CONNECTIONS * per_txn
                    results[f"txn{per_txn}"] = {
                        "tasks_per_s": count / (end - start),
                        "written_per_s": count / (written - start),
                        "lag_ms": (end - written) * 1000,
                    }
                # The whole lot in one transaction: the leader's ingest alone, from its commit.
                async with pool.acquire() as conn:
                    async with conn.transaction():
                        for first in range(0, n, 1000):
                            size = min(1000, n - first)
                            requests = [TaskRequest(KIND, pool=PARKED)] * size
                            await enqueue_many(conn, requests, schema=SCHEMA)
                    committed = time.perf_counter()
                end = await wait_until_zero(
                    poller, outbox_sql, interval=0.002, timeout=120, check=leader.check
                )
                results["one_txn"] = {"tasks_per_s": n / (end - committed)}
                total = (
                    sum(
                        (n // per_txn // INGEST_CONNECTIONS) * INGEST_CONNECTIONS * per_txn
                        for per_txn in (1, 100)
                    )
                    + n
                )
                tasks = await poller.fetchval(
                    f"SELECT count(*) FROM {SCHEMA}.cronoq_tasks"
                    f" WHERE pool = '{PARKED}' AND status = 'ready'"
                )
                assert tasks == total, f"{tasks} tasks in the paused pool, expected {total}"
        finally:
            await poller.close()
            await pool.close()
    return results


async def _expect_line(worker: Worker, word: str) -> str:
    async with asyncio.timeout(60):
        while True:
            line = await worker.lines.get()
            if not line:
                worker.check()
                raise RuntimeError(f"the consumer exited before printing {word}")
            if line.startswith(word):
                return line


# --- 3. commit to start at a steady rate --------------------------------------------------------


async def measure_latency(system: System, sizes: Sizes) -> dict[str, Any]:
    count = int(sizes.rate * sizes.seconds)
    with tempfile.TemporaryDirectory(prefix="cronoq-outbox-") as tmp:
        record = Path(tmp) / "starts.txt"
        async with application(system) as dsn:
            conns: asyncio.Queue[AppConn] = asyncio.Queue()
            for _ in range(CONNECTIONS):
                conns.put_nowait(await AppConn.open(dsn, system.driver))
            poller = await AppConn.open(dsn, "asyncpg")
            committed: dict[int, float] = {}

            async def transaction(index: int) -> None:
                conn = await conns.get()
                try:
                    async with conn.transaction():
                        await conn.order(index)
                        await system.one(conn, index)
                    committed[index] = time.monotonic()
                finally:
                    conns.put_nowait(conn)

            try:
                async with system.consumer(dsn, count, record) as consumer:
                    if isinstance(system, Cronoq):
                        await _expect_line(consumer, "LEADING")
                    # Warm-up: negative indexes, run and waited for, not counted.
                    await asyncio.gather(*(transaction(i) for i in range(-sizes.warmup, 0)))
                    await wait_until_zero(
                        poller.raw,
                        system.pending_sql,
                        interval=0.02,
                        timeout=120,
                        check=consumer.check,
                    )
                    interval = 1.0 / sizes.rate
                    begin = time.monotonic()
                    pending: list[asyncio.Task[None]] = []
                    for index in range(count):
                        delay = begin + index * interval - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        pending.append(asyncio.create_task(transaction(index)))
                    await asyncio.gather(*pending)
                    await consumer.done(timeout=worker_timeout(count) + sizes.seconds)
            finally:
                await poller.close()
                while not conns.empty():
                    await conns.get_nowait().close()
        result = {"start": _since_commit(record, committed)}
        commits = record.with_suffix(".commits")
        if commits.exists():
            result["task_commit"] = _since_commit(commits, committed)
        return result


def _since_commit(path: Path, committed: dict[int, float]) -> dict[str, float]:
    """p50 and p99 (ms) from each task's commit to its line (``index monotonic``) in ``path``."""
    seen: dict[int, float] = {}
    for line in path.read_text().splitlines():
        index, at = line.split()
        seen.setdefault(int(index), float(at))
    wanted = [i for i in committed if i >= 0]
    missing = [i for i in wanted if i not in seen]
    assert not missing, f"{len(missing)} tasks missing from {path.name}"
    delays = [seen[i] - committed[i] for i in wanted]
    return {"p50": percentile(delays, 50) * 1000, "p99": percentile(delays, 99) * 1000}


# --- the cronoq consumer process (--serve) ------------------------------------------------------


def serve(dsn: str, target: int, record: str, commits: str) -> None:
    """A Scheduler on a PgStore of ``dsn`` (schema ``cronoq``) leading and ingesting: pool
    ``default`` (concurrency 50) runs the no-op, reporting to ``probe`` as bench/peers' workers
    do; pool ``parked`` is paused. ``commits``: a line ``index monotonic`` per task, once the
    commit that created it has returned. ``STATS`` on stdin as bench/peers' workers; the
    process ends when stdin closes."""
    from collections.abc import Sequence

    from peers._harness import Usage

    from cronoq import BytesCodec, Pool, Scheduler, TaskContext
    from cronoq.store import Mutation, TaskSubmitted
    from cronoq_store_postgres import PgStore, PgStoreConfig

    probe.target = target
    if record != "-":
        probe.record_fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    commits_fd = (
        None if commits == "-" else os.open(commits, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    )

    class TimedStore(PgStore):
        async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
            await super().commit(epoch, batch)
            if commits_fd is None:
                return
            now = time.monotonic()
            lines = "".join(
                f"{int(m.spec.payload)} {now:.9f}\n"
                for m in batch
                if isinstance(m, TaskSubmitted) and m.spec.payload
            )
            if lines:
                os.write(commits_fd, lines.encode())

    def answer_stats() -> None:
        for line in sys.stdin:
            if line.strip() == "STATS":
                os.write(1, (Usage.of_self().line() + "\n").encode())
        os._exit(0)

    async def noop(ctx: TaskContext, payload: bytes) -> None:
        if payload:
            probe.started(int(payload))

    async def main() -> None:
        store = await TimedStore.connect(dsn, PgStoreConfig(schema=SCHEMA))
        pools = [Pool("default", noop, concurrency=50), Pool(PARKED, noop, concurrency=50)]
        async with Scheduler(pools, store=store, codec=BytesCodec()) as sched:
            await sched.pause_pool(PARKED)
            assert sched.leading  # start() returns once this scheduler leads
            os.write(1, b"LEADING\n")
            await asyncio.Event().wait()

    threading.Thread(target=answer_stats, daemon=True).start()
    asyncio.run(main())


# --- the runner -------------------------------------------------------------------------------


def child(system_name: str, measure: str, sizes: Sizes) -> Any:
    if measure == "cost":
        return asyncio.run(measure_cost(make_system(system_name), sizes))
    if measure == "ingest":
        return asyncio.run(measure_ingest(sizes))
    if measure == "latency":
        return asyncio.run(measure_latency(make_system(system_name), sizes))
    raise ValueError(f"unknown measure {measure!r}")


def run_child(python: str, system: str, measure: str, sizes: Sizes, timeout: float) -> Any:
    args = [python, str(SCRIPT), "--child", system, measure, json.dumps(asdict(sizes))]
    done = subprocess.run(
        args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (done.stderr or done.stdout).strip()[-1500:]
    raise RuntimeError(f"{system} {measure} exited {done.returncode}: {tail}")


def rotated(items: list[str], by: int) -> list[str]:
    if not items:
        return items
    by %= len(items)
    return items[by:] + items[:by]


Results = dict[str, dict[str, list[Any]]]


def median_at(values: list[Any], *path: str) -> float | None:
    picked: list[float] = []
    for value in values:
        for key in path:
            value = value[key]
        picked.append(float(value))
    return statistics.median(picked) if picked else None


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.{digits}f}"


def report(results: Results, systems: list[str], sizes: Sizes) -> None:
    cost = results.get("cost", {})
    names = [s for s in systems if cost.get(s)]
    mine = [s for s in names if s.startswith("cronoq")]
    peers = [s for s in names if not s.startswith("cronoq")]
    if names:
        print()
        print(
            "| the application's transaction (medians of the rounds) | "
            + " | ".join(f"{s} ({make_driver_label(s)})" for s in names)
            + "".join(f" | {s} vs best peer" for s in mine)
            + " |"
        )
        print("|---" * (len(names) + len(mine) + 1) + "|")

        def added(s: str, with_: str, alone: str, pct: str, per: int = 1) -> float | None:
            values = [(v[with_][pct] - v[alone][pct]) / per for v in cost[s]]
            return statistics.median(values) if values else None

        def kept(s: str) -> float | None:
            values = [v["commits_per_s"]["one"] / v["commits_per_s"]["alone"] for v in cost[s]]
            return statistics.median(values) if values else None

        n = sizes.batch
        Row = tuple[str, Callable[[str], float | None], int, Literal["lower", "higher", ""]]

        def at(*path: str) -> Callable[[str], float | None]:
            return lambda s: median_at(cost[s], *path)

        def more(with_: str, alone: str, pct: str, per: int = 1) -> Callable[[str], float | None]:
            return lambda s: added(s, with_, alone, pct, per)

        def more_us(with_: str, alone: str, pct: str, per: int) -> Callable[[str], float | None]:
            return lambda s: _us(added(s, with_, alone, pct, per))

        c = CONCURRENT
        rows: list[Row] = [
            ("1 orders row alone, p50 (ms)", at("alone", "p50"), 2, ""),
            ("1 orders row + 1 task, p50 (ms)", at("one", "p50"), 2, ""),
            ("**added by 1 task, p50 (ms)**", more("one", "alone", "p50"), 2, "lower"),
            ("1 orders row alone, p99 (ms)", at("alone", "p99"), 2, ""),
            ("1 orders row + 1 task, p99 (ms)", at("one", "p99"), 2, ""),
            ("**added by 1 task, p99 (ms)**", more("one", "alone", "p99"), 2, "lower"),
            (f"{n} orders rows alone, p50 (ms)", at("alone100", "p50"), 2, ""),
            (f"{n} orders rows + {n} tasks, p50 (ms)", at("many", "p50"), 2, ""),
            (f"{n} orders rows alone, p99 (ms)", at("alone100", "p99"), 2, ""),
            (f"{n} orders rows + {n} tasks, p99 (ms)", at("many", "p99"), 2, ""),
            (
                f"**added per task, batch of {n}, p50 (µs)**",
                more_us("many", "alone100", "p50", n), 1, "lower",
            ),
            (
                f"**added per task, batch of {n}, p99 (µs)**",
                more_us("many", "alone100", "p99", n), 1, "lower",
            ),
            (f"{c} connections at once, 1 orders row alone (commits/s)",
             at("commits_per_s", "alone"), 0, ""),
            (f"{c} connections at once, 1 orders row + 1 task (commits/s)",
             at("commits_per_s", "one"), 0, ""),
            ("**commit rate kept with the enqueue (ratio)**", kept, 2, "higher"),
            (f"{c} connections at once, + 1 task, cronoq's NOTIFY trigger disabled (commits/s)",
             lambda s: median_at(cost[s], "commits_per_s", "quiet") if s in mine else None, 0, ""),
        ]  # fmt: skip
        for label, get, digits, better in rows:
            values = {s: get(s) for s in names}
            ratios = ""
            for m in mine:
                ratio = ""
                # A difference of percentiles can be 0 or below (noise): no ratio then.
                known = [v for p in peers if (v := values[p]) is not None]
                value = values[m]
                if better and known and min(known) > 0 and value is not None and value > 0:
                    best = min(known) if better == "lower" else max(known)
                    ratio = f"{best / value:.2f}x" if better == "lower" else f"{value / best:.2f}x"
                ratios += f" | {ratio}"
            cells = " | ".join(fmt(values[s], digits) for s in names)
            print(f"| {label} | {cells}{ratios} |")

    ingest = results.get("ingest", {}).get("cronoq", [])
    if ingest:
        n = sizes.ingest_tasks
        print()
        print("| cronoq ingest (medians of the rounds) | tasks/s | the application's commits/s"
              " | last commit to empty outbox (ms) |")  # fmt: skip
        print("|---|---|---|---|")
        for key, label in (
            ("txn1", f"{n:,} tasks, transactions of 1, {INGEST_CONNECTIONS} connections"),
            ("txn100", f"{n:,} tasks, transactions of 100, {INGEST_CONNECTIONS} connections"),
        ):
            print(
                f"| {label} | {fmt(median_at(ingest, key, 'tasks_per_s'), 0)} | "
                f"{fmt(median_at(ingest, key, 'written_per_s'), 0)} | "
                f"{fmt(median_at(ingest, key, 'lag_ms'), 1)} |"
            )
        print(
            f"| {n:,} tasks in one transaction, from its commit | "
            f"{fmt(median_at(ingest, 'one_txn', 'tasks_per_s'), 0)} | | |"
        )

    latency = results.get("latency", {})
    lnames = [s for s in systems if latency.get(s)]
    if lnames:
        print()
        print(f"| at {sizes.rate:,.0f} transactions/s (ms, medians of the rounds) | "
              + " | ".join(lnames) + " | cronoq vs best peer |")  # fmt: skip
        print("|---" * (len(lnames) + 2) + "|")
        lpeers = [s for s in lnames if not s.startswith("cronoq")]
        for key, pct, label in (
            ("task_commit", "p50", "commit to the task's commit, p50"),
            ("task_commit", "p99", "commit to the task's commit, p99"),
            ("start", "p50", "**commit to start in the consumer, p50**"),
            ("start", "p99", "**commit to start in the consumer, p99**"),
        ):
            values = {
                s: (median_at(latency[s], key, pct) if key in latency[s][0] else None)
                for s in lnames
            }
            ratio = ""
            fastest = min((v for p in lpeers if (v := values[p]) is not None), default=None)
            ours = values.get("cronoq")
            if key == "start" and fastest is not None and ours:
                ratio = f"{fastest / ours:.2f}x"
            print(f"| {label} | " + " | ".join(fmt(values[s]) for s in lnames) + f" | {ratio} |")


def _us(ms: float | None) -> float | None:
    return None if ms is None else ms * 1000


def make_driver_label(system: str) -> str:
    return "asyncpg" if system in ("cronoq", "pgqueuer") else "psycopg 3"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--measures", default=",".join(MEASURES))
    parser.add_argument("--txns", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--concurrent-txns", type=int, default=None)
    parser.add_argument("--ingest-tasks", type=int, default=None)
    parser.add_argument("--rate", type=float, default=None)
    parser.add_argument("--seconds", type=float, default=None)
    parser.add_argument("--timeout", type=float, default=300.0, help="per measurement")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", nargs=3, metavar=("SYSTEM", "MEASURE", "SIZES"))
    parser.add_argument("--serve", nargs=4, metavar=("DSN", "TARGET", "RECORD", "COMMITS"))
    args = parser.parse_args()

    if args.serve:
        dsn, target, record, commits = args.serve
        serve(dsn, int(target), record, commits)
        return 0
    if args.child:
        system, measure, sizes_json = args.child
        result = child(system, measure, Sizes(**json.loads(sizes_json)))
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    sizes = Sizes.quick() if args.quick else Sizes()
    overrides = {
        "txns": args.txns,
        "batches": args.batches,
        "concurrent_txns": args.concurrent_txns,
        "ingest_tasks": args.ingest_tasks,
        "rate": args.rate,
        "seconds": args.seconds,
    }
    sizes = Sizes(**{**asdict(sizes), **{k: v for k, v in overrides.items() if v is not None}})
    rounds = args.rounds or (1 if args.quick else 3)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    measures = [m.strip() for m in args.measures.split(",") if m.strip()]
    for name in systems:
        if name not in SYSTEMS:
            parser.error(f"unknown system {name!r}; systems: {', '.join(SYSTEMS)}")
    for name in measures:
        if name not in MEASURES:
            parser.error(f"unknown measure {name!r}; measures: {', '.join(MEASURES)}")

    settings = asyncio.run(check_durability(ADMIN_DSN))
    pythons: dict[str, str] = {}
    failures: list[str] = []
    for name in systems:
        python, note = python_for(name)
        if python is None:
            failures.append(f"{name}: not run: {note}")
        else:
            pythons[name] = python
            if note:
                print(f"{name}: {note}")
    print(
        f"python {sys.version.split()[0]}, "
        + ", ".join(f"{k}={v}" for k, v in settings.items())
        + f", {rounds} rounds, sizes {asdict(sizes)}",
        flush=True,
    )
    # Other jobs on the machine show here (a 2-core machine is busy above 2).
    print("load average before: " + " ".join(f"{v:.2f}" for v in os.getloadavg()), flush=True)

    results: Results = {m: {} for m in measures}
    started = time.monotonic()
    for r in range(rounds):
        for measure in measures:
            if measure == "ingest":
                group = ["cronoq"] if "cronoq" in pythons else []
            elif measure == "latency":
                group = [s for s in pythons if s != "cronoq-psycopg"]
            else:
                group = list(pythons)
            for name in rotated(group, r):
                try:
                    value = run_child(pythons[name], name, measure, sizes, args.timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    failures.append(f"round {r + 1}, {measure}, {name}: {exc}")
                    print(f"  FAILED {measure} {name}: {exc}", file=sys.stderr, flush=True)
                    continue
                results[measure].setdefault(name, []).append(value)
                print(
                    f"  round {r + 1} {measure:<8} {name:<15} {json.dumps(value)}"
                    f"  [{time.monotonic() - started:.0f} s]",
                    flush=True,
                )
    report(results, systems, sizes)
    print()
    for name in systems:
        if name in pythons:
            print(f"- {name}: {make_system_how(name)}")
    if args.json is not None:
        args.json.write_text(json.dumps({"sizes": asdict(sizes), "results": results}, indent=1))
    for failure in failures:
        print(f"FAILED: {failure}")
    print("load average after: " + " ".join(f"{v:.2f}" for v in os.getloadavg()))
    print(f"total {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


def make_system_how(name: str) -> str:
    hows = {
        "cronoq": Cronoq.how + " on asyncpg",
        "cronoq-psycopg": Cronoq.how + " on psycopg 3",
        "pgqueuer": PgQueuer.how,
        "procrastinate": Procrastinate.how,
        "oban": Oban.how,
    }
    return hows[name]


if __name__ == "__main__":
    sys.exit(main())
