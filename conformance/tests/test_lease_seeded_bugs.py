"""The kit's lease checks (issue 19) fail on a store seeded with the matching bug, and pass on
MemoryStore itself: a check that cannot fail proves nothing. Each seeded store wraps a
MemoryStore and rewrites the batches it commits, as a store with that bug would persist them.
(The SQL stores' tests seed the same bugs in SQL: test_sqlite_seeded_bugs, test_pg_seeded_bugs.)
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence

import pytest

from cronoq import MemoryStore
from cronoq.store import AttemptLease, CancelRequested, Mutation, Store, TaskUpdated
from cronoq_conformance import Capability, StoreHarness, StoreSuite
from cronoq_conformance._faults import DelegatingStore


class LeaseBug(enum.Enum):
    NONE = "no bug: MemoryStore as it is"
    DROPPED = "every lease is dropped at commit"
    FIRST_KEPT = "a lease already on the row is kept when an update brings another"
    NOT_CLEARED = "an update without a lease leaves the row's lease (COALESCE(new, old))"
    CLEARED_BY_CANCEL = "a cancellation request clears the row's lease"
    PRUNED_WITH_LEASE = "pruning deletes a finished row that keeps a lease"


class LeaseBugStore(DelegatingStore):
    def __init__(self, inner: MemoryStore, bug: LeaseBug) -> None:
        super().__init__(inner)
        self.memory = inner
        self.bug = bug

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        await self.inner.commit(epoch, await self._seeded(epoch, batch))

    async def _row_lease(
        self, task_id: int, leases: dict[int, AttemptLease | None]
    ) -> AttemptLease | None:
        if task_id not in leases:
            record = await self.inner.get_task(task_id)
            leases[task_id] = None if record is None else record.lease
        return leases[task_id]

    async def _seeded(self, epoch: int, batch: Sequence[Mutation]) -> list[Mutation]:
        leases: dict[int, AttemptLease | None] = {}  # each row's lease as the batch goes
        seeded: list[Mutation] = []
        for mutation in batch:
            if isinstance(mutation, TaskUpdated):
                current = await self._row_lease(mutation.task_id, leases)
                lease = mutation.lease
                if self.bug is LeaseBug.DROPPED:
                    lease = None
                elif (self.bug is LeaseBug.FIRST_KEPT and current is not None) or (
                    self.bug is LeaseBug.NOT_CLEARED and lease is None
                ):
                    lease = current
                leases[mutation.task_id] = lease
                mutation = TaskUpdated(
                    mutation.task_id, mutation.status, mutation.attempt, mutation.message,
                    mutation.at_ns, mutation.due_ns, mutation.output, lease,
                )  # fmt: skip
            elif isinstance(mutation, CancelRequested) and self.bug is LeaseBug.CLEARED_BY_CANCEL:
                # The row as the batch left it, rewritten without its lease, then the request.
                await self.inner.commit(epoch, seeded)
                seeded = []
                record = await self.inner.get_task(mutation.task_id)
                assert record is not None
                seeded.append(
                    TaskUpdated(
                        record.task_id,
                        record.status,
                        record.attempt,
                        record.message,
                        record.updated_ns,
                        record.due_ns,
                        record.output,
                        None,
                    )
                )
                leases[mutation.task_id] = None
            seeded.append(mutation)
        return seeded


class LeaseBugHarness(StoreHarness):
    leadership_timeout = 1.0
    capabilities = frozenset({Capability.PRUNE})

    def __init__(self, bug: LeaseBug) -> None:
        self.bug = bug
        self._first = MemoryStore()
        self._opened = 0

    async def open(self) -> Store:
        self._opened += 1
        memory = self._first if self._opened == 1 else self._first.connect_another()
        return LeaseBugStore(memory, self.bug)

    async def crash(self, instance: Store) -> None:
        assert isinstance(instance, LeaseBugStore)
        instance.memory.simulate_crash()

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        assert isinstance(instance, LeaseBugStore)
        cluster = instance.memory._cluster
        if self.bug is LeaseBug.PRUNED_WITH_LEASE:
            # The store's prune as it was before finished rows kept leases.
            for task_id, finished_at in list(cluster.finished.items()):
                if finished_at < horizon_unix_ns:
                    del cluster.finished[task_id]
                    del cluster.tasks[task_id]
            return
        cluster.prune(horizon_unix_ns)


Check = Callable[[StoreSuite, StoreHarness], Awaitable[None]]

CASES: list[tuple[Check, LeaseBug, str]] = [
    (
        StoreSuite.test_a_lease_round_trips_through_commit_and_lookups,
        LeaseBug.DROPPED,
        "get_task must return the lease a TaskUpdated wrote",
    ),
    (
        StoreSuite.test_a_lease_survives_a_new_instance_recovery,
        LeaseBug.DROPPED,
        r"recover\(\) must return each running row's lease",
    ),
    (
        StoreSuite.test_a_later_update_replaces_the_lease,
        LeaseBug.FIRST_KEPT,
        "must replace the row's lease, not keep the older one",
    ),
    (
        StoreSuite.test_an_update_without_a_lease_clears_it,
        LeaseBug.NOT_CLEARED,
        "without a lease .* must clear it",
    ),
    (
        StoreSuite.test_a_cancellation_request_keeps_the_lease,
        LeaseBug.CLEARED_BY_CANCEL,
        "a CancelRequested must keep the row's lease",
    ),
    (
        StoreSuite.test_a_finished_row_keeps_its_lease_and_is_not_pruned_until_cleared,
        LeaseBug.PRUNED_WITH_LEASE,
        "pruning must leave a finished row that keeps a lease",
    ),
]


@pytest.mark.parametrize(("check", "bug", "message"), CASES, ids=lambda c: getattr(c, "name", ""))
async def test_each_lease_check_fails_on_its_seeded_bug(
    check: Check, bug: LeaseBug, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        await check(StoreSuite(), LeaseBugHarness(bug))


@pytest.mark.parametrize(("check", "bug", "message"), CASES, ids=lambda c: getattr(c, "name", ""))
async def test_each_lease_check_passes_on_the_store_without_the_bug(
    check: Check, bug: LeaseBug, message: str
) -> None:
    await check(StoreSuite(), LeaseBugHarness(LeaseBug.NONE))
