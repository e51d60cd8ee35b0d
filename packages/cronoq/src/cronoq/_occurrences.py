"""The occurrence ledger as the API shows it (``Scheduler.occurrences``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from cronoq._model import NS_PER_S, OccurrenceOutcome
from cronoq._mutations import OccurrenceRecorded

__all__ = ["OccurrenceInfo"]


def _utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / NS_PER_S, UTC)


@dataclass(frozen=True, slots=True)
class OccurrenceInfo:
    """What became of a schedule's occurrences due from ``due_at`` up to (not including)
    ``until``: one occurrence, or several decided together (``coalesced``, ``missed``,
    ``paused`` after downtime or a pause). Every occurrence that came due is in exactly one
    record of its schedule."""

    schedule: str
    due_at: datetime
    until: datetime
    """The schedule's next occurrence after this record was decided (exclusive)."""
    outcome: OccurrenceOutcome
    task_id: int | None
    """The task it created (started, coalesced), or the earlier task that was still live
    (skipped); None otherwise."""
    decided_at: datetime
    message: str
    """Why, for people (empty for a plain start)."""

    @classmethod
    def of(cls, record: OccurrenceRecorded) -> OccurrenceInfo:
        return cls(
            record.schedule,
            _utc(record.due_ns),
            _utc(record.until_ns),
            record.outcome,
            record.task_id,
            _utc(record.at_ns),
            record.message,
        )
