"""The kit's checks of the occurrence ledger (issue 32) fail on a store seeded with the matching
bug, and pass on MemoryStore itself: a check that cannot fail proves nothing. Each seeded store
wraps a MemoryStore and writes, reads or prunes its records as a store with that bug would.
(The SQL stores' tests seed some of the same bugs in SQL: test_sqlite_seeded_bugs,
test_pg_seeded_bugs.)"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import pytest

from cronoq import MemoryStore
from cronoq.errors import Fenced
from cronoq.store import Mutation, OccurrenceRecorded, ScheduleRemoved, Store
from cronoq_conformance import Capability, StoreHarness, StoreSuite
from cronoq_conformance._faults import DelegatingStore


class Bug(enum.Enum):
    NONE = "no bug: MemoryStore as it is"
    TIMES_IN_UNIX = "records are read back in Unix time, whatever the reader's time base"
    MESSAGES_RAW = "messages are stored as given: NUL and lone surrogates kept"
    LAST_WRITE_WINS = "a repeated record replaces the first (an upsert, not DO NOTHING)"
    OLDEST_FIRST = "records are read oldest first"
    BEFORE_INCLUSIVE = "a record due at before_ns is read too"
    LIMIT_IGNORED = "every record is read, whatever the limit"
    NAMES_LIKE = "the name is matched as a LIKE pattern"
    NAMES_CASELESS = "names are compared ignoring case"
    RECORDS_OUTSIDE_THE_BATCH = "a batch's records are written, fenced, in a transaction of "
    "their own before the rest: a batch that fails midway leaves them"
    RECORDS_UNFENCED = "a batch's records are written even when its commit is fenced"
    PRUNE_KEEPS_RECORDS = "pruning deletes tasks only"
    PRUNE_EXISTING_ONLY = "pruning deletes the records of schedules that still exist only"
    PRUNE_INCLUSIVE = "pruning deletes a record whose span ends at the horizon too"
    PRUNE_BY_DUE = "pruning goes by a record's due time, not the end of its span"
    REMOVAL_DELETES_RECORDS = "a ScheduleRemoved deletes the schedule's records (a cascade)"
    LEDGER_PRUNE_UNFENCED = "pruning deletes the records before it asks whether it leads"


_READS = {
    Bug.TIMES_IN_UNIX,
    Bug.OLDEST_FIRST,
    Bug.BEFORE_INCLUSIVE,
    Bug.LIMIT_IGNORED,
    Bug.NAMES_LIKE,
    Bug.NAMES_CASELESS,
}


def _like(pattern: str) -> re.Pattern[str]:
    return re.compile("".join({"%": ".*", "_": "."}.get(c, re.escape(c)) for c in pattern))


class LedgerBugStore(DelegatingStore):
    def __init__(self, inner: MemoryStore, bug: Bug) -> None:
        super().__init__(inner)
        self.memory = inner
        self.bug = bug

    def _put(self, record: OccurrenceRecorded, *, keep_first: bool) -> None:
        """Into the cluster, bypassing the commit's fence, undo and sanitizing."""
        to_unix = self.memory._time_base.to_unix
        due = to_unix(record.due_ns)
        unix = replace(
            record, due_ns=due, until_ns=to_unix(record.until_ns), at_ns=to_unix(record.at_ns)
        )
        kept = self.memory._cluster.occurrences.setdefault(record.schedule, {})
        if keep_first:
            kept.setdefault(due, unix)
        else:
            kept[due] = unix

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        bug, cluster = self.bug, self.memory._cluster
        records = [m for m in batch if isinstance(m, OccurrenceRecorded)]
        if bug is Bug.RECORDS_OUTSIDE_THE_BATCH:
            self.memory._fence(epoch)
            for record in records:
                self._put(record, keep_first=True)
            batch = [m for m in batch if not isinstance(m, OccurrenceRecorded)]
        to_unix = self.memory._time_base.to_unix
        new = [
            r for r in records if to_unix(r.due_ns) not in cluster.occurrences.get(r.schedule, {})
        ]
        try:
            await self.inner.commit(epoch, batch)
        except Fenced:
            if bug is Bug.RECORDS_UNFENCED:
                for record in records:
                    self._put(record, keep_first=True)
            raise
        if bug is Bug.LAST_WRITE_WINS:
            for record in records:
                self._put(record, keep_first=False)
        elif bug is Bug.MESSAGES_RAW:
            for record in reversed(new):  # the first of the batch last: it stays
                self._put(record, keep_first=False)
        elif bug is Bug.REMOVAL_DELETES_RECORDS:
            for m in batch:
                if isinstance(m, ScheduleRemoved):
                    cluster.occurrences.pop(m.name, None)

    async def get_occurrences(
        self, schedule: str, before_ns: int | None, limit: int
    ) -> Sequence[OccurrenceRecorded]:
        bug = self.bug
        if bug not in _READS:
            return await self.inner.get_occurrences(schedule, before_ns, limit)
        base = self.memory._time_base

        def matches(name: str) -> bool:
            if bug is Bug.NAMES_LIKE:
                return _like(schedule).fullmatch(name) is not None
            if bug is Bug.NAMES_CASELESS:
                return name.casefold() == schedule.casefold()
            return name == schedule

        ledger = self.memory._cluster.occurrences
        found = [r for name, kept in ledger.items() if matches(name) for r in kept.values()]
        if before_ns is not None:
            before = base.to_unix(before_ns)
            inclusive = bug is Bug.BEFORE_INCLUSIVE
            found = [r for r in found if r.due_ns < before or (inclusive and r.due_ns == before)]
        found.sort(key=lambda r: r.due_ns, reverse=bug is not Bug.OLDEST_FIRST)
        if bug is not Bug.LIMIT_IGNORED:
            found = found[:limit]
        convert = (lambda ns: ns) if bug is Bug.TIMES_IN_UNIX else base.to_engine
        return [
            replace(
                r, due_ns=convert(r.due_ns), until_ns=convert(r.until_ns), at_ns=convert(r.at_ns)
            )
            for r in found
        ]


