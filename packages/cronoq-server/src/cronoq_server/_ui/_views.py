"""What the pages show, from the request's query and the scheduler's answers: pure functions,
each bounded (a query's fields, a page's size, a preview's length)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import overload
from urllib.parse import urlencode

from cronoq import AttemptInfo, OccurrenceInfo, OccurrenceOutcome, Status, TaskInfo
from cronoq import preview as cron_preview
from cronoq.errors import CronoqError, InvalidArgument
from cronoq.store import QuarantinedRow
from cronoq_client.protocol import cut_text

__all__ = [
    "DEFAULT_PAGE",
    "MAX_PAGE",
    "OUTBOX_PAYLOAD_BYTES",
    "OUTBOX_REASON_BYTES",
    "OUTBOX_TEXT_BYTES",
    "PREVIEW_BYTES",
    "AttemptRow",
    "OccurrenceQuery",
    "OccurrenceRow",
    "OutboxQuery",
    "Preview",
    "QuarantineRow",
    "TaskQuery",
    "attempt_rows",
    "duration",
    "occurrence_rows",
    "parse_id",
    "preview",
    "quarantine_rows",
]

DEFAULT_PAGE = 50
MAX_PAGE = 200
"""Tasks one page lists at most: one bounded ``list`` call, one bounded render."""
MAX_FIELD = 1024
"""Characters of a query field (a key may be 1,024; names and tags 255, which the scheduler
checks)."""
PREVIEW_BYTES = 4096
"""Bytes of a payload or output a task's page shows."""
OUTBOX_TEXT_BYTES = 256
"""Bytes of a quarantined row's kind and options the outbox page shows: a row written by hand
may hold anything, and a table cell is small."""
OUTBOX_REASON_BYTES = 4096
"""Bytes of a quarantined row's reason the outbox page shows, as many as the wire carries:
the scheduler's checks bound their own messages, but a codec's error may be any length."""
OUTBOX_PAYLOAD_BYTES = 64
"""Bytes of a quarantined row's payload the outbox page shows: enough to tell what it was,
little enough to leave its reason room."""
_MAX_ID = 2**63 - 1


def parse_id(text: str, what: str, minimum: int = 1) -> int:
    if not text.isascii() or not text.isdigit() or len(text) > 19:
        raise InvalidArgument(f"{what} must be a whole number, got {text[:40]!r}")
    value = int(text)
    if not minimum <= value <= _MAX_ID:
        raise InvalidArgument(f"{what} must be between {minimum} and {_MAX_ID}")
    return value


def _field(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name, "").strip()
    if len(value) > MAX_FIELD:
        raise InvalidArgument(f"{name} is longer than {MAX_FIELD} characters")
    return value or None


@dataclass(frozen=True, slots=True)
class TaskQuery:
    """The tasks page's filters, order and place: the newest first unless ``oldest_first``;
    ``before`` (newest first) or ``after`` (oldest first) is the scheduler's page token, the
    last id of the previous page."""

    status: Status | None = None
    pool: str | None = None
    kind: str | None = None
    tag: str | None = None
    key: str | None = None
    after: int | None = None
    limit: int = DEFAULT_PAGE
    before: int | None = None
    oldest_first: bool = False

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> TaskQuery:
        """InvalidArgument, saying which field, for anything out of bounds."""
        status = _field(query, "status")
        if status is not None and status not in Status._value2member_map_:
            choices = ", ".join(s.value for s in Status)
            raise InvalidArgument(f"status must be one of {choices}, got {status[:40]!r}")
        after = _field(query, "after")
        before = _field(query, "before")
        order = _field(query, "order")
        if order not in (None, "newest", "oldest"):
            raise InvalidArgument(f"order must be newest or oldest, got {order[:40]!r}")
        limit = _field(query, "limit")
        size = DEFAULT_PAGE if limit is None else parse_id(limit, "limit")
        if size > MAX_PAGE:
            raise InvalidArgument(f"limit must be at most {MAX_PAGE}")
        return cls(
            None if status is None else Status(status),
            _field(query, "pool"),
            _field(query, "kind"),
            _field(query, "tag"),
            _field(query, "key"),
            None if after is None else parse_id(after, "after", 0),
            size,
            None if before is None else parse_id(before, "before", 0),
            order == "oldest",
        )

    def filters(self) -> dict[str, str]:
        fields = {
            "status": None if self.status is None else self.status.value,
            "pool": self.pool,
            "kind": self.kind,
            "tag": self.tag,
            "key": self.key,
        }
        if self.limit != DEFAULT_PAGE:
            fields["limit"] = str(self.limit)
        if self.oldest_first:
            fields["order"] = "oldest"
        return {name: value for name, value in fields.items() if value is not None}

    @property
    def paged(self) -> bool:
        """Not the first page: it starts after the previous page's last id."""
        return (self.after if self.oldest_first else self.before) is not None

    def page(self, last: int | None) -> str:
        """The query string of the page that follows the id ``last`` in this order, with the
        same filters and the same bound at the far end (None: the first page)."""
        fields = self.filters()
        if self.oldest_first and self.before is not None:
            fields["before"] = str(self.before)
        elif not self.oldest_first and self.after is not None:
            fields["after"] = str(self.after)
        if last is not None:
            fields["after" if self.oldest_first else "before"] = str(last)
        return urlencode(fields)

    def reordered(self) -> str:
        """The query string of the first page in the other order, with the same filters."""
        fields = self.filters()
        if self.oldest_first:
            del fields["order"]
        else:
            fields["order"] = "oldest"
        return urlencode(fields)


