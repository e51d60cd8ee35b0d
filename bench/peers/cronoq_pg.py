"""cronoq with its PostgreSQL store: ``PgStore.connect(DSN, PgStoreConfig())`` in a fresh database.

Settings (see README.md): ``PgStoreConfig`` defaults (schema ``public`` of the fresh database,
pool_size 4, session_timeout 10 s, ...); ``Pool("default", concurrency=50)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cronoq.store import Store
from cronoq_store_postgres import PgStore, PgStoreConfig

from ._cronoq import CronoqSystem
from ._harness import fresh_database


@asynccontextmanager
async def open_store() -> AsyncIterator[Store]:
    async with fresh_database("cronoq_pg") as dsn:
        store = await PgStore.connect(dsn, PgStoreConfig())
        try:
            yield store
        finally:
            await store.close()


SYSTEM = CronoqSystem("cronoq-pg", open_store)
