"""A commit's statement holds only the parts its batch needs (new tasks, changes, saved and
removed schedules): every combination writes what it holds, and is fenced all the same."""

from __future__ import annotations

import itertools
import time

import pytest
from pg_fault_helpers import config, query
from pg_harness import DSN, drop_schema, new_schema

from cronoq import Status
from cronoq.errors import Fenced
from cronoq.store import (
    Mutation,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    ScheduleSpec,
    TaskSpec,
    TaskSubmitted,
    TaskTemplate,
    TaskUpdated,
    TimeBase,
)
from cronoq_store_postgres import PgStore, _commit
from cronoq_store_postgres._schema import quote_ident

HOUR_NS = 3600 * 1_000_000_000


def _schedule(name: str) -> ScheduleRecord:
    template = TaskTemplate("default", "job", b"")
    return ScheduleRecord(ScheduleSpec(name, "* * * * *", "UTC", template), time.time_ns())


async def test_every_combination_of_parts_writes_what_it_holds(schema: str) -> None:
    store = await PgStore.connect(DSN, config(schema))
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        next_id = lease.epoch << 40 | 1
        expected_tasks: dict[int, Status] = {}
        expected_schedules: set[str] = set()
        for n, (new, change, save, remove) in enumerate(itertools.product((False, True), repeat=4)):
            # What the batch's changes and removals act on, committed first.
            existing = next_id
            kept = f"kept-{n}"
            await store.commit(
                lease.epoch,
                [
                    TaskSubmitted(existing, TaskSpec("default", "job", b""), Status.READY, 1),
                    ScheduleSaved(_schedule(kept)),
                ],
            )
            expected_tasks[existing] = Status.READY
            expected_schedules.add(kept)
            next_id += 1
            batch: list[Mutation] = []
            if new:
                spec = TaskSpec("default", "job", b"p", tags=("t",), after=(existing,))
                batch.append(TaskSubmitted(next_id, spec, Status.WAITING, 2))
                expected_tasks[next_id] = Status.WAITING
                next_id += 1
            if change:
                batch.append(TaskUpdated(existing, Status.RUNNING, 1, "started", 3))
                expected_tasks[existing] = Status.RUNNING
            if save:
                batch.append(ScheduleSaved(_schedule(f"saved-{n}")))
                expected_schedules.add(f"saved-{n}")
            if remove:
                batch.append(ScheduleRemoved(kept))
                expected_schedules.discard(kept)
            if batch:
                await store.commit(lease.epoch, batch)
        state = await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        assert {t.task_id: t.status for t in state.tasks} == expected_tasks
        assert {s.spec.name for s in state.schedules} == expected_schedules
        assert state.max_task_id == next_id - 1
    finally:
        await store.close()


@pytest.mark.parametrize(
    "batch",
    [
        [TaskUpdated(1, Status.RUNNING, 1, "started", 3)],
        [ScheduleSaved(_schedule("late"))],
        [ScheduleRemoved("gone")],
    ],
    ids=["changes", "saved", "removed"],
)
async def test_a_batch_without_new_tasks_is_fenced_too(schema: str, batch: list[Mutation]) -> None:
    store = await PgStore.connect(DSN, config(schema))
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        await query(f"UPDATE {quote_ident(schema)}.cronoq_leader SET epoch = epoch + 1")
        with pytest.raises(Fenced):
            await store.commit(lease.epoch, batch)
    finally:
        await store.close()


async def test_a_batch_that_landed_before_is_taken_again_as_it_was(schema: str) -> None:
    """New tasks are inserted plainly first; a taken id (the driver retrying a commit whose
    outcome it did not learn) runs the statement again with ON CONFLICT, which finds the same
    rows: no clash, and the rest of the batch is applied as before."""
    store = await PgStore.connect(DSN, config(schema))
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        first, second = lease.epoch << 40 | 1, lease.epoch << 40 | 2
        batch: list[Mutation] = [
            TaskSubmitted(first, TaskSpec("default", "job", b""), Status.READY, 1),
            TaskSubmitted(second, TaskSpec("default", "job", b""), Status.READY, 1),
            TaskUpdated(first, Status.RUNNING, 1, "started", 2),
            ScheduleSaved(_schedule("s")),
        ]
        await store.commit(lease.epoch, batch)
        await store.commit(lease.epoch, batch)
        state = await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        assert {t.task_id: t.status for t in state.tasks} == {
            first: Status.RUNNING,
            second: Status.READY,
        }
        assert [s.spec.name for s in state.schedules] == ["s"]
    finally:
        await store.close()


async def test_a_schema_name_that_looks_like_sql_parameters_is_only_a_name() -> None:
    # The statement is assembled from parts and numbered parameters: a "$1" in the (quoted)
    # schema name must stay as it is, or the commit would write into another schema.
    schema = f"{new_schema()}$1$20"
    store = await PgStore.connect(DSN, config(schema))
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        task_id = lease.epoch << 40 | 1
        batch: list[Mutation] = [
            TaskSubmitted(task_id, TaskSpec("default", "job", b""), Status.READY, 1),
            ScheduleSaved(_schedule("s")),
        ]
        await store.commit(lease.epoch, batch)
        await store.commit(lease.epoch, batch)  # again: the ON CONFLICT variant too
        rows = await query(f"SELECT id FROM {quote_ident(schema)}.cronoq_tasks")
        assert [row["id"] for row in rows] == [task_id]
    finally:
        await store.close()
        await drop_schema(schema)


async def test_batches_of_shapes_past_the_bound_go_as_arrays_and_write_alike(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Statements with scalar columns are kept for MAX_SHAPES shapes only (each is prepared on
    every pooled connection); a batch of another shape sends every column as an array."""
    monkeypatch.setattr(_commit, "MAX_SHAPES", 1)
    store = await PgStore.connect(DSN, config(schema))
    try:
        lease = await store.acquire_leadership()
        await store.recover(lease.epoch, TimeBase(), HOUR_NS)
        first = lease.epoch << 40 | 1
        specs = [
            [TaskSpec("default", "job", b"a"), TaskSpec("default", "job", b"b")],
            [TaskSpec("default", "one", b"a"), TaskSpec("mail", "two", b"a", key="k")],
            [TaskSpec("default", "job", b"a", key="x"), TaskSpec("default", "job", b"a")],
        ]
        expected: dict[int, TaskSpec] = {}
        for batch_specs in specs:
            batch: list[Mutation] = []
            for spec in batch_specs:
                task_id = first + len(expected)
                batch.append(TaskSubmitted(task_id, spec, Status.READY, 1))
                expected[task_id] = spec
            await store.commit(lease.epoch, batch)
        assert len(store._sql.commit._shapes) == 1
        for task_id, spec in expected.items():
            record = await store.get_task(task_id)
            assert record is not None
            assert record.spec == spec
    finally:
        await store.close()
