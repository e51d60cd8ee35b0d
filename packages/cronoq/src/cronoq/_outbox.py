"""The outbox: tasks an application writes in its own database transaction.

A row holds a kind, a payload (bytes, as the scheduler's codec encodes them) and the options of
a submission as a JSON object. The leader reads rows, checks each as ``submit`` checks its
arguments, and submits them; a row that cannot become a task is quarantined with its reason.
This module holds the values a source gives (``OutboxRow``...), the protocol of a source
(``OutboxSource``) and the options' JSON form, written by the application's helpers and read at
ingest by the same rules.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Protocol, runtime_checkable

from cronoq import _validate as check
from cronoq._model import NS_PER_S, MissPolicy, RetryPolicy
from cronoq.errors import InvalidArgument

__all__ = [
    "MAX_OUTBOX_OPTIONS_BYTES",
    "MAX_OUTBOX_PAGE",
    "MAX_QUARANTINE_REASON",
    "OUTBOX_OPTIONS",
    "QUARANTINE_PAYLOAD_HEAD",
    "OutboxRow",
    "OutboxSource",
    "OutboxStats",
    "QuarantinedRow",
    "decode_outbox_options",
    "encode_outbox_options",
]

OUTBOX_OPTIONS = frozenset(
    {"pool", "key", "tags", "name", "priority", "retry", "start_at", "deadline", "timeout",
     "miss_policy", "grace"}
)  # fmt: skip
"""The options a row may carry: those of ``submit`` that make sense before the task exists
(no ``after``: a dependency's id is not known inside the application's transaction)."""

MAX_OUTBOX_OPTIONS_BYTES = 64 * 1024
"""Options longer than this are refused (helpers) or quarantined (ingest): 64 tags of 255
characters, a key of 1,024 and a name stay far below it."""

QUARANTINE_PAYLOAD_HEAD = 4096
"""Bytes of a quarantined row's payload a listing holds."""
MAX_QUARANTINE_REASON = 4096
"""Characters of a quarantine's reason kept (a codec's error may be of any length)."""

MAX_OUTBOX_PAGE = 1000
"""Quarantined rows per listing, and row ids per requeue or discard."""

_RETRY_FIELDS = ("max_attempts", "initial_ns", "multiplier", "max_ns", "jitter")
_NONE_IS_DEFAULT = frozenset({"key", "name", "retry", "start_at", "deadline", "timeout"})
"""The options whose default in ``submit`` is None: None leaves them out. Elsewhere (pool,
tags, priority, miss_policy, grace) None is refused, as ``submit`` refuses it."""


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One row as the leader reads it: its id in the outbox, and what the application wrote."""

    row_id: int
    kind: str
    payload: bytes
    options: str
    """The JSON object of the options, as stored."""
    enqueued_unix_ns: int
    """When the row's transaction wrote it (the database's clock)."""


@dataclass(frozen=True, slots=True)
class QuarantinedRow:
    """A row that could not become a task, kept with the reason until an operator requeues or
    discards it. A listing holds what an operator reads, bounded whatever SQL wrote: the
    payload's first ``QUARANTINE_PAYLOAD_HEAD`` bytes and the options' first
    ``MAX_OUTBOX_OPTIONS_BYTES`` characters (the row keeps them whole)."""

    row_id: int
    kind: str
    payload: bytes
    options: str
    enqueued_unix_ns: int
    reason: str
    quarantined_unix_ns: int
    payload_size: int
    """The whole payload's length in bytes."""


@dataclass(frozen=True, slots=True)
class OutboxStats:
    """What an operator watches: rows waiting, the age of the oldest, rows quarantined."""

    depth: int
    oldest_enqueued_unix_ns: int | None
    quarantined: int


