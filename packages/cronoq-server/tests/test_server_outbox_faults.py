"""The outbox under faults, as the Helm chart deploys cronoq-server: tokens on, two replicas on
one PostgreSQL schema. An application commits orders, each with its tasks enqueued in the
same transaction (some transactions roll back), while the leader is killed (SIGKILL) and its
sessions are terminated (``pg_terminate_backend``) during ingest, again and again, and a
standby takes over each time. Every committed row must become exactly one task, and a
rolled-back one none."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
from chaos import _pg_terminate
from server_cluster import pg_store
from server_pg import pg_connect, pg_schema
from server_process import ServerProcess, config_toml, start_server
from test_server_ha_auth import AUTH, POOLS

from cronoq import TaskRequest
from cronoq_store_postgres import enqueue, enqueue_many

__all__ = ["pg_schema"]  # a fixture: requested by name

FAULTS = 10
"""Faults injected while the application writes: kills and terminated sessions, alternating."""
BETWEEN_FAULTS = 300
"""Tasks made from the outbox between two faults: each fault strikes during ingest."""
TIMEOUT_S = 60.0


class _Rollback(Exception):
    pass


def _tasks_of(order: int) -> int:
    """Every 10th order enqueues 20 tasks at once, the others one."""
    return 20 if order % 10 == 0 else 1


def _rolled_back(order: int) -> bool:
    return order % 7 == 3


async def _write_orders(
    dsn_conn: asyncpg.Connection, schema: str, progress: list[int], stop: asyncio.Event
) -> None:
    """The application, until ``stop``: each order and its tasks in one transaction."""
    order = 0
    while not stop.is_set():
        with contextlib.suppress(_Rollback):
            async with dsn_conn.transaction():
                await dsn_conn.execute(f'INSERT INTO "{schema}".orders VALUES ($1)', order)
                if _tasks_of(order) > 1:
                    await enqueue_many(
                        dsn_conn,
                        [TaskRequest("order", f"{order}/{i}".encode(), pool="matrix")
                         for i in range(_tasks_of(order))],
                        schema=schema,
                    )  # fmt: skip
                else:
                    await enqueue(dsn_conn, "order", f"{order}/0".encode(), schema=schema,
                                  pool="matrix")  # fmt: skip
                if _rolled_back(order):
                    raise _Rollback
        progress.append(order)
        order += 1


async def _ingested(conn: asyncpg.Connection, schema: str) -> int:
    return int(await conn.fetchval(f'SELECT count(*) FROM "{schema}".cronoq_tasks'))


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Until ``condition()`` is true: the database has no event to await, so it is read again
    every 20 ms."""
    async with asyncio.timeout(timeout):
        while not await condition():  # noqa: ASYNC110 (no event: a table is read)
            await asyncio.sleep(0.02)


async def _new_leader(servers: list[ServerProcess], above: int) -> tuple[ServerProcess, int]:
    """The replica that leads next with an epoch above ``above``, and that epoch."""

    async def leads(server: ServerProcess) -> tuple[ServerProcess, int]:
        line = await server.wait_line(
            lambda line: line.get("msg") == "leading" and int(line.get("epoch", "0")) > above,
            f"leading above epoch {above}",
            TIMEOUT_S,
        )
        return server, int(line["epoch"])

    waits = [asyncio.ensure_future(leads(s)) for s in servers if s.process.returncode is None]
    try:
        for done in asyncio.as_completed(waits):
            with contextlib.suppress(AssertionError):  # that one exited: another may lead
                return await done
        raise AssertionError(f"no replica led above epoch {above}")
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


async def test_every_committed_outbox_row_becomes_exactly_one_task_through_kills(
    tmp_path: Path, pg_schema: str
) -> None:
    config = config_toml(pg_store(pg_schema), pools=POOLS, tables=AUTH)
    servers = [await start_server(tmp_path, config)]
    app = await pg_connect()
    watch = await pg_connect()
    writing: asyncio.Future[None] | None = None
    try:
        leader, epoch = await _new_leader(servers, 0)
        servers.append(await start_server(tmp_path, config))
        await servers[-1].wait_for("standby")
        await app.execute(f'CREATE TABLE "{pg_schema}".orders (id bigint PRIMARY KEY)')
        progress: list[int] = []
        stop = asyncio.Event()
        writing = asyncio.ensure_future(_write_orders(app, pg_schema, progress, stop))
        kills = terminations = 0
        for fault in range(FAULTS):
            # During ingest: rows are waiting and tasks are being made from them.
            seen = await _ingested(watch, pg_schema)

            async def ingesting(seen: int = seen, writing: asyncio.Future[None] = writing) -> bool:
                if writing.done():
                    writing.result()  # the application failed: say why
                return await _ingested(watch, pg_schema) >= seen + BETWEEN_FAULTS

            try:
                await _until(ingesting, TIMEOUT_S)
            except TimeoutError:
                depth = await watch.fetchval(f'SELECT count(*) FROM "{pg_schema}".cronoq_outbox')
                for server in servers:
                    print("\n".join(server.raw[-12:]))
                raise AssertionError(
                    f"fault {fault}: no ingest, {depth} rows, {len(progress)} orders"
                ) from None
            if fault % 2 == 0:
                leader.signal(signal.SIGKILL)
                kills += 1
                servers.append(await start_server(tmp_path, config))  # the next standby
            else:
                assert await _pg_terminate(leader) > 0
                terminations += 1
            leader, epoch = await _new_leader(servers, epoch)
        stop.set()
        await asyncio.wait_for(writing, TIMEOUT_S)
        outbox = f'"{pg_schema}".cronoq_outbox'

        async def drained() -> bool:
            return bool(await watch.fetchval(f"SELECT NOT EXISTS (SELECT FROM {outbox})"))

        await _until(drained, TIMEOUT_S)
        committed = {
            f"{r['id']}/{i}".encode()
            for r in await watch.fetch(f'SELECT id FROM "{pg_schema}".orders')
            for i in range(_tasks_of(r["id"]))
        }
        made = Counter(
            bytes(r["payload"])
            for r in await watch.fetch(f'SELECT payload FROM "{pg_schema}".cronoq_tasks')
        )
        quarantined = await watch.fetchval(
            f'SELECT count(*) FROM "{pg_schema}".cronoq_outbox_quarantine'
        )
        duplicates = {p: n for p, n in made.items() if n > 1}
        lost = committed - set(made)
        phantom = set(made) - committed
        rolled_back = sum(map(_rolled_back, progress))
        print(
            f"\noutbox under faults: {len(committed)} rows committed in "
            f"{len(progress) - rolled_back} transactions ({rolled_back} rolled back), "
            f"{sum(made.values())} tasks made, {len(duplicates)} duplicates, {len(lost)} lost, "
            f"{len(phantom)} from rolled-back transactions, {quarantined} quarantined; "
            f"{kills} leaders killed, {terminations} terminated, last epoch {epoch}"
        )
        assert not duplicates, sorted(duplicates)[:10]
        assert not lost, sorted(lost)[:10]
        assert not phantom, sorted(phantom)[:10]
        assert quarantined == 0
    finally:
        if writing is not None:
            writing.cancel()
            await asyncio.gather(writing, return_exceptions=True)
        await app.close()
        await watch.close()
        await asyncio.gather(*(s.stop() for s in servers))
