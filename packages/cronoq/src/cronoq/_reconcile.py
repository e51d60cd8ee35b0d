"""Did a batch whose commit failed land anyway? Read off the state recovered afterwards.

A commit that timed out or lost its reply may have been applied. Stores apply a batch whole or
not at all, and the driver commits nothing else in between, so one mutation of the batch that is
visibly there (or visibly not) decides for the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from cronoq._mutations import (
    CancelRequested,
    Mutation,
    PoolPaused,
    ScheduleRemoved,
    ScheduleSaved,
    TaskRetried,
    TaskSubmitted,
    TaskUpdated,
    sanitize_message,
)
from cronoq.store import RecoveredState

__all__ = ["batch_landed"]


def batch_landed(batch: Sequence[Mutation], state: RecoveredState) -> bool | None:
    """True if ``batch`` is in ``state``, False if it is not, None if the state cannot tell
    (every row the batch touched is outside what recovery loads)."""
    tasks = {record.task_id: record for record in state.tasks}
    schedules = {record.spec.name: record for record in state.schedules}
    # A submission decides for sure (ids only grow, the mark survives pruning); a schedule
    # saved unchanged, or a pool paused and resumed in one batch, matches either way, so
    # schedules and pools are asked last.
    submitted = [m.task_id for m in batch if isinstance(m, TaskSubmitted)]
    if submitted:
        return state.max_task_id >= max(submitted)
    last = ScheduleSaved | ScheduleRemoved | PoolPaused
    ordered: list[Mutation] = [m for m in batch if isinstance(m, last)]
    ordered += [m for m in batch if not isinstance(m, last)]
    # From the end: the last mutation of a row is the row's state after the batch.
    for mutation in reversed(ordered):
        match mutation:
            case TaskSubmitted(task_id=task_id):
                # Ids only grow and the high-water mark survives pruning.
                return state.max_task_id >= task_id
            case TaskUpdated(task_id=task_id) | TaskRetried(task_id=task_id):
                row = tasks.get(task_id)
                if row is not None:
                    return (row.status, row.attempt, row.updated_ns) == (
                        mutation.status,
                        mutation.attempt,
                        mutation.at_ns,
                    )
            case CancelRequested(task_id=task_id):
                row = tasks.get(task_id)
                if row is not None:
                    return row.cancel_requested and row.message == sanitize_message(
                        mutation.message
                    )
            case ScheduleSaved(schedule=saved):
                return schedules.get(saved.spec.name) == saved
            case ScheduleRemoved(name=name):
                return name not in schedules
            case PoolPaused(name=name, paused=paused):
                return (name in state.paused_pools) == paused
    return None