@runtime_checkable
class OutboxSource(Protocol):
    """Where the leader reads outbox rows from. ``transactional``: the rows live in the store's
    own database, and a batch's ``OutboxTaken`` deletes them in the commit that makes their
    tasks durable (exactly once). Otherwise the ingest gives every row a key derived from it
    and deletes the rows after the commit (at least once, deduplicated by that key)."""

    @property
    def transactional(self) -> bool: ...

    async def read(self, epoch: int, limit: int) -> Sequence[OutboxRow]:
        """Up to ``limit`` committed rows, oldest id first. A transactional source reads only
        once every write of this leader whose outcome it did not learn is over."""
        ...

    async def take(self, epoch: int, row_ids: Sequence[int]) -> None:
        """Delete these rows (a source that is not transactional, after their commit)."""
        ...

    async def quarantine(self, epoch: int, rows: Sequence[tuple[int, str]]) -> None:
        """Move these rows, by id, to the quarantine with their reasons, in one transaction
        (fenced by ``epoch`` where the source can tell)."""
        ...

    async def wait(self) -> None:
        """Return when rows may have arrived (a notification), or after the source's polling
        interval."""
        ...

    async def stats(self) -> OutboxStats: ...

    async def quarantined(self, after: int, limit: int) -> Sequence[QuarantinedRow]:
        """Quarantined rows with ids above ``after``, in id order, at most ``limit``."""
        ...

    async def requeue(self, row_ids: Sequence[int]) -> int:
        """Move these quarantined rows back to the outbox (once their cause is fixed); return
        how many moved."""
        ...

    async def discard(self, row_ids: Sequence[int]) -> int:
        """Delete these quarantined rows; return how many."""
        ...

    async def close(self) -> None: ...


# --- the options' JSON form --------------------------------------------------------------------


def encode_outbox_options(options: Mapping[str, Any], now_ns: int) -> str:
    """The options of one row as stored: checked as ``submit`` checks them (the same errors),
    except the pool's existence, which only the scheduler knows (decided at ingest). A
    ``timedelta`` start or deadline counts from ``now_ns`` (Unix ns, the application's clock)."""
    unknown = sorted(set(options) - OUTBOX_OPTIONS)
    if unknown:
        raise InvalidArgument(
            f"unknown outbox option {unknown[0]!r}; expected some of: "
            + ", ".join(sorted(OUTBOX_OPTIONS))
        )
    out: dict[str, Any] = {}
    instants: dict[str, int] = {}
    durations: dict[str, int] = {}
    for name, value in options.items():
        if value is None and name in _NONE_IS_DEFAULT:
            continue
        match name:
            case "pool" | "name":
                out[name] = check.text(value, name)
            case "key":
                out[name] = check.text(value, "key", max_length=check.MAX_KEY_LENGTH)
            case "tags":
                tags = check.tags(value)
                if tags:
                    out[name] = list(tags)
            case "priority":
                out[name] = check.integer(
                    value, "priority", -check.MAX_PRIORITY, check.MAX_PRIORITY
                )
            case "retry":
                policy = check.retry(value)
                out[name] = {field: getattr(policy, field) for field in _RETRY_FIELDS}
            case "start_at" | "deadline":
                instants[name] = check.instant_ns(value, name, now_ns)
                out[name] = _iso(instants[name])
            case "timeout":
                durations[name] = check.duration_ns(value, name, allow_zero=False)
            case "grace":
                durations[name] = check.duration_ns(value, name)
            case "miss_policy":
                out[name] = check.enum_value(value, MissPolicy, name).value
    if len(instants) == 2 and instants["deadline"] <= instants["start_at"]:
        raise InvalidArgument("deadline must be after start_at")
    text = json.dumps(out, separators=(",", ":"), ensure_ascii=False)
    if durations:
        # Written to the nanosecond (ns / 1e9 as a float is off by up to tens of ns past 2**53
        # ns, 104 days), as json.dumps cannot: decode_outbox_options reads them as exactly.
        tail = ",".join(f'"{name}":{_seconds_text(ns)}' for name, ns in durations.items())
        text = f"{text[:-1]}{',' if out else ''}{tail}}}"
    if len(text.encode()) > MAX_OUTBOX_OPTIONS_BYTES:
        raise InvalidArgument(f"outbox options are longer than {MAX_OUTBOX_OPTIONS_BYTES} bytes")
    return text


