"""The kit's limits check (issue 31) fails on a store seeded with each bug it is there for, and
passes on MemoryStore itself. Each seeded store wraps a MemoryStore and rewrites what it
commits, as a store with that bug would persist it."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

import pytest

from cronoq import MemoryStore
from cronoq.store import Mutation, Store, TaskSubmitted
from cronoq_conformance import StoreHarness, StoreSuite
from cronoq_conformance._faults import DelegatingStore


class LimitsBug(enum.Enum):
    NONE = "no bug: MemoryStore as it is"
    LIMITS_DROPPED = "a spec is stored without its limits"
    KEYS_DROPPED = "a spec's limits are stored without their keys"
    START_FORGOTTEN = "a finished row forgets when its latest attempt started"


class LimitsBugStore(DelegatingStore):
    def __init__(self, inner: MemoryStore, bug: LimitsBug) -> None:
        super().__init__(inner)
        self.memory = inner
        self.bug = bug

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        seeded: list[Mutation] = []
        for mutation in batch:
            if isinstance(mutation, TaskSubmitted) and self.bug is LimitsBug.LIMITS_DROPPED:
                mutation = dataclasses.replace(
                    mutation, spec=dataclasses.replace(mutation.spec, limits=())
                )
            elif isinstance(mutation, TaskSubmitted) and self.bug is LimitsBug.KEYS_DROPPED:
                unkeyed = tuple((name, None) for name, _ in mutation.spec.limits)
                mutation = dataclasses.replace(
                    mutation, spec=dataclasses.replace(mutation.spec, limits=unkeyed)
                )
            seeded.append(mutation)
        await self.inner.commit(epoch, seeded)
        if self.bug is LimitsBug.START_FORGOTTEN:
            # As a store that writes a finished row whole, its start column left out.
            cluster = self.memory._cluster
            for task_id, record in list(cluster.tasks.items()):
                if record.status.is_terminal:
                    cluster.tasks[task_id] = dataclasses.replace(record, started_ns=None)


class LimitsBugHarness(StoreHarness):
    leadership_timeout = 1.0

    def __init__(self, bug: LimitsBug) -> None:
        self.bug = bug
        self._first = MemoryStore()
        self._opened = 0

    async def open(self) -> Store:
        self._opened += 1
        memory = self._first if self._opened == 1 else self._first.connect_another()
        return LimitsBugStore(memory, self.bug)

    async def crash(self, instance: Store) -> None:
        assert isinstance(instance, LimitsBugStore)
        instance.memory.simulate_crash()


CASES = [
    (LimitsBug.LIMITS_DROPPED, "get_task must return the limits"),
    (LimitsBug.KEYS_DROPPED, "get_task must return the limits"),
    (LimitsBug.START_FORGOTTEN, "must return a finished task's latest start"),
]


@pytest.mark.parametrize(("bug", "message"), CASES, ids=lambda c: getattr(c, "name", ""))
async def test_the_limits_check_fails_on_each_seeded_bug(bug: LimitsBug, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        await StoreSuite().test_limits_and_the_latest_start_round_trip_through_recovery(
            LimitsBugHarness(bug)
        )


async def test_the_limits_check_passes_on_the_store_without_a_bug() -> None:
    await StoreSuite().test_limits_and_the_latest_start_round_trip_through_recovery(
        LimitsBugHarness(LimitsBug.NONE)
    )
