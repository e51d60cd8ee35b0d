"""cronoq-server with its PostgreSQL store, in a fresh database; client and worker over gRPC.

Settings (see README.md): ``[store] kind = "postgres"`` with the fresh database's DSN, every
other key at the server's default (schema ``public``, ``pool_size`` 4, as cronoq-pg); one pool
``default`` at its defaults (``concurrency`` 1000, ``lease_s`` 30); the worker attaches with 50
slots. Durability: ``synchronous_commit`` and ``fsync`` are asserted ``on`` in the database.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ._harness import fresh_database
from ._server import ServerSystem


@asynccontextmanager
async def store_section() -> AsyncIterator[str]:
    async with fresh_database("cronoq_server_pg") as dsn:
        yield f'kind = "postgres"\ndsn = {json.dumps(dsn)}'


SYSTEM = ServerSystem("cronoq-server-pg", store_section)
