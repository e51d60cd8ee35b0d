"""cronoq with ``MemoryStore``: a reference line (nothing is durable), not compared with peers.

Settings (see README.md): ``MemoryStore()``; ``Pool("default", concurrency=50)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cronoq import MemoryStore
from cronoq.store import Store

from ._cronoq import CronoqSystem


@asynccontextmanager
async def open_store() -> AsyncIterator[Store]:
    store = MemoryStore()
    try:
        yield store
    finally:
        await store.close()


SYSTEM = CronoqSystem("cronoq-memory", open_store)
