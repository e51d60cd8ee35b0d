"""cronoq-server with its SQLite store, ``full_sync`` on; client and worker over gRPC.

The file goes to a fresh temporary directory, under CRONOQ_BENCH_SQLITE_DIR if set (as for
cronoq-sqlite). Settings (see README.md): ``[store] kind = "sqlite"``, ``full_sync = true``
(``synchronous=FULL``: every commit synced; the server's default too, set here so that it is
said), every other key at the server's default; one pool ``default`` at its defaults; the
worker attaches with 50 slots.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from ._server import ServerSystem


@asynccontextmanager
async def store_section() -> AsyncIterator[str]:
    parent = os.environ.get("CRONOQ_BENCH_SQLITE_DIR")
    with tempfile.TemporaryDirectory(prefix="cronoq-peers-", dir=parent) as tmp:
        path = Path(tmp) / "bench.db"
        yield f'kind = "sqlite"\npath = {json.dumps(str(path))}\nfull_sync = true'


SYSTEM = ServerSystem("cronoq-server-sqlite", store_section)
