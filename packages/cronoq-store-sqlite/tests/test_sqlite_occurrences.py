"""The occurrence ledger's table (schema version 5, issue 32), beyond the conformance kit: a
record whose outcome this build does not know is left out of a read, which still fills its page;
pruning takes more records than one batch holds, also when no task is left to prune."""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
import time
from pathlib import Path

from sqlite_harness import FAST, SqliteHarness

from cronoq.store import OccurrenceOutcome, OccurrenceRecorded, TimeBase

HOUR_NS = 3600 * 10**9


def recorded(due_ns: int) -> OccurrenceRecorded:
    return OccurrenceRecorded(
        "nightly", due_ns, due_ns + 10, OccurrenceOutcome.STARTED, 1, due_ns + 1, ""
    )


async def test_a_record_of_an_outcome_this_build_does_not_know_is_left_out(
    tmp_path: Path,
) -> None:
    path = tmp_path / "cronoq.db"
    harness = SqliteHarness(path)
    try:
        store = await harness.open()
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        at = time.time_ns()
        records = [recorded(at + i) for i in range(4)]
        await store.commit(lease.epoch, records)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute(
                "UPDATE cronoq_occurrences SET outcome = 'postponed' WHERE due_ns = ?", (at + 2,)
            )
        assert await store.get_occurrences("nightly", None, 2) == [records[3], records[1]]
        assert await store.get_occurrences("nightly", at + 3, 1) == [records[1]]
    finally:
        await harness.close_all()


async def test_pruning_takes_more_records_than_a_batch_holds(tmp_path: Path) -> None:
    harness = SqliteHarness(tmp_path / "cronoq.db", dataclasses.replace(FAST, prune_batch=2))
    try:
        store = await harness.open()
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        at = time.time_ns()
        await store.commit(lease.epoch, [recorded(at - 60 * 10**9 + i) for i in range(5)])
        await store.commit(lease.epoch, [recorded(at)])
        assert await harness._sqlite(store).prune(at - 1) == 0, "no task to prune"
        assert await store.get_occurrences("nightly", None, 10) == [recorded(at)]
    finally:
        await harness.close_all()