@dataclass(frozen=True, slots=True)
class OutboxQuery:
    """The outbox page's place: the quarantined rows of ids above ``after``, ``limit`` of them
    (``after`` is the last id of the previous page)."""

    after: int | None = None
    limit: int = DEFAULT_PAGE

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> OutboxQuery:
        """InvalidArgument, saying which field, for anything out of bounds."""
        after = _field(query, "after")
        limit = _field(query, "limit")
        size = DEFAULT_PAGE if limit is None else parse_id(limit, "limit")
        if size > MAX_PAGE:
            raise InvalidArgument(f"limit must be at most {MAX_PAGE}")
        return cls(None if after is None else parse_id(after, "after", 0), size)

    def page(self, last: int | None) -> str:
        """The query string of the page after the row id ``last`` (None: the first page)."""
        fields = {} if self.limit == DEFAULT_PAGE else {"limit": str(self.limit)}
        if last is not None:
            fields["after"] = str(last)
        return urlencode(fields)


_MAX_INSTANT = 64
"""Characters of an ISO 8601 time in a query (``2026-07-01T03:00:00.123456+05:30`` is 32)."""


@dataclass(frozen=True, slots=True)
class OccurrenceQuery:
    """A schedule's page: its ``name`` (exact: not stripped), and its place in the occurrence
    ledger, ``limit`` records due before ``before`` (the due time of the previous page's last
    record; None: the newest)."""

    name: str
    before: datetime | None = None
    limit: int = DEFAULT_PAGE

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> OccurrenceQuery:
        """InvalidArgument, saying which field, for anything out of bounds (the scheduler
        checks the name's own bounds: 255 characters)."""
        name = query.get("name", "")
        if not name:
            raise InvalidArgument("name is required: the schedule's name")
        if len(name) > MAX_FIELD:
            raise InvalidArgument(f"name is longer than {MAX_FIELD} characters")
        before = _field(query, "before")
        limit = _field(query, "limit")
        size = DEFAULT_PAGE if limit is None else parse_id(limit, "limit")
        if size > MAX_PAGE:
            raise InvalidArgument(f"limit must be at most {MAX_PAGE}")
        return cls(name, None if before is None else _instant_of(before, "before"), size)

    def page(self, last: datetime | None) -> str:
        """The query string of the page of records due before ``last`` (None: the newest)."""
        fields = {"name": self.name}
        if self.limit != DEFAULT_PAGE:
            fields["limit"] = str(self.limit)
        if last is not None:
            fields["before"] = last.isoformat()
        return urlencode(fields)


def _instant_of(text: str, what: str) -> datetime:
    refused = InvalidArgument(
        f"{what} must be an ISO 8601 time with its UTC offset (a record's due time, "
        f"2026-07-01T03:00:00+00:00), got {text[:40]!r}"
    )
    if len(text) > _MAX_INSTANT:
        raise refused
    try:
        moment = datetime.fromisoformat(text)
        if moment.tzinfo is None or moment.utcoffset() is None:
            raise refused
        moment = moment.astimezone(UTC)
    except (ValueError, OverflowError):  # not a time, or past year 1 or 9999 in UTC
        raise refused from None
    if not _EARLIEST <= moment <= _LATEST:
        raise InvalidArgument(
            f"{what} must be between {_EARLIEST:%Y-%m-%d} and {_LATEST:%Y-%m-%d} (what a store "
            "keeps: Unix nanoseconds in 64 bits)"
        )
    return moment