class LedgerBugHarness(StoreHarness):
    capabilities = frozenset({Capability.PRUNE, Capability.PAUSE, Capability.FAULT_MID_BATCH})
    leadership_timeout = 1.0

    def __init__(self, bug: Bug) -> None:
        self.bug = bug
        self._first = MemoryStore()
        self._opened = 0

    async def open(self) -> Store:
        self._opened += 1
        memory = self._first if self._opened == 1 else self._first.connect_another()
        return LedgerBugStore(memory, self.bug)

    @staticmethod
    def _memory(instance: Store) -> MemoryStore:
        assert isinstance(instance, LedgerBugStore)
        return instance.memory

    async def crash(self, instance: Store) -> None:
        self._memory(instance).simulate_crash()

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        memory, bug = self._memory(instance), self.bug
        cluster = memory._cluster
        if bug is Bug.LEDGER_PRUNE_UNFENCED:
            for kept in cluster.occurrences.values():
                for due in [due for due, r in kept.items() if r.until_ns < horizon_unix_ns]:
                    del kept[due]
        # Fenced as MemoryHarness's (test_memory_conformance) is.
        if cluster.leader != memory._id or cluster.epoch != memory._epoch:
            raise Fenced("this MemoryStore instance does not lead: it prunes nothing")
        before = {name: dict(kept) for name, kept in cluster.occurrences.items()}
        memory.prune(horizon_unix_ns)
        for name, kept in before.items():
            if bug is Bug.PRUNE_KEEPS_RECORDS or (
                bug is Bug.PRUNE_EXISTING_ONLY and name not in cluster.schedules
            ):
                cluster.occurrences[name] = kept
            elif bug is Bug.PRUNE_INCLUSIVE:
                left = cluster.occurrences.get(name, {})
                for due in [due for due, r in left.items() if r.until_ns == horizon_unix_ns]:
                    del left[due]
            elif bug is Bug.PRUNE_BY_DUE:
                left = cluster.occurrences.get(name, {})
                for due in [due for due in left if due < horizon_unix_ns]:
                    del left[due]

    async def pause(self, instance: Store) -> None:
        self._memory(instance).pause()

    async def resume(self, instance: Store) -> None:
        self._memory(instance).resume()

    async def fail_next_commit_midway(self, instance: Store) -> None:
        self._memory(instance).fail_next_commit_midway()


