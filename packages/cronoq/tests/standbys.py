"""A standby that waits for leadership, known to wait from the store call itself."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from cronoq import MemoryStore, Pool, Scheduler
from cronoq.store import Lease


async def waiting_standby(
    store: MemoryStore, pools: Sequence[Pool]
) -> tuple[Scheduler, asyncio.Task[None]]:
    """A second scheduler on ``store``'s cluster and its running ``start()``, returned once
    that start waits in the store for leadership (an event of the store call, no polling)."""
    other = store.connect_another()
    asking = asyncio.Event()
    acquire = other.acquire_leadership

    async def acquire_saying_so() -> Lease:
        asking.set()
        return await acquire()

    other.acquire_leadership = acquire_saying_so  # type: ignore[method-assign]
    standby = Scheduler(list(pools), store=other)
    takeover = asyncio.create_task(standby.start())
    await asyncio.wait_for(asking.wait(), 5)
    return standby, takeover
