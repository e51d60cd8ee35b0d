"""Leadership under faults: a fenced leader writes nothing, and a recovery that outlasts the
lease keeps it."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from sqlite_harness import FAST

from cronoq import Pool, Scheduler, TaskContext
from cronoq.errors import Fenced
from cronoq.store import RecoveredState, Status, TaskSpec, TaskSubmitted, TaskUpdated, TimeBase
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig

NS = 1_000_000_000
DAY_NS = 24 * 3600 * NS


def count_rows(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        [(count,)] = conn.execute("SELECT count(*) FROM cronoq_tasks").fetchall()
    assert isinstance(count, int)
    return count


async def take_over(db: Path, config: SqliteStoreConfig, fenced: SqliteStore) -> SqliteStore:
    """Another instance leads once ``fenced`` stops renewing, though ``fenced`` is not closed
    and still believes it leads (as a process paused past its lease and resumed would)."""
    assert fenced._renewal is not None
    fenced._renewal.cancel()  # the pause: no renewal, no step-down, the epoch is kept
    other = await SqliteStore.open(db, config)
    async with asyncio.timeout(config.lease_ttl + 5):
        await other.acquire_leadership()
    assert fenced._epoch is not None, "the premise: the old leader does not know yet"
    return other


# --- item 8: pruning is fenced ---------------------------------------------------------------


async def test_a_leader_that_lost_its_lease_prunes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "prune.db"
    # The rows are too young for the stores' own pruning: only the explicit calls prune.
    config = replace(FAST, keep_finished=365 * DAY_NS / NS)
    old = time.time_ns() - 30 * DAY_NS
    first = await SqliteStore.open(db, config)
    other: SqliteStore | None = None
    try:
        epoch = (await first.acquire_leadership()).epoch
        spec = TaskSpec("default", "job", b"p")
        batch: list[Any] = []
        for task_id in range(1, 11):
            batch.append(TaskSubmitted(task_id, spec, Status.READY, old))
            batch.append(TaskUpdated(task_id, Status.SUCCEEDED, 1, "done", old, output=b"o"))
        await first.commit(epoch, batch)
        assert count_rows(db) == 10
        other = await take_over(db, config, first)

        with pytest.raises(Fenced):
            await first.prune(time.time_ns())
        assert count_rows(db) == 10, "a fenced instance deleted rows"
        # Learning it was fenced, it stepped down: its pruning loop and renewal are over.
        async with asyncio.timeout(1):
            await first.leadership_lost()
        # The leader itself prunes them (the rows were prunable: the check above can fail).
        assert await other.prune(time.time_ns()) == 10
        assert count_rows(db) == 0
    finally:
        if other is not None:
            await other.close()
        await first.close()


async def test_a_store_that_never_led_prunes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    config = replace(FAST, keep_finished=365 * DAY_NS / NS)
    leader = await SqliteStore.open(db, config)
    bystander = await SqliteStore.open(db, config)
    try:
        epoch = (await leader.acquire_leadership()).epoch
        old = time.time_ns() - 30 * DAY_NS
        await leader.commit(
            epoch,
            [
                TaskSubmitted(1, TaskSpec("default", "job", b"p"), Status.READY, old),
                TaskUpdated(1, Status.FAILED, 1, "gave up", old),
            ],
        )
        with pytest.raises(Fenced):
            await bystander.prune(time.time_ns())
        assert count_rows(db) == 1
    finally:
        await bystander.close()
        await leader.close()


# --- item 12: a recovery longer than the lease -------------------------------------------------

# A short lease, so that a recovery of tens of thousands of tasks outlasts it; renewed ten
# times per lease, so that a renewal delayed by a loaded machine does not let it lapse.
SHORT = SqliteStoreConfig(
    lock_poll=0.02, lease_renew=0.1, lease_ttl=1.0, busy_timeout=0.05, prune_interval=3600
)
# Recovery costs about 40 us per live task on the development machine (mostly decoding), so
# 50,000 take about 2 s, twice the lease; the test checks that it did outlast it.
LIVE_TASKS = 50_000


def fill_with_live_tasks(db: Path, count: int) -> None:
    """``count`` live tasks: one committed by a store, copied in SQL (a store commit of this
    many rows would take longer than the recovery under test)."""

    async def seed() -> None:
        store = await SqliteStore.open(db, SHORT)
        try:
            epoch = (await store.acquire_leadership()).epoch
            spec = TaskSpec("default", "job", b"x" * 100)
            await store.commit(epoch, [TaskSubmitted(1, spec, Status.READY, time.time_ns())])
        finally:
            await store.close()  # releases the lease: the next instance leads at once

    asyncio.run(seed())
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(cronoq_tasks)")]
        copied = ", ".join("n.i" if c == "id" else f"t.{c}" for c in columns)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            f"WITH RECURSIVE n(i) AS (SELECT 2 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
            f"INSERT INTO cronoq_tasks ({', '.join(columns)}) "
            f"SELECT {copied} FROM n, cronoq_tasks AS t WHERE t.id = 1",
            (count,),
        )
        conn.execute("UPDATE cronoq_leader SET max_task_id = ?", (count,))
        conn.execute("COMMIT")


@dataclass
class LeaseWatch:
    """Reads the lease row from outside every store, every few milliseconds, on a thread."""

    db: Path
    holder: str
    lapses: list[int] = field(default_factory=list)
    """How long (ns) past its expiry the lease was seen, each time it was seen lapsed."""
    others: list[str] = field(default_factory=list)
    looks: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        held = False  # from the time the watched holder is first seen to hold the lease
        with contextlib.closing(sqlite3.connect(self.db, isolation_level=None)) as conn:
            while not self._stop.wait(0.005):
                [(holder, expires_ns)] = conn.execute(
                    "SELECT holder, expires_ns FROM cronoq_leader"
                ).fetchall()
                now = time.time_ns()
                held = held or holder == self.holder
                if not held:
                    continue
                self.looks += 1
                if holder != self.holder:
                    self.others.append(str(holder))
                elif expires_ns <= now:
                    self.lapses.append(now - expires_ns)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stop.set()
            thread.join(5)


async def test_a_recovery_longer_than_the_lease_keeps_the_lease(tmp_path: Path) -> None:
    db = tmp_path / "big.db"
    await asyncio.to_thread(fill_with_live_tasks, db, LIVE_TASKS)
    leader = await SqliteStore.open(db, SHORT)
    standby = await SqliteStore.open(db, SHORT)
    watch = LeaseWatch(db, leader._holder)
    timed: list[float] = []
    standing_by: list[asyncio.Task[Any]] = []
    recover = leader.recover

    async def timed_recover(epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        # The leader holds the lease now: the standby starts trying to take it over.
        standing_by.append(asyncio.ensure_future(standby.acquire_leadership()))
        started = time.monotonic()
        state = await recover(epoch, time_base, retention_ns)
        # A machine fast enough to read them all within the lease reads them again, so that the
        # recovery outlasts the lease whatever the machine (the premise, asserted below).
        while time.monotonic() - started <= SHORT.lease_ttl + SHORT.lease_renew:
            state = await recover(epoch, time_base, retention_ns)
        timed.append(time.monotonic() - started)
        return state

    leader.recover = timed_recover  # type: ignore[method-assign]
    release = asyncio.Event()

    async def hold(ctx: TaskContext, payload: bytes) -> None:
        await release.wait()  # one attempt runs until the end: no commit per task

    scheduler = Scheduler([Pool("default", hold, concurrency=1)], store=leader, commit_timeout=5)
    try:
        with watch.watching():
            async with asyncio.timeout(60):
                await scheduler.start()
            [took] = timed
            print(f"recovery of {LIVE_TASKS} tasks: {took:.2f}s (lease_ttl {SHORT.lease_ttl}s)")
            assert took > SHORT.lease_ttl + SHORT.lease_renew, (
                f"the premise: recovery ({took:.2f}s) must outlast the lease; raise LIVE_TASKS"
            )
            # A commit after recovery succeeds, under the same epoch.
            task_id = await scheduler.submit("job", b"after recovery")
            assert scheduler.running and leader._epoch is not None
        [standby_task] = standing_by
        assert not standby_task.done(), "the standby took the lease during the recovery"
        assert watch.others == [], f"another holder was seen: {watch.others[:3]}"
        assert watch.lapses == [], (
            f"the lease lapsed during the recovery ({len(watch.lapses)} of {watch.looks} looks, "
            f"up to {max(watch.lapses) / NS:.2f}s past its expiry)"
        )
        assert watch.looks > 10 * took, "the watch did not look often enough to tell"
        assert (await leader.get_task(task_id)) is not None
        # The standby was trying all along: a clean handover lets it lead at once.
        release.set()
        await scheduler.close()
        async with asyncio.timeout(5):
            await standby_task
    finally:
        release.set()
        for task in standing_by:
            task.cancel()
        await scheduler.close()
        await standby.close()
        await leader.close()