Check = Callable[[StoreSuite, StoreHarness], Awaitable[None]]

READ_BACK = StoreSuite.test_occurrence_records_read_back_exactly_in_the_time_base_of_the_reader
PAGES = StoreSuite.test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name
PRUNING = StoreSuite.test_pruning_removes_the_occurrence_records_that_ended_before_the_horizon

CASES: list[tuple[Check, Bug, str]] = [
    (READ_BACK, Bug.TIMES_IN_UNIX, r"in the engine time of the TimeBase given to recover"),
    (READ_BACK, Bug.MESSAGES_RAW, r"NUL and lone surrogates in its message as U\+FFFD"),
    (
        StoreSuite.test_a_repeated_occurrence_record_changes_nothing,
        Bug.LAST_WRITE_WINS,
        "the first one written stays",
    ),
    (PAGES, Bug.OLDEST_FIRST, "newest first"),
    (PAGES, Bug.BEFORE_INCLUSIVE, r"only the records due before before_ns \(exclusive\)"),
    (PAGES, Bug.LIMIT_IGNORED, "at most limit records"),
    (PAGES, Bug.NAMES_LIKE, r"get_occurrences\('a%'\) .* names compared exactly"),
    (PAGES, Bug.NAMES_CASELESS, "names compared exactly"),
    (
        StoreSuite.test_a_batch_that_fails_midway_writes_no_occurrence,
        Bug.RECORDS_OUTSIDE_THE_BATCH,
        "a batch that fails midway must write no OccurrenceRecorded",
    ),
    (
        StoreSuite.test_a_replaced_leader_that_has_not_noticed_writes_no_occurrence,
        Bug.RECORDS_UNFENCED,
        "wrote its OccurrenceRecorded",
    ),
    (PRUNING, Bug.PRUNE_KEEPS_RECORDS, r"deletes the ledger records whose span ended before"),
    (PRUNING, Bug.PRUNE_BY_DUE, r"whose span ended before it, and only those"),
    (PRUNING, Bug.PRUNE_EXISTING_ONLY, r"whether or not their schedule still exists .*'gone'"),
    (PRUNING, Bug.PRUNE_INCLUSIVE, r"and only those"),
    (
        StoreSuite.test_the_records_of_a_removed_schedule_remain,
        Bug.REMOVAL_DELETES_RECORDS,
        "a removed schedule's records remain",
    ),
    (
        StoreSuite.test_an_instance_that_does_not_lead_prunes_nothing,
        Bug.LEDGER_PRUNE_UNFENCED,
        "a standby that never led pruned ledger records",
    ),
]


@pytest.mark.parametrize(("check", "bug", "message"), CASES, ids=lambda c: getattr(c, "name", ""))
async def test_each_ledger_check_fails_on_its_seeded_bug(
    check: Check, bug: Bug, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        await check(StoreSuite(), LedgerBugHarness(bug))


@pytest.mark.parametrize(
    "check", dict.fromkeys(c for c, _, _ in CASES), ids=lambda c: getattr(c, "__name__", "")
)
async def test_each_ledger_check_passes_on_the_store_without_the_bug(check: Check) -> None:
    await check(StoreSuite(), LedgerBugHarness(Bug.NONE))
