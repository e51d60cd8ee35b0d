"""The kit's checks of the transactional outbox (issue 30) fail on a store seeded with the
matching bug, and pass on MemoryStore(outbox=True) itself: a check that cannot fail proves
nothing. Each seeded store wraps a MemoryStore and its outbox, and changes what one call does
as a store with that bug would. (PostgreSQL's tests seed the same bugs in its SQL:
test_pg_outbox_seeded_bugs.)"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import pytest

from cronoq import MemoryStore
from cronoq._memory_outbox import MemoryOutbox
from cronoq.errors import Fenced, StoreFatal
from cronoq.store import (
    Mutation,
    OutboxRow,
    OutboxStats,
    OutboxTaken,
    QuarantinedRow,
    Store,
)
from cronoq_conformance import Capability, PendingOutboxRow, StoreHarness, StoreSuite
from cronoq_conformance._faults import DelegatingStore


class Bug(enum.Enum):
    NONE = "no bug: MemoryStore(outbox=True) as it is"
    TAKEN_IGNORED = "an OutboxTaken is not applied: the rows stay"
    TAKEN_BEFORE_THE_BATCH = "a batch's rows are taken, fenced, in a transaction of their own "
    "before the rest: a batch that fails midway has taken them"
    TAKEN_WHEN_FENCED = "a fenced commit still deletes its rows (their delete is not gated on "
    "the fence)"
    MISSING_ROW_FAILS = "a commit fails when a row it names is no longer in the outbox"
    DIRTY_READ = "read() returns the rows of transactions still open"
    NEWEST_FIRST = "read() returns the newest rows first"
    LIMIT_IGNORED = "read() returns every row, whatever its limit"
    FIRST_REASON_FOR_ALL = "quarantine() gives every row the first row's reason"
    QUARANTINE_UNFENCED = "quarantine() moves rows whatever the epoch"
    REQUEUE_NEW_ID = "requeue() puts a row back under a new id, as a new row"
    DISCARD_FROM_OUTBOX = "discard() deletes rows of those ids from the outbox too"
    STATS_DEPTH_WITH_QUARANTINE = "stats() counts the quarantined rows in the outbox's depth"
    UNDECLARED = "the harness does not declare Capability.OUTBOX for a store that has one"


class BugOutbox:
    """MemoryStore's outbox with ``bug`` seeded in its calls."""

    transactional = True

    def __init__(self, inner: MemoryOutbox, memory: MemoryStore, bug: Bug) -> None:
        self.inner = inner
        self.tables = memory._cluster.outbox
        self.bug = bug

    async def read(self, epoch: int, limit: int) -> Sequence[OutboxRow]:
        if self.bug is Bug.NEWEST_FIRST:
            return list(reversed(await self.inner.read(epoch, len(self.tables.rows))))[:limit]
        if self.bug is Bug.LIMIT_IGNORED:
            limit = len(self.tables.rows)
        return await self.inner.read(epoch, limit)

    async def take(self, epoch: int, row_ids: Sequence[int]) -> None:
        await self.inner.take(epoch, row_ids)

    async def quarantine(self, epoch: int, rows: Sequence[tuple[int, str]]) -> None:
        if self.bug is Bug.FIRST_REASON_FOR_ALL:
            rows = [(row_id, rows[0][1]) for row_id, _ in rows]
        elif self.bug is Bug.QUARANTINE_UNFENCED:
            for row_id, reason in rows:
                row = self.tables.rows.pop(row_id)
                self.tables.quarantine[row_id] = QuarantinedRow(
                    row.row_id, row.kind, row.payload, row.options, row.enqueued_unix_ns,
                    reason, row.enqueued_unix_ns, len(row.payload),
                )  # fmt: skip
            return
        await self.inner.quarantine(epoch, rows)

    async def wait(self) -> None:
        await self.inner.wait()

    async def stats(self) -> OutboxStats:
        stats = await self.inner.stats()
        if self.bug is Bug.STATS_DEPTH_WITH_QUARANTINE:
            return replace(stats, depth=stats.depth + stats.quarantined)
        return stats

    async def quarantined(self, after: int, limit: int) -> Sequence[QuarantinedRow]:
        return await self.inner.quarantined(after, limit)

    async def requeue(self, row_ids: Sequence[int]) -> int:
        if self.bug is not Bug.REQUEUE_NEW_ID:
            return await self.inner.requeue(row_ids)
        moved = 0
        for row_id in row_ids:
            row = self.tables.quarantine.pop(row_id, None)
            if row is not None:
                self.inner.put_raw(row.kind, row.payload, row.options)
                moved += 1
        return moved

    async def discard(self, row_ids: Sequence[int]) -> int:
        if self.bug is Bug.DISCARD_FROM_OUTBOX:
            for row_id in row_ids:
                self.tables.rows.pop(row_id, None)
        return await self.inner.discard(row_ids)

    async def close(self) -> None:
        await self.inner.close()


