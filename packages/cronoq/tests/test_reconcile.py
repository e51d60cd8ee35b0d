"""batch_landed: whether a batch whose commit failed is in the state recovered afterwards."""

from __future__ import annotations

from cronoq._model import ScheduleSpec, Status, TaskSpec, TaskTemplate
from cronoq._reconcile import batch_landed
from cronoq.store import (
    CancelRequested,
    RecoveredState,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    TaskRecord,
    TaskSubmitted,
    TaskUpdated,
)

SPEC = TaskSpec("default", "job", b"")
SCHEDULE = ScheduleSpec("nightly", "0 3 * * *", "UTC", TaskTemplate("default", "job", b""))


def state(
    *tasks: TaskRecord, max_task_id: int = 0, schedules: tuple[ScheduleRecord, ...] = ()
) -> RecoveredState:
    return RecoveredState(max(max_task_id, *(t.task_id for t in tasks), 0), tasks, schedules)


def running(
    task_id: int, attempt: int, at: int, message: str = "started", cancel_requested: bool = False
) -> TaskRecord:
    return TaskRecord(
        task_id, SPEC, Status.RUNNING, attempt, message, 1, at, cancel_requested=cancel_requested
    )


def test_a_submission_landed_iff_the_high_water_mark_reached_its_id() -> None:
    batch = [TaskSubmitted(7, SPEC, Status.READY, 100)]
    assert batch_landed(batch, state(max_task_id=7)) is True
    assert batch_landed(batch, state(max_task_id=6)) is False


def test_the_last_update_of_a_row_decides() -> None:
    batch = [
        TaskUpdated(3, Status.RUNNING, 2, "attempt 2 started", 50),
        TaskUpdated(3, Status.SUCCEEDED, 2, "attempt 2 succeeded", 60),
    ]
    done = TaskRecord(3, SPEC, Status.SUCCEEDED, 2, "attempt 2 succeeded", 1, 60)
    assert batch_landed(batch, state(done)) is True
    assert batch_landed(batch, state(running(3, 1, 40))) is False


def test_a_cancel_request_landed_iff_the_row_carries_it() -> None:
    batch = [CancelRequested(3, 70, "stop\x00")]
    flagged = running(3, 1, 40, cancel_requested=True, message="stop\ufffd")
    assert batch_landed(batch, state(flagged)) is True
    assert batch_landed(batch, state(running(3, 1, 40))) is False


def test_schedules_landed_iff_the_row_matches() -> None:
    saved = ScheduleRecord(SCHEDULE, 1000, paused=True)
    assert batch_landed([ScheduleSaved(saved)], state(schedules=(saved,))) is True
    before = ScheduleRecord(SCHEDULE, 1000, paused=False)
    assert batch_landed([ScheduleSaved(saved)], state(schedules=(before,))) is False
    assert batch_landed([ScheduleRemoved("nightly")], state(schedules=(before,))) is False
    assert batch_landed([ScheduleRemoved("nightly")], state()) is True


def test_rows_recovery_does_not_load_cannot_tell() -> None:
    batch = [TaskUpdated(3, Status.SUCCEEDED, 1, "done", 60)]
    assert batch_landed(batch, state()) is None
