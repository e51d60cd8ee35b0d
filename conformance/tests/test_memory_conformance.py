"""The conformance kit against MemoryStore: what a store author's test module looks like."""

from __future__ import annotations

import pytest
from hypothesis import settings

from cronoq import MemoryStore
from cronoq.errors import Fenced
from cronoq.store import Store
from cronoq_conformance import (
    Capability,
    PendingOutboxRow,
    StoreConformance,
    StoreHarness,
    StoreSuite,
)


class MemoryHarness(StoreHarness):
    capabilities = frozenset(
        {
            Capability.UNAVAILABLE,
            Capability.FAULT_MID_BATCH,
            Capability.PRUNE,
            Capability.PAUSE,
            Capability.FATAL_COMMIT,
            Capability.OUTBOX,
        }
    )
    leadership_timeout = 1.0
    handover_timeout = 0.2

    def __init__(self) -> None:
        self._first = MemoryStore(outbox=True)
        self._opened = 0

    async def open(self) -> Store:
        self._opened += 1
        # The first instance is the cluster's seed; every later one joins it.
        return self._first if self._opened == 1 else self._first.connect_another()

    @staticmethod
    def _memory(instance: Store) -> MemoryStore:
        assert isinstance(instance, MemoryStore)
        return instance

    async def crash(self, instance: Store) -> None:
        self._memory(instance).simulate_crash()

    async def set_available(self, instance: Store, available: bool) -> None:
        self._memory(instance).set_available(available)

    async def fail_next_commit_midway(self, instance: Store) -> None:
        self._memory(instance).fail_next_commit_midway()

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        # MemoryStore prunes inside its commits, which are fenced; its prune() is a test
        # helper that prunes the cluster whoever calls it, so the fence is the harness's here.
        memory = self._memory(instance)
        cluster = memory._cluster
        if cluster.leader != memory._id or cluster.epoch != memory._epoch:
            raise Fenced("this MemoryStore instance does not lead: it prunes nothing")
        memory.prune(horizon_unix_ns)

    async def pause(self, instance: Store) -> None:
        self._memory(instance).pause()

    async def resume(self, instance: Store) -> None:
        self._memory(instance).resume()

    async def fail_commits_fatally(self, instance: Store) -> None:
        self._memory(instance).fail_commits_fatally()

    async def put_outbox_row(self, kind: str, payload: bytes, options_json: str) -> int:
        assert self._first.outbox is not None
        return self._first.outbox.put_raw(kind, payload, options_json)

    async def begin_outbox_row(
        self, kind: str, payload: bytes, options_json: str
    ) -> PendingOutboxRow:
        return PendingMemoryRow(self, kind, payload, options_json)


class PendingMemoryRow(PendingOutboxRow):
    """A MemoryStore's outbox has no transactions: an application's transaction writes its
    row when it commits (``put_raw``), and nothing before."""

    def __init__(self, harness: MemoryHarness, kind: str, payload: bytes, options: str) -> None:
        self._harness = harness
        self._row = (kind, payload, options)

    async def commit(self) -> int:
        return await self._harness.put_outbox_row(*self._row)

    async def rollback(self) -> None:
        return None


class TestMemoryStore(StoreConformance):
    # Memory histories take milliseconds a step: more and longer ones, for the same time.
    simulation_settings = settings(max_examples=20, stateful_step_count=16, deadline=None)

    @pytest.fixture
    def harness(self) -> StoreHarness:
        return MemoryHarness()


# --- the kit's pruning checks fail on a store whose pruning is not fenced (issue 25) ----------


class UnfencedPruneHarness(MemoryHarness):
    """Seeded bug: MemoryStore's own prune() test helper prunes the cluster whoever calls it,
    as a store whose prune asks nobody whether it leads does. (The stores' tests seed the
    other bugs of issue 25: test_pg_seeded_bugs, test_sqlite_seeded_bugs.)"""

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        self._memory(instance).prune(horizon_unix_ns)


async def test_the_check_of_an_instance_that_does_not_lead_fails_on_unfenced_pruning() -> None:
    with pytest.raises(AssertionError, match="a standby that never led must be told it is fenced"):
        await StoreSuite().test_an_instance_that_does_not_lead_prunes_nothing(
            UnfencedPruneHarness()
        )


async def test_the_check_of_a_replaced_leader_fails_on_unfenced_pruning() -> None:
    with pytest.raises(AssertionError, match="replaced behind its back must be told it is fenced"):
        await StoreSuite().test_a_replaced_leader_that_has_not_noticed_prunes_nothing(
            UnfencedPruneHarness()
        )