class BugStore(DelegatingStore):
    def __init__(self, inner: MemoryStore, bug: Bug) -> None:
        super().__init__(inner)
        self.memory = inner
        self.bug = bug
        assert inner.outbox is not None
        self.outbox = BugOutbox(inner.outbox, inner, bug)

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        taken = [i for m in batch if isinstance(m, OutboxTaken) for i in m.row_ids]
        rest = [m for m in batch if not isinstance(m, OutboxTaken)]
        rows = self.memory._cluster.outbox.rows
        match self.bug:
            case Bug.TAKEN_IGNORED:
                batch = rest
            case Bug.TAKEN_BEFORE_THE_BATCH:
                self.memory._fence(epoch)
                self._take_directly(taken)
                batch = rest
            case Bug.MISSING_ROW_FAILS:
                missing = [i for i in taken if i not in rows]
                if missing:
                    raise StoreFatal(f"outbox rows {missing} are gone: corrupt outbox?")
        try:
            await self.inner.commit(epoch, batch)
        except Fenced:
            if self.bug is Bug.TAKEN_WHEN_FENCED:
                self._take_directly(taken)
            raise

    def _take_directly(self, row_ids: Sequence[int]) -> None:
        """From the cluster's outbox, bypassing the commit's fence and undo."""
        for row_id in row_ids:
            self.memory._cluster.outbox.rows.pop(row_id, None)


class BugHarness(StoreHarness):
    capabilities = frozenset({Capability.PAUSE, Capability.FAULT_MID_BATCH, Capability.OUTBOX})
    leadership_timeout = 1.0

    def __init__(self, bug: Bug) -> None:
        self.bug = bug
        if bug is Bug.UNDECLARED:
            self.capabilities = self.capabilities - {Capability.OUTBOX}
        self._first = MemoryStore(outbox=True)
        assert self._first.outbox is not None
        self._outbox = self._first.outbox
        self._opened = 0

    async def open(self) -> Store:
        self._opened += 1
        memory = self._first if self._opened == 1 else self._first.connect_another()
        return BugStore(memory, self.bug)

    @staticmethod
    def _memory(instance: Store) -> MemoryStore:
        assert isinstance(instance, BugStore)
        return instance.memory

    async def crash(self, instance: Store) -> None:
        self._memory(instance).simulate_crash()

    async def pause(self, instance: Store) -> None:
        self._memory(instance).pause()

    async def resume(self, instance: Store) -> None:
        self._memory(instance).resume()

    async def fail_next_commit_midway(self, instance: Store) -> None:
        self._memory(instance).fail_next_commit_midway()

    async def put_outbox_row(self, kind: str, payload: bytes, options_json: str) -> int:
        return self._outbox.put_raw(kind, payload, options_json)

    async def begin_outbox_row(
        self, kind: str, payload: bytes, options_json: str
    ) -> PendingOutboxRow:
        if self.bug is Bug.DIRTY_READ:
            # The store's outbox sees the row the moment the application writes it.
            return DirtyRow(self._first, self._outbox.put_raw(kind, payload, options_json))
        return PendingRow(self._outbox, kind, payload, options_json)