_EARLIEST = datetime(1678, 1, 1, tzinfo=UTC)
_LATEST = datetime(2262, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class OccurrenceRow:
    """A ledger record as a schedule's page shows it."""

    due_at: datetime
    until: datetime
    outcome: OccurrenceOutcome
    task_id: int | None
    decided_at: datetime
    message: str
    several: bool
    """It covers more than the occurrence due at ``due_at``: those up to ``until`` (not
    included) were decided together."""


def occurrence_rows(
    records: Sequence[OccurrenceInfo], cron: str | None, timezone: str
) -> list[OccurrenceRow]:
    """The rows of a page of the ledger. A record covers several occurrences when the
    schedule's next occurrence after its due time comes before its ``until``, as the scheduler
    decides it; without the cron (a removed schedule, or one that no longer parses), every
    record shows its span. CPU work (a cron step a record): run it off the event loop."""
    rows = []
    for record in records:
        several = True
        if cron is not None:
            try:
                (following,) = cron_preview(cron, timezone, 1, after=record.due_at)
            except CronoqError:
                pass
            else:
                several = following < record.until
        rows.append(
            OccurrenceRow(
                record.due_at,
                record.until,
                record.outcome,
                record.task_id,
                record.decided_at,
                record.message,
                several,
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class QuarantineRow:
    """A quarantined outbox row as the outbox page shows it, its fields bounded."""

    row_id: int
    kind: str
    enqueued: datetime
    quarantined: datetime
    reason: str
    options: str
    payload: Preview


def quarantine_rows(rows: Sequence[QuarantinedRow]) -> list[QuarantineRow]:
    return [
        QuarantineRow(
            row.row_id,
            cut_text(row.kind, OUTBOX_TEXT_BYTES),
            _instant(row.enqueued_unix_ns),
            _instant(row.quarantined_unix_ns),
            cut_text(row.reason, OUTBOX_REASON_BYTES),
            cut_text(row.options, OUTBOX_TEXT_BYTES),
            _whole(preview(row.payload, OUTBOX_PAYLOAD_BYTES), row.payload_size),
        )
        for row in rows
    ]


def _whole(shown: Preview, size: int) -> Preview:
    """A preview of a listing's payload head, with the whole payload's size."""
    return dataclasses.replace(shown, size=size, truncated=shown.truncated or size > shown.size)


def _instant(unix_ns: int) -> datetime:
    return datetime.fromtimestamp(unix_ns / 1e9, UTC)


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt of a task's page. ``ended`` is None while it runs; ``started`` is None
    only when the scheduler does not know it."""

    attempt: int
    started: datetime | None
    ended: datetime | None
    message: str
    """What happened, without the traceback."""
    traceback: str | None = None

    @property
    def duration(self) -> str:
        if self.started is None or self.ended is None:
            return ""
        return duration((self.ended - self.started).total_seconds())


def attempt_rows(task: TaskInfo, history: Sequence[AttemptInfo]) -> list[AttemptRow]:
    """The attempts a task's page lists, oldest first: those that ended without success (the
    scheduler's history, its latest ``ATTEMPTS_KEPT``), then the current one from the task
    itself when the history lacks it: running, or succeeded (ended at its finish), with the
    start the task keeps of its latest attempt."""
    rows = [
        AttemptRow(a.attempt, a.started_at, a.ended_at, a.description, a.traceback) for a in history
    ]
    known = {a.attempt for a in history}
    if task.attempt > 0 and task.attempt not in known:
        if task.status is Status.RUNNING:
            rows.append(AttemptRow(task.attempt, task.started_at, None, task.description))
        elif task.status is Status.SUCCEEDED:
            rows.append(
                AttemptRow(task.attempt, task.started_at, task.finished_at, task.description)
            )
    return rows


def duration(seconds: float) -> str:
    """A duration for people: ``6.64 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest:02d} s"
    hours, rest = divmod(round(seconds / 60), 60)
    return f"{hours} h {rest:02d} min"


@dataclass(frozen=True, slots=True)
class Preview:
    text: str
    size: int
    truncated: bool
    binary: bool
    """Not UTF-8 text: ``text`` is a hex dump."""


@overload
def preview(data: bytes, limit: int = PREVIEW_BYTES) -> Preview: ...
@overload
def preview(data: None, limit: int = PREVIEW_BYTES) -> None: ...
def preview(data: bytes | None, limit: int = PREVIEW_BYTES) -> Preview | None:
    """The first ``limit`` bytes of a payload or output, as text (JSON indented) if it is
    printable UTF-8, else as hex (at most 512 bytes of it)."""
    if data is None:
        return None
    head = data[:limit]
    truncated = len(data) > len(head)
    text = _text(head, truncated)
    if text is None:
        shown = min(_HEX_BYTES, limit)
        return Preview(head[:shown].hex(" ", 2), len(data), len(data) > shown, True)
    if not truncated:
        with contextlib.suppress(ValueError):  # text, not JSON: shown as it is
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    return Preview(text, len(data), truncated, False)


_HEX_BYTES = 512


def _text(head: bytes, truncated: bool) -> str | None:
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by the preview's end is not a reason to call it binary.
        if not (truncated and exc.reason == "unexpected end of data"):
            return None
        text = head[: exc.start].decode("utf-8")
    if all(c.isprintable() or c in "\n\r\t" for c in text):
        return text
    return None
