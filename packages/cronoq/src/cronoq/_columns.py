"""A batch's new tasks as columns (one list per column), for stores that insert in bulk.

A SQL store binds a column whose values are all equal (the pool, the status, a NULL key) as
one value and the others per row; building the columns once here keeps the stores to the
translation into their own statements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cronoq._collapse import NewTask
from cronoq._rows import encode_task_options

__all__ = ["NEW_TASK_COLUMNS", "new_task_columns", "varies"]

NEW_TASK_COLUMNS = (
    "id",
    "pool",
    "kind",
    "key",
    "payload",
    "options",
    "status",
    "attempt",
    "message",
    "submitted",
    "updated",
    "due",
    "finished",
    "output",
    "cancel",
    "lease_epoch",
    "lease_hash",
    "started",
)
"""The names of ``new_task_columns()``' lists, in order (times in Unix nanoseconds)."""


def new_task_columns(new: Sequence[NewTask], unix: Callable[[int], int]) -> list[list[object]]:
    """One list per name of ``NEW_TASK_COLUMNS``; ``unix``: the TimeBase's ``to_unix``."""

    def maybe(ns: int | None) -> int | None:
        return None if ns is None else unix(ns)

    # A new task has a lease only when it was submitted and started remotely in one batch:
    # most batches have none, and two columns of NULLs need no look at each task's lease.
    leases = [t.lease for t in new]
    if leases.count(None) == len(leases):
        lease_epochs: list[object] = [None] * len(leases)
        lease_hashes: list[object] = [None] * len(leases)
    else:
        lease_epochs = [None if lease is None else lease.epoch for lease in leases]
        lease_hashes = [None if lease is None else lease.id_hash for lease in leases]
    # Likewise a start: only a task submitted and started in one batch has one.
    starts = [t.started_ns for t in new]
    if starts.count(None) == len(starts):
        started: list[object] = [None] * len(starts)
    else:
        started = [maybe(ns) for ns in starts]
    # Spelled out as comprehensions, not one extractor per column: a call per value would
    # cost about a millisecond per 1,000 tasks.
    return [
        [t.task_id for t in new],
        [t.spec.pool for t in new],
        [t.spec.kind for t in new],
        [t.spec.key for t in new],
        [t.spec.payload for t in new],
        [encode_task_options(t.spec) for t in new],
        [t.status.value for t in new],
        [t.attempt for t in new],
        [t.message for t in new],
        [unix(t.submitted_ns) for t in new],
        [unix(t.updated_ns) for t in new],
        [maybe(t.due_ns) for t in new],
        [maybe(t.finished_ns) for t in new],
        [t.output for t in new],
        [t.cancel_requested for t in new],
        lease_epochs,
        lease_hashes,
        started,
    ]


def varies(column: Sequence[object]) -> bool:
    """Whether the column holds two unequal values (an empty column does not vary)."""
    return bool(column) and column.count(column[0]) != len(column)
