"""The kit's checks of the operator calls' mutations (issue 21: PoolPaused, TaskRetried) and of
the trace context a task stores (issue 22) fail on a store seeded with the matching bug, and
pass on MemoryStore itself: a check that cannot fail
proves nothing. Each seeded store wraps a MemoryStore and rewrites the batches it commits, as a
store with that bug would persist them. (The SQL stores' tests seed the same bugs in SQL:
test_sqlite_seeded_bugs, test_pg_seeded_bugs.)"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import pytest

from cronoq import MemoryStore
from cronoq.store import Mutation, PoolPaused, Store, TaskRetried, TaskSubmitted, TaskUpdated
from cronoq_conformance import Capability, StoreHarness, StoreSuite
from cronoq_conformance._faults import DelegatingStore


class Bug(enum.Enum):
    NONE = "no bug: MemoryStore as it is"
    PAUSE_DROPPED = "a PoolPaused is not written"
    RESUME_IGNORED = "a resume does not clear the pool's pause (only pauses are written)"
    RETRY_AS_UPDATE = "a TaskRetried is written as a status update: spec, cancellation request "
    "and finish time stay"
    TRACE_DROPPED = "a task's trace context is not written (a store that keeps only the "
    "options it knows)"


class BugStore(DelegatingStore):
    def __init__(self, inner: MemoryStore, bug: Bug) -> None:
        super().__init__(inner)
        self.memory = inner
        self.bug = bug

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        await self.inner.commit(epoch, [m for m in map(self._seeded, batch) if m is not None])

    def _seeded(self, mutation: Mutation) -> Mutation | None:
        bug = self.bug
        match mutation:
            case PoolPaused(paused=paused) if bug is Bug.PAUSE_DROPPED or (
                bug is Bug.RESUME_IGNORED and not paused
            ):
                return None
            case TaskRetried(task_id, _, status, attempt, message, at_ns) if (
                bug is Bug.RETRY_AS_UPDATE
            ):
                return TaskUpdated(task_id, status, attempt, message, at_ns)
            case TaskSubmitted(spec=spec) if bug is Bug.TRACE_DROPPED:
                return replace(mutation, spec=replace(spec, trace_context=None))
        return mutation


class BugHarness(StoreHarness):
    capabilities = frozenset({Capability.PRUNE})
    leadership_timeout = 1.0

    def __init__(self, bug: Bug) -> None:
        self.bug = bug
        self._first = MemoryStore()
        self._opened = 0

    async def open(self) -> Store:
        self._opened += 1
        memory = self._first if self._opened == 1 else self._first.connect_another()
        return BugStore(memory, self.bug)

    async def crash(self, instance: Store) -> None:
        assert isinstance(instance, BugStore)
        instance.memory.simulate_crash()

    async def prune(self, instance: Store, horizon_unix_ns: int) -> None:
        assert isinstance(instance, BugStore)
        instance.memory.prune(horizon_unix_ns)


Check = Callable[[StoreSuite, StoreHarness], Awaitable[None]]

CASES: list[tuple[Check, Bug, str]] = [
    (
        StoreSuite.test_a_paused_pool_is_recovered_by_a_new_instance,
        Bug.PAUSE_DROPPED,
        "must return every pool a PoolPaused paused",
    ),
    (
        StoreSuite.test_a_resumed_pool_is_not_recovered_as_paused,
        Bug.RESUME_IGNORED,
        r"PoolPaused\(paused=False\) must replace the pool's earlier pause",
    ),
    (
        StoreSuite.test_a_retried_task_is_live_again_with_its_new_spec,
        Bug.RETRY_AS_UPDATE,
        "a TaskRetried must make the row live",
    ),
    (
        StoreSuite.test_a_retried_task_is_not_pruned,
        Bug.RETRY_AS_UPDATE,
        "pruning must not delete it",
    ),
    (
        StoreSuite.test_a_trace_context_round_trips_through_recovery_and_lookups,
        Bug.TRACE_DROPPED,
        "get_task must return the trace context a task was submitted with",
    ),
]


@pytest.mark.parametrize(("check", "bug", "message"), CASES, ids=lambda c: getattr(c, "name", ""))
async def test_each_check_fails_on_its_seeded_bug(check: Check, bug: Bug, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        await check(StoreSuite(), BugHarness(bug))


@pytest.mark.parametrize(("check", "bug", "message"), CASES, ids=lambda c: getattr(c, "name", ""))
async def test_each_check_passes_on_the_store_without_the_bug(
    check: Check, bug: Bug, message: str
) -> None:
    await check(StoreSuite(), BugHarness(Bug.NONE))