class PendingRow(PendingOutboxRow):
    """Written when the application's transaction commits, as MemoryHarness does."""

    def __init__(self, outbox: MemoryOutbox, kind: str, payload: bytes, options: str) -> None:
        self._outbox = outbox
        self._row = (kind, payload, options)

    async def commit(self) -> int:
        return self._outbox.put_raw(*self._row)

    async def rollback(self) -> None:
        return None


class DirtyRow(PendingOutboxRow):
    """Written at once: visible to the store before its transaction ends."""

    def __init__(self, memory: MemoryStore, row_id: int) -> None:
        self._memory = memory
        self._row_id = row_id

    async def commit(self) -> int:
        return self._row_id

    async def rollback(self) -> None:
        self._memory._cluster.outbox.rows.pop(self._row_id, None)


Check = Callable[[StoreSuite, StoreHarness], Awaitable[None]]

CASES: list[tuple[Check, Bug, str]] = [
    (
        StoreSuite.test_a_store_with_a_transactional_outbox_declares_it,
        Bug.UNDECLARED,
        "the harness does not declare Capability.OUTBOX",
    ),
    (
        StoreSuite.test_a_landed_batch_takes_exactly_the_outbox_rows_it_names,
        Bug.TAKEN_IGNORED,
        "an OutboxTaken deletes exactly the rows it names",
    ),
    (
        StoreSuite.test_a_batch_that_fails_midway_takes_no_outbox_row,
        Bug.TAKEN_BEFORE_THE_BATCH,
        "batches that failed midway took outbox rows",
    ),
    (
        StoreSuite.test_a_fenced_commit_takes_no_outbox_row,
        Bug.TAKEN_WHEN_FENCED,
        "fenced commits took outbox rows",
    ),
    (
        StoreSuite.test_a_retried_commit_skips_the_outbox_rows_already_taken,
        Bug.MISSING_ROW_FAILS,
        "a commit retried after it landed must not fail",
    ),
    (
        StoreSuite.test_an_outbox_read_returns_committed_rows_oldest_id_first_up_to_its_limit,
        Bug.DIRTY_READ,
        "no row of a transaction still open",
    ),
    (
        StoreSuite.test_an_outbox_read_returns_committed_rows_oldest_id_first_up_to_its_limit,
        Bug.NEWEST_FIRST,
        "oldest id first",
    ),
    (
        StoreSuite.test_an_outbox_read_returns_committed_rows_oldest_id_first_up_to_its_limit,
        Bug.LIMIT_IGNORED,
        r"read\(epoch, 1\) must return the 1 oldest ids",
    ),
    (
        StoreSuite.test_quarantined_outbox_rows_keep_their_reasons_and_are_listed_in_id_order,
        Bug.FIRST_REASON_FOR_ALL,
        "each with its own reason",
    ),
    (
        StoreSuite.test_a_fenced_quarantine_moves_no_outbox_row,
        Bug.QUARANTINE_UNFENCED,
        "a quarantine by an epoch that no longer leads moved rows",
    ),
    (
        StoreSuite.test_requeue_and_discard_move_quarantined_rows_and_stats_count_them,
        Bug.REQUEUE_NEW_ID,
        "a requeued row is back in the outbox with its id",
    ),
    (
        StoreSuite.test_requeue_and_discard_move_quarantined_rows_and_stats_count_them,
        Bug.DISCARD_FROM_OUTBOX,
        "discard deletes only quarantined rows",
    ),
    (
        StoreSuite.test_requeue_and_discard_move_quarantined_rows_and_stats_count_them,
        Bug.STATS_DEPTH_WITH_QUARANTINE,
        r"stats\(\) after a quarantine",
    ),
]


def _id(value: object) -> str:
    return getattr(value, "name", "") or getattr(value, "__name__", "")


@pytest.mark.parametrize(("check", "bug", "message"), CASES, ids=_id)
async def test_each_outbox_check_fails_on_its_seeded_bug(
    check: Check, bug: Bug, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        await check(StoreSuite(), BugHarness(bug))


@pytest.mark.parametrize("check", sorted({c for c, _, _ in CASES}, key=_id), ids=_id)
async def test_each_outbox_check_passes_on_the_store_without_the_bug(check: Check) -> None:
    await check(StoreSuite(), BugHarness(Bug.NONE))
