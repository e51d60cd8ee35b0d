"""cronoq with its SQLite store, ``full_sync`` on (``synchronous=FULL``: every commit synced).

The file goes to a fresh temporary directory, under CRONOQ_BENCH_SQLITE_DIR if set (by default
the system's temporary directory: put it on the disk PostgreSQL uses to compare like with like).
Settings (see README.md): ``SqliteStoreConfig(full_sync=True)``, the rest at defaults;
``Pool("default", concurrency=50)``.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from cronoq.store import Store
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig

from ._cronoq import CronoqSystem


@asynccontextmanager
async def open_store() -> AsyncIterator[Store]:
    parent = os.environ.get("CRONOQ_BENCH_SQLITE_DIR")
    with tempfile.TemporaryDirectory(prefix="cronoq-peers-", dir=parent) as tmp:
        store = await SqliteStore.open(Path(tmp) / "bench.db", SqliteStoreConfig(full_sync=True))
        try:
            yield store
        finally:
            await store.close()


SYSTEM = CronoqSystem("cronoq-sqlite", open_store)
