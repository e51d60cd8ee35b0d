"""The kit's checks of the operator calls' mutations (issue 21: PoolPaused, TaskRetried), of
the trace context and the limits a task stores (issues 22 and 31), and of the batch rules
those mutations and the attempt history are held to (issue 34: atomic, fenced, each pause on
its own pool, a retry clearing a kept lease) fail on a store seeded with the matching bug,
and pass on MemoryStore itself: a check that cannot fail proves nothing. Each seeded store
wraps a MemoryStore and rewrites the batches it commits, as a store with that bug would
persist them. (The SQL stores' tests seed the same bugs in SQL: test_sqlite_seeded_bugs,
test_pg_seeded_bugs.)"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace

import pytest

from cronoq import MemoryStore
from cronoq.errors import Fenced
from cronoq.store import (
    AttemptEnded,
    AttemptLease,
    Mutation,
    PoolPaused,
    Store,
    TaskRetried,
    TaskSubmitted,
    TaskUpdated,
)
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
    PAUSES_OUTSIDE_THE_BATCH = "a batch's pauses are written, fenced, in a transaction of their "
    "own before the rest: a batch that fails midway leaves them"
    PAUSES_UNFENCED = "a batch's pauses are written even when its commit is fenced (their "
    "statement is not gated on the fence)"
    ATTEMPTS_UNFENCED = "a batch's ended attempts are written even when its commit is fenced"
    POOLS_MIXED_UP = "a batch's pools are paired with their flags in reverse order"
    RETRY_KEEPS_LEASE = "a TaskRetried keeps the lease a finished row kept"
    LIMITS_DROPPED = "a spec is stored without its limits (issue 31)"
    LIMIT_KEYS_DROPPED = "a spec's limits are stored without their keys"
    START_FORGOTTEN = "a finished row forgets when its latest attempt started (a store that "
    "writes a finished row whole, its start left out)"


class BugStore(DelegatingStore):
    def __init__(self, inner: MemoryStore, bug: Bug) -> None:
        super().__init__(inner)
        self.memory = inner
        self.bug = bug

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        seeded = [m for m in map(self._seeded, batch) if m is not None]
        pauses = [m for m in seeded if isinstance(m, PoolPaused)]
        if self.bug is Bug.PAUSES_OUTSIDE_THE_BATCH:
            self.memory._fence(epoch)
            self._write_directly(pauses)
            seeded = [m for m in seeded if not isinstance(m, PoolPaused)]
        elif self.bug is Bug.POOLS_MIXED_UP:
            last_word = {m.name: m.paused for m in pauses}
            flags = reversed(last_word.values())
            seeded = [m for m in seeded if not isinstance(m, PoolPaused)]
            seeded += [PoolPaused(n, f) for n, f in zip(last_word, flags, strict=True)]
        elif self.bug is Bug.RETRY_KEEPS_LEASE:
            seeded = await self._retries_keep_leases(seeded)
        try:
            await self.inner.commit(epoch, seeded)
            if self.bug is Bug.START_FORGOTTEN:
                cluster = self.memory._cluster
                for task_id, record in list(cluster.tasks.items()):
                    if record.status.is_terminal:
                        cluster.tasks[task_id] = replace(record, started_ns=None)
        except Fenced:
            if self.bug is Bug.PAUSES_UNFENCED:
                self._write_directly(pauses)
            elif self.bug is Bug.ATTEMPTS_UNFENCED:
                self._write_directly([m for m in seeded if isinstance(m, AttemptEnded)])
            raise

    def _write_directly(self, mutations: Sequence[PoolPaused | AttemptEnded]) -> None:
        """Into the cluster, bypassing the commit's fence and undo (times: unix = engine)."""
        cluster = self.memory._cluster
        for m in mutations:
            if isinstance(m, AttemptEnded):
                cluster.attempts.setdefault(m.task_id, {}).setdefault(m.attempt, m)
            elif m.paused:
                cluster.paused_pools.add(m.name)
            else:
                cluster.paused_pools.discard(m.name)

    async def _retries_keep_leases(self, batch: Sequence[Mutation]) -> list[Mutation]:
        """Each retry followed by an update that gives the row back its lease, as the batch
        had left it."""
        leases: dict[int, AttemptLease | None] = {}
        seeded: list[Mutation] = []
        for m in batch:
            seeded.append(m)
            if isinstance(m, TaskUpdated):
                leases[m.task_id] = m.lease
            elif isinstance(m, TaskRetried):
                if m.task_id not in leases:
                    record = await self.inner.get_task(m.task_id)
                    leases[m.task_id] = None if record is None else record.lease
                kept = leases[m.task_id]
                if kept is not None:
                    seeded.append(
                        TaskUpdated(m.task_id, m.status, m.attempt, m.message, m.at_ns, lease=kept)
                    )
        return seeded

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
            case TaskSubmitted(spec=spec) if bug is Bug.LIMITS_DROPPED:
                return replace(mutation, spec=replace(spec, limits=()))
            case TaskSubmitted(spec=spec) if bug is Bug.LIMIT_KEYS_DROPPED:
                unkeyed = tuple((name, None) for name, _ in spec.limits)
                return replace(mutation, spec=replace(spec, limits=unkeyed))
        return mutation


class BugHarness(StoreHarness):
    capabilities = frozenset({Capability.PRUNE, Capability.PAUSE, Capability.FAULT_MID_BATCH})
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

    async def pause(self, instance: Store) -> None:
        assert isinstance(instance, BugStore)
        instance.memory.pause()

    async def resume(self, instance: Store) -> None:
        assert isinstance(instance, BugStore)
        instance.memory.resume()

    async def fail_next_commit_midway(self, instance: Store) -> None:
        assert isinstance(instance, BugStore)
        instance.memory.fail_next_commit_midway()


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
    (
        StoreSuite.test_limits_and_the_latest_start_round_trip_through_recovery,
        Bug.LIMITS_DROPPED,
        "get_task must return the limits a task was submitted with",
    ),
    (
        StoreSuite.test_limits_and_the_latest_start_round_trip_through_recovery,
        Bug.LIMIT_KEYS_DROPPED,
        "get_task must return the limits a task was submitted with",
    ),
    (
        StoreSuite.test_limits_and_the_latest_start_round_trip_through_recovery,
        Bug.START_FORGOTTEN,
        "must return a finished task's latest start",
    ),
    (
        StoreSuite.test_a_batch_that_fails_midway_leaves_nothing_behind,
        Bug.PAUSES_OUTSIDE_THE_BATCH,
        "a batch that fails midway must leave no pause or resume behind",
    ),
    (
        StoreSuite.test_a_pool_pause_by_a_replaced_leader_does_not_land,
        Bug.PAUSES_UNFENCED,
        "committed by a leader replaced behind its back landed",
    ),
    (
        StoreSuite.test_a_replaced_leader_that_has_not_noticed_writes_no_attempt,
        Bug.ATTEMPTS_UNFENCED,
        "wrote its AttemptEnded",
    ),
    (
        StoreSuite.test_pauses_and_resumes_of_many_pools_land_each_on_its_own_pool,
        Bug.POOLS_MIXED_UP,
        "each PoolPaused must pause or resume its own pool",
    ),
    (
        StoreSuite.test_a_retry_clears_the_lease_a_finished_row_kept,
        Bug.RETRY_KEEPS_LEASE,
        "a TaskRetried must clear the row's lease",
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
