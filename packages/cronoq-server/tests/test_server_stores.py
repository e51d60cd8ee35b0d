"""open_store and remote_pools: the configured store and pools, in a real Scheduler that leases
an attempt to a worker link and takes its report."""

from __future__ import annotations

import asyncio
from pathlib import Path

from server_pg import PG_DSN, pg_schema, pg_tables

from cronoq import LeasedAttempt, MemoryStore, RemotePool, Scheduler, Status
from cronoq_server import ServerConfig, load_config, open_store, remote_pools
from cronoq_store_postgres import PgStore
from cronoq_store_sqlite import SqliteStore

__all__ = ["pg_schema"]  # a fixture: used by name


async def run_one_remote_task(config: ServerConfig) -> None:
    store = await open_store(config)
    try:
        async with Scheduler(
            remote_pools(config), store=store, commit_timeout=config.commit_timeout_s
        ) as scheduler:
            task_id = await scheduler.submit("k", b"in", pool="emails")
            async with scheduler.attach(["emails"], slots=1) as link, asyncio.timeout(10):
                attempt = await link.next()
                assert isinstance(attempt, LeasedAttempt)
                assert (attempt.token.task_id, attempt.payload) == (task_id, b"in")
                await scheduler.report_success(attempt.token, b"out", lease_id=attempt.lease_id)
                info = await scheduler.wait(task_id)
            assert (info.status, info.output) == (Status.SUCCEEDED, b"out")
    finally:
        await store.close()


def pools_env() -> dict[str, str]:
    return {
        "CRONOQ_POOLS": '[{"name": "emails", "concurrency": 5, "max_live": 9, "lease_s": 2}]',
        "CRONOQ_KEEP_FINISHED_S": "7200",
        "CRONOQ_COMMIT_TIMEOUT_S": "5",
    }


def test_remote_pools() -> None:
    config = load_config(None, pools_env())
    assert remote_pools(config) == [RemotePool("emails", 5, 9, 2.0)]
    assert remote_pools(ServerConfig()) == [RemotePool("default")]


async def test_memory_store() -> None:
    config = load_config(None, {**pools_env(), "CRONOQ_STORE__KIND": "memory"})
    assert isinstance(await open_store(config), MemoryStore)
    await run_one_remote_task(config)


async def test_sqlite_store(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    config = load_config(
        None,
        {
            **pools_env(),
            "CRONOQ_STORE__PATH": str(path),
            "CRONOQ_STORE__LOCK_POLL_S": "0.05",
            "CRONOQ_STORE__FULL_SYNC": "false",
        },
    )
    store = await open_store(config)
    try:
        assert isinstance(store, SqliteStore)
        assert store.path == str(path)
    finally:
        await store.close()
    await run_one_remote_task(config)
    assert path.is_file()


async def test_postgres_store(pg_schema: str) -> None:
    config = load_config(
        None,
        {
            **pools_env(),
            "CRONOQ_STORE__KIND": "postgres",
            "CRONOQ_STORE__DSN": PG_DSN,
            "CRONOQ_STORE__SCHEMA": pg_schema,
            "CRONOQ_STORE__LOCK_POLL_S": "0.05",
            "CRONOQ_STORE__KEEPALIVE_S": "0.2",
            "CRONOQ_STORE__SESSION_TIMEOUT_S": "2",
            "CRONOQ_STORE__POOL_SIZE": "2",
        },
    )
    store = await open_store(config)
    try:
        assert isinstance(store, PgStore)
        assert store.config.schema == pg_schema
        assert store.config.keep_finished == 7200.0
        assert store.config.pool_size == 2
        assert "cronoq_tasks" in await pg_tables(pg_schema)
    finally:
        await store.close()
    await run_one_remote_task(config)
