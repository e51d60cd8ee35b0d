"""Everything a store does to its files, for the file-mode tests: create the database, lead
with a standby polling, commit, recover, prune, close, open the existing file again.

Imported by ``test_sqlite_files.py``, and run as ``python sqlite_files_workload.py DB UMASK``
(octal) when a test traces the process's system calls.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlite_harness import FAST

from cronoq.store import Mutation, Status, TaskSpec, TaskSubmitted, TaskUpdated, TimeBase
from cronoq_store_sqlite import SqliteStore

DAY_NS = 24 * 3600 * 1_000_000_000


async def run(db: Path, check: Callable[[str], Awaitable[None]] | None = None) -> None:
    """The workload; ``check(stage)`` is awaited at each stage while files are open."""
    for stage in ("new file", "existing file"):
        leader = await SqliteStore.open(db, FAST)
        # Before a second open could tighten what the first one created.
        if check is not None:
            await check(f"{stage}, opened")
        standby = await SqliteStore.open(db, FAST)
        try:
            epoch = (await leader.acquire_leadership()).epoch
            polling = asyncio.ensure_future(standby.acquire_leadership())
            base = epoch << 40
            old = time.time_ns() - 30 * DAY_NS
            spec = TaskSpec("default", "job", b"p" * 2000)
            batch: list[Mutation] = []
            for i in range(1, 300):
                batch.append(TaskSubmitted(base + i, spec, Status.READY, old))
                if i % 2:
                    batch.append(TaskUpdated(base + i, Status.SUCCEEDED, 1, "ok", old, output=b"o"))
            await leader.commit(epoch, batch)
            await leader.recover(epoch, TimeBase(), 3600 * 1_000_000_000)
            await leader.prune(time.time_ns())
            if check is not None:
                await check(f"{stage}, used")
            polling.cancel()
        finally:
            await standby.close()
            await leader.close()


if __name__ == "__main__":
    os.umask(int(sys.argv[2], 8))
    asyncio.run(run(Path(sys.argv[1])))
