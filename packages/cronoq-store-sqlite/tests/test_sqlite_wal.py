"""The WAL stays bounded under steady load, with a standby polling the same file."""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cronoq import Pool, Scheduler, Status, TaskContext
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig

SUBMITTERS = 1  # one at a time: a step (and a commit) per submission, and one per completion
SUBMITS_EACH = 3000
JOURNAL_SIZE_LIMIT = 64 * 1024
# The largest step of this load writes a handful of pages (the leader row, a table leaf, a few
# index pages); 64 pages is a generous allowance for one commit's frames.
STEP_PAGES = 64
WAL_HEADER = 32
FRAME_HEADER = 24

# Leadership must not change hands during the load: a lease much longer than the run's hiccups.
LEADER = SqliteStoreConfig(lock_poll=0.05, lease_renew=0.5, lease_ttl=5.0)
# The standby looks at the lease as often as it reasonably can.
STANDBY = SqliteStoreConfig(lock_poll=0.002, lease_renew=0.5, lease_ttl=5.0)


async def noop(ctx: TaskContext, payload: bytes) -> None:
    return None


async def pragma(store: SqliteStore, name: str) -> int:
    [(value,)] = await store._conn.run(lambda db: db.execute(f"PRAGMA {name}").fetchall())
    assert isinstance(value, int)
    return value


async def test_wal_stays_bounded_under_steady_load_with_a_polling_standby(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "wal.db"
    wal = f"{db}-wal"
    store = await SqliteStore.open(db, replace(LEADER, journal_size_limit=JOURNAL_SIZE_LIMIT))
    standby = await SqliteStore.open(db, STANDBY)
    # Count the standby's looks at the lease, to know it polled all along the load.
    polls = 0
    read_now: Callable[..., Awaitable[list[Any]]] = standby._read_now

    async def counting_read_now(*args: Any) -> list[Any]:
        nonlocal polls
        polls += 1
        return await read_now(*args)

    monkeypatch.setattr(standby, "_read_now", counting_read_now)
    sizes: list[int] = []
    try:
        async with Scheduler([Pool("default", noop, concurrency=50)], store=store) as scheduler:
            standing_by = asyncio.ensure_future(standby.acquire_leadership())
            page_size = await pragma(store, "page_size")
            autocheckpoint = await pragma(store, "wal_autocheckpoint")
            polls_before = polls

            submitted: list[int] = []

            async def submitter() -> None:
                for _ in range(SUBMITS_EACH):
                    submitted.append(await scheduler.submit("load", b"x" * 200))
                    sizes.append(os.stat(wal).st_size)

            async with asyncio.timeout(60):
                await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))
                for task_id in submitted[-10:]:
                    await scheduler.wait(task_id)
            commits = scheduler._driver.commits
            succeeded = await scheduler.list(status=Status.SUCCEEDED)
            assert not standing_by.done(), "the standby must not have led during the load"
            standing_by.cancel()
            polled = polls - polls_before
    finally:
        await standby.close()
        await store.close()

    frame = page_size + FRAME_HEADER
    # A passive checkpoint runs after the commit that takes the WAL past `autocheckpoint`
    # pages; as no reader pins an old snapshot it completes, the next commit restarts the WAL
    # from its start and truncates the file to max(journal_size_limit, that commit). So the file
    # never holds more than `autocheckpoint` pages plus one step's.
    bound = WAL_HEADER + (autocheckpoint + STEP_PAGES) * frame
    # Bytes appended to the file over the run (a lower bound of what was written to the WAL):
    # without checkpoints, the file would have grown by all of it.
    grown = sizes[0] + sum(max(b - a, 0) for a, b in itertools.pairwise(sizes))
    drops = [b for a, b in itertools.pairwise(sizes) if b < a]
    summary = (
        f"{commits} commits, {len(sizes)} submits, standby polled {polled} times; WAL max "
        f"{max(sizes)} B, bound {bound} B, {grown} B appended, {len(drops)} truncations"
    )
    assert len(succeeded) == len(submitted), summary  # submitted and completed
    assert commits >= 2000, summary  # a few thousand steps, not a handful of large batches
    assert polled >= 100, summary
    assert grown >= 3 * bound, f"the load is too light to tell: {summary}"
    assert max(sizes) <= bound, summary
    # The checkpoints restarted the WAL and journal_size_limit shrank the file each time.
    assert len(drops) >= 2, summary
    assert min(drops) <= JOURNAL_SIZE_LIMIT + STEP_PAGES * frame, summary
