"""Protocol-level checks: the store alone, driven through the ``Store`` methods."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
import stat
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from cronoq import MemoryStore, TraceContext
from cronoq._model import (
    CatchUpPolicy,
    MissPolicy,
    OverlapPolicy,
    RetryPolicy,
    ScheduleSpec,
    Status,
    TaskSpec,
    TaskTemplate,
)
from cronoq.errors import Fenced, StoreError, StoreFatal, Unavailable
from cronoq.store import (
    ATTEMPTS_KEPT,
    MAX_OCCURRENCE_PAGE,
    AttemptEnded,
    AttemptLease,
    CancelRequested,
    Mutation,
    OccurrenceOutcome,
    OccurrenceRecorded,
    OutboxRow,
    OutboxSource,
    OutboxTaken,
    PoolPaused,
    QuarantinedRow,
    RecoveredState,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    Store,
    TaskRecord,
    TaskRetried,
    TaskSubmitted,
    TaskUpdated,
    TimeBase,
    sanitize_message,
)
from cronoq_conformance._footprint import changes, footprint
from cronoq_conformance._harness import Capability, ClusterRows, DatabaseCondition, StoreHarness

__all__ = ["StoreSuite"]

SECOND_NS = 1_000_000_000
HOUR_NS = 3600 * SECOND_NS
FULL_SPEC = TaskSpec(
    pool="mail",
    kind="send",
    payload=bytes(range(256)) + b"\x00tail",
    key="order-7",
    tags=("a", "b c", "ü"),
    name="welcome mail",
    priority=-5,
    retry=RetryPolicy(7, 250_000_001, 1.5, 60_000_000_007, 0.25),
    start_at_ns=1_900_000_000_123_456_789,
    miss_policy=MissPolicy.SKIP,
    grace_ns=5_000_000_001,
    deadline_ns=1_900_000_100_987_654_321,
    timeout_ns=30_000_000_003,
    after=(11, 12),
    schedule="nightly",
)
SCHEDULE = ScheduleSpec(
    name="nightly",
    cron="0 30 2 * * *",
    timezone="Europe/Paris",
    template=TaskTemplate(
        pool="mail",
        kind="digest",
        payload=b"\x01\x02",
        tags=("t",),
        priority=3,
        retry=RetryPolicy(2, 1, 1.0, 1, 0.0),
        timeout_ns=999,
    ),
    overlap=OverlapPolicy.ALLOW,
    catch_up=CatchUpPolicy.SKIP,
    grace_ns=123,
)


OUTBOX_ROWS: tuple[tuple[str, bytes, str], ...] = (
    ("mail.send", b"to=a@example.com", '{"pool": "mail", "key": "order-1"}'),
    ("ünï kind", bytes(range(256)) + b"\x00tail", "{}"),
    ("report", b"", '{"tags": ["a", "b c"], "priority": -3}'),
    ("sms", b"\x00", '{"retry": {"max_attempts": 2}, "name": "été"}'),
    ("k" * 255, b"x" * 1000, '{"start_at": "2030-01-01T00:00:00+00:00"}'),
    ("push", b"p", '{"deadline": "2031-01-01T00:00:00+00:00", "timeout": 1.5}'),
)
"""What the kit writes into an outbox, in turn: kinds, payloads and options of every sort (a
store may keep the options as JSON of its own spelling: the kit compares them parsed)."""
OUTBOX_PAGE = 1000


def outbox_of(store: Store) -> OutboxSource:
    """The store's transactional outbox, which a harness declaring ``OUTBOX`` promises."""
    outbox = getattr(store, "outbox", None)
    assert isinstance(outbox, OutboxSource) and outbox.transactional, (
        "a harness declaring Capability.OUTBOX opens instances whose `outbox` is a "
        f"transactional cronoq.store.OutboxSource, not {outbox!r}"
    )
    return outbox


def outbox_fields(row: OutboxRow | QuarantinedRow) -> tuple[object, ...]:
    """A row as the application wrote it, options parsed: (id, kind, payload, options,
    enqueue time)."""
    return (row.row_id, row.kind, row.payload, json.loads(row.options), row.enqueued_unix_ns)


def now_ns() -> int:
    return time.time_ns()


def submitted(task_id: int, at_ns: int, **changes: object) -> TaskSubmitted:
    spec = replace(TaskSpec("default", "job", b"p"), **changes)  # type: ignore[arg-type]
    return TaskSubmitted(task_id, spec, Status.READY, at_ns)


def finished(task_id: int, at_ns: int, status: Status = Status.SUCCEEDED) -> TaskUpdated:
    output = b"out" if status is Status.SUCCEEDED else None
    return TaskUpdated(task_id, status, 1, f"{status} at the end", at_ns, output=output)


def lease(epoch: int, name: str) -> AttemptLease:
    """A lease as the engine makes one: the starting epoch, the SHA-256 of a lease id."""
    return AttemptLease(epoch, hashlib.sha256(name.encode()).digest())


def started(task_id: int, attempt: int, at_ns: int, with_lease: AttemptLease | None) -> TaskUpdated:
    return TaskUpdated(
        task_id, Status.RUNNING, attempt, f"attempt {attempt} started", at_ns, lease=with_lease
    )


async def leases_looked_up(store: Store, task_ids: Sequence[int]) -> list[AttemptLease | None]:
    """Each task's lease as ``get_task`` returns it (each task must exist)."""
    found = []
    for task_id in task_ids:
        record = await store.get_task(task_id)
        assert record is not None, f"task {task_id} is unknown to get_task"
        found.append(record.lease)
    return found


def recorded(schedule: str, due_ns: int, message: str = "started") -> OccurrenceRecorded:
    """A ledger record of one occurrence that started a task."""
    return OccurrenceRecorded(
        schedule, due_ns, due_ns + 60 * SECOND_NS, OccurrenceOutcome.STARTED, 7, due_ns + 3, message
    )


async def ledger(
    store: Store, schedule: str, before_ns: int | None = None
) -> list[OccurrenceRecorded]:
    """The schedule's records ``get_occurrences`` returns, a page of the most it is asked for."""
    return list(await store.get_occurrences(schedule, before_ns, MAX_OCCURRENCE_PAGE))


def by_id(state: RecoveredState) -> dict[int, TaskRecord]:
    return {r.task_id: r for r in state.tasks}


def _name(record: ScheduleRecord) -> str:
    return record.spec.name


def _column(rng: random.Random, rows: int, values: Sequence[object]) -> list[Any]:
    """One field over ``rows`` rows: the same value in each, every row its own, or a mix."""
    mode = rng.choice(("same", "varied", "mixed"))
    if mode == "same":
        return [rng.choice(values)] * rows
    if mode == "varied":
        start = rng.randrange(len(values))
        return [values[(start + i) % len(values)] for i in range(rows)]
    return [rng.choice(values) if rng.random() < 0.5 else None for _ in range(rows)]


def _varied_batch(rng: random.Random, first_id: int, at: int, names: list[str]) -> list[Mutation]:
    """New tasks, updates of earlier ones (and of the new ones) and schedule writes, each
    field drawn by ``_column()``."""
    batch: list[Mutation] = []
    n = rng.randint(1, 6)
    keys = _column(rng, n, ["k1", "k2", "k3"])
    pools = [p or "default" for p in _column(rng, n, ["default", "mail"])]
    kinds = [k or "x" for k in _column(rng, n, ["x", "y", "z"])]
    payloads = [p or b"" for p in _column(rng, n, [b"", b"\x00p", b"q" * 40])]
    tags = [t or () for t in _column(rng, n, [(), ("a",), ("a", "b")])]
    after = [a or () for a in _column(rng, n, [(), (1,), (1, 2)])]
    statuses = [s or Status.READY for s in _column(rng, n, [Status.READY, Status.WAITING])]
    for i in range(n):
        spec = TaskSpec(pools[i], kinds[i], payloads[i], keys[i], tags[i], after=after[i])
        batch.append(TaskSubmitted(first_id + i, spec, statuses[i], at + i))
    touched = rng.sample(range(1, first_id + n), k=min(first_id + n - 1, rng.randint(0, 8)))
    outcomes = _column(rng, len(touched), [Status.RUNNING, Status.RETRYING, Status.SUCCEEDED])
    outputs = _column(rng, len(touched), [b"out", b""])
    leases = _column(rng, len(touched), [lease(1, "a"), lease(2, "b"), lease(2, "c")])
    for task_id, status, output, held in zip(touched, outcomes, outputs, leases, strict=True):
        if status is None:
            batch.append(CancelRequested(task_id, at + 50, "stop"))
        elif status is Status.RETRYING:
            batch.append(TaskUpdated(task_id, status, 1, "failed", at + 50, due_ns=at + 99))
        elif status is Status.SUCCEEDED:
            batch.append(TaskUpdated(task_id, status, 1, "done", at + 60, output=output))
        else:
            batch.append(TaskUpdated(task_id, status, 2, "started", at + 40, lease=held))
    # The attempts that ended, as the engine writes one beside a retrying update; an attempt
    # already written by an earlier batch is written again (the first one stays).
    ended = [t for t, status in zip(touched, outcomes, strict=True) if status is Status.RETRYING]
    numbers = _column(rng, len(ended), [1, 2, 3])
    starts = _column(rng, len(ended), [at + 1, at + 2])
    messages = _column(rng, len(ended), ["failed", "timed out\x00"])
    for task_id, number, start, message in zip(ended, numbers, starts, messages, strict=True):
        batch.append(AttemptEnded(task_id, number or 1, start or at, at + 50, message or "lost"))
    for name in rng.sample(names, k=rng.randint(0, len(names))):
        if rng.random() < 0.3:
            batch.append(ScheduleRemoved(name))
        else:
            cron = rng.choice(("* * * * *", "0 * * * *"))
            record = ScheduleRecord(
                replace(SCHEDULE, name=name, cron=cron), at + rng.randint(0, 9), rng.random() < 0.5
            )
            batch.append(ScheduleSaved(record))
    return batch


def earlier_rows(at: int) -> ClusterRows:
    """Rows of every kind, each column set in one at least (a lease on a running and on a
    finished row, a start, a due time, an output, a cancellation request, a paused and a
    resumed pool, ended attempts), around ``at`` (Unix ns): what the kit has a store write
    under an earlier schema version."""
    epoch, second = 6, 1_000_000_000
    running = AttemptLease(epoch, hashlib.sha256(b"running before the upgrade").digest())
    stopped = AttemptLease(epoch - 1, hashlib.sha256(b"stopped before the upgrade").digest())
    traced = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "v=1")
    tasks = (
        TaskRecord(
            1, replace(FULL_SPEC, after=()), Status.RUNNING, 2, "attempt 2 started",
            at - 50 * second, at - 10 * second, lease=running, started_ns=at - 10 * second,
        ),
        TaskRecord(
            2, TaskSpec("default", "job", b"", trace_context=traced), Status.READY, 0,
            "submitted", at - 40 * second, at - 40 * second,
        ),
        TaskRecord(
            3, TaskSpec("mail", "send", b"\x00x", key="k3", tags=("t",)), Status.RETRYING, 1,
            "attempt 1 failed: \ufffd", at - 30 * second, at - 20 * second,
            due_ns=at + 5 * second, started_ns=at - 25 * second,
        ),
        TaskRecord(
            4, TaskSpec("default", "job", b"p"), Status.SUCCEEDED, 1, "done", at - 30 * second,
            at - 5 * second, output=bytes(range(256)), started_ns=at - 6 * second,
        ),
        TaskRecord(
            5, TaskSpec("default", "job", b"", key="k5"), Status.CANCELLED, 1, "cancelled",
            at - 30 * second, at - 4 * second, cancel_requested=True, lease=stopped,
            started_ns=at - 8 * second,
        ),
        TaskRecord(
            6, TaskSpec("default", "job", b"", after=(3,)), Status.WAITING, 0, "submitted",
            at - 3 * second, at - 3 * second,
        ),
    )  # fmt: skip
    return ClusterRows(
        epoch=epoch,
        max_task_id=9,  # rows 7 to 9 were pruned
        tasks=tasks,
        schedules=(
            ScheduleRecord(SCHEDULE, at + HOUR_NS, paused=True, last_task_id=4),
            ScheduleRecord(replace(SCHEDULE, name="hourly", cron="0 * * * *"), at + second),
        ),
        pools=(("mail", True), ("ünï", True), ("sms", False)),
        attempts=(
            AttemptEnded(1, 1, at - 49 * second, at - 45 * second, "attempt 1 timed out"),
            AttemptEnded(3, 1, at - 25 * second, at - 20 * second, "failed: \ufffd"),
            AttemptEnded(5, 1, at - 9 * second, at - 8 * second, "lost with its worker"),
        ),
    )


def _kept_is_what_a_schema_can_lack(written: ClusterRows, kept: ClusterRows, version: int) -> None:
    """A harness's ``open_upgraded_from`` may leave out of the rows only what a schema version
    can lack, and all of it: every lease, every start, the pools, the attempts."""
    lacking = f"version {version}'s rows, as its harness says it keeps them, "

    def bare(rows: ClusterRows) -> list[TaskRecord]:
        return [replace(t, lease=None, started_ns=None) for t in rows.tasks]

    assert (kept.epoch, kept.max_task_id, kept.schedules, bare(kept)) == (
        written.epoch, written.max_task_id, written.schedules, bare(written)
    ), f"{lacking}differ from what the kit wrote"  # fmt: skip
    for field in ("lease", "started_ns"):
        values = [getattr(t, field) for t in kept.tasks]
        assert values in ([getattr(t, field) for t in written.tasks], [None] * len(values)), (
            f"{lacking}leave out some {field} values only: all or none"
        )
    assert kept.pools in (written.pools, ()), f"{lacking}leave out some pools only"
    assert kept.attempts in (written.attempts, ()), f"{lacking}leave out some attempts only"