def decode_outbox_options(text: str) -> dict[str, Any]:
    """A row's options as ``Scheduler.task_spec`` takes them, or ``InvalidArgument`` saying
    why the row cannot become a task. Checks only the JSON's shape; ``task_spec`` checks the
    values (by the same rules as every submission)."""
    if len(text) > MAX_OUTBOX_OPTIONS_BYTES:
        raise InvalidArgument(f"options are longer than {MAX_OUTBOX_OPTIONS_BYTES} bytes")
    try:
        # Decimal: a duration's seconds are read exactly (_seconds); other numbers are floats.
        raw = json.loads(text, parse_constant=_no_constant, parse_float=Decimal)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"options are not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise InvalidArgument(f"options must be a JSON object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - OUTBOX_OPTIONS)
    if unknown:
        raise InvalidArgument(f"unknown option {check.shown(unknown[0])}")
    options: dict[str, Any] = {}
    for name, value in raw.items():
        if value is None:
            continue
        match name:
            case "retry":
                options[name] = _retry(_floats(value))
            case "start_at" | "deadline":
                options[name] = _instant(_floats(value), name)
            case "timeout" | "grace":
                options[name] = _seconds(value, name)
            case _:
                options[name] = _floats(value)
    return options


def _floats(value: Any) -> Any:
    """The JSON value with its Decimals as floats (what json.loads alone gives), down to the
    items of a list or object (tags, retry's fields): deeper, a value is refused whatever its
    numbers, and no recursion meets a nesting as deep as json.loads allows."""
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, list):
        return [float(item) if isinstance(item, Decimal) else item for item in value]
    if isinstance(value, dict):
        return {k: float(item) if isinstance(item, Decimal) else item for k, item in value.items()}
    return value


_MAX_SECONDS = check.MAX_DURATION_NS // NS_PER_S + 1


def _seconds(value: object, name: str) -> object:
    """A duration's JSON number as ``task_spec`` takes it, to the nanosecond its decimal value
    says: an int as it is; a whole number of microseconds as a timedelta (exact, where the
    nearest float's scaling may be off by tens of ns); a finer one as the nearest float,
    which is what a float of ``submit``'s scales back to. Out of range, a number, for
    ``submit``'s own error."""
    if isinstance(value, bool) or not isinstance(value, int | Decimal):
        raise InvalidArgument(
            f"{name} must be a number of seconds, got {check.shown(_floats(value))}"
        )
    if isinstance(value, int):
        return value
    if not 0 < value <= _MAX_SECONDS:
        return float(value)
    ns = int((value * NS_PER_S).to_integral_value(ROUND_HALF_EVEN))
    if ns == 0 or ns % 1000:
        return float(value)
    return timedelta(microseconds=ns // 1000)


def _seconds_text(ns: int) -> str:
    """Nanoseconds as a JSON number of seconds, exactly: ``1.5``, ``30``, ``0.000000001``."""
    whole, fraction = divmod(ns, NS_PER_S)
    return f"{whole}.{fraction:09d}".rstrip("0") if fraction else str(whole)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _retry(value: object) -> RetryPolicy:
    if not isinstance(value, dict):
        raise InvalidArgument(f"retry must be an object, got {check.shown(value)}")
    unknown = sorted(set(value) - set(_RETRY_FIELDS))
    if unknown:
        raise InvalidArgument(
            f"unknown retry field {check.shown(unknown[0])}; expected some of: "
            + ", ".join(_RETRY_FIELDS)
        )
    return RetryPolicy(**value)  # its own checks raise InvalidArgument


def _instant(value: object, name: str) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise InvalidArgument(
            f"{name} must be an ISO 8601 time with its offset, got {check.shown(value)}"
        )
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidArgument(
            f"{name} must be an ISO 8601 time with its offset, got {check.shown(value)}"
        ) from None
    if instant.tzinfo is None:
        raise InvalidArgument(f"{name} has no UTC offset: {check.shown(value)}")
    return instant


def _iso(unix_ns: int) -> str:
    seconds, ns = divmod(unix_ns, 1_000_000_000)
    instant = datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=ns // 1000)
    return instant.isoformat()


def derived_key(row: OutboxRow) -> str:
    """The key of a row ingested from a source outside the store's database: the same row
    read twice (its deletion failed after its task committed) is deduplicated by it."""
    return f"outbox:{row.row_id}:{row.enqueued_unix_ns // 1000}"
