"""A scheduler process for the failover benchmark: ``_pg_node.py DSN SCHEMA``.

Prints ``LEADING`` once it leads, then ``COMMITTED <unix seconds>`` when its first own step
(one submission) is committed, then serves until killed.
"""

from __future__ import annotations

import asyncio
import sys
import time

from cronoq import Pool, Scheduler, TaskContext
from cronoq_store_postgres import PgStore, PgStoreConfig


async def noop(ctx: TaskContext, payload: bytes) -> None:
    return None


async def main(dsn: str, schema: str) -> None:
    store = await PgStore.connect(dsn, PgStoreConfig(schema=schema))
    async with Scheduler([Pool("default", noop)], store=store) as sched:
        print("LEADING", flush=True)
        await sched.submit("noop")
        print(f"COMMITTED {time.time():.6f}", flush=True)
        await sched.leadership_lost()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