class StoreSuite:
    """Every store passes these. Subclass it (or ``StoreConformance``) and provide a ``harness``
    fixture returning your ``StoreHarness``."""

    # --- fixtures and helpers -------------------------------------------------------------

    @pytest_asyncio.fixture
    async def cluster(self, harness: StoreHarness) -> AsyncIterator[StoreHarness]:
        try:
            yield harness
        finally:
            await harness.close_all()

    @staticmethod
    def require(harness: StoreHarness, capability: Capability) -> None:
        if capability not in harness.capabilities:
            pytest.skip(f"the harness does not declare Capability.{capability.name}")

    @staticmethod
    async def lead(store: Store, retention_ns: int = HOUR_NS) -> tuple[int, RecoveredState]:
        lease = await store.acquire_leadership()
        return lease.epoch, await store.recover(lease.epoch, TimeBase(), retention_ns)

    @staticmethod
    async def acquires_within(store: Store, seconds: float) -> bool:
        task = asyncio.ensure_future(store.acquire_leadership())
        done, _ = await asyncio.wait([task], timeout=seconds)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return False
        task.result()
        return True

    async def committed_and_recovered(
        self, cluster: StoreHarness, batch: Sequence[Mutation], retention_ns: int = HOUR_NS
    ) -> RecoveredState:
        """Commit ``batch`` on a leader, crash it, and recover on a new instance."""
        first = await cluster.open()
        epoch, _ = await self.lead(first)
        await first.commit(epoch, batch)
        await cluster.crash(first)
        second = await cluster.open()
        _, state = await self.lead(second, retention_ns)
        return state

    # --- leadership -----------------------------------------------------------------------

    async def test_a_second_instance_waits_while_the_first_leads(
        self, cluster: StoreHarness
    ) -> None:
        first, second = await cluster.open(), await cluster.open()
        await first.acquire_leadership()
        assert not await self.acquires_within(second, 0.3)

    async def test_the_epoch_strictly_increases_on_every_takeover(
        self, cluster: StoreHarness
    ) -> None:
        epochs = []
        for _ in range(3):
            store = await cluster.open()
            epochs.append((await store.acquire_leadership()).epoch)
            await cluster.crash(store)
        assert epochs == sorted(set(epochs)), f"epochs {epochs} must strictly increase"

    async def test_a_release_hands_over_well_before_a_crash_would(
        self, cluster: StoreHarness
    ) -> None:
        # A release that does not free leadership still hands over once the lease runs out:
        # only a bound well under the crash takeover tells the two apart.
        assert cluster.handover_timeout < cluster.leadership_timeout, "harness bounds"
        first, second, third = await cluster.open(), await cluster.open(), await cluster.open()
        first_epoch = (await first.acquire_leadership()).epoch
        waiting = asyncio.ensure_future(second.acquire_leadership())
        await asyncio.sleep(0)
        started = time.monotonic()
        await first.release_leadership()
        lease = await asyncio.wait_for(waiting, cluster.leadership_timeout)
        released = time.monotonic() - started
        assert lease.epoch > first_epoch
        waiting = asyncio.ensure_future(third.acquire_leadership())
        await asyncio.sleep(0)
        started = time.monotonic()
        await cluster.crash(second)
        await asyncio.wait_for(waiting, cluster.leadership_timeout)
        crashed = time.monotonic() - started
        assert released < cluster.handover_timeout, (
            f"the standby led {released:.2f}s after a clean release (after a crash: "
            f"{crashed:.2f}s); a release must free leadership at once, not let it run out"
        )

    async def test_a_crashed_leader_is_replaced_within_the_leadership_timeout(
        self, cluster: StoreHarness
    ) -> None:
        first, second = await cluster.open(), await cluster.open()
        await first.acquire_leadership()
        await cluster.crash(first)
        assert await self.acquires_within(second, cluster.leadership_timeout)

    async def test_leadership_lost_returns_after_release(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        await store.acquire_leadership()
        await store.release_leadership()
        reason = await asyncio.wait_for(store.leadership_lost(), cluster.leadership_timeout)
        assert reason is None, f"a release is no loss to explain: leadership_lost() -> {reason!r}"

    async def test_a_paused_leader_that_was_replaced_finds_out_when_it_resumes(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.PAUSE)
        first, second = await cluster.open(), await cluster.open()
        first_epoch, _ = await self.lead(first)
        await cluster.pause(first)
        try:
            lease = await asyncio.wait_for(second.acquire_leadership(), cluster.leadership_timeout)
        except TimeoutError:
            raise AssertionError(
                "a standby must take over from a frozen leader once its leadership lapses"
            ) from None
        finally:
            await cluster.resume(first)
        second_epoch = lease.epoch
        await second.recover(second_epoch, TimeBase(), HOUR_NS)
        try:
            reason = await asyncio.wait_for(first.leadership_lost(), cluster.leadership_timeout)
        except TimeoutError:
            raise AssertionError(
                "a leader resumed after another instance took over must notice (its lease "
                "renewal must check who holds the lease), not renew as if it still led"
            ) from None
        # Why, if the store says: the scheduler stops with it (None: a generic Fenced).
        assert reason is None or isinstance(reason, Fenced | StoreFatal), reason
        with pytest.raises(StoreError):
            await first.commit(first_epoch, [submitted(1, now_ns())])
        await second.commit(second_epoch, [submitted(2, now_ns())])
        _, state = await self.lead_after_crash(cluster, second)
        assert sorted(by_id(state)) == [2]

    # --- fencing and atomicity ------------------------------------------------------------

    async def test_a_commit_with_a_stale_epoch_is_fenced_and_changes_nothing(
        self, cluster: StoreHarness
    ) -> None:
        first = await cluster.open()
        old_epoch, _ = await self.lead(first)
        await first.commit(old_epoch, [submitted(1, now_ns())])
        await cluster.crash(first)
        second = await cluster.open()
        epoch, _ = await self.lead(second)
        with pytest.raises(Fenced):
            await second.commit(old_epoch, [submitted(2, now_ns())])
        await second.commit(epoch, [submitted(3, now_ns())])
        await cluster.crash(second)
        _, state = await self.lead(await cluster.open())
        assert sorted(by_id(state)) == [1, 3]

    async def test_a_crashed_instance_can_no_longer_commit(self, cluster: StoreHarness) -> None:
        first = await cluster.open()
        epoch, _ = await self.lead(first)
        await cluster.crash(first)
        second = await cluster.open()
        await self.lead(second)
        with pytest.raises(StoreError):
            await first.commit(epoch, [submitted(5, now_ns())])
        await cluster.crash(second)
        _, recovered = await self.lead(await cluster.open())
        assert 5 not in by_id(recovered)

    async def test_a_batch_that_fails_midway_leaves_nothing_behind(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.FAULT_MID_BATCH)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(1, at), PoolPaused("push", True)])
        await cluster.fail_next_commit_midway(store)
        # Pauses and a resume before and after the rows (a store may write its pools first or
        # last); the fault meets the rows.
        batch: list[Mutation] = [PoolPaused("mail", True), PoolPaused("push", False)]
        batch += [submitted(i, at) for i in range(2, 12)]
        batch += [finished(1, at), ScheduleSaved(ScheduleRecord(SCHEDULE, at))]
        batch += [PoolPaused("sms", True)]
        with pytest.raises(StoreError):
            await store.commit(epoch, batch)
        await store.commit(epoch, [submitted(20, at), PoolPaused("web", True)])
        await cluster.crash(store)
        _, state = await self.lead(await cluster.open())
        assert sorted(by_id(state)) == [1, 20]
        assert by_id(state)[1].status is Status.READY
        assert list(state.schedules) == []
        assert state.max_task_id == 20
        assert state.paused_pools == {"push", "web"}, (
            "a batch that fails midway must leave no pause or resume behind: a PoolPaused is "
            "written in its batch's transaction, all or nothing with it"
        )

    async def test_a_batch_applied_twice_leaves_the_state_of_once(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        batch: list[Mutation] = [submitted(1, at, key="k"), finished(1, at + 1)]
        await store.commit(epoch, batch)
        await store.commit(epoch, batch)
        await cluster.crash(store)
        _, state = await self.lead(await cluster.open())
        assert [(r.task_id, r.status) for r in state.tasks] == [(1, Status.SUCCEEDED)]

    # --- round trips ----------------------------------------------------------------------

    async def test_every_mutation_kind_round_trips_exactly(self, cluster: StoreHarness) -> None:
        at = now_ns()
        spec_two = replace(FULL_SPEC, key="order-8", after=(1,))
        schedule = ScheduleRecord(SCHEDULE, 1_900_000_000_000_000_001, True, 2)
        batch: list[Mutation] = [
            TaskSubmitted(1, replace(FULL_SPEC, after=()), Status.SCHEDULED, at),
            TaskSubmitted(2, spec_two, Status.WAITING, at + 1),
            TaskSubmitted(3, TaskSpec("default", "x", b""), Status.READY, at + 2),
            TaskSubmitted(4, TaskSpec("default", "y", b""), Status.READY, at + 3),
            TaskUpdated(1, Status.RUNNING, 1, "attempt 1 started", at + 10),
            TaskUpdated(1, Status.RETRYING, 1, "attempt 1 failed", at + 11, due_ns=at + 99),
            TaskUpdated(3, Status.RUNNING, 2, "attempt 2 started", at + 12),
            CancelRequested(3, at + 13, "stop please"),
            TaskUpdated(4, Status.CANCELLED, 0, "cancelled by request", at + 14),
            ScheduleSaved(schedule),
            ScheduleSaved(ScheduleRecord(replace(SCHEDULE, name="gone"), at)),
            ScheduleRemoved("gone"),
        ]
        state = await self.committed_and_recovered(cluster, batch)
        rows = by_id(state)
        assert rows[1] == TaskRecord(
            1, replace(FULL_SPEC, after=()), Status.RETRYING, 1, "attempt 1 failed", at, at + 11,
            due_ns=at + 99, started_ns=at + 10,
        )  # fmt: skip
        assert rows[2] == TaskRecord(2, spec_two, Status.WAITING, 0, "submitted", at + 1, at + 1)
        assert rows[3].status is Status.RUNNING
        assert rows[3].attempt == 2
        assert rows[3].cancel_requested
        assert rows[3].message == "stop please"
        assert rows[4].status is Status.CANCELLED
        assert rows[4].updated_ns == at + 14
        assert rows[4].finished_ns == at + 14
        assert list(state.schedules) == [schedule]
        assert state.max_task_id == 4
        assert [r.task_id for r in state.tasks] == [1, 2, 3, 4], "recovery returns id order"

    async def test_columns_that_repeat_vary_or_mix_nulls_round_trip_as_the_reference_store(
        self, cluster: StoreHarness
    ) -> None:
        """A store may send a column whose values are all equal in a batch once (PgStore does,
        so its statement depends on which columns vary). Batches in which each field is the
        same in every row, differs, or mixes None and values come back as ``MemoryStore``
        keeps them."""
        rng = random.Random(20261201)
        reference = MemoryStore()
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        reference_epoch, _ = await self.lead(reference)
        at, next_id, names = now_ns(), 1, ["s0", "s1", "s2"]
        for _ in range(30):
            batch = _varied_batch(rng, next_id, at, names)
            next_id += sum(isinstance(m, TaskSubmitted) for m in batch)
            at += 1_000
            await store.commit(epoch, batch)
            await reference.commit(reference_epoch, batch)
        await cluster.crash(store)
        reopened = await cluster.open()
        _, state = await self.lead(reopened)
        expected = await reference.recover(reference_epoch, TimeBase(), HOUR_NS)
        assert by_id(state) == by_id(expected)
        assert sorted(state.schedules, key=_name) == sorted(expected.schedules, key=_name)
        assert state.max_task_id == expected.max_task_id
        # Recovery leaves outputs in the store: a lookup reads them too.
        for task_id in range(1, next_id):
            assert await reopened.get_task(task_id) == await reference.get_task(task_id)
            assert await reopened.get_attempts(task_id) == await reference.get_attempts(task_id)

    async def test_a_retry_committed_on_its_own_keeps_its_next_due_time(
        self, cluster: StoreHarness
    ) -> None:
        # The engine commits a submission, its start and its retry in separate steps: the
        # update alone must persist the due time (one batch would hide a missing column).
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        due = at + 7 * 1_000_000_000 + 1
        await store.commit(epoch, [submitted(1, at)])
        await store.commit(epoch, [TaskUpdated(1, Status.RUNNING, 1, "attempt 1 started", at + 1)])
        retry = TaskUpdated(1, Status.RETRYING, 1, "attempt 1 failed", at + 2, due_ns=due)
        await store.commit(epoch, [retry])
        looked_up = await store.get_task(1)
        assert looked_up is not None
        assert (looked_up.status, looked_up.due_ns) == (Status.RETRYING, due)
        await cluster.crash(store)
        store = await cluster.open()
        epoch, state = await self.lead(store)
        row = by_id(state)[1]
        assert (row.status, row.attempt, row.message) == (Status.RETRYING, 1, "attempt 1 failed")
        assert row.due_ns == due, "the retry's due time was not persisted by its own commit"
        assert row.updated_ns == at + 2
        # On the new leader: the next attempt clears the due time, and its retry sets another.
        await store.commit(epoch, [TaskUpdated(1, Status.RUNNING, 2, "attempt 2 started", at + 3)])
        assert (running := await store.get_task(1)) is not None
        assert (running.status, running.attempt, running.due_ns) == (Status.RUNNING, 2, None)
        later = due + 5
        await store.commit(
            epoch, [TaskUpdated(1, Status.RETRYING, 2, "attempt 2 failed", at + 4, due_ns=later)]
        )
        _, state = await self.lead_after_crash(cluster, store)
        row = by_id(state)[1]
        assert (row.status, row.attempt, row.due_ns) == (Status.RETRYING, 2, later)

    # --- operator calls (issue 21): pool pauses, retried tasks -------------------------------
    # A PoolPaused is kept by pool name until a later one replaces it; recover() returns the
    # paused names. A TaskRetried makes a finished row live again: its options rewritten, its
    # finish time, output, lease and cancellation request cleared.

    async def test_a_paused_pool_is_recovered_by_a_new_instance(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, state = await self.lead(store)
        assert state.paused_pools == frozenset(), "a new cluster has no pool paused"
        await store.commit(epoch, [PoolPaused("mail", paused=True)])
        # Beside the rows recovery reads anyway (a task, a paused schedule).
        schedule = ScheduleRecord(SCHEDULE, now_ns(), paused=True)
        await store.commit(
            epoch,
            [submitted(1, now_ns()), ScheduleSaved(schedule), PoolPaused("ünï", paused=True)],
        )
        _, state = await self.lead_after_crash(cluster, store)
        assert state.paused_pools == {"mail", "ünï"}, (
            "recover() must return every pool a PoolPaused paused: a pause outlives its leader"
        )

    async def test_a_resumed_pool_is_not_recovered_as_paused(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        await store.commit(epoch, [PoolPaused("mail", True), PoolPaused("sms", True)])
        await store.commit(epoch, [PoolPaused("mail", paused=False)])
        # Paused and resumed again in one batch: the last word counts.
        await store.commit(epoch, [PoolPaused("sms", False), PoolPaused("sms", True)])
        await store.commit(epoch, [PoolPaused("push", True), PoolPaused("push", False)])
        _, state = await self.lead_after_crash(cluster, store)
        assert state.paused_pools == {"sms"}, (
            "a PoolPaused(paused=False) must replace the pool's earlier pause (and the last "
            "of a batch wins)"
        )

    async def test_a_retried_task_is_live_again_with_its_new_spec(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        old = TaskSpec("default", "job", b"p", key="k", retry=RetryPolicy(2, 1, 1.0, 1, 0.0))
        new = replace(old, retry=replace(old.retry, max_attempts=3))
        # Task 1: started remotely, asked to stop, cancelled; then retried in a commit of its
        # own. Task 2: submitted, cancelled and retried in one batch. Long finished (at 1 ns
        # after 1970): a store that keeps the finish time drops them from recovery.
        await store.commit(epoch, [TaskSubmitted(1, old, Status.READY, 1)])
        await store.commit(epoch, [started(1, 2, 2, lease(epoch, "1"))])
        await store.commit(epoch, [CancelRequested(1, 3, "stop")])
        await store.commit(epoch, [TaskUpdated(1, Status.FAILED, 2, "dead", 4, output=b"x")])
        await store.commit(epoch, [TaskRetried(1, new, Status.READY, 2, "retried", at)])
        await store.commit(
            epoch,
            [
                TaskSubmitted(2, replace(old, key=None), Status.READY, 1),
                TaskUpdated(2, Status.CANCELLED, 0, "cancelled", 2),
                TaskRetried(2, replace(new, key=None), Status.SCHEDULED, 0, "again", at + 1),
            ],
        )
        expected = {
            1: (new, Status.READY, 2, "retried", at, None, False, None, None),
            2: (replace(new, key=None), Status.SCHEDULED, 0, "again", at + 1, None, False, None,
                None),
        }  # fmt: skip

        def fields(record: TaskRecord | None) -> tuple[object, ...] | None:
            if record is None:
                return None
            return (
                record.spec, record.status, record.attempt, record.message, record.updated_ns,
                record.due_ns, record.cancel_requested, record.lease, record.finished_ns,
            )  # fmt: skip

        looked_up = {i: fields(await store.get_task(i)) for i in (1, 2)}
        assert looked_up == expected, (
            "a TaskRetried must make the row live: its spec's options rewritten, status, "
            "attempt, message and time as given, and its due time, cancellation request, "
            "lease and finish time cleared"
        )
        assert (await store.load_output(1)) is None, "a retried task has no output"
        _, state = await self.lead_after_crash(cluster, store)
        recovered = {i: fields(r) for i, r in by_id(state).items()}
        assert recovered == expected, (
            "recover() must return a retried task as live, however long ago it had finished, "
            "with its new spec and no cancellation request"
        )

    async def test_a_retried_task_is_not_pruned(self, cluster: StoreHarness) -> None:
        self.require(cluster, Capability.PRUNE)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(1, 1), submitted(2, 1)])
        await store.commit(epoch, [finished(1, 2, Status.FAILED), finished(2, 2, Status.FAILED)])
        spec = TaskSpec("default", "job", b"p")
        await store.commit(epoch, [TaskRetried(1, spec, Status.READY, 1, "retried", at)])
        await cluster.prune(store, at)
        assert await store.get_task(2) is None, "the harness's prune must delete old rows"
        record = await store.get_task(1)
        assert record is not None and record.status is Status.READY, (
            "a retried task is live: pruning must not delete it (clear its finish time)"
        )

    # --- every mutation is held to its batch's rules (issue 34) ----------------------------
    # A pause, a resume and an ended attempt are writes of their batch like a task's row: all
    # or nothing with it, fenced with it; a pause lands on its own pool only; a retry clears
    # even the lease a finished row kept for a stopped attempt.

    async def replaced_leader_commits(
        self, cluster: StoreHarness, before: Sequence[Mutation], batch: Sequence[Mutation]
    ) -> tuple[Store, int, RecoveredState]:
        """A leader commits ``before``, is replaced behind its back (``SUPERSEDE`` or
        ``PAUSE``), and commits ``batch``, which must raise ``Fenced``; returns the leader that
        replaced it (opened here, if the harness supersedes), its epoch and its recovery."""
        first = await cluster.open()
        epoch, _ = await self.lead(first)
        await first.commit(epoch, before)
        replaced = await self.replaced_without_knowing(cluster, first)
        with pytest.raises(StoreError) as raised:
            await first.commit(epoch, batch)
        assert isinstance(raised.value, Fenced), (
            f"a leader replaced behind its back must be told it is fenced when it commits, "
            f"not {raised.value!r}"
        )
        return await self.successor_after(cluster, first, replaced)

    async def successor_after(
        self, cluster: StoreHarness, first: Store, replaced: tuple[Store, int] | None
    ) -> tuple[Store, int, RecoveredState]:
        """The leader after ``first``: the one that replaced it (``replaced_without_knowing``),
        recovered; or, when the harness superseded ``first`` in place, a new one opened once
        ``first`` crashed. With its epoch and its recovery."""
        if replaced is None:
            await cluster.crash(first)
            successor = await cluster.open()
            successor_epoch, state = await self.lead(successor)
            return successor, successor_epoch, state
        successor, successor_epoch = replaced
        return (
            successor,
            successor_epoch,
            await successor.recover(successor_epoch, TimeBase(), HOUR_NS),
        )

    async def test_a_pool_pause_by_a_replaced_leader_does_not_land(
        self, cluster: StoreHarness
    ) -> None:
        at = now_ns()
        late: list[Mutation] = [PoolPaused("mail", True), PoolPaused("push", False)]
        successor, epoch, state = await self.replaced_leader_commits(
            cluster, [submitted(1, at), PoolPaused("push", True)], late
        )
        assert state.paused_pools == {"push"}, (
            "a pause or resume committed by a leader replaced behind its back landed: a "
            "PoolPaused is fenced like the rest of its batch, in the commit's transaction"
        )
        # The check can fail: the same batch of the leader lands.
        await successor.commit(epoch, late)
        again = await successor.recover(epoch, TimeBase(), HOUR_NS)
        assert again.paused_pools == {"mail"}

    async def test_a_replaced_leader_that_has_not_noticed_writes_no_attempt(
        self, cluster: StoreHarness
    ) -> None:
        at = now_ns()
        ended = AttemptEnded(1, 1, at + 1, at + 2, "attempt 1 failed")
        late: list[Mutation] = [
            ended,
            TaskUpdated(1, Status.RETRYING, 1, "attempt 1 failed", at + 2, due_ns=at + 3),
        ]
        successor, epoch, state = await self.replaced_leader_commits(
            cluster, [submitted(1, at), started(1, 1, at + 1, None)], late
        )
        assert list(await successor.get_attempts(1)) == [], (
            "a commit by a leader replaced behind its back wrote its AttemptEnded: gate the "
            "attempts' insert on the fence, as the rows' are"
        )
        assert by_id(state)[1].status is Status.RUNNING, "the fenced commit's update landed"
        # The check can fail: the same batch of the leader writes it.
        await successor.commit(epoch, late)
        assert list(await successor.get_attempts(1)) == [ended]

    async def test_pauses_and_resumes_of_many_pools_land_each_on_its_own_pool(
        self, cluster: StoreHarness
    ) -> None:
        """Batches that pause some pools and resume others, with names that differ only in
        case, accents, a trailing space or length, come back as ``MemoryStore`` keeps them:
        a store that pairs a batch's names with the wrong flags (or compares names loosely)
        passes every check whose batches pause, or resume, alone."""
        rng = random.Random(20261206)
        names = ["mail", "Mail", "mail ", "ünï", "uni", "sms", "p" * 200, "a.b"]
        reference = MemoryStore()
        reference_epoch, _ = await self.lead(reference)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        for number in range(8):
            pools = rng.sample(names, rng.randint(3, len(names)))
            flags = [i % 2 == 0 for i in range(len(pools))]
            rng.shuffle(flags)
            batch: list[Mutation] = [PoolPaused(n, f) for n, f in zip(pools, flags, strict=True)]
            # A pool's second word in the batch wins.
            batch.append(PoolPaused(pools[0], not flags[0]))
            await store.commit(epoch, batch)
            await reference.commit(reference_epoch, batch)
            expected = await reference.recover(reference_epoch, TimeBase(), HOUR_NS)
            state = await store.recover(epoch, TimeBase(), HOUR_NS)
            assert state.paused_pools == expected.paused_pools, (
                f"after batch {number} ({batch}), each PoolPaused must pause or resume its own "
                "pool, and no other"
            )
        _, state = await self.lead_after_crash(cluster, store)
        assert state.paused_pools == expected.paused_pools, "(recovered by a new instance)"

    async def test_a_retry_clears_the_lease_a_finished_row_kept(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        held = lease(epoch, "a stopped attempt that may still run")
        spec = TaskSpec("default", "job", b"p")
        await store.commit(epoch, [submitted(i, at) for i in (1, 2, 3)])
        await store.commit(epoch, [started(i, 1, at + 1, held) for i in (1, 2, 3)])

        def stopped(task_id: int) -> TaskUpdated:
            """The engine cancelled the attempt; its worker may still run it: the row keeps
            its lease."""
            return TaskUpdated(task_id, Status.CANCELLED, 1, "cancelled", at + 2, lease=held)

        def retried(task_id: int) -> TaskRetried:
            return TaskRetried(task_id, spec, Status.READY, 1, "retried", at + 3)

        # Task 1: retried in a commit of its own; task 2: stopped and retried in one batch;
        # task 3: retried, and its lease written again after (the engine still waits for
        # the attempt), in one batch.
        await store.commit(epoch, [stopped(1), stopped(3)])
        await store.commit(epoch, [retried(1)])
        await store.commit(epoch, [stopped(2), retried(2)])
        await store.commit(
            epoch,
            [retried(3), TaskUpdated(3, Status.READY, 1, "retried", at + 3, lease=held)],
        )
        cleared = (
            "a TaskRetried must clear the row's lease, also one a finished row kept for a "
            "stopped attempt (a TaskUpdated after it sets it again)"
        )
        assert await leases_looked_up(store, [1, 2, 3]) == [None, None, held], cleared
        _, state = await self.lead_after_crash(cluster, store)
        rows = by_id(state)
        assert [(rows[i].status, rows[i].lease) for i in (1, 2, 3)] == [
            (Status.READY, None), (Status.READY, None), (Status.READY, held)
        ], f"{cleared} (recovered)"  # fmt: skip

    # --- attempt history (issue 22) -------------------------------------------------------
    # An attempt that ended without success leaves an AttemptEnded: written once per (task,
    # attempt), the latest ATTEMPTS_KEPT of a task kept, deleted with the task's row.

    async def test_ended_attempts_come_back_in_attempt_order_and_once(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        first = AttemptEnded(1, 1, at + 1, at + 2, "attempt 1 failed: boom\x00")
        second = AttemptEnded(1, 2, at + 3, at + 4, "timed out")
        other = AttemptEnded(2, 1, at + 5, at + 6, "lost")
        await store.commit(epoch, [submitted(1, at), submitted(2, at), second, other])
        # Out of order, and attempt 2 again with another message: the first write stays.
        await store.commit(epoch, [first, replace(second, message="again", ended_ns=at + 9)])
        expected = [replace(first, message="attempt 1 failed: boom\ufffd"), second]
        assert list(await store.get_attempts(1)) == expected, (
            "get_attempts returns a task's ended attempts in attempt order, each as first "
            "written, times at nanosecond precision, NUL as U+FFFD"
        )
        assert list(await store.get_attempts(2)) == [other]
        assert list(await store.get_attempts(3)) == [], "an unknown task has no attempts"
        await cluster.crash(store)
        reopened = await cluster.open()
        await self.lead(reopened)
        assert list(await reopened.get_attempts(1)) == expected, "attempts are durable"

    async def test_a_row_keeps_the_start_of_its_latest_attempt(self, cluster: StoreHarness) -> None:
        """A ``TaskUpdated`` to running sets ``started_ns``; every other mutation keeps it, so
        that a succeeded row still says when its last attempt began."""
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        # Task 2 is submitted and started in one batch (a new row with its start).
        await store.commit(epoch, [submitted(1, at), submitted(2, at), started(2, 1, at + 1, None)])
        fresh = await store.get_task(1)
        assert fresh is not None and fresh.started_ns is None, "no attempt yet: no start"
        await store.commit(epoch, [started(1, 1, at + 2, None)])
        await store.commit(
            epoch,
            [
                TaskUpdated(1, Status.RETRYING, 1, "attempt 1 failed", at + 3, due_ns=at + 4),
                CancelRequested(2, at + 5, "stop"),
            ],
        )
        await store.commit(epoch, [started(1, 2, at + 6, None), finished(2, at + 7)])
        await store.commit(epoch, [TaskUpdated(1, Status.SUCCEEDED, 2, "done", at + 8)])
        starts = [(await store.get_task(i)) for i in (1, 2)]
        assert [r.started_ns if r else None for r in starts] == [at + 6, at + 1], (
            "started_ns is the time of the last TaskUpdated to running, kept by later updates"
        )
        await cluster.crash(store)
        _, state = await self.lead(await cluster.open())
        assert [r.started_ns for r in state.tasks] == [at + 6, at + 1], "recover returns it"

    async def test_a_batch_of_attempts_applied_twice_duplicates_none(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        batch: list[Mutation] = [
            submitted(1, at),
            AttemptEnded(1, 1, at + 1, at + 2, "failed"),
            TaskUpdated(1, Status.RETRYING, 1, "failed", at + 2, due_ns=at + 3),
        ]
        await store.commit(epoch, batch)
        await store.commit(epoch, batch)  # a retried commit whose first try landed
        assert list(await store.get_attempts(1)) == [AttemptEnded(1, 1, at + 1, at + 2, "failed")]

    async def test_only_the_latest_attempts_of_a_task_are_kept(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()

        def ended(task_id: int, attempt: int) -> AttemptEnded:
            return AttemptEnded(task_id, attempt, at + 2 * attempt, at + 2 * attempt + 1, "x")

        total = ATTEMPTS_KEPT + 5
        await store.commit(epoch, [submitted(1, at), submitted(2, at)])
        # Task 1: a batch of most of them, then one per batch; task 2: all in one batch.
        await store.commit(epoch, [ended(1, n) for n in range(1, ATTEMPTS_KEPT)])
        for n in range(ATTEMPTS_KEPT, total + 1):
            await store.commit(epoch, [ended(1, n)])
        await store.commit(epoch, [ended(2, n) for n in range(1, total + 1)])
        latest = range(total - ATTEMPTS_KEPT + 1, total + 1)
        for task_id in (1, 2):
            assert list(await store.get_attempts(task_id)) == [ended(task_id, n) for n in latest], (
                f"a store keeps the latest ATTEMPTS_KEPT ({ATTEMPTS_KEPT}) attempts of a task"
            )

    async def test_pruning_a_task_deletes_its_attempts(self, cluster: StoreHarness) -> None:
        self.require(cluster, Capability.PRUNE)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        await self.prunable(store, epoch)
        at = now_ns()
        batch = [AttemptEnded(i, 1, at - 9, at - 8, f"attempt of {i}") for i in (1, 2, 3, 4)]
        await store.commit(epoch, batch)
        await cluster.prune(store, at)
        assert [i for i in (1, 2, 3, 4) if await store.get_task(i) is not None] == [4]
        assert [i for i in (1, 2, 3, 4) if await store.get_attempts(i)] == [4], (
            "pruning a task's row deletes its attempts, and only its"
        )

    async def test_a_fenced_commit_writes_no_attempt(self, cluster: StoreHarness) -> None:
        first = await cluster.open()
        old_epoch, _ = await self.lead(first)
        at = now_ns()
        await first.commit(old_epoch, [submitted(1, at)])
        await cluster.crash(first)
        second = await cluster.open()
        epoch, _ = await self.lead(second)
        with pytest.raises(Fenced):
            await second.commit(old_epoch, [AttemptEnded(1, 1, at, at + 1, "stale")])
        assert list(await second.get_attempts(1)) == []
        # The check can fail: the leader's commit writes it.
        await second.commit(epoch, [AttemptEnded(1, 1, at, at + 1, "current")])
        assert [a.message for a in await second.get_attempts(1)] == ["current"]

    async def test_a_batch_that_fails_midway_writes_no_attempt(self, cluster: StoreHarness) -> None:
        self.require(cluster, Capability.FAULT_MID_BATCH)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(1, at)])
        await cluster.fail_next_commit_midway(store)
        batch: list[Mutation] = [AttemptEnded(1, n, at, at + 1, "x") for n in range(1, 9)]
        with pytest.raises(StoreError):
            await store.commit(epoch, [*batch, finished(1, at + 2)])
        assert list(await store.get_attempts(1)) == []

    # --- occurrence ledger (issue 32) --------------------------------------------------------
    # A schedule's firing leaves an OccurrenceRecorded: written once per (schedule, due_ns),
    # read newest first by exact name, kept after its schedule is removed, pruned by its due
    # time with the finished tasks, and a write of its batch like any other (all or nothing
    # with it, fenced with it).

    async def test_occurrence_records_read_back_exactly_in_the_time_base_of_the_reader(
        self, cluster: StoreHarness
    ) -> None:
        first = await cluster.open()
        epoch, _ = await self.lead(first)
        at = now_ns()
        messages = [
            "",
            "ran once\x00",
            "lone \ud800 surrogate",
            "ünïcødé ✓",
            "x" * 2000,
            "quote ' and \"",
            "line\nbreak",
        ]
        # Every outcome, a task id or none, messages a store must sanitize or keep as they are,
        # times at nanosecond precision: each column differs from record to record...
        varied = [
            OccurrenceRecorded(
                "nightly", at - (20 - i) * SECOND_NS + i, at + 7 * i + 3, outcome,
                i if i % 2 else None, at + 11 * i + 1, messages[i % len(messages)],
            )
            for i, outcome in enumerate(OccurrenceOutcome)
        ]  # fmt: skip
        # ... and all but the due time are the same in every record of this batch.
        alike = [
            OccurrenceRecorded(
                "nightly", at + i * SECOND_NS, at + HOUR_NS, OccurrenceOutcome.MISSED, None, at,
                "fired late",
            )
            for i in (1, 2, 3)
        ]  # fmt: skip
        await first.commit(epoch, varied)
        await first.commit(epoch, alike)
        written = sorted(varied + alike, key=lambda r: r.due_ns, reverse=True)
        expected = [replace(r, message=sanitize_message(r.message)) for r in written]
        assert await ledger(first, "nightly") == expected, (
            "get_occurrences must return each record as written, newest first: times at "
            "nanosecond precision, NUL and lone surrogates in its message as U+FFFD"
        )
        await cluster.crash(first)
        second = await cluster.open()
        lease = await second.acquire_leadership()
        base = TimeBase(unix_nanos_at_zero=1_000_000_000_000_000_000)
        await second.recover(lease.epoch, base, HOUR_NS)
        shifted = [
            replace(
                r,
                due_ns=base.to_engine(r.due_ns),
                until_ns=base.to_engine(r.until_ns),
                at_ns=base.to_engine(r.at_ns),
            )
            for r in expected
        ]
        in_engine_time = "in the engine time of the TimeBase given to recover()"
        assert await ledger(second, "nightly") == shifted, (
            f"a new instance's get_occurrences must return the records {in_engine_time}"
        )
        assert await ledger(second, "nightly", shifted[2].due_ns) == shifted[3:], (
            f"get_occurrences' before_ns is {in_engine_time} too"
        )
        # The largest bound (the scheduler's for a `before` far in the future) reads them all,
        # whatever the time base adds to it.
        assert await ledger(second, "nightly", 2**63 - 1) == shifted

    async def test_a_repeated_occurrence_record_changes_nothing(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        first = recorded("nightly", at, "first")
        again = OccurrenceRecorded(
            "nightly", at, at + HOUR_NS, OccurrenceOutcome.SKIPPED, 6, at + 9, "again"
        )
        await store.commit(epoch, [first])
        await store.commit(epoch, [again])
        await store.commit(epoch, [again, first])
        # Twice in one batch (the first stays), and that batch applied twice.
        later = recorded("nightly", at + 5, "first of its batch")
        batch: list[Mutation] = [later, replace(later, message="second of its batch")]
        await store.commit(epoch, batch)
        await store.commit(epoch, batch)
        assert await ledger(store, "nightly") == [later, first], (
            "a repeated OccurrenceRecorded (the same schedule and due_ns: a commit retried "
            "after it landed) changes nothing: the first one written stays"
        )

    async def test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        dues = [at + offset for offset in (5, 1, 9, 3, 7, 2, 8)]
        mine = [recorded("a", due) for due in dues]
        for batch in (mine[:3], mine[3:5], mine[5:]):  # out of order, over three batches
            await store.commit(epoch, batch)
        # Names that a LIKE pattern, a comparison ignoring case or padding spaces, or a prefix
        # match takes for "a" (or "a" for them).
        others = ["a%", "A", "_", "%", "a ", " a", "ab", "á"]
        await store.commit(epoch, [recorded(name, due) for name in others for due in dues])
        newest = sorted(mine, key=lambda r: r.due_ns, reverse=True)
        assert await ledger(store, "a") == newest, (
            "get_occurrences returns the schedule's records newest first (by due_ns), and only "
            "its own: names compared exactly"
        )
        for name in others:
            theirs = [recorded(name, r.due_ns) for r in newest]
            assert await ledger(store, name) == theirs, (
                f"get_occurrences({name!r}) returns the schedule's records newest first, and "
                "only its own: names compared exactly"
            )
        assert await ledger(store, "b") == [], "a schedule without records has none"
        assert list(await store.get_occurrences("a", None, 3)) == newest[:3], (
            "get_occurrences returns at most limit records, the newest"
        )
        assert await ledger(store, "a", newest[2].due_ns) == newest[3:], (
            "get_occurrences returns only the records due before before_ns (exclusive)"
        )
        assert await ledger(store, "a", newest[-1].due_ns) == [], "none is due before the oldest"
        # Paging by the due time of a page's last record reads each record once.
        paged: list[OccurrenceRecorded] = []
        before: int | None = None
        for _ in range(len(newest)):
            page = list(await store.get_occurrences("a", before, 2))
            if not page:
                break
            paged += page
            before = page[-1].due_ns
        assert paged == newest, "pages of 2, each before the last one's oldest, read each once"

    async def test_a_batch_that_fails_midway_writes_no_occurrence(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.FAULT_MID_BATCH)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(1, at)])
        await cluster.fail_next_commit_midway(store)
        # The records first: the fault meets the task's update after them.
        batch: list[Mutation] = [recorded("nightly", at + i) for i in range(8)]
        batch.append(finished(1, at + 9))
        with pytest.raises(StoreError):
            await store.commit(epoch, batch)
        assert await ledger(store, "nightly") == [], (
            "a batch that fails midway must write no OccurrenceRecorded: the records are "
            "written in the batch's transaction, all or nothing with it"
        )
        # The check can fail: the same batch, landing, writes them.
        await store.commit(epoch, batch)
        assert len(await ledger(store, "nightly")) == 8

    async def test_a_replaced_leader_that_has_not_noticed_writes_no_occurrence(
        self, cluster: StoreHarness
    ) -> None:
        at = now_ns()
        late: list[Mutation] = [recorded("nightly", at), recorded("hourly", at + 1)]
        successor, epoch, _ = await self.replaced_leader_commits(
            cluster, [submitted(1, at), recorded("nightly", at - 1)], late
        )
        assert await ledger(successor, "nightly") == [recorded("nightly", at - 1)], (
            "a commit by a leader replaced behind its back wrote its OccurrenceRecorded: gate "
            "the records' insert on the fence, as the rows' are"
        )
        assert await ledger(successor, "hourly") == [], "(the fenced batch's other record)"
        # The check can fail: the same batch of the leader writes them.
        await successor.commit(epoch, late)
        assert await ledger(successor, "hourly") == [recorded("hourly", at + 1)]

    async def test_pruning_removes_the_occurrence_records_that_ended_before_the_horizon(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.PRUNE)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        horizon = at - 30 * SECOND_NS
        minute = 60 * SECOND_NS
        # Spans of a minute ending around the horizon, and one of a long pause that began a
        # day before it and ends after it (written when it ended: not prunable yet).
        ends = [horizon - minute, horizon - 1, horizon, horizon + 1, at]
        spans = [(end - minute, end) for end in ends] + [(horizon - 24 * 60 * minute, at)]
        # "kept" still exists, "gone" was removed: their records are pruned alike.
        schedules = [
            ScheduleRecord(replace(SCHEDULE, name=n), at + HOUR_NS) for n in ("kept", "gone")
        ]
        await store.commit(epoch, [ScheduleSaved(record) for record in schedules])
        await store.commit(
            epoch,
            [
                replace(recorded(n, due), until_ns=until, at_ns=until)
                for n in ("kept", "gone")
                for due, until in spans
            ],
        )
        await store.commit(epoch, [ScheduleRemoved("gone")])
        await cluster.prune(store, horizon)
        for name in ("kept", "gone"):
            left = sorted(r.until_ns for r in await ledger(store, name))
            assert left[:3] == [horizon, horizon + 1, at], (
                "pruning up to a horizon deletes the ledger records whose span ended before "
                f"it, and only those, whether or not their schedule still exists ({name!r})"
            )
            assert len(left) == 4, (
                "a record is pruned by the end of its span (until_ns): a span that ends after "
                f"the horizon is kept however early it began ({name!r})"
            )

    async def test_the_records_of_a_removed_schedule_remain(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        early, last = recorded("gone", at - 2 * SECOND_NS), recorded("gone", at - SECOND_NS)
        saved = ScheduleSaved(ScheduleRecord(replace(SCHEDULE, name="gone"), at + HOUR_NS))
        await store.commit(epoch, [saved, early])
        # Its last firing and its removal in one batch, as when it is removed as it fires.
        await store.commit(epoch, [last, ScheduleRemoved("gone")])
        await cluster.crash(store)
        reopened = await cluster.open()
        _, state = await self.lead(reopened)
        assert [s.spec.name for s in state.schedules] == []
        assert await ledger(reopened, "gone") == [last, early], (
            "a removed schedule's records remain: get_occurrences returns them whether or not "
            "the schedule still exists"
        )

    # --- attempt leases (issue 19) ---------------------------------------------------------
    # A remote attempt's lease is kept with its row, so that a new leader waits for the
    # attempt's worker instead of starting another attempt, and can verify that worker when it
    # re-attaches. Every TaskUpdated replaces the row's lease with its own (None clears it); a
    # CancelRequested keeps it.

    async def test_a_trace_context_round_trips_through_recovery_and_lookups(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        traced = TraceContext(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=opaque,b=2"
        )
        bare = TraceContext("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00")
        # One row alone, then a batch that mixes traced and untraced rows (bulk inserts).
        await store.commit(epoch, [submitted(1, at, key="one", trace_context=traced)])
        await store.commit(
            epoch,
            [submitted(2, at + 1), submitted(3, at + 2, trace_context=bare), finished(2, at + 3)],
        )
        expected = {1: traced, 2: None, 3: bare}
        records = [await store.get_task(i) for i in expected]
        looked_up = {r.task_id: r.spec.trace_context for r in records if r is not None}
        assert looked_up == expected, (
            "get_task must return the trace context a task was submitted with"
        )
        by_key = await store.get_task_by_key("one")
        assert by_key is not None and by_key.spec.trace_context == traced, (
            "get_task_by_key must return the trace context too"
        )
        # What lets an attempt join its submitter's trace after a failover: the new leader's
        # recovery gives each task the context it was submitted with.
        _, state = await self.lead_after_crash(cluster, store)
        recovered = {i: r.spec.trace_context for i, r in by_id(state).items()}
        assert recovered == expected, (
            "recover() must return the trace context (traceparent and tracestate) each task "
            "was submitted with"
        )

    async def test_limits_and_the_latest_start_round_trip_through_recovery(
        self, cluster: StoreHarness
    ) -> None:
        # A new leader rebuilds its limits from the rows: which limits (and keys) each task
        # takes, and when the latest attempt of each task started, finished ones included
        # (the starts inside a rate window; docs/limits.md).
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        keyed = (("stripe", None), ("tenant", "acme \u00e9"))
        await store.commit(epoch, [submitted(1, at, key="one", limits=keyed)])
        await store.commit(
            epoch,
            [
                submitted(2, at + 1),
                submitted(3, at + 2, limits=(("tenant", "b"),)),
                started(3, 1, at + 3, None),
                finished(3, at + 4),
            ],
        )
        expected = {1: keyed, 2: (), 3: (("tenant", "b"),)}
        records = [await store.get_task(i) for i in expected]
        looked_up = {r.task_id: r.spec.limits for r in records if r is not None}
        assert looked_up == expected, "get_task must return the limits a task was submitted with"
        _, state = await self.lead_after_crash(cluster, store)
        recovered = by_id(state)
        assert {i: r.spec.limits for i, r in recovered.items()} == expected, (
            "recover() must return the limits (names and keys) each task was submitted with"
        )
        assert recovered[3].started_ns == at + 3, (
            "recover() must return a finished task's latest start (started_ns): a new leader "
            "recounts the starts inside each rate window from it"
        )

    async def test_a_lease_round_trips_through_commit_and_lookups(
        self, cluster: StoreHarness
    ) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        first, second = lease(epoch, "lease of task 1"), lease(epoch, "lease of task 2")
        # Task 1 is submitted and started in one batch (a new row written with its lease);
        # task 2 was submitted before, and its start updates the existing row.
        await store.commit(epoch, [submitted(2, at, key="two")])
        await store.commit(
            epoch,
            [
                submitted(1, at + 1, key="one"),
                started(1, 1, at + 2, first),
                started(2, 1, at + 3, second),
            ],
        )
        assert await leases_looked_up(store, [1, 2]) == [first, second], (
            "get_task must return the lease a TaskUpdated wrote (task 1: started in the batch "
            "that submitted it; task 2: an existing row updated)"
        )
        one, two = await store.get_task_by_key("one"), await store.get_task_by_key("two")
        assert (one and one.lease, two and two.lease) == (first, second), (
            "get_task_by_key must return the lease a TaskUpdated wrote"
        )
        # Leases of another epoch and of a local attempt (no lease) sit beside them.
        await store.commit(
            epoch, [submitted(3, at + 4), submitted(4, at + 5), started(3, 1, at + 6, None)]
        )
        await store.commit(epoch, [started(4, 1, at + 7, lease(epoch + 5, "4"))])
        assert await leases_looked_up(store, [1, 2, 3, 4]) == [
            first, second, None, lease(epoch + 5, "4")
        ], "each row keeps its own lease"  # fmt: skip

    async def test_a_lease_survives_a_new_instance_recovery(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        first, second = lease(epoch, "recovered 1"), lease(epoch, "recovered 2")
        await store.commit(epoch, [submitted(2, at)])
        await store.commit(
            epoch,
            [submitted(1, at + 1), started(1, 1, at + 2, first), started(2, 3, at + 3, second)],
        )
        await cluster.crash(store)
        other = await cluster.open()
        new_epoch, state = await self.lead(other)
        rows = by_id(state)
        assert (rows[1].lease, rows[2].lease) == (first, second), (
            "recover() must return each running row's lease, as the leader that started the "
            "attempt wrote it: the new leader waits for that worker instead of re-running it"
        )
        assert (rows[1].status, rows[2].attempt) == (Status.RUNNING, 3)
        assert await leases_looked_up(other, [1, 2]) == [first, second], (
            "the new instance's lookups must return the lease too"
        )
        # The new leader's writes to other rows leave the leases alone, across another takeover.
        await other.commit(new_epoch, [submitted(3, at + 4), started(3, 1, at + 5, None)])
        _, again = await self.lead_after_crash(cluster, other)
        assert [by_id(again)[i].lease for i in (1, 2, 3)] == [first, second, None], (
            "a lease must survive every takeover until an update of its own row replaces it"
        )

    async def test_a_later_update_replaces_the_lease(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        old, new = lease(epoch, "attempt 1"), lease(epoch + 1, "attempt 2")
        await store.commit(epoch, [submitted(1, at), started(1, 1, at + 1, old)])
        await store.commit(epoch, [submitted(2, at + 2), started(2, 1, at + 3, old)])
        # Task 1: the next attempt's start in a commit of its own; task 2: its retry and its
        # next start in one batch.
        await store.commit(epoch, [started(1, 2, at + 4, new)])
        await store.commit(
            epoch,
            [
                TaskUpdated(2, Status.RETRYING, 1, "attempt 1 failed", at + 5, due_ns=at + 6),
                started(2, 2, at + 7, new),
            ],
        )
        assert await leases_looked_up(store, [1, 2]) == [new, new], (
            "a TaskUpdated with a lease must replace the row's lease, not keep the older one"
        )
        _, state = await self.lead_after_crash(cluster, store)
        assert [by_id(state)[i].lease for i in (1, 2)] == [new, new], (
            "a TaskUpdated with a lease must replace the row's lease, not keep the older one "
            "(after recovery)"
        )

    async def test_an_update_without_a_lease_clears_it(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        held = lease(epoch, "to be cleared")
        await store.commit(epoch, [submitted(i, at + i) for i in (1, 2, 3, 4)])
        await store.commit(epoch, [started(i, 1, at + 10 + i, held) for i in (1, 2, 3, 4)])
        await store.commit(
            epoch,
            [
                TaskUpdated(1, Status.RETRYING, 1, "attempt 1 failed", at + 20, due_ns=at + 30),
                TaskUpdated(2, Status.SUCCEEDED, 1, "done", at + 21, output=b"out"),
                TaskUpdated(3, Status.FAILED, 1, "dead-lettered", at + 22),
                started(4, 2, at + 23, None),  # the next attempt runs locally: no lease
            ],
        )
        # Submitted, started with a lease and retried in one batch: the new row has none.
        await store.commit(
            epoch,
            [
                submitted(5, at + 24),
                started(5, 1, at + 25, held),
                TaskUpdated(5, Status.RETRYING, 1, "attempt 1 failed", at + 26, due_ns=at + 30),
            ],
        )
        cleared = "a TaskUpdated without a lease (retrying, terminal, a local start) must clear it"
        assert await leases_looked_up(store, [1, 2, 3, 4, 5]) == [None] * 5, cleared
        _, state = await self.lead_after_crash(cluster, store)
        assert [by_id(state)[i].lease for i in (1, 4, 5)] == [None] * 3, f"{cleared} (recovered)"

    async def test_a_cancellation_request_keeps_the_lease(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        held = lease(epoch, "still running")
        await store.commit(epoch, [submitted(1, at), started(1, 1, at + 1, held)])
        # Task 1: the request in a commit of its own; task 2: submitted, started and asked to
        # stop in one batch. The attempt runs until its worker stops: its lease still holds.
        await store.commit(epoch, [CancelRequested(1, at + 2, "stop please")])
        await store.commit(
            epoch,
            [submitted(2, at + 3), started(2, 1, at + 4, held), CancelRequested(2, at + 5, "stop")],
        )
        kept = "a CancelRequested must keep the row's lease (the attempt still runs)"
        assert await leases_looked_up(store, [1, 2]) == [held, held], kept
        _, state = await self.lead_after_crash(cluster, store)
        rows = by_id(state)
        assert [(rows[i].lease, rows[i].cancel_requested) for i in (1, 2)] == [
            (held, True), (held, True)
        ], f"{kept} (recovered)"  # fmt: skip

    async def test_a_finished_row_keeps_its_lease_and_is_not_pruned_until_cleared(
        self, cluster: StoreHarness
    ) -> None:
        """An attempt the engine stopped (cancelled, past its deadline, out of attempts) may
        still run: the finished row keeps its lease until the attempt ends, so that a new
        leader (and an operator's retry there) waits for it, and pruning leaves the row."""
        self.require(cluster, Capability.PRUNE)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        held = lease(epoch, "stopped, still running")
        await store.commit(epoch, [submitted(i, at + i) for i in (1, 2)])
        await store.commit(epoch, [started(i, 1, at + 10 + i, held) for i in (1, 2)])
        await store.commit(
            epoch,
            [
                TaskUpdated(1, Status.CANCELLED, 1, "cancelled", at + 20, lease=held),
                TaskUpdated(2, Status.FAILED, 1, "dead-lettered", at + 21),
            ],
        )
        kept = "a terminal TaskUpdated with a lease must keep it on the finished row"
        assert await leases_looked_up(store, [1, 2]) == [held, None], kept
        await cluster.crash(store)
        store = await cluster.open()
        # Its attempt may run for longer than the retention: a recovery whose retention ended
        # before the row finished returns it all the same (and not the other row).
        epoch, state = await self.lead(store, retention_ns=1)
        rows = by_id(state)
        assert 1 in rows, "recover() must return a finished row that keeps a lease, however old"
        assert (rows[1].status, rows[1].lease) == (Status.CANCELLED, held), f"{kept} (recovered)"
        await cluster.prune(store, now_ns() + 10**9)
        assert await store.get_task(2) is None, "the harness's prune must delete old rows"
        record = await store.get_task(1)
        assert record is not None and record.lease == held, (
            "pruning must leave a finished row that keeps a lease (its attempt may still run)"
        )
        await store.commit(epoch, [TaskUpdated(1, Status.CANCELLED, 1, "cancelled", at + 20)])
        await cluster.prune(store, now_ns() + 10**9)
        assert await store.get_task(1) is None, (
            "once an update clears its lease, a finished row is pruned like any other"
        )

    async def test_outputs_are_kept_and_loaded_on_demand(self, cluster: StoreHarness) -> None:
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        output = bytes(range(256)) * 100
        await store.commit(
            epoch,
            [
                submitted(1, at, key="with-output"),
                TaskUpdated(1, Status.SUCCEEDED, 1, "done", at + 1, output=output),
                submitted(2, at),
                TaskUpdated(2, Status.SUCCEEDED, 1, "done", at + 1, output=None),
            ],
        )
        assert await store.load_output(1) == output
        assert await store.load_output(2) is None
        assert await store.load_output(999) is None
        record = await store.get_task(1)
        assert record is not None
        assert record.output == output
        by_key = await store.get_task_by_key("with-output")
        assert by_key is not None
        assert by_key.task_id == 1
        assert await store.get_task(999) is None
        assert await store.get_task_by_key("missing") is None
        _, state = await self.lead_after_crash(cluster, store)
        assert all(r.output is None for r in state.tasks), "recovery does not load outputs"

    async def lead_after_crash(
        self, cluster: StoreHarness, store: Store
    ) -> tuple[int, RecoveredState]:
        await cluster.crash(store)
        return await self.lead(await cluster.open())

    async def test_timestamps_round_trip_at_nanosecond_precision(
        self, cluster: StoreHarness
    ) -> None:
        at = 1_764_000_000_123_456_789
        due = at + 987_654_321
        state = await self.committed_and_recovered(
            cluster,
            [
                submitted(1, at),
                TaskUpdated(1, Status.RETRYING, 1, "m", at + 1, due_ns=due),
            ],
            retention_ns=10**19,
        )
        row = by_id(state)[1]
        assert (row.submitted_ns, row.updated_ns, row.due_ns) == (at, at + 1, due)

    async def test_the_given_time_base_is_applied(self, cluster: StoreHarness) -> None:
        base = TimeBase(unix_nanos_at_zero=1_000_000_000_000_000_000)
        first = await cluster.open()
        lease = await first.acquire_leadership()
        await first.recover(lease.epoch, base, HOUR_NS)
        engine_now = now_ns() - base.unix_nanos_at_zero
        await first.commit(lease.epoch, [submitted(1, engine_now)])
        assert (record := await first.get_task(1)) is not None
        assert record.submitted_ns == engine_now
        await cluster.crash(first)
        second = await cluster.open()
        _, unix_state = await self.lead(second)
        assert by_id(unix_state)[1].submitted_ns == engine_now + base.unix_nanos_at_zero

    async def test_nul_in_messages_is_stored_as_the_replacement_character(
        self, cluster: StoreHarness
    ) -> None:
        at = now_ns()
        state = await self.committed_and_recovered(
            cluster,
            [
                submitted(1, at),
                submitted(2, at),
                TaskUpdated(1, Status.RETRYING, 1, "bad\x00byte", at, due_ns=at),
                TaskUpdated(2, Status.FAILED, 1, "\x00", at),
            ],
        )
        assert by_id(state)[1].message == "bad\ufffdbyte"
        assert by_id(state)[2].message == "\ufffd"

    # --- recovery -------------------------------------------------------------------------

    async def test_recovery_loads_live_recent_parents_and_schedules_and_nothing_else(
        self, cluster: StoreHarness
    ) -> None:
        at = now_ns()
        old = at - 5 * HOUR_NS
        batch: list[Mutation] = [
            submitted(1, old),  # live, however old
            submitted(2, old),
            finished(2, old + 1),  # finished long ago, nobody depends on it: not loaded
            submitted(3, old),
            finished(3, old + 1, Status.FAILED),  # finished long ago, parent of 5: loaded
            submitted(4, at),
            finished(4, at, Status.CANCELLED),  # finished recently: loaded
            submitted(5, at, after=(3, 99)),
            ScheduleSaved(ScheduleRecord(SCHEDULE, at + HOUR_NS)),
        ]
        state = await self.committed_and_recovered(cluster, batch)
        assert [r.task_id for r in state.tasks] == [1, 3, 4, 5]
        assert [s.spec.name for s in state.schedules] == ["nightly"]
        assert state.max_task_id == 5
        assert list(state.quarantined) == []

    async def test_recovery_returns_tasks_in_id_order_even_when_the_clock_stepped_back(
        self, cluster: StoreHarness
    ) -> None:
        # Id order is submission order; times need not rise with ids (a clock stepped back),
        # so a store ordering by time instead of id shows only here.
        at = now_ns()
        second = 1_000_000_000
        first_batch: list[Mutation] = [
            submitted(3, at - 30 * second),
            submitted(1, at - 10 * second),
            submitted(2, at - 20 * second),
            TaskUpdated(1, Status.RETRYING, 1, "m", at + 9 * second, due_ns=at),
        ]
        second_batch: list[Mutation] = [
            submitted(6, at - 60 * second),
            submitted(4, at - 40 * second),
            submitted(5, at - 50 * second),
            finished(5, at - 55 * second),
            TaskUpdated(2, Status.RUNNING, 1, "m", at - 99 * second),
        ]
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        await store.commit(epoch, first_batch)
        await store.commit(epoch, second_batch)
        _, state = await self.lead_after_crash(cluster, store)
        assert [r.task_id for r in state.tasks] == [1, 2, 3, 4, 5, 6], "recovery returns id order"

    async def test_a_lookup_by_key_returns_the_newest_holder_of_the_key(
        self, cluster: StoreHarness
    ) -> None:
        # Newest is the highest id (submission order), whatever the times say: here the newer
        # holders were submitted and finished "earlier" (a clock stepped back).
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        commits: list[list[Mutation]] = [
            [submitted(1, at, key="k"), finished(1, at + 100)],
            [submitted(2, at - 50, key="k"), finished(2, at - 40, Status.FAILED)],
            [submitted(3, at - 90, key="j"), finished(3, at - 80)],
            [submitted(4, at - 200, key="j")],
        ]
        for batch in commits:
            await store.commit(epoch, batch)

        async def holder(instance: Store, key: str) -> int | None:
            record = await instance.get_task_by_key(key)
            return None if record is None else record.task_id

        assert (await holder(store, "k"), await holder(store, "j")) == (2, 4)
        await store.commit(epoch, [submitted(5, at - 300, key="k")])
        assert await holder(store, "k") == 5, "a live holder is newer than finished ones"
        await cluster.crash(store)
        other = await cluster.open()
        await self.lead(other)
        assert (await holder(other, "k"), await holder(other, "j")) == (5, 4)

    async def test_the_id_high_water_mark_survives_pruning(self, cluster: StoreHarness) -> None:
        self.require(cluster, Capability.PRUNE)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        old = now_ns() - 30 * 24 * HOUR_NS
        await store.commit(epoch, [submitted(1, old), submitted(7, old), finished(7, old)])
        await cluster.prune(store, now_ns())
        _, state = await self.lead_after_crash(cluster, store)
        assert [r.task_id for r in state.tasks] == [1]
        assert state.max_task_id == 7
        assert await (await cluster.open()).get_task(7) is None

    async def test_an_undecodable_row_is_quarantined_and_recovery_succeeds(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.CORRUPT_ROW)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(i, at) for i in (1, 2, 3)])
        await cluster.corrupt_task(store, 2)
        await cluster.crash(store)
        second = await cluster.open()
        _, state = await self.lead(second)
        assert [r.task_id for r in state.tasks if not r.status.is_terminal] == [1, 3]
        assert [task_id for task_id, _ in state.quarantined] == [2]
        assert state.quarantined[0][1], "the quarantine reason must say what went wrong"
        assert state.max_task_id == 3
        # Quarantine is durable: the row is failed now, so it is no longer live.
        _, again = await self.lead_after_crash(cluster, second)
        assert 2 not in {r.task_id for r in again.tasks if not r.status.is_terminal}

    async def test_what_an_earlier_schema_holds_reads_back_the_same_after_the_upgrade(
        self, cluster: StoreHarness
    ) -> None:
        """For every schema version the store still upgrades from: rows of every kind, each
        column set, written as that version's store wrote them, read back after the upgrade
        (recovery, lookups, attempts, pauses, schedules, the id high-water mark) as they were
        written; only what that version had no place for reads as absent."""
        self.require(cluster, Capability.EARLIER_SCHEMAS)
        versions = cluster.earlier_schema_versions
        assert versions, "a harness declaring EARLIER_SCHEMAS names its earlier_schema_versions"
        written = earlier_rows(now_ns())
        for version in versions:
            store, kept = await cluster.open_upgraded_from(version, written)
            _kept_is_what_a_schema_can_lack(written, kept, version)
            try:
                await self.reads_back(store, kept, f"after the upgrade from version {version}")
            finally:
                await store.close()

    @staticmethod
    async def reads_back(store: Store, kept: ClusterRows, when: str) -> None:
        """``store``, opened on a cluster holding ``kept``, leads and reads it all back; and
        its upgraded schema takes every mutation."""
        epoch = (await store.acquire_leadership()).epoch
        assert epoch > kept.epoch, (
            f"{when}: a new leader's epoch ({epoch}) must be above the last one ({kept.epoch})"
        )
        state = await store.recover(epoch, TimeBase(), HOUR_NS)
        assert list(state.quarantined) == [], f"{when}: recovery quarantined rows"
        assert list(state.tasks) == [replace(t, output=None) for t in kept.tasks], (
            f"{when}: recover() must return every row as it was written"
        )
        looked_up = [await store.get_task(t.task_id) for t in kept.tasks]
        assert looked_up == list(kept.tasks), f"{when}: get_task must return every row as written"
        for record in kept.tasks:
            if record.spec.key is not None:
                by_key = await store.get_task_by_key(record.spec.key)
                assert by_key == record, f"{when}: get_task_by_key({record.spec.key!r})"
        attempts = [a for t in kept.tasks for a in await store.get_attempts(t.task_id)]
        assert attempts == list(kept.attempts), (
            f"{when}: get_attempts must return every ended attempt as written"
        )
        assert state.paused_pools == {name for name, paused in kept.pools if paused}, (
            f"{when}: recover() must return the pools paused before it"
        )
        assert sorted(state.schedules, key=_name) == sorted(kept.schedules, key=_name), (
            f"{when}: recover() must return every schedule as written"
        )
        assert state.max_task_id == kept.max_task_id, f"{when}: the id high-water mark changed"
        # No earlier version had a ledger: it is empty.
        for name in map(_name, kept.schedules):
            assert await ledger(store, name) == [], (
                f"{when}: the ledger of schedule {name!r} must be empty"
            )
        # The upgraded schema takes leases, starts, pauses, attempts and ledger records like a
        # new one.
        at = now_ns()
        fresh = lease(epoch, "after the upgrade")
        ended = AttemptEnded(3, 2, at, at + 1, "attempt 2 failed")
        fired = recorded(_name(kept.schedules[0]), at)
        await store.commit(epoch, [started(2, 1, at, fresh), ended, PoolPaused("sms", True), fired])
        updated = await store.get_task(2)
        assert updated is not None and (updated.lease, updated.started_ns) == (fresh, at), (
            f"{when}: the upgraded schema must keep a new lease and start"
        )
        assert ended in await store.get_attempts(3), f"{when}: an attempt was not written"
        assert await ledger(store, fired.schedule) == [fired], f"{when}: a record was not written"
        again = await store.recover(epoch, TimeBase(), HOUR_NS)
        assert "sms" in again.paused_pools, f"{when}: a pause was not written"

    async def test_a_newer_schema_is_refused_with_a_clear_error(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.NEWER_SCHEMA)
        store = await cluster.open()
        await cluster.set_schema_newer(store)
        with pytest.raises(StoreFatal, match="schema"):
            await self.lead(await cluster.open())

    async def test_instances_opened_at_once_on_an_empty_cluster_all_work(
        self, cluster: StoreHarness
    ) -> None:
        stores = await asyncio.gather(*(cluster.open() for _ in range(3)))
        epoch, state = await self.lead(stores[0])
        assert list(state.tasks) == []
        assert state.max_task_id == 0
        await stores[0].commit(epoch, [submitted(1, now_ns())])

    async def test_leadership_is_exclusive_across_processes(self, cluster: StoreHarness) -> None:
        self.require(cluster, Capability.SECOND_PROCESS)
        store = await cluster.open()
        await store.acquire_leadership()
        probe = (
            "store = await open_store()\n"
            "try:\n"
            "    await asyncio.wait_for(store.acquire_leadership(), {timeout})\n"
            "    print('acquired')\n"
            "except TimeoutError:\n"
            "    print('waited')\n"
            "await store.close()\n"
        )
        assert (await cluster.run_in_other_process(probe.format(timeout=0.5))).split() == ["waited"]
        await store.release_leadership()
        timeout = cluster.leadership_timeout
        assert (await cluster.run_in_other_process(probe.format(timeout=timeout))).split() == [
            "acquired"
        ]

    async def test_two_processes_migrating_an_empty_cluster_at_once_both_succeed(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.SECOND_PROCESS)
        opening = "store = await open_store()\nprint('opened')\nawait store.close()\n"
        outputs = await asyncio.gather(*(cluster.run_in_other_process(opening) for _ in range(2)))
        assert [o.split() for o in outputs] == [["opened"], ["opened"]]
        epoch, state = await self.lead(await cluster.open())
        assert epoch >= 1
        assert state.max_task_id == 0

    async def test_a_fatal_database_error_is_reported_as_store_fatal(
        self, cluster: StoreHarness
    ) -> None:
        # Retrying cannot fix a refused write: Unavailable here would make the scheduler retry
        # forever instead of stopping with the error.
        self.require(cluster, Capability.FATAL_COMMIT)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(1, at)])
        await cluster.fail_commits_fatally(store)
        with pytest.raises(StoreFatal):
            await store.commit(epoch, [submitted(2, at), finished(1, at + 1)])
        with pytest.raises(StoreFatal):
            await store.commit(epoch, [finished(1, at + 2)])
        _, state = await self.lead_after_crash(cluster, store)
        assert [(r.task_id, r.status) for r in state.tasks] == [(1, Status.READY)]

    @pytest.mark.parametrize("condition", list(DatabaseCondition), ids=lambda c: c.name.lower())
    async def test_each_database_condition_is_fatal_or_transient_as_it_is(
        self, cluster: StoreHarness, condition: DatabaseCondition
    ) -> None:
        # The real error of each condition: a store that maps a whole class of errors (every
        # "operational" one, say) to Unavailable retries a read-only or unopenable database
        # for ever; one that maps contention to StoreFatal stops the scheduler for a busy one.
        self.require(cluster, Capability.DATABASE_CONDITIONS)
        if condition not in cluster.conditions:
            pytest.skip(f"the harness cannot produce {condition.description}")
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(1, at)])
        await cluster.meet_condition(store, condition)
        expected = StoreFatal if condition.permanent else Unavailable
        batches: list[list[Mutation]] = [
            [submitted(2, at), finished(1, at + 1)],
            [finished(1, at + 2)],
        ]
        for batch in batches:
            with pytest.raises(StoreError) as raised:
                await store.commit(epoch, batch)
            error = raised.value
            assert isinstance(error, expected), (
                f"{condition.description} must be {expected.__name__}, "
                f"not {type(error).__name__}: {error}"
            )
            if condition.permanent:
                assert re.search(condition.reason, str(error), re.IGNORECASE), (
                    f"the error must say why ({condition.description}): {error}"
                )
        await cluster.lift_condition(store)
        if not condition.permanent:
            # It passed: the same instance commits again.
            await store.commit(epoch, [submitted(3, at)])
        _, state = await self.lead_after_crash(cluster, store)
        expected_ids = [1] if condition.permanent else [1, 3]
        assert [(r.task_id, r.status) for r in state.tasks] == [
            (i, Status.READY) for i in expected_ids
        ], "a refused commit wrote something"

    async def test_a_commit_statement_that_reaches_the_database_after_recovery_changes_nothing(
        self, cluster: StoreHarness
    ) -> None:
        # The driver gives up on a commit whose connection broke, recovers, tells its callers
        # what the recovered state holds and builds on it. The commit's statement may still be
        # on its way (in a socket, a proxy, a server's queue): arriving after the recovery it
        # must write nothing, or an answered "not applied" turns out applied and the ids the
        # recovery handed out again clash with it.
        self.require(cluster, Capability.LATE_STATEMENT)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        at = now_ns()
        await store.commit(epoch, [submitted(1, at, key="before")])
        await cluster.hold_next_commit(store)
        late: list[Mutation] = [submitted(2, at, key="late"), finished(1, at + 1)]
        with pytest.raises(StoreError) as raised:
            await store.commit(epoch, late)
        # Its outcome is unknown to the store: the caller must retry or recover, not stop.
        assert isinstance(raised.value, Unavailable), (
            f"a commit whose connection broke must raise Unavailable, not {raised.value!r}"
        )
        state = await store.recover(epoch, TimeBase(), HOUR_NS)
        assert sorted(by_id(state)) == [1], "the held statement had not reached the database"
        assert state.max_task_id == 1
        await cluster.release_held_commit(store)
        looked_up = await store.get_task(1)
        assert looked_up is not None
        assert (looked_up.status, await store.get_task(2)) == (Status.READY, None), (
            "a commit statement that reached the database after recover() landed: the "
            "recovered state, which the callers were answered from, is no longer what the "
            "store holds (fence every write on what recovery bumps, not only on the epoch)"
        )
        # The recovery's answer holds for good: the ids it allows are free.
        await store.commit(epoch, [submitted(2, at + 2, key="after")])
        _, again = await self.lead_after_crash(cluster, store)
        assert [(r.task_id, r.spec.key, r.status) for r in again.tasks] == [
            (1, "before", Status.READY),
            (2, "after", Status.READY),
        ]

    async def replaced_without_knowing(
        self, cluster: StoreHarness, leader: Store
    ) -> tuple[Store, int] | None:
        """Another leader takes over from ``leader`` without telling it (a supersede, or a
        pause past its lease); the new leader and its epoch, if one was opened."""
        if Capability.SUPERSEDE in cluster.capabilities:
            await cluster.supersede(leader)
            return None
        if Capability.PAUSE not in cluster.capabilities:
            pytest.skip("the harness declares neither Capability.SUPERSEDE nor Capability.PAUSE")
        successor = await cluster.open()
        await cluster.pause(leader)
        try:
            lease = await asyncio.wait_for(
                successor.acquire_leadership(), cluster.leadership_timeout
            )
        finally:
            await cluster.resume(leader)
        return successor, lease.epoch

    async def prunable(self, store: Store, epoch: int) -> None:
        """Tasks 1-3 finished a minute ago, task 4 live, and a ledger record of schedule
        "pruned" due a minute ago: a prune up to now deletes 1-3 and the record, and the
        stores' own pruning (which keeps finished tasks longer) does not."""
        old = now_ns() - 60 * SECOND_NS
        batch: list[Mutation] = [submitted(i, old) for i in (1, 2, 3, 4)]
        batch += [finished(i, old) for i in (1, 2, 3)]
        await store.commit(epoch, [*batch, recorded("pruned", old)])

    @staticmethod
    async def prunes_nothing(
        cluster: StoreHarness, instance: Store, reader: Store, who: str
    ) -> None:
        told: object = "nothing: the prune returned"
        try:
            await cluster.prune(instance, now_ns())
        except StoreError as exc:
            told = exc
        kept = [i for i in (1, 2, 3) if await reader.get_task(i) is not None]
        pruned = sorted({1, 2, 3} - set(kept))
        assert isinstance(told, Fenced), (
            f"{who} must be told it is fenced when it prunes, not {told!r} (it pruned {pruned})"
        )
        assert pruned == [], f"{who} pruned tasks {pruned}"
        assert await ledger(reader, "pruned"), f"{who} pruned ledger records"

    async def test_an_instance_that_does_not_lead_prunes_nothing(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.PRUNE)
        first, standby = await cluster.open(), await cluster.open()
        epoch, _ = await self.lead(first)
        await self.prunable(first, epoch)
        await self.prunes_nothing(cluster, standby, first, "a standby that never led")
        await first.release_leadership()
        second = await cluster.open()
        await self.lead(second)
        await self.prunes_nothing(cluster, first, second, "a leader that released leadership")
        # The check can fail: the leader's prune deletes them.
        await cluster.prune(second, now_ns())
        assert [i for i in (1, 2, 3, 4) if await second.get_task(i) is not None] == [4]
        assert await ledger(second, "pruned") == []

    async def test_a_replaced_leader_that_has_not_noticed_prunes_nothing(
        self, cluster: StoreHarness
    ) -> None:
        # Pruning is a write of the leader like a commit: fenced in the same transaction,
        # not on what the instance believes (its pruning runs on its own timer, and a
        # replaced leader may not know yet).
        self.require(cluster, Capability.PRUNE)
        first = await cluster.open()
        epoch, _ = await self.lead(first)
        await self.prunable(first, epoch)
        replaced = await self.replaced_without_knowing(cluster, first)
        reader = first if replaced is None else replaced[0]
        await self.prunes_nothing(cluster, first, reader, "a leader replaced behind its back")
        if replaced is not None:
            # The check can fail: the new leader's prune deletes them.
            successor, successor_epoch = replaced
            await successor.recover(successor_epoch, TimeBase(), HOUR_NS)
            await cluster.prune(successor, now_ns())
            assert [i for i in (1, 2, 3, 4) if await successor.get_task(i) is not None] == [4]
            assert await ledger(successor, "pruned") == []

    async def test_no_file_of_the_store_is_readable_by_group_or_others(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.PRIVATE_FILES)
        directory = cluster.store_directory()

        def open_to_others(when: str) -> None:
            files = [p for p in directory.rglob("*") if p.is_file()]
            assert files, f"the store created no file under {directory}"
            readable = {
                str(p.relative_to(directory)): oct(stat.S_IMODE(p.stat().st_mode))
                for p in files
                if p.stat().st_mode & 0o077
            }
            assert readable == {}, f"files open to group or others {when}: {readable}"

        # A permissive umask, so that a store relying on the environment's shows here.
        previous = os.umask(0o022)
        try:
            first = await cluster.open()
            epoch, _ = await self.lead(first)
            await first.commit(epoch, [submitted(i, now_ns(), payload=b"secret") for i in (1, 2)])
            open_to_others("after the first instance's first commit")
            second = await cluster.open()
            await cluster.crash(first)
            await self.lead(second)
        finally:
            os.umask(previous)
        open_to_others("after a takeover")

    async def test_a_path_the_store_does_not_own_is_refused_and_left_as_it_was(
        self, cluster: StoreHarness, tmp_path: Path
    ) -> None:
        """A typo in a store's path may name a shared directory (``/tmp``) or somebody's file:
        the store must refuse it with ``StoreFatal`` before it changes anything of it, not
        tighten its mode, write a header or create a journal beside it and then fail."""
        self.require(cluster, Capability.FOREIGN_PATHS)
        room = tmp_path / "not-the-stores"
        room.mkdir()
        shared = room / "shared"
        shared.mkdir()
        (shared / "someone-elses.txt").write_text("keep me\n")
        shared.chmod(0o1777)  # sticky and open to all, as /tmp is
        notes = room / "notes.txt"
        notes.write_text("a note, not a database\n")
        notes.chmod(0o644)
        noise = room / "noise.bin"
        noise.write_bytes(random.Random(7).randbytes(8192))
        noise.chmod(0o640)
        for target in [shared, notes, noise, *cluster.foreign_files(room)]:
            before = footprint(room)
            with pytest.raises(StoreFatal) as refused:
                await cluster.open_at(target)
            assert str(target) in str(refused.value), f"the refusal must name the path: {refused}"
            changed = changes(before, footprint(room))
            assert changed == [], (
                f"refusing {target.name} changed what the store does not own: {changed}"
            )

    async def test_unavailable_is_reported_and_the_store_works_again(
        self, cluster: StoreHarness
    ) -> None:
        self.require(cluster, Capability.UNAVAILABLE)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        await cluster.set_available(store, False)
        with pytest.raises(Unavailable):
            await store.commit(epoch, [submitted(1, now_ns())])
        await cluster.set_available(store, True)
        await store.commit(epoch, [submitted(2, now_ns())])
        _, state = await self.lead_after_crash(cluster, store)
        assert [r.task_id for r in state.tasks] == [2]

    # --- the transactional outbox (issue 30) ----------------------------------------------
    # Applications write rows into the store's own outbox in their transactions; the leader
    # reads them, submits them, and the commit of that submission carries an OutboxTaken,
    # which deletes the rows in the batch's transaction: that is what makes a row exactly one
    # task. A store without such an outbox does not declare Capability.OUTBOX.

    @staticmethod
    async def put_outbox_rows(cluster: StoreHarness, count: int) -> list[int]:
        """``count`` committed rows (``OUTBOX_ROWS`` in turn), by the harness; their ids."""
        return [
            await cluster.put_outbox_row(*OUTBOX_ROWS[i % len(OUTBOX_ROWS)]) for i in range(count)
        ]

    @staticmethod
    async def outbox_ids(store: Store, epoch: int) -> list[int]:
        """The ids ``read()`` returns, as the leader of ``epoch`` reads them."""
        return [row.row_id for row in await outbox_of(store).read(epoch, OUTBOX_PAGE)]

    @staticmethod
    def can_replace_behind_its_back(cluster: StoreHarness) -> bool:
        return bool({Capability.SUPERSEDE, Capability.PAUSE} & cluster.capabilities)

    async def test_a_store_with_a_transactional_outbox_declares_it(
        self, cluster: StoreHarness
    ) -> None:
        """A harness declares ``OUTBOX`` if and only if its store's ``outbox`` is a
        transactional ``OutboxSource``: a store that offers one and does not declare it would
        have every outbox check skipped."""
        store = await cluster.open()
        outbox = getattr(store, "outbox", None)
        offered = isinstance(outbox, OutboxSource) and outbox.transactional
        if Capability.OUTBOX in cluster.capabilities:
            outbox_of(store)
        else:
            assert not offered, (
                "the store's `outbox` is a transactional OutboxSource, but the harness does "
                "not declare Capability.OUTBOX (and its hooks): the kit would not check it"
            )

    async def test_a_landed_batch_takes_exactly_the_outbox_rows_it_names(
        self, cluster: StoreHarness
    ) -> None:
        """An ``OutboxTaken`` deletes the outbox rows it names in the transaction of its batch:
        once the batch has landed its tasks are there, ``read()`` returns none of the rows it
        named (nor on the next leader), and every other row is still there."""
        self.require(cluster, Capability.OUTBOX)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        ids = await self.put_outbox_rows(cluster, 7)
        assert await self.outbox_ids(store, epoch) == ids, "read() returns the rows written"
        at = now_ns()
        # Not the oldest rows only, in two OutboxTaken of one batch, among its tasks; then a
        # batch that takes a row beside a task's update only.
        batch: list[Mutation] = [
            submitted(1, at),
            OutboxTaken((ids[1],)),
            submitted(2, at),
            OutboxTaken((ids[3], ids[4])),
        ]
        await store.commit(epoch, batch)
        kept = [ids[0], ids[2], ids[5], ids[6]]
        left = await self.outbox_ids(store, epoch)
        assert left == kept, (
            f"after a batch taking rows {[ids[1], ids[3], ids[4]]} landed, the outbox must hold "
            f"the others, {kept}, not {left}: an OutboxTaken deletes exactly the rows it names, "
            "in its batch's transaction"
        )
        assert [await store.get_task(i) is not None for i in (1, 2)] == [True, True]
        # A batch that takes rows and writes nothing else (their keys were held, say).
        await store.commit(epoch, [finished(1, at + 1), OutboxTaken((ids[5],))])
        await store.commit(epoch, [OutboxTaken((ids[6],))])
        kept = kept[:2]
        assert await self.outbox_ids(store, epoch) == kept, "a batch of OutboxTaken alone"
        assert (await outbox_of(store).stats()).depth == len(kept), "stats() counts the rows"
        other = await cluster.open()
        await cluster.crash(store)
        other_epoch, state = await self.lead(other)
        left = await self.outbox_ids(other, other_epoch)
        assert left == kept, f"the next leader reads {left}, not {kept}: taking rows is durable"
        assert [(r.task_id, r.status) for r in state.tasks] == [
            (1, Status.SUCCEEDED), (2, Status.READY)
        ]  # fmt: skip

    async def test_a_batch_that_fails_midway_takes_no_outbox_row(
        self, cluster: StoreHarness
    ) -> None:
        """A batch that fails midway leaves every row its ``OutboxTaken`` names in the outbox,
        and none of its tasks: the rows are deleted in the batch's transaction, all or nothing
        with it (a row taken without its task is lost; a task written while its row stays is
        submitted from it again). Two faulted batches: one that also changes tasks, one of new
        tasks and taken rows alone."""
        self.require(cluster, Capability.OUTBOX)
        self.require(cluster, Capability.FAULT_MID_BATCH)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        ids = await self.put_outbox_rows(cluster, 4)
        at = now_ns()
        await store.commit(epoch, [submitted(1, at)])
        changing: list[Mutation] = [OutboxTaken((ids[0],))]
        changing += [submitted(i, at) for i in range(2, 8)]
        changing += [finished(1, at + 1), OutboxTaken((ids[1],))]
        adding: list[Mutation] = [submitted(10, at), submitted(11, at), OutboxTaken(tuple(ids[2:]))]
        for batch in (changing, adding):
            await cluster.fail_next_commit_midway(store)
            with pytest.raises(StoreError):
                await store.commit(epoch, batch)
        left = await self.outbox_ids(store, epoch)
        assert left == ids, (
            f"batches that failed midway took outbox rows {sorted(set(ids) - set(left))}: an "
            "OutboxTaken deletes its rows in its batch's transaction, all or nothing with it, "
            "not in a transaction of its own"
        )
        written = [i for i in (*range(2, 8), 10, 11) if await store.get_task(i) is not None]
        assert written == [], (
            f"batches that failed midway wrote tasks {written} and left the outbox rows they "
            "came from: the rows are taken in the batch's transaction, not in one after it"
        )
        # The check can fail: the same batches, landed, take every row.
        await store.commit(epoch, changing)
        await store.commit(epoch, adding)
        assert await self.outbox_ids(store, epoch) == []

    async def test_a_fenced_commit_takes_no_outbox_row(self, cluster: StoreHarness) -> None:
        """A commit fenced by an epoch that no longer leads deletes none of the outbox rows it
        names: by a leader replaced behind its back that has not noticed (the fence is read in
        the commit's transaction, for the rows too), and by an older epoch than the leader's."""
        self.require(cluster, Capability.OUTBOX)
        first = await cluster.open()
        epoch, _ = await self.lead(first)
        ids = await self.put_outbox_rows(cluster, 4)
        at = now_ns()
        if self.can_replace_behind_its_back(cluster):
            replaced = await self.replaced_without_knowing(cluster, first)
            with pytest.raises(StoreError) as raised:
                await first.commit(epoch, [submitted(1, at), OutboxTaken((ids[0], ids[1]))])
            assert isinstance(raised.value, Fenced), (
                f"a leader replaced behind its back must be told it is fenced, not {raised.value!r}"
            )
        else:
            replaced = None
        successor, successor_epoch, _ = await self.successor_after(cluster, first, replaced)
        with pytest.raises(Fenced):
            await successor.commit(epoch, [submitted(2, at), OutboxTaken((ids[2],))])
        left = await self.outbox_ids(successor, successor_epoch)
        assert left == ids, (
            f"fenced commits took outbox rows {sorted(set(ids) - set(left))}: gate the "
            "deletion on the fence, as the rows' writes are"
        )
        assert [await successor.get_task(i) for i in (1, 2)] == [None, None]
        # The check can fail: the leader's commit takes them.
        await successor.commit(successor_epoch, [submitted(1, at), OutboxTaken(tuple(ids[:3]))])
        assert await self.outbox_ids(successor, successor_epoch) == [ids[3]]

    async def test_a_retried_commit_skips_the_outbox_rows_already_taken(
        self, cluster: StoreHarness
    ) -> None:
        """An id no longer in the outbox is skipped: a commit retried after it landed (the
        driver retries one whose outcome it did not learn) does not fail and changes nothing,
        and a batch naming rows taken before beside rows still there takes the latter."""
        self.require(cluster, Capability.OUTBOX)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        ids = await self.put_outbox_rows(cluster, 4)
        at = now_ns()
        batch: list[Mutation] = [
            submitted(1, at, key="k"), finished(1, at + 1), OutboxTaken((ids[0], ids[1]))
        ]  # fmt: skip
        await store.commit(epoch, batch)
        try:
            await store.commit(epoch, batch)
        except StoreError as exc:
            raise AssertionError(
                "a commit retried after it landed must not fail because its outbox rows are "
                f"gone (an id no longer in the outbox is skipped): {exc!r}"
            ) from exc
        left = await self.outbox_ids(store, epoch)
        assert left == ids[2:], f"a retried commit changed the outbox: {ids[2:]} became {left}"
        record = await store.get_task(1)
        assert record is not None and record.status is Status.SUCCEEDED
        try:
            await store.commit(epoch, [submitted(2, at), OutboxTaken((ids[1], ids[2]))])
        except StoreError as exc:
            raise AssertionError(
                "a batch naming a row already taken beside one still there must land, taking "
                f"the latter: {exc!r}"
            ) from exc
        left = await self.outbox_ids(store, epoch)
        assert left == [ids[3]], f"the outbox must hold {[ids[3]]}, not {left}"
        _, state = await self.lead_after_crash(cluster, store)
        assert [(r.task_id, r.status) for r in state.tasks] == [
            (1, Status.SUCCEEDED), (2, Status.READY)
        ]  # fmt: skip

    async def test_an_outbox_read_returns_committed_rows_oldest_id_first_up_to_its_limit(
        self, cluster: StoreHarness
    ) -> None:
        """``read(epoch, limit)`` returns at most ``limit`` committed rows, the oldest ids
        first, as the application wrote them: none of a transaction still open (whatever its
        id: one begun first may commit last), none of one rolled back; ``stats()`` counts them
        and gives the oldest enqueue time."""
        self.require(cluster, Capability.OUTBOX)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        outbox = outbox_of(store)
        pending = await cluster.begin_outbox_row("pending", b"begun first", '{"key": "p"}')
        rolled_back = await cluster.begin_outbox_row("rolled back", b"never", "{}")
        ids = await self.put_outbox_rows(cluster, 5)
        written = {row_id: OUTBOX_ROWS[i] for i, row_id in enumerate(ids)}
        rows = await outbox.read(epoch, OUTBOX_PAGE)
        assert [r.row_id for r in rows] == sorted(ids), (
            f"read() must return the committed rows {sorted(ids)}, oldest id first, and no row "
            f"of a transaction still open, not {[r.row_id for r in rows]}"
        )
        assert [(r.kind, r.payload, json.loads(r.options)) for r in rows] == [
            (kind, payload, json.loads(options))
            for kind, payload, options in (written[i] for i in sorted(ids))
        ], "read() must return each row's kind, payload and options as written"
        for limit in (1, 3):
            got = [r.row_id for r in await outbox.read(epoch, limit)]
            assert got == sorted(ids)[:limit], (
                f"read(epoch, {limit}) must return the {limit} oldest ids, not {got}"
            )
        stats = await outbox.stats()
        oldest = min(r.enqueued_unix_ns for r in rows)
        assert (stats.depth, stats.oldest_enqueued_unix_ns) == (len(ids), oldest), (
            f"stats() must count the committed rows and give the oldest one's time: {stats}"
        )
        await rolled_back.rollback()
        every = sorted([*ids, await pending.commit()])
        got = [r.row_id for r in await outbox.read(epoch, OUTBOX_PAGE)]
        assert got == every, (
            f"once committed, a row begun first is read in its id's place: {every}, not {got}"
        )
        got = [r.row_id for r in await outbox.read(epoch, 2)]
        assert got == every[:2], f"read(epoch, 2) must return the 2 oldest ids, not {got}"
        assert (await outbox.stats()).depth == len(every)

    async def test_an_outbox_read_never_returns_a_row_a_commit_in_doubt_may_still_take(
        self, cluster: StoreHarness
    ) -> None:
        """A transactional outbox reads only once every write of this leader whose outcome
        it did not learn is over or can no longer land: a row ``read()`` returns must not be
        taken by a commit statement of the leader still on its way (the ingest would submit
        the row a second time). And a commit that does not land takes none of its rows, also
        when its statement never reaches the database."""
        self.require(cluster, Capability.OUTBOX)
        self.require(cluster, Capability.LATE_STATEMENT)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        ids = await self.put_outbox_rows(cluster, 2)
        at = now_ns()
        await cluster.hold_next_commit(store)
        with pytest.raises(StoreError):
            await store.commit(epoch, [submitted(1, at), OutboxTaken((ids[0],))])
        returned = await self.outbox_ids(store, epoch)
        await cluster.release_held_commit(store)
        left = await self.outbox_ids(store, epoch)
        taken = [i for i in returned if i not in left]
        assert taken == [], (
            f"read() returned rows {taken} that a commit statement in doubt then took (task 1 "
            f"{'written' if await store.get_task(1) else 'not written'}): read only once "
            "every write whose outcome the leader did not learn is over or fenced"
        )
        assert ids[1] in returned, f"read() must return the rows no commit takes: {returned}"
        if await store.get_task(1) is None:
            assert ids[0] in left, (
                f"a commit that did not land (task 1 was not written) took outbox row {ids[0]}: "
                "rows are taken in the batch's transaction, not in one of their own before it"
            )

    async def test_quarantined_outbox_rows_keep_their_reasons_and_are_listed_in_id_order(
        self, cluster: StoreHarness
    ) -> None:
        """``quarantine(epoch, rows)`` moves rows out of the outbox with their reasons;
        ``quarantined(after, limit)`` lists them in id order, ids above ``after``, at most
        ``limit``, each as written with its reason, on any instance."""
        self.require(cluster, Capability.OUTBOX)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        outbox = outbox_of(store)
        ids = await self.put_outbox_rows(cluster, 5)
        before = {r.row_id: r for r in await outbox.read(epoch, OUTBOX_PAGE)}
        reasons = {ids[3]: "unknown kind 'k…'", ids[1]: "options are not JSON:\nline 2 \ufffd"}
        await outbox.quarantine(epoch, list(reasons.items()))
        left = await self.outbox_ids(store, epoch)
        assert left == [ids[0], ids[2], ids[4]], f"quarantine moves rows out: {left} are left"
        expected = [(*outbox_fields(before[i]), reasons[i]) for i in sorted(reasons)]

        async def listed(instance: Store, after: int, limit: int) -> list[tuple[object, ...]]:
            rows = await outbox_of(instance).quarantined(after, limit)
            assert all(r.quarantined_unix_ns >= r.enqueued_unix_ns for r in rows), rows
            return [(*outbox_fields(r), r.reason) for r in rows]

        assert await listed(store, 0, OUTBOX_PAGE) == expected, (
            "quarantined() must list every quarantined row in id order, as written, each with "
            "its own reason"
        )
        assert await listed(store, sorted(reasons)[0], OUTBOX_PAGE) == expected[1:], (
            "quarantined(after, ...) lists only ids above `after`"
        )
        assert await listed(store, 0, 1) == expected[:1], "quarantined(0, 1) lists one row"
        other = await cluster.open()
        await cluster.crash(store)
        await self.lead(other)
        assert await listed(other, 0, OUTBOX_PAGE) == expected, "the quarantine is durable"

    async def test_a_fenced_quarantine_moves_no_outbox_row(self, cluster: StoreHarness) -> None:
        """``quarantine`` is fenced like a commit: by an epoch that no longer leads (also a
        leader replaced behind its back that has not noticed) it moves nothing and raises
        ``Fenced``."""
        self.require(cluster, Capability.OUTBOX)
        first = await cluster.open()
        epoch, _ = await self.lead(first)
        ids = await self.put_outbox_rows(cluster, 3)
        told: list[object] = []
        if self.can_replace_behind_its_back(cluster):
            replaced = await self.replaced_without_knowing(cluster, first)
            try:
                await outbox_of(first).quarantine(epoch, [(ids[0], "by a replaced leader")])
                told.append("nothing: the quarantine returned")
            except StoreError as exc:
                told.append(exc)
        else:
            replaced = None
        successor, successor_epoch, _ = await self.successor_after(cluster, first, replaced)
        try:
            await outbox_of(successor).quarantine(epoch, [(ids[1], "by an older epoch")])
            told.append("nothing: the quarantine returned")
        except StoreError as exc:
            told.append(exc)
        moved = [r.row_id for r in await outbox_of(successor).quarantined(0, OUTBOX_PAGE)]
        assert moved == [], f"a quarantine by an epoch that no longer leads moved rows {moved}"
        assert all(isinstance(t, Fenced) for t in told), (
            f"a quarantine by an epoch that no longer leads must raise Fenced, not {told}"
        )
        assert await self.outbox_ids(successor, successor_epoch) == ids
        # The check can fail: the leader's quarantine moves them.
        await outbox_of(successor).quarantine(successor_epoch, [(ids[0], "now")])
        moved = [r.row_id for r in await outbox_of(successor).quarantined(0, OUTBOX_PAGE)]
        assert moved == [ids[0]]

    async def test_requeue_and_discard_move_quarantined_rows_and_stats_count_them(
        self, cluster: StoreHarness
    ) -> None:
        """``requeue(ids)`` moves quarantined rows back into the outbox with their ids and
        contents, ``discard(ids)`` deletes quarantined rows; each returns how many it moved or
        deleted, and touches no row that is not quarantined. ``stats()`` counts the outbox and
        the quarantine and gives the oldest enqueue time of the outbox (None when empty)."""
        self.require(cluster, Capability.OUTBOX)
        store = await cluster.open()
        epoch, _ = await self.lead(store)
        outbox = outbox_of(store)
        ids = await self.put_outbox_rows(cluster, 5)
        rows = {r.row_id: r for r in await outbox.read(epoch, OUTBOX_PAGE)}
        unknown = max(ids) + 1000

        async def stats() -> tuple[int, int | None, int]:
            found = await outbox.stats()
            return found.depth, found.oldest_enqueued_unix_ns, found.quarantined

        def oldest(row_ids: Sequence[int]) -> int:
            return min(rows[i].enqueued_unix_ns for i in row_ids)

        assert await stats() == (5, oldest(ids), 0), "stats() of five rows"
        await outbox.quarantine(epoch, [(ids[0], "a"), (ids[2], "c"), (ids[3], "d")])
        assert await stats() == (2, oldest([ids[1], ids[4]]), 3), "stats() after a quarantine"
        moved = await outbox.requeue([ids[2], ids[1], unknown])
        assert moved == 1, f"requeue of one quarantined row (and of others) must return 1: {moved}"
        back = await outbox.read(epoch, OUTBOX_PAGE)
        assert [outbox_fields(r) for r in back] == [
            outbox_fields(rows[i]) for i in (ids[1], ids[2], ids[4])
        ], "a requeued row is back in the outbox with its id, as written, in its id's place"
        listed = [r.row_id for r in await outbox.quarantined(0, OUTBOX_PAGE)]
        assert listed == [ids[0], ids[3]], f"a requeued row leaves the quarantine: {listed}"
        deleted = await outbox.discard([ids[3], ids[1], unknown])
        assert deleted == 1, (
            f"discard of one quarantined row (and of others) must return 1: {deleted}"
        )
        listed = [r.row_id for r in await outbox.quarantined(0, OUTBOX_PAGE)]
        assert listed == [ids[0]], f"a discarded row leaves the quarantine: {listed}"
        left = await self.outbox_ids(store, epoch)
        assert left == [ids[1], ids[2], ids[4]], f"discard deletes only quarantined rows: {left}"
        assert await stats() == (3, oldest(left), 1), "stats() after a requeue and a discard"
        assert await outbox.discard([ids[0]]) == 1
        await store.commit(epoch, [submitted(1, now_ns()), OutboxTaken(tuple(left))])
        assert await stats() == (0, None, 0), "stats() of an empty outbox and quarantine"
