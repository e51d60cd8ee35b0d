"""What the outbox calls of ``AsyncClient`` return: the outbox's figures and its quarantined
rows as the server sends them (bounded: a row written by hand may hold anything)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["OutboxStatus", "QuarantinedOutboxRow"]


@dataclass(frozen=True, slots=True)
class OutboxStatus:
    """The leader's outbox now (``cronoq outbox status``)."""

    depth: int
    """Rows waiting to be ingested."""
    oldest_enqueued_at: datetime | None
    """When the oldest waiting row was written (the database's clock); None: none waits."""
    oldest_age: timedelta | None
    """Its age by the server's clock; None: none waits."""
    quarantined: int
    """Rows in the quarantine."""
    ingested_by_leader: int
    """Rows the current leader turned into tasks since it began leading."""
    quarantined_by_leader: int
    """Rows the current leader quarantined since it began leading."""


@dataclass(frozen=True, slots=True)
class QuarantinedOutboxRow:
    """A row that could not become a task, kept until it is requeued or discarded. Its text
    fields are cut at the protocol's bounds (a cut one ends with ``...``), its payload at
    1 KiB: ``payload_size`` is the whole payload's length."""

    row_id: int
    kind: str
    payload_size: int
    payload_head: bytes
    """The payload's first bytes (at most 1,024): the bytes the application's codec made."""
    options: str
    """The options' JSON object, as stored."""
    enqueued_at: datetime
    reason: str
    """Why it could not become a task (``UnknownPool: unknown pool 'x'; configured: ...``)."""
    quarantined_at: datetime
