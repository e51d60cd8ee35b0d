"""Conversions between cronoq's public values and the messages of the wire protocol.

Both ends use them. The client encodes its call arguments (payloads through its codec) and
decodes replies (payloads and outputs through its codec). The server decodes requests into the
arguments of a ``Scheduler`` that uses ``BytesCodec`` (a payload is the raw bytes the client's
codec made, or None) and encodes its replies; a submitted task's fields go straight into
``Scheduler.task_spec``, which checks them once into the engine's input.

Encoding (Python to message) raises ``InvalidArgument`` for a value that has
no wire form: a wrong type, a str with a lone surrogate, an int beyond int64, a naive datetime,
a non-finite float, an endless iterable. Any other value, even one the Scheduler will refuse (an
empty kind, a negative timeout, a NUL in a key), is sent as it is, so that the Scheduler refuses
it with the message the embedded API gives.

Decoding (message to Python) raises nothing but ``InvalidArgument``, and only for what Python
cannot hold or the protocol forbids: a Timestamp outside years 1..9999, a Duration whose nanos
disagree with its seconds, an unknown or unspecified enum number where a value is required, a
missing required field. A request field left at its "absent" form is omitted from the decoded
arguments, so the Scheduler's own default applies and none is restated here.

Durations reach the Scheduler as ``timedelta`` (exact to the microsecond, as the embedded API
is) or, when the wire value has nanoseconds, as float seconds. Instants are ``datetime``, so a
Timestamp's sub-microsecond part is dropped, as a datetime cannot hold it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, TypeGuard, TypeVar

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import DecodeError, Message

from cronoq import (
    AttemptInfo,
    AttemptToken,
    CancelRequested,
    CatchUpPolicy,
    CheckedTask,
    Codec,
    CodecContext,
    Explanation,
    Hold,
    LeasedAttempt,
    LeaseRenewed,
    Limit,
    LimitInfo,
    LimitKeyInfo,
    MissPolicy,
    OccurrenceInfo,
    OccurrenceOutcome,
    OnFull,
    OverlapPolicy,
    ParentOutput,
    PoolInfo,
    RetryPolicy,
    ScheduleInfo,
    Scheduler,
    Status,
    TaskInfo,
    TaskRequest,
    TaskSummary,
    TraceContext,
    WorkerInfo,
    binds_context,
    decode_with,
    encode_with,
    unix_ns,
)
from cronoq.errors import CronoqError, InvalidArgument, PayloadError, SchedulerError
from cronoq.store import OutboxStats, QuarantinedRow
from cronoq_client._outbox import OutboxStatus, QuarantinedOutboxRow
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._status import cut_text, error_from_report_result, report_result

__all__ = [
    "MAX_HEARTBEATS_PER_CALL",
    "MAX_REPORTS_PER_CALL",
    "MAX_SUBMIT_EACH",
    "MAX_SUBMIT_MANY_REFERENCES",
    "MAX_SUBMIT_MANY_TASKS",
    "MAX_TASK_LIMITS",
    "MAX_WORKER_ID_LENGTH",
    "MAX_WORKER_POOLS",
    "MAX_WORKER_SLOTS",
    "OUTBOX_KIND_BYTES",
    "OUTBOX_PAGE_DEFAULT",
    "OUTBOX_PAYLOAD_HEAD_BYTES",
    "OUTBOX_TEXT_BYTES",
    "Attached",
    "RemoteAttempt",
    "ReportFailure",
    "ReportSuccess",
    "UnreadableAttempt",
    "add_schedule_kwargs",
    "add_schedule_request",
    "attach_kwargs",
    "attach_message_limit",
    "attach_request",
    "attempt_info_from_pb",
    "attempt_info_to_pb",
    "attempts_response",
    "cancel_kwargs",
    "cancel_request",
    "dependants_response",
    "explain_request",
    "explanation_from_pb",
    "explanation_to_pb",
    "get_attempts_request",
    "get_by_key_request",
    "get_dependants_request",
    "get_request",
    "heartbeat_many_from_pb",
    "heartbeat_request",
    "heartbeat_result",
    "heartbeat_result_from_pb",
    "heartbeat_token",
    "lease_renewed_from_pb",
    "lease_renewed_to_pb",
    "limit_info_from_pb",
    "limit_info_to_pb",
    "list_kwargs",
    "list_limits_kwargs",
    "list_limits_request",
    "list_occurrences_kwargs",
    "list_occurrences_request",
    "list_request",
    "list_response",
    "occurrence_from_pb",
    "occurrence_to_pb",
    "occurrences_response",
    "outbox_quarantine_kwargs",
    "outbox_quarantine_request",
    "outbox_quarantine_response",
    "outbox_row_ids",
    "outbox_status_from_pb",
    "outbox_status_to_pb",
    "parent_output_from_pb",
    "parent_output_to_pb",
    "parse",
    "pool_and_kind",
    "pool_info_from_pb",
    "pool_info_to_pb",
    "preview_kwargs",
    "preview_request",
    "preview_response",
    "preview_response_to_pb",
    "quarantined_row_from_pb",
    "quarantined_row_to_pb",
    "report_from_pb",
    "report_many_from_pb",
    "report_request",
    "rerun_request",
    "retry_from_pb",
    "retry_to_pb",
    "schedule_info_from_pb",
    "schedule_info_to_pb",
    "status_from_pb",
    "status_to_pb",
    "submit_each_requests",
    "submit_many_request",
    "submit_many_specs",
    "submit_many_tasks",
    "submit_request",
    "submit_result",
    "task_data_request",
    "task_info_from_pb",
    "task_info_to_pb",
    "task_request_to_pb",
    "task_spec_from_pb",
    "task_summary_from_pb",
    "task_summary_to_pb",
    "token_from_pb",
    "token_to_pb",
    "wait_kwargs",
    "wait_request",
    "worker_event_from_pb",
    "worker_event_to_pb",
    "worker_events_from_pb",
    "worker_events_to_pb",
    "worker_info_from_pb",
    "worker_info_to_pb",
]

NS_PER_S = 1_000_000_000
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
MAX_ITEMS = 1_000_000
"""Most items any list of a message may be given, so that an endless iterable stops. Far above
every limit of the Scheduler, whose own (precise) messages apply below it."""
_MAX_DURATION_S = 315_576_000_000  # protobuf's range of a Duration: about 10,000 years
# Seconds since 1970 of 0001-01-01T00:00:00 and 9999-12-31T23:59:59: a datetime's range.
_MIN_TIMESTAMP_S = -62_135_596_800
_MAX_TIMESTAMP_S = 253_402_300_799
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)

_M = TypeVar("_M", bound=Message)
_E = TypeVar("_E", bound=StrEnum)


def parse(message_type: type[_M], data: bytes) -> _M:
    """A message from its bytes; ``InvalidArgument`` if they are not one (bad UTF-8 in a string,
    a truncated field). For a server that deserializes requests itself: grpcio's own
    deserializer failing makes the call ``INTERNAL``, which bad input must never be."""
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        raise InvalidArgument(
            f"the request is not a valid {message_type.__name__}: {exc}"
        ) from None


# --- scalars, encoding ----------------------------------------------------------------------


def _shown(value: object) -> str:
    """A bounded repr for a message, as cronoq's own messages show values."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _text(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidArgument(
            f"{what} must be valid Unicode, but has a lone surrogate {value[exc.start]!r} "
            f"at index {exc.start}: {_shown(value)}"
        ) from None
    return value


def _int64(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__}")
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidArgument(
            f"{what} must be between {INT64_MIN} and {INT64_MAX}, got {_shown(value)}"
        )
    return int(value)  # an IntEnum or other int subclass, as a plain int


def _flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be a bool, got {type(value).__name__}")
    return value


def _items(value: object, what: str, expected: str) -> Iterator[Any]:
    """The items of an iterable, one at a time, at most MAX_ITEMS of them."""
    # str and bytes are iterable, but tags given as "a,b" are a mistake, not three tags.
    if isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be {expected}, got {type(value).__name__}")
    try:
        iterator = iter(value)
    except TypeError as exc:  # an __iter__ that returns a non-iterator
        raise InvalidArgument(f"{what} must be {expected}: iter() failed: {exc}") from None
    for count, item in enumerate(iterator):
        if count == MAX_ITEMS:
            raise InvalidArgument(f"{what}: more than {MAX_ITEMS} items given")
        yield item


def _texts(value: object, what: str, each: str) -> list[str]:
    if type(value) is tuple and not value:
        return []  # the default, on the path of every submission
    return [_text(item, each) for item in _items(value, what, "a list or tuple of str")]


def _int64s(value: object, what: str, expected: str, each: str) -> list[int]:
    if type(value) is tuple and not value:
        return []  # the default, on the path of every submission
    return [_int64(item, each) for item in _items(value, what, expected)]


def _float_ns(value: float) -> int:
    """``round(Fraction(value) * NS_PER_S)`` (exact, halves to even) in integer arithmetic,
    without a Fraction: a float is ``numerator / 2**k``."""
    numerator, denominator = value.as_integer_ratio()
    ns, remainder = divmod(numerator * NS_PER_S, denominator)
    twice = 2 * remainder
    if twice > denominator or (twice == denominator and ns % 2):
        ns += 1
    return ns


def _duration_of_ns(ns: int) -> duration_pb2.Duration:
    seconds, nanos = divmod(abs(ns), NS_PER_S)
    if ns < 0:
        seconds, nanos = -seconds, -nanos
    if not nanos:
        return duration_pb2.Duration(seconds=seconds)  # the same message, made faster
    return duration_pb2.Duration(seconds=seconds, nanos=nanos)


def _duration(value: object, what: str) -> duration_pb2.Duration:
    """Seconds (int or float) or a timedelta, exact to the nanosecond; negative ones are sent
    for the Scheduler to refuse."""
    if isinstance(value, timedelta):
        # Exact integer arithmetic: total_seconds() is a float and loses nanoseconds.
        ns = (value.days * 86_400 + value.seconds) * NS_PER_S + value.microseconds * 1000
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(
            f"{what} must be seconds (int or float) or a timedelta, got {type(value).__name__}"
        )
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{what} must be finite, got {value!r}")
    elif isinstance(value, float) and abs(value) > _MAX_DURATION_S:  # before 1e300 * 1e9 = inf
        ns = _MAX_DURATION_S * NS_PER_S + 1
    else:
        # Exact: value * 1e9 in floats is off by a nanosecond or more past 2**52 ns, and
        # then a float made from nanoseconds (LeasedAttempt.timeout) would not come back.
        ns = value * NS_PER_S if isinstance(value, int) else _float_ns(value)
    if abs(ns) > _MAX_DURATION_S * NS_PER_S:
        given = str(value) if isinstance(value, timedelta) else f"{_shown(value)} seconds"
        raise InvalidArgument(f"{what} of {given} is longer than a protobuf Duration can be")
    return _duration_of_ns(ns)


def _timestamp(value: object, what: str) -> timestamp_pb2.Timestamp:
    return _timestamp_of_ns(unix_ns(value, what))


def _timestamp_of_ns(ns: int) -> timestamp_pb2.Timestamp:
    seconds, nanos = divmod(ns, NS_PER_S)
    return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)


def _enum_to_pb(value: object, kind: type[_E], table: Mapping[_E, int], what: str) -> int:
    """A policy given as a member or its string value (as the Scheduler accepts it)."""
    if isinstance(value, kind):
        return table[value]
    if isinstance(value, str):
        try:
            return table[kind(value)]
        except ValueError:
            pass
    allowed = ", ".join(repr(m.value) for m in kind)
    given = _shown(value) if isinstance(value, str) else type(value).__name__
    raise InvalidArgument(f"{what} must be one of {allowed}, got {given}")


# --- scalars, decoding ----------------------------------------------------------------------


def _ns(duration: duration_pb2.Duration, what: str) -> int:
    seconds, nanos = duration.seconds, duration.nanos
    if not -NS_PER_S < nanos < NS_PER_S or (seconds > 0 > nanos) or (seconds < 0 < nanos):
        raise InvalidArgument(
            f"{what}: a Duration's nanos must be within +-999999999 and of the sign of its "
            f"seconds, got seconds={seconds} nanos={nanos}"
        )
    return seconds * NS_PER_S + nanos


def _seconds(duration: duration_pb2.Duration, what: str) -> timedelta | float:
    """A duration as the Scheduler takes it: a timedelta when exact, else float seconds."""
    ns = _ns(duration, what)
    if ns % 1000 == 0:
        try:
            return timedelta(microseconds=ns // 1000)
        except OverflowError:
            pass  # beyond timedelta's 999,999,999 days: the Scheduler refuses the float
    return ns / NS_PER_S


def _float_seconds(duration: duration_pb2.Duration, what: str) -> float:
    return _ns(duration, what) / NS_PER_S


def _delay(duration: duration_pb2.Duration, what: str) -> timedelta:
    """A delay from now, as the timedelta the Scheduler's instants take (to the microsecond)."""
    ns = _ns(duration, what)
    micros = ns // 1000 if ns >= 0 else -(-ns // 1000)  # the nanoseconds dropped, toward zero
    try:
        return timedelta(microseconds=micros)
    except OverflowError:
        raise InvalidArgument(
            f"{what}: a delay of {duration.seconds} seconds is beyond any date"
        ) from None


def _datetime(ts: timestamp_pb2.Timestamp, what: str) -> datetime:
    if not 0 <= ts.nanos < NS_PER_S:
        raise InvalidArgument(f"{what}: a Timestamp's nanos must be 0..999999999, got {ts.nanos}")
    if not _MIN_TIMESTAMP_S <= ts.seconds <= _MAX_TIMESTAMP_S:
        raise InvalidArgument(
            f"{what}: a Timestamp of {ts.seconds} seconds since 1970 is outside years 1..9999"
        )
    return _EPOCH_UTC + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def _ns_since_epoch(ts: timestamp_pb2.Timestamp, what: str) -> int:
    if not 0 <= ts.nanos < NS_PER_S:
        raise InvalidArgument(f"{what}: a Timestamp's nanos must be 0..999999999, got {ts.nanos}")
    return ts.seconds * NS_PER_S + ts.nanos


def _enum_from_pb(number: int, back: Mapping[int, _E], what: str) -> _E:
    try:
        return back[number]
    except KeyError:
        given = "unspecified" if number == 0 else f"an unknown value ({number})"
        raise InvalidArgument(f"{what} is {given}") from None


# --- enums ----------------------------------------------------------------------------------


def _table(kind: type[_E], prefix: str, wire: Any) -> dict[_E, int]:
    # Each member's wire name is its Python name with the enum's prefix: a member added on one
    # side only fails here, at import, instead of on the first message that carries it.
    return {member: int(wire.Value(prefix + member.name)) for member in kind}


_STATUS = _table(Status, "STATUS_", pb.Status)
_MISS = _table(MissPolicy, "MISS_POLICY_", pb.MissPolicy)
_OVERLAP = _table(OverlapPolicy, "OVERLAP_POLICY_", pb.OverlapPolicy)
_CATCH_UP = _table(CatchUpPolicy, "CATCH_UP_POLICY_", pb.CatchUpPolicy)
_ON_FULL = _table(OnFull, "ON_FULL_", pb.OnFull)
_HOLD = _table(Hold, "HOLD_", pb.Hold)
_OUTCOME = _table(OccurrenceOutcome, "OCCURRENCE_OUTCOME_", pb.OccurrenceOutcome)
_STATUS_BACK = {number: member for member, number in _STATUS.items()}
_MISS_BACK = {number: member for member, number in _MISS.items()}
_OVERLAP_BACK = {number: member for member, number in _OVERLAP.items()}
_CATCH_UP_BACK = {number: member for member, number in _CATCH_UP.items()}
_ON_FULL_BACK = {number: member for member, number in _ON_FULL.items()}
_HOLD_BACK = {number: member for member, number in _HOLD.items()}
_OUTCOME_BACK = {number: member for member, number in _OUTCOME.items()}


def status_to_pb(status: Status) -> pb.Status.ValueType:
    return pb.Status.ValueType(_STATUS[status])


def status_from_pb(number: int, what: str = "status") -> Status:
    return _enum_from_pb(number, _STATUS_BACK, what)


def _status_filter(value: object) -> int:
    # As Scheduler.list checks each status, with its message.
    if isinstance(value, Status):
        return _STATUS[value]
    if isinstance(value, str):
        try:
            return _STATUS[Status(value)]
        except ValueError:
            pass
    allowed = ", ".join(s.value for s in Status)
    given = _shown(value) if isinstance(value, str) else type(value).__name__
    raise InvalidArgument(f"status must be among {allowed}, got {given}")


# --- retry policy ---------------------------------------------------------------------------


def retry_to_pb(policy: object) -> pb.RetryPolicy | None:
    """None (the default policy) is no message."""
    if policy is None:
        return None
    if not isinstance(policy, RetryPolicy):
        raise InvalidArgument(f"retry must be a RetryPolicy, got {type(policy).__name__}")
    return pb.RetryPolicy(
        max_attempts=_int64(policy.max_attempts, "max_attempts"),
        initial=_duration_of_ns(_int64(policy.initial_ns, "initial_ns")),
        multiplier=float(policy.multiplier),
        maximum=_duration_of_ns(_int64(policy.max_ns, "max_ns")),
        jitter=float(policy.jitter),
    )


def retry_from_pb(message: pb.RetryPolicy) -> RetryPolicy:
    """The policy; RetryPolicy itself refuses out-of-range values (InvalidArgument)."""
    fields: dict[str, Any] = {}
    if message.HasField("max_attempts"):
        fields["max_attempts"] = message.max_attempts
    if message.HasField("initial"):
        fields["initial_ns"] = _ns(message.initial, "retry initial")
    if message.HasField("multiplier"):
        fields["multiplier"] = message.multiplier
    if message.HasField("maximum"):
        fields["max_ns"] = _ns(message.maximum, "retry maximum")
    if message.HasField("jitter"):
        fields["jitter"] = message.jitter
    return RetryPolicy(**fields)


# --- TaskRequest ----------------------------------------------------------------------------

_ABSENT = TaskRequest("")
"""Where a request field is absent from the message, the Scheduler's default: this one's."""


def _payload_to_pb(codec: Codec, value: object, kind: str, pool: object, key: object) -> bytes:
    """A payload encoded by ``codec``, for its task's kind, pool and key if the codec binds
    values to their context (CodecContext: pool and key are then checked here; for any other
    codec they are checked where they always were, after the payload)."""
    context = None
    if binds_context(codec):
        key = None if key is None else _text(key, "key")
        context = CodecContext("payload", kind, _text(pool, "pool"), key)
    return encode_with(codec, value, "payload", context)


def task_request_to_pb(request: object, codec: Codec) -> pb.TaskRequest:
    """The client's request, its payload encoded by ``codec`` (None: no payload).

    A field at the request's default is left out of the message, which the server reads as
    that default: each field set costs about as much as the rest of the message. Only a value
    of the default's own type is left out, so every other one is checked as before. Fields are
    checked in the order of ``TaskRequest``, so the first bad one is reported.
    """
    if not isinstance(request, TaskRequest):
        raise InvalidArgument(f"expected a TaskRequest, got {type(request).__name__}")
    kind = _text(request.kind, "kind")
    message = pb.TaskRequest(kind=kind)
    if request.pool is _ABSENT.pool and request.only_kind_payload_pool:
        # Every field at its default object: the message is the kind and the payload alone.
        if request.payload is not None:
            message.payload = _payload_to_pb(codec, request.payload, kind, _ABSENT.pool, None)
        return message
    pool = request.pool
    if type(pool) is not str or pool != _ABSENT.pool:
        pool = message.pool = _text(pool, "pool")
    tags = _texts(request.tags, "tags", "tag")
    if tags:
        message.tags.extend(tags)
    priority = request.priority
    if type(priority) is not int or priority:
        message.priority = _int64(priority, "priority")
    if request.miss_policy is not _ABSENT.miss_policy:
        miss_policy = _enum_to_pb(request.miss_policy, MissPolicy, _MISS, "miss_policy")
        message.miss_policy = pb.MissPolicy.ValueType(miss_policy)
    grace = request.grace
    if type(grace) is not float or grace != _ABSENT.grace:
        message.grace.CopyFrom(_duration(grace, "grace"))
    after = _int64s(request.after, "after", "a list of task ids", "a dependency id")
    if after:
        message.after.extend(after)
    if request.payload is not None:
        message.payload = _payload_to_pb(codec, request.payload, kind, pool, request.key)
    if request.key is not None:
        message.key = _text(request.key, "key")
    if request.name is not None:
        message.name = _text(request.name, "name")
    retry = retry_to_pb(request.retry)
    if retry is not None:
        message.retry.CopyFrom(retry)
    if request.start_at is not None:
        _set_instant(message, "start_time", "start_delay", request.start_at, "start_at")
    if request.deadline is not None:
        _set_instant(message, "deadline_time", "deadline_delay", request.deadline, "deadline")
    if request.timeout is not None:
        message.timeout.CopyFrom(_duration(request.timeout, "timeout"))
    if request.limits is not None:
        message.limits.extend(_limit_keys_to_pb(request.limits))
    return message


def _limit_keys_to_pb(limits: object) -> list[pb.LimitKey]:
    """A request's ``limits`` (a mapping of limit name to key or None) as LimitKey
    messages, by name. Only what has no wire form is refused here; an unknown limit, a
    missing or extra key and too many limits are the Scheduler's to refuse."""
    if not isinstance(limits, Mapping):
        raise InvalidArgument(
            f"limits must be a mapping of limit name to key, got {type(limits).__name__}"
        )
    keys: list[pb.LimitKey] = []
    for name in _items(limits, "limits", "a mapping of limit name to key"):
        entry = pb.LimitKey(name=_text(name, "limit name"))
        key = limits[name]
        if key is not None:
            entry.key = _text(key, f"limit {name!r} key")
        keys.append(entry)
    return keys


MAX_TASK_LIMITS = 16
"""Most limits one task names (cronoq's own bound, its pool's included): a request naming
more is refused before its limits are decoded."""


def _limit_keys_from_pb(entries: Sequence[pb.LimitKey]) -> dict[str, str | None] | None:
    """A request's LimitKey messages as ``Scheduler.task_spec`` takes them: None for none
    (its pool's limits still apply), each name once."""
    if not entries:
        return None
    if len(entries) > MAX_TASK_LIMITS:
        raise InvalidArgument(
            f"a task takes at most {MAX_TASK_LIMITS} limits (its pool's included), "
            f"got {len(entries)}"
        )
    keys: dict[str, str | None] = {}
    for entry in entries:
        if entry.name in keys:
            raise InvalidArgument(f"limits name limit {_shown(entry.name)} twice")
        keys[entry.name] = entry.key if entry.HasField("key") else None
    return keys


def _set_instant(message: pb.TaskRequest, at: str, delay: str, value: object, what: str) -> None:
    if isinstance(value, timedelta):
        getattr(message, delay).CopyFrom(_duration(value, what))
    elif isinstance(value, datetime):
        getattr(message, at).CopyFrom(_timestamp(value, what))
    else:
        raise InvalidArgument(
            f"{what} must be a timezone-aware datetime or a timedelta from now, "
            f"got {type(value).__name__}"
        )


def pool_and_kind(message: pb.TaskRequest) -> tuple[str, str]:
    """The pool (an absent one is the default) and the kind a request submits to, unchecked:
    what the server authorizes before it looks at any other field."""
    return message.pool if message.HasField("pool") else _ABSENT.pool, message.kind


def task_spec_from_pb(
    message: pb.TaskRequest,
    sched: Scheduler,
    now_ns: int,
    trace_context: TraceContext | None = None,
) -> CheckedTask:
    """The task as ``sched`` submits it (``Scheduler.submit_specs``): the message's fields
    decoded and handed to ``Scheduler.task_spec``, which checks them, in one pass with nothing
    in between. The payload is the client's bytes (its codec's), or None: ``sched`` uses
    ``BytesCodec``. A delay (``start_delay``, ``deadline_delay``) counts from ``now_ns``, when
    the server took the call, as an embedded caller's counts from its call. Every field is
    decoded before any is checked, so a decoding error comes first (InvalidArgument); then the
    Scheduler's checks, in the order of an embedded ``submit``.
    """
    payload = message.payload if message.HasField("payload") else None
    return _task_spec(message, sched, now_ns, payload, trace_context)


def _task_spec(
    message: pb.TaskRequest,
    sched: Scheduler,
    now_ns: int,
    payload: bytes | None,
    trace_context: TraceContext | None = None,
) -> CheckedTask:
    # Positional, in field order, without a dict of keywords: this runs for every task of
    # every submission.
    has = message.HasField
    tags = message.tags
    after = message.after
    start = message.WhichOneof("start_at")
    deadline = message.WhichOneof("deadline")
    return sched.task_spec(
        now_ns,
        message.kind,
        payload,
        message.pool if has("pool") else _ABSENT.pool,
        message.key if has("key") else None,
        tuple(tags) if tags else (),
        message.name if has("name") else None,
        message.priority,
        retry_from_pb(message.retry) if has("retry") else None,
        None if start is None else _instant_from_pb(message, start, "start_at"),
        (
            _enum_from_pb(message.miss_policy, _MISS_BACK, "miss_policy")
            if message.miss_policy != pb.MISS_POLICY_UNSPECIFIED
            else _ABSENT.miss_policy
        ),
        _seconds(message.grace, "grace") if has("grace") else _ABSENT.grace,
        None if deadline is None else _instant_from_pb(message, deadline, "deadline"),
        _seconds(message.timeout, "timeout") if has("timeout") else None,
        tuple(after) if after else (),
        trace_context,
        _limit_keys_from_pb(message.limits),
    )


def _instant_from_pb(message: pb.TaskRequest, which: str, what: str) -> object:
    """The set member of a start_at or deadline oneof: an instant, or a delay."""
    if which.endswith("_time"):
        return _datetime(getattr(message, which), what)
    return _delay(getattr(message, which), what)


def submit_request(request: TaskRequest, codec: Codec) -> pb.SubmitRequest:
    return pb.SubmitRequest(task=task_request_to_pb(request, codec))


def submit_many_request(requests: Iterable[TaskRequest], codec: Codec) -> pb.SubmitManyRequest:
    """Read one request at a time, so an endless iterable stops after MAX_ITEMS, and the first
    bad request is reported as soon as it is read.

    Requests that differ only in their payloads (every other field at its default object,
    one kind and one pool, each with a payload), as a bulk submission's are, go in the compact
    form: the common request once, and the payloads, which protobuf encodes and decodes in
    one step. At the first request that differs otherwise, the list goes task by task.
    """
    common: pb.TaskRequest | None = None
    kind = pool = ""
    context: CodecContext | None = None  # the compact form's: one kind and pool, no key
    payloads: list[bytes] = []
    tasks: list[pb.TaskRequest] | None = None
    for item in _items(requests, "submit_many requests", "an iterable of TaskRequest"):
        if tasks is None:
            if common is None and _bulk(item, None, None):
                kind, pool = item.kind, item.pool
                common = task_request_to_pb(TaskRequest(kind, None, pool), codec)
                if binds_context(codec):
                    context = CodecContext("payload", kind, pool)
            if common is not None and _bulk(item, kind, pool):
                payloads.append(encode_with(codec, item.payload, "payload", context))
                continue
            tasks = [_with_payload(common, p) for p in payloads] if common is not None else []
        tasks.append(task_request_to_pb(item, codec))
    if tasks is None and common is not None and len(payloads) > 1:
        message = pb.SubmitManyRequest(common=common)
        message.payloads.extend(payloads)
        return message
    if tasks is None:
        tasks = [_with_payload(common, p) for p in payloads] if common is not None else []
    return pb.SubmitManyRequest(tasks=tasks)


def _bulk(item: object, kind: str | None, pool: str | None) -> TypeGuard[TaskRequest]:
    """Whether ``item`` is a request the compact form carries: a payload, every field but kind,
    payload and pool at its default object, kind and pool exact str (any other value goes task
    by task, where it is checked), equal to ``kind`` and ``pool`` when given."""
    return (
        type(item) is TaskRequest
        and item.payload is not None
        and item.only_kind_payload_pool
        and type(item.kind) is str
        and type(item.pool) is str
        and (kind is None or item.kind is kind or item.kind == kind)
        and (pool is None or item.pool is pool or item.pool == pool)
    )


def _with_payload(common: pb.TaskRequest, payload: bytes) -> pb.TaskRequest:
    message = pb.TaskRequest()
    message.CopyFrom(common)
    message.payload = payload
    return message


MAX_SUBMIT_MANY_TASKS = 1_000
"""Most tasks one SubmitMany carries. The server checks and applies a call in one step on its
event loop while every other call (leadership renewal, heartbeats) waits: about 20 µs a task
in the compact form, up to about 60 µs with every field set (a 1 KiB key, a retry policy). A
larger batch is several calls; the embedded ``Scheduler.submit_many`` still takes
``cronoq.MAX_BATCH`` in one step."""
MAX_SUBMIT_MANY_REFERENCES = 5_000
"""Most dependencies, and most tags, the tasks of one SubmitMany name in all (each costs about
2 µs to check and link): without it, 1,000 tasks of 600 dependencies each fit the message
limit and hold the event loop for 0.6 s. Five per task on average."""


def submit_many_tasks(message: pb.SubmitManyRequest) -> Sequence[pb.TaskRequest]:
    """The requests of either form (``submit_many_request``) to authorize: the common one of
    the compact form, else each. A message of both forms is refused, and so is one past the
    server's bounds of a call (``MAX_SUBMIT_MANY_TASKS``, ``MAX_SUBMIT_MANY_REFERENCES``),
    before anything is decoded."""
    tasks, payloads = message.tasks, message.payloads
    count = len(tasks) + len(payloads)
    if count > MAX_SUBMIT_MANY_TASKS:
        raise InvalidArgument(
            f"SubmitMany: {count} tasks in one call; the server takes at most "
            f"{MAX_SUBMIT_MANY_TASKS} per call: split the batch (keys make each call safe to retry)"
        )
    common = message.common
    _check_references("SubmitMany", tasks, (len(common.after), len(common.tags), len(payloads)))
    if not message.HasField("common"):
        if payloads:
            raise InvalidArgument("payloads given without common: set common, or use tasks")
        return tasks
    if tasks:
        raise InvalidArgument("tasks and common are both set: use one of the two forms")
    if common.HasField("payload"):
        raise InvalidArgument("common.payload is set: the compact form's payloads are payloads")
    return [common]


def _check_references(
    call: str, tasks: Sequence[pb.TaskRequest], common: tuple[int, int, int] = (0, 0, 0)
) -> None:
    """The dependencies, and the tags, ``tasks`` name in all (with ``common``'s, given as its
    dependencies, its tags and the number of tasks it stands for) within
    ``MAX_SUBMIT_MANY_REFERENCES``."""
    after, tags, times = common
    for what, per_task, in_common in (
        ("dependencies", (len(task.after) for task in tasks), after),
        ("tags", (len(task.tags) for task in tasks), tags),
    ):
        named = sum(per_task) + in_common * times
        if named > MAX_SUBMIT_MANY_REFERENCES:
            raise InvalidArgument(
                f"{call}: its tasks name {named} {what} in all; the server takes at most "
                f"{MAX_SUBMIT_MANY_REFERENCES} per call: split the batch"
            )


MAX_SUBMIT_EACH = MAX_SUBMIT_MANY_TASKS
"""Most submissions one SubmitEach carries, and (``MAX_SUBMIT_MANY_REFERENCES``) most
dependencies and tags they name in all: the same work on the event loop as a SubmitMany's."""


def submit_each_requests(message: pb.SubmitEachRequest) -> Sequence[pb.SubmitRequest]:
    """The submissions of a SubmitEach, each to be judged alone as a Submit is, once the call
    is within the server's bounds (``MAX_SUBMIT_EACH``)."""
    count = len(message.submissions)
    if count > MAX_SUBMIT_EACH:
        raise InvalidArgument(
            f"SubmitEach: {count} submissions in one call; the server takes at most "
            f"{MAX_SUBMIT_EACH} per call"
        )
    _check_references("SubmitEach", [submission.task for submission in message.submissions])
    return message.submissions


def submit_result(outcome: int | BaseException) -> pb.SubmitResult:
    """One submission's result in a SubmitEach: its task id, or what its Submit would have
    failed with."""
    if isinstance(outcome, int):
        return pb.SubmitResult(task_id=outcome)
    return pb.SubmitResult(refused=report_result(outcome))


def submit_many_specs(
    message: pb.SubmitManyRequest,
    sched: Scheduler,
    now_ns: int,
    trace_context: TraceContext | None = None,
) -> list[CheckedTask]:
    """The tasks of a message ``submit_many_tasks`` accepted, as ``task_spec_from_pb`` makes
    each, in order: the first bad task is the one reported. In the compact form the common
    request is decoded and checked once, with the first payload (so the first task's error is
    the one an embedded ``submit_many`` of the tasks reports), and each other payload only as
    a payload (``Scheduler.payload_specs``). A compact message without payloads submits
    nothing, but its common request is checked even so."""
    if not message.HasField("common"):
        return [task_spec_from_pb(task, sched, now_ns, trace_context) for task in message.tasks]
    payloads = message.payloads
    if not payloads:
        _task_spec(message.common, sched, now_ns, None)
        return []
    first = _task_spec(message.common, sched, now_ns, payloads[0], trace_context)
    return [first, *sched.payload_specs(first, payloads[1:])]


# --- TaskInfo and TaskSummary ---------------------------------------------------------------


def _optional_bytes(value: object, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    raise TypeError(
        f"{what} must be bytes (a Scheduler with BytesCodec), got {type(value).__name__}"
    )


def task_info_to_pb(info: TaskInfo) -> pb.TaskInfo:
    """The task as the server's Scheduler (BytesCodec) returns it: payload and output are bytes
    or None. Anything else is the server's mistake, a TypeError."""
    message = pb.TaskInfo(
        task_id=info.task_id,
        status=status_to_pb(info.status),
        attempt=info.attempt,
        message=info.message,
        pool=info.pool,
        kind=info.kind,
        tags=info.tags,
        priority=info.priority,
        submitted_at=_timestamp(info.submitted_at, "submitted_at"),
        updated_at=_timestamp(info.updated_at, "updated_at"),
        after=info.after,
    )
    if info.key is not None:
        message.key = info.key
    if info.name is not None:
        message.name = info.name
    payload = _optional_bytes(info.payload, "payload")
    if payload is not None:
        message.payload = payload
    output = _optional_bytes(info.output, "output")
    if output is not None:
        message.output = output
    if info.finished_at is not None:
        message.finished_at.CopyFrom(_timestamp(info.finished_at, "finished_at"))
    if info.schedule is not None:
        message.schedule = info.schedule
    for name, key in info.limits:
        entry = message.limits.add(name=name)
        if key is not None:
            entry.key = key
    if info.waiting_for is not None:
        message.waiting_for = info.waiting_for
    if info.started_at is not None:
        message.started_at.CopyFrom(_timestamp(info.started_at, "started_at"))
    if info.rerun_of is not None:
        message.rerun_of = info.rerun_of
    return message


def _task_limits_from_pb(entries: Sequence[pb.LimitKey]) -> tuple[tuple[str, str | None], ...]:
    return tuple((e.name, e.key if e.HasField("key") else None) for e in entries)


def task_info_from_pb(message: pb.TaskInfo, codec: Codec) -> TaskInfo:
    """The task with payload and output decoded by the client's codec.

    As the embedded Scheduler does: an empty or absent payload is None whatever the codec, an
    absent output is None, and a codec that cannot decode raises PayloadError naming the task.
    """
    status = status_from_pb(message.status)
    key = message.key if message.HasField("key") else None
    try:
        payload = output = None
        if message.payload:
            context = None
            if binds_context(codec):  # as the submitter encoded it (no task id yet)
                context = CodecContext("payload", message.kind, message.pool, key)
            payload = decode_with(codec, message.payload, "payload", context)
        if message.HasField("output"):
            context = None
            if binds_context(codec):  # as the worker encoded it, for this task
                context = CodecContext("output", message.kind, message.pool, key, message.task_id)
            output = decode_with(codec, message.output, "output", context)
    except InvalidArgument as exc:  # PayloadError, or fields no CodecContext can have
        text = message.message if len(message.message) <= 200 else f"{message.message[:200]}..."
        raise PayloadError(f"task {message.task_id} ({status}: {text}): {exc}") from exc
    return TaskInfo(
        task_id=message.task_id,
        status=status,
        attempt=message.attempt,
        message=message.message,
        pool=message.pool,
        kind=message.kind,
        key=key,
        tags=tuple(message.tags),
        name=message.name if message.HasField("name") else None,
        priority=message.priority,
        payload=payload,
        output=output,
        submitted_at=_datetime(message.submitted_at, "submitted_at"),
        updated_at=_datetime(message.updated_at, "updated_at"),
        finished_at=(
            _datetime(message.finished_at, "finished_at")
            if message.HasField("finished_at")
            else None
        ),
        after=tuple(message.after),
        schedule=message.schedule if message.HasField("schedule") else None,
        started_at=(
            _datetime(message.started_at, "started_at") if message.HasField("started_at") else None
        ),
        limits=_task_limits_from_pb(message.limits),
        waiting_for=message.waiting_for if message.HasField("waiting_for") else None,
        rerun_of=message.rerun_of if message.HasField("rerun_of") else None,
    )


def task_summary_to_pb(summary: TaskSummary) -> pb.TaskSummary:
    message = pb.TaskSummary(
        task_id=summary.task_id,
        status=status_to_pb(summary.status),
        attempt=summary.attempt,
        pool=summary.pool,
        kind=summary.kind,
        tags=summary.tags,
    )
    if summary.key is not None:
        message.key = summary.key
    if summary.finished_ns is not None:
        message.finished_at.CopyFrom(_timestamp_of_ns(summary.finished_ns))
    if summary.error is not None:
        message.error = summary.error
    if summary.waiting_for is not None:
        message.waiting_for = summary.waiting_for
    return message


def task_summary_from_pb(message: pb.TaskSummary) -> TaskSummary:
    return TaskSummary(
        task_id=message.task_id,
        status=status_from_pb(message.status),
        attempt=message.attempt,
        pool=message.pool,
        kind=message.kind,
        key=message.key if message.HasField("key") else None,
        tags=tuple(message.tags),
        finished_ns=(
            _ns_since_epoch(message.finished_at, "finished_at")
            if message.HasField("finished_at")
            else None
        ),
        error=message.error if message.HasField("error") else None,
        waiting_for=message.waiting_for if message.HasField("waiting_for") else None,
    )


# --- the calls on tasks ---------------------------------------------------------------------


def _unknown(call: str, options: Mapping[str, object], known: Iterable[str]) -> None:
    extra = sorted(set(options) - set(known))
    if extra:
        # As the Scheduler does, instead of Python's TypeError for an unexpected keyword.
        raise InvalidArgument(f"{call} got unknown options: {', '.join(extra)}")


def get_request(
    task_id: object, *, include_payload: object = False, include_output: object = False
) -> pb.GetRequest:
    return pb.GetRequest(
        task_id=_int64(task_id, "task_id"),
        include_payload=_flag(include_payload, "include_payload"),
        include_output=_flag(include_output, "include_output"),
    )


def get_by_key_request(
    key: object, *, include_payload: object = False, include_output: object = False
) -> pb.GetByKeyRequest:
    return pb.GetByKeyRequest(
        key=_text(key, "key"),
        include_payload=_flag(include_payload, "include_payload"),
        include_output=_flag(include_output, "include_output"),
    )


def task_data_request(task_id: int, data: pb.TaskData.ValueType) -> pb.GetTaskDataRequest:
    return pb.GetTaskDataRequest(task_id=task_id, data=data)


def wait_request(
    task_id: object,
    timeout: object = None,
    *,
    include_payload: object = False,
    include_output: object = False,
) -> pb.WaitRequest:
    message = pb.WaitRequest(
        task_id=_int64(task_id, "task_id"),
        include_payload=_flag(include_payload, "include_payload"),
        include_output=_flag(include_output, "include_output"),
    )
    if timeout is not None:
        message.timeout.CopyFrom(_duration(timeout, "timeout"))
    return message


def wait_kwargs(message: pb.WaitRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.wait``."""
    kwargs: dict[str, Any] = {"task_id": message.task_id}
    if message.HasField("timeout"):
        kwargs["timeout"] = _seconds(message.timeout, "timeout")
    return kwargs


def cancel_request(task_id: object, reason: object = None) -> pb.CancelRequest:
    """``reason=None``: the Scheduler's default reason."""
    message = pb.CancelRequest(task_id=_int64(task_id, "task_id"))
    if reason is not None:
        message.reason = _text(reason, "reason")
    return message


def cancel_kwargs(message: pb.CancelRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.cancel``."""
    kwargs: dict[str, Any] = {"task_id": message.task_id}
    if message.HasField("reason"):
        kwargs["reason"] = message.reason
    return kwargs


def rerun_request(task_id: object) -> pb.RerunRequest:
    return pb.RerunRequest(task_id=_int64(task_id, "task_id"))


# --- why a task is where it is (issue 32) ---------------------------------------------------


def explain_request(task_id: object) -> pb.ExplainRequest:
    return pb.ExplainRequest(task_id=_int64(task_id, "task_id"))


def explanation_to_pb(explanation: Explanation) -> pb.Explanation:
    message = pb.Explanation(
        task_id=explanation.task_id,
        status=status_to_pb(explanation.status),
        hold=pb.Hold.ValueType(_HOLD[explanation.hold]),
        summary=explanation.summary,
        since=_timestamp(explanation.since, "since"),
        attempt=explanation.attempt,
        parents=explanation.parents,
        pool=explanation.pool,
    )
    if explanation.until is not None:
        message.until.CopyFrom(_timestamp(explanation.until, "until"))
    for name in ("running", "concurrency", "limit", "limit_key", "worker"):
        value = getattr(explanation, name)
        if value is not None:
            setattr(message, name, value)
    return message


def explanation_from_pb(message: pb.Explanation) -> Explanation:
    """As ``Scheduler.explain`` answers; a hold this client does not know (a newer server's)
    is InvalidArgument, as any unknown enum number is."""
    return Explanation(
        task_id=message.task_id,
        status=status_from_pb(message.status),
        hold=_enum_from_pb(message.hold, _HOLD_BACK, "hold"),
        summary=message.summary,
        since=_datetime(message.since, "since"),
        until=_datetime(message.until, "until") if message.HasField("until") else None,
        attempt=message.attempt,
        parents=tuple(message.parents),
        pool=message.pool,
        running=message.running if message.HasField("running") else None,
        concurrency=message.concurrency if message.HasField("concurrency") else None,
        limit=message.limit if message.HasField("limit") else None,
        limit_key=message.limit_key if message.HasField("limit_key") else None,
        worker=message.worker if message.HasField("worker") else None,
    )


def get_attempts_request(task_id: object, after: object = 0) -> pb.GetAttemptsRequest:
    """``after``: only attempts numbered above it (the next page of a reply ended early)."""
    return pb.GetAttemptsRequest(task_id=_int64(task_id, "task_id"), after=_int64(after, "after"))


def attempt_info_to_pb(info: AttemptInfo) -> pb.AttemptInfo:
    return pb.AttemptInfo(
        attempt=info.attempt,
        started_at=_timestamp(info.started_at, "started_at"),
        ended_at=_timestamp(info.ended_at, "ended_at"),
        message=info.message,
    )


def attempt_info_from_pb(message: pb.AttemptInfo) -> AttemptInfo:
    return AttemptInfo(
        message.attempt,
        _datetime(message.started_at, "started_at"),
        _datetime(message.ended_at, "ended_at"),
        message.message,
    )


def attempts_response(message: pb.GetAttemptsResponse) -> tuple[list[AttemptInfo], int | None]:
    """The reply's attempts, and the ``after`` of the next call (None: this was the last)."""
    attempts = [attempt_info_from_pb(a) for a in message.attempts]
    return attempts, message.next_after if message.HasField("next_after") else None


def get_dependants_request(task_id: object, after: object = 0) -> pb.GetDependantsRequest:
    """``after``: only dependants of ids above it (the next page of a reply ended early)."""
    return pb.GetDependantsRequest(task_id=_int64(task_id, "task_id"), after=_int64(after, "after"))


def dependants_response(message: pb.GetDependantsResponse) -> tuple[list[int], int | None]:
    """The reply's ids, and the ``after`` of the next call (None: this was the last)."""
    return list(message.task_ids), message.next_after if message.HasField("next_after") else None


_LIST_OPTIONS = ("status", "pool", "kind", "tag", "after", "before", "newest_first", "limit")


def list_request(**options: object) -> pb.ListRequest:
    """The options of ``Scheduler.list`` (status, pool, kind, tag, after, limit); an option
    given as None is the same as not given."""
    _unknown("list", options, _LIST_OPTIONS)
    message = pb.ListRequest()
    status = options.get("status")
    if status is not None:
        statuses = (
            [status]
            if isinstance(status, str)
            else _items(status, "status", "a Status, a str or an iterable of them")
        )
        message.statuses.SetInParent()  # present even when empty: then no status matches
        message.statuses.statuses.extend(pb.Status.ValueType(_status_filter(s)) for s in statuses)
    for name in ("pool", "kind", "tag"):
        value = options.get(name)
        if value is not None:
            setattr(message, name, _text(value, name))
    for name in ("after", "before"):
        bound = options.get(name)
        if bound is not None:
            setattr(message, name, _int64(bound, name))
    newest_first = options.get("newest_first")
    if newest_first is not None:
        message.newest_first = _flag(newest_first, "newest_first")
    limit = options.get("limit")
    if limit is not None:
        message.page_size = _int64(limit, "limit")
    return message


_TOKEN = re.compile(r"-?[0-9]{1,19}")  # an int64: int() of 5000 digits is slow, or refused


def _after_of_token(token: str, what: str) -> int | None:
    if not token:
        return None
    if not _TOKEN.fullmatch(token):
        raise InvalidArgument(
            f"{what} must be the next_page_token of an earlier page (a task id), "
            f"got {_shown(token)}"
        )
    return int(token)


def list_kwargs(message: pb.ListRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.list``: a page is ``after`` the token's id (``before``
    it, newest first) and within the request's own bounds, at most ``page_size`` long."""
    kwargs: dict[str, Any] = {}
    if message.HasField("statuses"):
        kwargs["status"] = frozenset(
            status_from_pb(s, "a status of the filter") for s in message.statuses.statuses
        )
    for name in ("pool", "kind", "tag"):
        if message.HasField(name):
            kwargs[name] = getattr(message, name)
    bounds = {
        name: getattr(message, name) for name in ("after", "before") if message.HasField(name)
    }
    cursor = _after_of_token(message.page_token, "page_token")
    if cursor is not None:  # the id the previous page ended at, in the list's direction
        if message.newest_first:
            bounds["before"] = min(bounds.get("before", cursor), cursor)
        else:
            bounds["after"] = max(bounds.get("after", cursor), cursor)
    kwargs.update(bounds)
    if message.newest_first:
        kwargs["newest_first"] = True
    if message.HasField("page_size"):
        kwargs["limit"] = message.page_size
    return kwargs


def list_response(message: pb.ListResponse) -> tuple[list[TaskSummary], int | None]:
    """The page's tasks, and the ``after`` of the next page (None: this one was the last)."""
    tasks = [task_summary_from_pb(t) for t in message.tasks]
    return tasks, _after_of_token(message.next_page_token, "next_page_token")


# --- schedules ------------------------------------------------------------------------------


def schedule_info_to_pb(info: ScheduleInfo) -> pb.ScheduleInfo:
    message = pb.ScheduleInfo(
        name=info.name,
        cron=info.cron,
        timezone=info.timezone,
        kind=info.kind,
        pool=info.pool,
        paused=info.paused,
        next_run_at=_timestamp(info.next_run_at, "next_run_at"),
        overlap=pb.OverlapPolicy.ValueType(_OVERLAP[info.overlap]),
        catch_up=pb.CatchUpPolicy.ValueType(_CATCH_UP[info.catch_up]),
    )
    if info.last_task_id is not None:
        message.last_task_id = info.last_task_id
    return message


def schedule_info_from_pb(message: pb.ScheduleInfo) -> ScheduleInfo:
    return ScheduleInfo(
        name=message.name,
        cron=message.cron,
        timezone=message.timezone,
        kind=message.kind,
        pool=message.pool,
        paused=message.paused,
        next_run_at=_datetime(message.next_run_at, "next_run_at"),
        last_task_id=message.last_task_id if message.HasField("last_task_id") else None,
        overlap=_enum_from_pb(message.overlap, _OVERLAP_BACK, "overlap"),
        catch_up=_enum_from_pb(message.catch_up, _CATCH_UP_BACK, "catch_up"),
    )


def pool_info_to_pb(info: PoolInfo) -> pb.PoolInfo:
    return pb.PoolInfo(
        name=info.name,
        concurrency=info.concurrency,
        paused=info.paused,
        running=info.running,
        depth={status.value: count for status, count in info.depth.items()},
        remote=info.remote,
    )


def pool_info_from_pb(message: pb.PoolInfo) -> PoolInfo:
    depth: dict[Status, int] = {}
    for name, count in message.depth.items():
        try:
            depth[Status(name)] = count
        except ValueError:
            raise InvalidArgument(f"depth: {_shown(name)} is not a task status") from None
    return PoolInfo(
        message.name, message.concurrency, message.paused, message.running, depth, message.remote
    )


LIST_LIMITS_KEYS_DEFAULT = 20
"""How many of each limit's busiest keys ListLimits sends when the request does not say."""


def list_limits_request(keys: object = LIST_LIMITS_KEYS_DEFAULT) -> pb.ListLimitsRequest:
    return pb.ListLimitsRequest(keys=_int64(keys, "keys"))


def list_limits_kwargs(message: pb.ListLimitsRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.list_limits``, which checks the range of ``keys``."""
    return {"keys": message.keys} if message.HasField("keys") else {}


def _limit_to_pb(limit: Limit) -> pb.Limit:
    message = pb.Limit(
        name=limit.name,
        per_key=limit.per_key,
        on_full=pb.OnFull.ValueType(_ON_FULL[OnFull(limit.on_full)]),
    )
    if limit.concurrency is not None:
        message.concurrency = limit.concurrency
    if limit.rate is not None:
        message.rate = limit.rate
    per_ns = limit.per_ns
    if per_ns is not None:
        message.per.CopyFrom(_duration_of_ns(per_ns))
    if limit.burst is not None:
        message.burst = limit.burst
    return message


def _limit_from_pb(message: pb.Limit) -> Limit:
    per: float | None = None
    if message.HasField("per"):
        ns = _ns(message.per, "per")
        # Whole seconds as an int, so that Limit.describe() reads as the server's does.
        per = ns // NS_PER_S if ns % NS_PER_S == 0 else ns / NS_PER_S
    return Limit(
        message.name,
        concurrency=message.concurrency if message.HasField("concurrency") else None,
        rate=message.rate if message.HasField("rate") else None,
        per=per,
        burst=message.burst if message.HasField("burst") else None,
        per_key=message.per_key,
        on_full=(
            _enum_from_pb(message.on_full, _ON_FULL_BACK, "on_full")
            if message.on_full != pb.ON_FULL_UNSPECIFIED
            else OnFull.QUEUE
        ),
    )


def _limit_key_use_to_pb(use: LimitKeyInfo) -> pb.LimitKeyUse:
    message = pb.LimitKeyUse(running=use.running, starts=use.starts, waiting=use.waiting)
    if use.key is not None:
        message.key = use.key
    return message


def limit_info_to_pb(info: LimitInfo, *, keys: bool = True) -> pb.LimitInfo:
    """A limit and its use; ``keys``: with its busiest keys (the server adds them while
    they fit in its reply)."""
    message = pb.LimitInfo(
        limit=_limit_to_pb(info.limit),
        keys_in_use=info.keys_in_use,
        running=info.running,
        starts=info.starts,
        waiting=info.waiting,
    )
    if keys:
        message.keys.extend(_limit_key_use_to_pb(use) for use in info.keys)
    return message


def limit_info_from_pb(message: pb.LimitInfo) -> LimitInfo:
    """A limit and its use, as ``Scheduler.list_limits`` returns it. A limit this client
    cannot build (a newer server's bound) is InvalidArgument."""
    return LimitInfo(
        _limit_from_pb(message.limit),
        message.keys_in_use,
        message.running,
        message.starts,
        message.waiting,
        tuple(
            LimitKeyInfo(
                use.key if use.HasField("key") else None, use.running, use.starts, use.waiting
            )
            for use in message.keys
        ),
    )


def worker_info_to_pb(info: WorkerInfo) -> pb.WorkerInfo:
    message = pb.WorkerInfo(
        worker_id=info.worker_id,
        address=info.address,
        pools=info.pools,
        slots=info.slots,
        in_flight=info.in_flight,
        attached_at=_timestamp(info.attached_at, "attached_at"),
        identity=info.identity or "",
    )
    if info.last_heartbeat_at is not None:
        message.last_heartbeat_at.CopyFrom(_timestamp(info.last_heartbeat_at, "last_heartbeat_at"))
    return message


def worker_info_from_pb(message: pb.WorkerInfo) -> WorkerInfo:
    heard = None
    if message.HasField("last_heartbeat_at"):
        heard = _datetime(message.last_heartbeat_at, "last_heartbeat_at")
    return WorkerInfo(
        message.worker_id,
        message.address,
        tuple(message.pools),
        message.slots,
        message.in_flight,
        _datetime(message.attached_at, "attached_at"),
        heard,
        message.identity or None,
    )


_SCHEDULE_OPTIONS = (
    "payload", "pool", "timezone", "tags", "priority", "retry", "timeout", "overlap",
    "catch_up", "grace", "replace",
)  # fmt: skip


def add_schedule_request(
    codec: Codec, name: object, cron: object, *, kind: object, **options: object
) -> pb.AddScheduleRequest:
    """The arguments of ``Scheduler.add_schedule``, the payload encoded by ``codec``. An option
    not given (or None, for payload, retry and timeout) takes the Scheduler's default."""
    _unknown("add_schedule", options, _SCHEDULE_OPTIONS)
    message = pb.AddScheduleRequest(
        name=_text(name, "schedule name"), cron=_text(cron, "cron"), kind=_text(kind, "kind")
    )
    if options.get("payload") is not None:
        pool = options.get("pool", _ABSENT.pool)
        # A schedule's tasks have no key.
        message.payload = _payload_to_pb(codec, options["payload"], message.kind, pool, None)
    for text in ("pool", "timezone"):
        if text in options:
            setattr(message, text, _text(options[text], text))
    if "tags" in options:
        message.tags.extend(_texts(options["tags"], "tags", "tag"))
    if "priority" in options:
        message.priority = _int64(options["priority"], "priority")
    retry = retry_to_pb(options.get("retry"))
    if retry is not None:
        message.retry.CopyFrom(retry)
    if options.get("timeout") is not None:
        message.timeout.CopyFrom(_duration(options["timeout"], "timeout"))
    if "overlap" in options:
        message.overlap = pb.OverlapPolicy.ValueType(
            _enum_to_pb(options["overlap"], OverlapPolicy, _OVERLAP, "overlap")
        )
    if "catch_up" in options:
        message.catch_up = pb.CatchUpPolicy.ValueType(
            _enum_to_pb(options["catch_up"], CatchUpPolicy, _CATCH_UP, "catch_up")
        )
    if "grace" in options:
        message.grace.CopyFrom(_duration(options["grace"], "grace"))
    if "replace" in options:
        message.replace = _flag(options["replace"], "replace")
    return message


def add_schedule_kwargs(message: pb.AddScheduleRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.add_schedule`` (BytesCodec: the payload is bytes or None)."""
    kwargs: dict[str, Any] = {
        "name": message.name,
        "cron": message.cron,
        "kind": message.kind,
        "tags": tuple(message.tags),
        "priority": message.priority,
        "replace": message.replace,
    }
    if message.HasField("payload"):
        kwargs["payload"] = message.payload
    for text in ("pool", "timezone"):
        if message.HasField(text):
            kwargs[text] = getattr(message, text)
    if message.HasField("retry"):
        kwargs["retry"] = retry_from_pb(message.retry)
    if message.HasField("timeout"):
        kwargs["timeout"] = _seconds(message.timeout, "timeout")
    if message.overlap != pb.OVERLAP_POLICY_UNSPECIFIED:
        kwargs["overlap"] = _enum_from_pb(message.overlap, _OVERLAP_BACK, "overlap")
    if message.catch_up != pb.CATCH_UP_POLICY_UNSPECIFIED:
        kwargs["catch_up"] = _enum_from_pb(message.catch_up, _CATCH_UP_BACK, "catch_up")
    if message.HasField("grace"):
        kwargs["grace"] = _seconds(message.grace, "grace")
    return kwargs


def preview_request(cron: object, **options: object) -> pb.PreviewScheduleRequest:
    """The arguments of ``cronoq.preview`` (timezone, n, after); a missing one, its default."""
    _unknown("preview", options, ("timezone", "n", "after"))
    message = pb.PreviewScheduleRequest(cron=_text(cron, "cron"))
    if "timezone" in options:
        message.timezone = _text(options["timezone"], "timezone")
    if "n" in options:
        message.n = _int64(options["n"], "n")
    if options.get("after") is not None:
        message.after.CopyFrom(_timestamp(options["after"], "after"))
    return message


def preview_kwargs(message: pb.PreviewScheduleRequest) -> dict[str, Any]:
    """The arguments of ``cronoq.preview``."""
    kwargs: dict[str, Any] = {"cron": message.cron}
    if message.HasField("timezone"):
        kwargs["timezone"] = message.timezone
    if message.HasField("n"):
        kwargs["n"] = message.n
    if message.HasField("after"):
        kwargs["after"] = _datetime(message.after, "after")
    return kwargs


def preview_response_to_pb(occurrences: Iterable[datetime]) -> pb.PreviewScheduleResponse:
    return pb.PreviewScheduleResponse(
        occurrences=[_timestamp(when, "occurrence") for when in occurrences]
    )


def preview_response(message: pb.PreviewScheduleResponse) -> list[datetime]:
    return [_datetime(ts, "occurrence") for ts in message.occurrences]


OCCURRENCES_PAGE_DEFAULT = 100
"""Records of a ListOccurrences that names no limit (``Scheduler.occurrences``'s)."""


def list_occurrences_request(
    name: object, before: object = None, limit: object = None
) -> pb.ListOccurrencesRequest:
    """``before=None``: from the newest; ``limit=None``: the server's default (100). The
    Scheduler checks the name and the limit's range."""
    message = pb.ListOccurrencesRequest(name=_text(name, "schedule name"))
    if before is not None:
        message.before.CopyFrom(_timestamp(before, "before"))
    if limit is not None:
        message.limit = _int64(limit, "limit")
    return message


def list_occurrences_kwargs(message: pb.ListOccurrencesRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.occurrences``, ``limit`` always among them."""
    kwargs: dict[str, Any] = {
        "name": message.name,
        "limit": message.limit if message.HasField("limit") else OCCURRENCES_PAGE_DEFAULT,
    }
    if message.HasField("before"):
        kwargs["before"] = _datetime(message.before, "before")
    return kwargs


def occurrence_to_pb(info: OccurrenceInfo) -> pb.OccurrenceRecord:
    message = pb.OccurrenceRecord(
        schedule=info.schedule,
        due_at=_timestamp(info.due_at, "due_at"),
        until=_timestamp(info.until, "until"),
        outcome=pb.OccurrenceOutcome.ValueType(_OUTCOME[info.outcome]),
        decided_at=_timestamp(info.decided_at, "decided_at"),
        message=info.message,
    )
    if info.task_id is not None:
        message.task_id = info.task_id
    return message


def occurrence_from_pb(message: pb.OccurrenceRecord) -> OccurrenceInfo:
    return OccurrenceInfo(
        schedule=message.schedule,
        due_at=_datetime(message.due_at, "due_at"),
        until=_datetime(message.until, "until"),
        outcome=_enum_from_pb(message.outcome, _OUTCOME_BACK, "outcome"),
        task_id=message.task_id if message.HasField("task_id") else None,
        decided_at=_datetime(message.decided_at, "decided_at"),
        message=message.message,
    )


def occurrences_response(
    message: pb.ListOccurrencesResponse,
) -> tuple[list[OccurrenceInfo], datetime | None]:
    """The page's records, and the ``before`` of the next page (None: this one was the last)."""
    records = [occurrence_from_pb(record) for record in message.occurrences]
    following = None
    if message.HasField("next_before"):
        following = _datetime(message.next_before, "next_before")
    return records, following


# --- the outbox -----------------------------------------------------------------------------

OUTBOX_KIND_BYTES = 1024
"""A quarantined row's kind on the wire is cut at this many UTF-8 bytes: the store bounds a
kind at 255 characters, but a source outside it may not, and a kind too long is a reason to
be quarantined."""
OUTBOX_PAYLOAD_HEAD_BYTES = 1024
"""The first bytes of a quarantined row's payload that its listing carries: enough to tell
which application wrote it; the store has the rest."""
OUTBOX_PAGE_DEFAULT = 100
"""Rows of a ListOutboxQuarantine that names no limit (``Scheduler.outbox_quarantine``'s)."""
OUTBOX_TEXT_BYTES = 4096
"""A quarantined row's options and reason on the wire are cut at this many UTF-8 bytes:
options may be any JSON a hand-written row holds, and a page of 1,000 rows must stay bounded."""


def outbox_status_to_pb(
    stats: OutboxStats, *, ingested: int, quarantined: int, now_ns: int
) -> pb.OutboxStatusResponse:
    """The outbox's figures and the leader's counters (``ingested``, ``quarantined``); the
    oldest row's age by ``now_ns``, the server's clock."""
    message = pb.OutboxStatusResponse(
        depth=stats.depth,
        quarantined=stats.quarantined,
        ingested_by_leader=ingested,
        quarantined_by_leader=quarantined,
    )
    oldest = stats.oldest_enqueued_unix_ns
    if oldest is not None:
        message.oldest_enqueued_at.CopyFrom(_timestamp_of_ns(oldest))
        message.oldest_age.CopyFrom(_duration_of_ns(max(now_ns - oldest, 0)))
    return message


def outbox_status_from_pb(message: pb.OutboxStatusResponse) -> OutboxStatus:
    oldest = age = None
    if message.HasField("oldest_enqueued_at"):
        oldest = _datetime(message.oldest_enqueued_at, "oldest_enqueued_at")
    if message.HasField("oldest_age"):
        age = _delay(message.oldest_age, "oldest_age")
    return OutboxStatus(
        message.depth,
        oldest,
        age,
        message.quarantined,
        message.ingested_by_leader,
        message.quarantined_by_leader,
    )


def outbox_quarantine_request(
    after: object = 0, limit: object = None
) -> pb.ListOutboxQuarantineRequest:
    """``limit=None``: the server's default (100); the Scheduler checks both."""
    message = pb.ListOutboxQuarantineRequest(after=_int64(after, "after"))
    if limit is not None:
        message.limit = _int64(limit, "limit")
    return message


def outbox_quarantine_kwargs(message: pb.ListOutboxQuarantineRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.outbox_quarantine``, ``limit`` always among them."""
    limit = message.limit if message.HasField("limit") else OUTBOX_PAGE_DEFAULT
    return {"after": message.after, "limit": limit}


def quarantined_row_to_pb(row: QuarantinedRow) -> pb.QuarantinedOutboxRow:
    """A quarantined row with its fields cut at the protocol's bounds."""
    return pb.QuarantinedOutboxRow(
        row_id=row.row_id,
        kind=cut_text(row.kind, OUTBOX_KIND_BYTES),
        payload_size=row.payload_size,
        payload_head=row.payload[:OUTBOX_PAYLOAD_HEAD_BYTES],
        options=cut_text(row.options, OUTBOX_TEXT_BYTES),
        enqueued_at=_timestamp_of_ns(row.enqueued_unix_ns),
        reason=cut_text(row.reason, OUTBOX_TEXT_BYTES),
        quarantined_at=_timestamp_of_ns(row.quarantined_unix_ns),
    )


def quarantined_row_from_pb(message: pb.QuarantinedOutboxRow) -> QuarantinedOutboxRow:
    return QuarantinedOutboxRow(
        message.row_id,
        message.kind,
        message.payload_size,
        message.payload_head,
        message.options,
        _datetime(message.enqueued_at, "enqueued_at"),
        message.reason,
        _datetime(message.quarantined_at, "quarantined_at"),
    )


def outbox_quarantine_response(
    message: pb.ListOutboxQuarantineResponse,
) -> tuple[list[QuarantinedOutboxRow], int | None]:
    """The page's rows, and the ``after`` of the next page (None: this one was the last)."""
    rows = [quarantined_row_from_pb(row) for row in message.rows]
    return rows, message.next_after if message.HasField("next_after") else None


def outbox_row_ids(row_ids: object) -> list[int]:
    """Row ids as the wire carries them; how many a call may name is the server's to check
    (``MAX_OUTBOX_PAGE``), with the Scheduler's message."""
    return _int64s(row_ids, "row_ids", "an iterable of outbox row ids", "outbox row id")


# --- remote workers -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Attached:
    """The first event of every Attach stream: the link is up (a wire value only)."""

    epoch: int
    """The leader's epoch: a token of an older one is stale."""
    leases: Mapping[str, float]
    """Pool name -> seconds an attempt stays leased without a heartbeat."""


@dataclass(frozen=True, slots=True)
class RemoteAttempt(LeasedAttempt):
    """A leased attempt as the Attach stream carries it: with the outputs of its parents as
    stored (``Scheduler.parent_outputs``), which the worker decodes with its codec into
    ``TaskContext.parent_outputs`` (a wire value only). Every attempt the stream carries
    decodes to one; the server sends a ``LeasedAttempt`` with no ``after`` as it is."""

    parent_outputs: tuple[ParentOutput, ...] = ()
    """A parent the store pruned is absent; one that returned None has ``output=None``."""

    @classmethod
    def carrying(
        cls, attempt: LeasedAttempt, parent_outputs: Iterable[ParentOutput]
    ) -> RemoteAttempt:
        fields = {name: getattr(attempt, name) for name in LeasedAttempt.__dataclass_fields__}
        return cls(**fields, parent_outputs=tuple(parent_outputs))


WorkerEvent = Attached | LeasedAttempt | CancelRequested
"""What the Attach stream carries (a ``RemoteAttempt`` is a ``LeasedAttempt``)."""


@dataclass(frozen=True, slots=True)
class UnreadableAttempt:
    """An attempt of the Attach stream whose fields do not decode (a value out of range): the
    worker cannot run it, but can report it failed by its token (a wire value only)."""

    token: AttemptToken
    pool: str
    reason: str
    lease_id: bytes = field(default=b"", repr=False)
    """Its lease id, to report it with (a secret, never shown)."""


@dataclass(frozen=True, slots=True)
class ReportSuccess:
    output: bytes | None = None
    """As the worker's codec made it; None: the function returned None."""


@dataclass(frozen=True, slots=True)
class ReportFailure:
    message: str
    retryable: bool = True
    retry_after: float | timedelta | None = None
    """Seconds before the next attempt (as ``TaskError.retry_after``); None: the backoff."""
    traceback: str = ""
    """Where the exception was raised (``cronoq.format_traceback``); "": none."""


def token_to_pb(token: AttemptToken, lease_id: bytes = b"") -> pb.AttemptToken:
    """``lease_id``: only on what goes between the server and the attempt's own worker."""
    if not isinstance(lease_id, bytes):
        raise InvalidArgument(f"lease_id must be bytes, got {type(lease_id).__name__}")
    return pb.AttemptToken(
        epoch=_int64(token.epoch, "token epoch"),
        task_id=_int64(token.task_id, "token task_id"),
        attempt=_int64(token.attempt, "token attempt"),
        lease_id=lease_id,
    )


def token_from_pb(message: pb.AttemptToken) -> AttemptToken:
    """Any numbers: the Scheduler refuses impossible ones (InvalidArgument), and answers an
    unknown attempt with StaleAttempt."""
    return AttemptToken(message.epoch, message.task_id, message.attempt)


def _required_token(
    message: pb.HeartbeatRequest | pb.ReportRequest, what: str
) -> tuple[AttemptToken, bytes]:
    """The token and the lease id a worker sent (the Scheduler checks the id's length)."""
    if not message.HasField("token"):
        raise InvalidArgument(f"{what} needs the token of its attempt")
    return token_from_pb(message.token), message.token.lease_id


def _running_to_pb(attempt: object) -> pb.AttemptToken:
    if not isinstance(attempt, tuple) or len(attempt) != 2:
        raise InvalidArgument("each running attempt must be a (token, lease_id) pair")
    token, lease_id = attempt
    return token_to_pb(token, lease_id)


def attach_request(
    worker_id: str,
    pools: Iterable[str],
    slots: int,
    running: Iterable[tuple[AttemptToken, bytes]] = (),
    max_message_bytes: int = 0,
) -> pb.AttachRequest:
    """``running``: the attempts the worker still runs, as (token, lease id) pairs."""
    return pb.AttachRequest(
        worker_id=_worker_id(_text(worker_id, "worker_id")),
        pools=_texts(pools, "pools", "a pool name"),
        slots=_int64(slots, "slots"),
        running=[
            _running_to_pb(a)
            for a in _items(running, "running", "an iterable of (token, lease_id) pairs")
        ],
        max_message_bytes=_int64(max_message_bytes, "max_message_bytes"),
    )


def attach_message_limit(message: pb.AttachRequest) -> int | None:
    """The worker's largest acceptable stream message; None: it did not say."""
    if message.max_message_bytes < 0:
        raise InvalidArgument(
            f"max_message_bytes must be >= 0 (0: unknown), got {message.max_message_bytes}"
        )
    return message.max_message_bytes or None


MAX_WORKER_ID_LENGTH = 255
"""Characters of a worker's name (it is in the server's log lines)."""
MAX_WORKER_SLOTS = 10_000
"""Most slots a worker attaches with, and most attempts it names as still running."""
MAX_WORKER_POOLS = 1_000
"""Most pools one worker attaches to."""


def _worker_id(value: str) -> str:
    if len(value) > MAX_WORKER_ID_LENGTH:
        raise InvalidArgument(
            f"worker_id is {len(value)} characters long; the limit is {MAX_WORKER_ID_LENGTH}: "
            f"{_shown(value)}"
        )
    return value


def attach_kwargs(message: pb.AttachRequest) -> dict[str, Any]:
    """The arguments of ``Scheduler.attach``, each list bounded before any item is decoded;
    ``worker_id`` is its ``name`` (and the server's, for its logs and ListWorkers)."""
    _worker_id(message.worker_id)
    if len(message.pools) > MAX_WORKER_POOLS:
        raise InvalidArgument(f"pools: {len(message.pools)} given; the limit is {MAX_WORKER_POOLS}")
    if message.slots < 1:
        raise InvalidArgument(
            f"slots must be between 1 and {MAX_WORKER_SLOTS}, got {message.slots}: a worker "
            "attaches with at least one slot"
        )
    if message.slots > MAX_WORKER_SLOTS or len(message.running) > MAX_WORKER_SLOTS:
        raise InvalidArgument(
            f"a worker may have at most {MAX_WORKER_SLOTS} slots (and attempts running); "
            f"this one asked for {message.slots} (with {len(message.running)} running): "
            "use fewer slots"
        )
    return {
        "pools": tuple(message.pools),
        "slots": message.slots,
        "running": tuple((token_from_pb(t), t.lease_id) for t in message.running),
        # What ``explain`` shows for its attempts (the Scheduler checks it as a name).
        "name": message.worker_id,
    }


def _attempt_to_pb(attempt: LeasedAttempt) -> pb.Attempt:
    message = pb.Attempt(
        token=token_to_pb(attempt.token, attempt.lease_id),
        pool=attempt.pool,
        kind=attempt.kind,
        tags=attempt.tags,
        lease_expires_at=_timestamp(attempt.lease_expires_at, "lease_expires_at"),
    )
    if attempt.key is not None:
        message.key = attempt.key
    if attempt.name is not None:
        message.name = attempt.name
    if attempt.deadline is not None:
        message.deadline.CopyFrom(_timestamp(attempt.deadline, "deadline"))
    if attempt.timeout is not None:
        message.timeout.CopyFrom(_duration(attempt.timeout, "timeout"))
    if attempt.payload:
        message.payload = attempt.payload
    if attempt.trace_context is not None:
        message.traceparent = attempt.trace_context.traceparent
        if attempt.trace_context.tracestate:
            message.tracestate = attempt.trace_context.tracestate
    if attempt.after:
        message.after.extend(attempt.after)
    if isinstance(attempt, RemoteAttempt):
        message.parents.extend(parent_output_to_pb(parent) for parent in attempt.parent_outputs)
    return message


def parent_output_to_pb(parent: ParentOutput) -> pb.ParentOutput:
    message = pb.ParentOutput(task_id=parent.task_id, kind=parent.kind, pool=parent.pool)
    if parent.key is not None:
        message.key = parent.key
    if parent.output is not None:
        message.output = parent.output
    return message


def parent_output_from_pb(message: pb.ParentOutput) -> ParentOutput:
    """As stored; the worker's codec judges the kind, pool and key when it decodes the
    output (the server is not trusted with them)."""
    return ParentOutput(
        message.task_id,
        message.kind,
        message.pool,
        message.key if message.HasField("key") else None,
        message.output if message.HasField("output") else None,
    )


def _attempt_from_pb(message: pb.Attempt) -> RemoteAttempt:
    return RemoteAttempt(
        token=token_from_pb(message.token),
        pool=message.pool,
        kind=message.kind,
        key=message.key if message.HasField("key") else None,
        tags=tuple(message.tags),
        name=message.name if message.HasField("name") else None,
        deadline=_datetime(message.deadline, "deadline") if message.HasField("deadline") else None,
        timeout=(
            _float_seconds(message.timeout, "timeout") if message.HasField("timeout") else None
        ),
        payload=message.payload,  # absent is b"": no payload, as stored
        lease_expires_at=_datetime(message.lease_expires_at, "lease_expires_at"),
        lease_id=message.token.lease_id,
        # Leniently, as W3C Trace Context asks: a malformed context is dropped, the attempt
        # still runs.
        trace_context=TraceContext.from_headers(
            message.traceparent if message.HasField("traceparent") else None,
            message.tracestate if message.HasField("tracestate") else None,
        ),
        after=tuple(message.after),
        parent_outputs=tuple(parent_output_from_pb(parent) for parent in message.parents),
    )


def worker_event_to_pb(event: WorkerEvent) -> pb.WorkerEvent:
    if isinstance(event, Attached):
        leases = {name: _duration(s, f"lease of {name}") for name, s in event.leases.items()}
        return pb.WorkerEvent(attached=pb.Attached(epoch=event.epoch, leases=leases))
    if isinstance(event, LeasedAttempt):
        return pb.WorkerEvent(attempt=_attempt_to_pb(event))
    return pb.WorkerEvent(
        cancel=pb.CancelAttempt(token=token_to_pb(event.token), reason=event.reason)
    )


def worker_event_from_pb(message: pb.WorkerEvent) -> WorkerEvent | UnreadableAttempt:
    kind = message.WhichOneof("event")
    if kind == "attached":
        leases = {
            name: _float_seconds(lease, f"lease of {name}")
            for name, lease in message.attached.leases.items()
        }
        return Attached(message.attached.epoch, leases)
    if kind == "attempt":
        try:
            return _attempt_from_pb(message.attempt)
        except InvalidArgument as exc:
            attempt = message.attempt
            return UnreadableAttempt(
                token_from_pb(attempt.token), attempt.pool, str(exc), attempt.token.lease_id
            )
    if kind == "cancel":
        return CancelRequested(token_from_pb(message.cancel.token), message.cancel.reason)
    raise InvalidArgument("a worker event must be attached, attempt or cancel; it is empty")


def worker_events_to_pb(events: Iterable[WorkerEvent]) -> pb.AttachResponse:
    """One message of the Attach stream."""
    return pb.AttachResponse(events=[worker_event_to_pb(event) for event in events])


def worker_events_from_pb(message: pb.AttachResponse) -> list[WorkerEvent | UnreadableAttempt]:
    if not message.events:
        raise InvalidArgument("a message of the Attach stream carries at least one event")
    return [worker_event_from_pb(event) for event in message.events]


def heartbeat_request(token: AttemptToken, lease_id: bytes) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(token=token_to_pb(token, lease_id))


def heartbeat_token(message: pb.HeartbeatRequest) -> tuple[AttemptToken, bytes]:
    """The arguments of ``Scheduler.heartbeat``: the token and its lease id."""
    return _required_token(message, "a heartbeat")


def lease_renewed_to_pb(renewed: LeaseRenewed) -> pb.HeartbeatResponse:
    return pb.HeartbeatResponse(
        lease_expires_at=_timestamp(renewed.lease_expires_at, "lease_expires_at"),
        cancel_requested=renewed.cancel_reason is not None,
        cancel_reason=renewed.cancel_reason or "",
        stopped=renewed.stopped,
    )


def lease_renewed_from_pb(message: pb.HeartbeatResponse) -> LeaseRenewed:
    return LeaseRenewed(
        _datetime(message.lease_expires_at, "lease_expires_at"),
        message.cancel_reason if message.cancel_requested else None,
        message.stopped,
    )


MAX_HEARTBEATS_PER_CALL = 1_000
"""Most heartbeats one HeartbeatMany may carry (a worker with more due sends several calls)."""


def heartbeat_many_from_pb(message: pb.HeartbeatManyRequest) -> Sequence[pb.HeartbeatRequest]:
    """The heartbeats of a HeartbeatMany, each for ``heartbeat_token`` (and so judged alone)."""
    if len(message.heartbeats) > MAX_HEARTBEATS_PER_CALL:
        raise InvalidArgument(
            f"heartbeats: {len(message.heartbeats)} given; the limit is {MAX_HEARTBEATS_PER_CALL}"
        )
    return message.heartbeats


def heartbeat_result(outcome: LeaseRenewed | CronoqError) -> pb.HeartbeatResult:
    """One heartbeat's result in a HeartbeatMany: renewed, or refused for good."""
    if isinstance(outcome, LeaseRenewed):
        return pb.HeartbeatResult(renewed=lease_renewed_to_pb(outcome))
    return pb.HeartbeatResult(refused=report_result(outcome))


def heartbeat_result_from_pb(result: pb.HeartbeatResult) -> LeaseRenewed | CronoqError:
    """The renewal, or the exception a Heartbeat call would have raised. A result that is
    neither (a server that does not keep the protocol) is a SchedulerError: nothing is known,
    and the worker tries again soon, as after a failed call."""
    which = result.WhichOneof("result")
    try:
        if which == "renewed":
            return lease_renewed_from_pb(result.renewed)
        refusal = error_from_report_result(result.refused) if which == "refused" else None
    except InvalidArgument as exc:
        return SchedulerError(f"the server answered an unreadable renewal: {exc}", applied=None)
    if refusal is None:
        return SchedulerError("the server answered a heartbeat with no result", applied=None)
    return refusal


def report_request(
    token: AttemptToken, lease_id: bytes, outcome: ReportSuccess | ReportFailure
) -> pb.ReportRequest:
    """A report of the worker. A failure's message may be any str: a lone surrogate in an
    exception's text is escaped, since refusing the report would lose the outcome."""
    message = pb.ReportRequest(token=token_to_pb(token, lease_id))
    if isinstance(outcome, ReportSuccess):
        message.success.SetInParent()
        if outcome.output is not None:
            message.success.output = outcome.output
        return message
    if not isinstance(outcome.message, str):
        raise InvalidArgument(f"message must be a str, got {type(outcome.message).__name__}")
    text = outcome.message.encode("utf-8", "backslashreplace")
    message.failure.message = text.decode("utf-8")
    message.failure.retryable = _flag(outcome.retryable, "retryable")
    if outcome.retry_after is not None:
        message.failure.retry_after.CopyFrom(_duration(outcome.retry_after, "retry_after"))
    if not isinstance(outcome.traceback, str):
        raise InvalidArgument(f"traceback must be a str, got {type(outcome.traceback).__name__}")
    message.failure.traceback = outcome.traceback.encode("utf-8", "backslashreplace").decode()
    return message


MAX_REPORTS_PER_CALL = 1_000
"""Most reports one ReportMany may carry (a worker sends at most this many at once)."""


def report_many_from_pb(message: pb.ReportManyRequest) -> Sequence[pb.ReportRequest]:
    """The reports of a ReportMany, each for ``report_from_pb`` (and so judged alone)."""
    if len(message.reports) > MAX_REPORTS_PER_CALL:
        raise InvalidArgument(
            f"reports: {len(message.reports)} given; the limit is {MAX_REPORTS_PER_CALL}"
        )
    return message.reports


def report_from_pb(
    message: pb.ReportRequest,
) -> tuple[AttemptToken, bytes, ReportSuccess | ReportFailure]:
    """The token, lease id and outcome, for ``Scheduler.report_success`` or
    ``report_failure``."""
    token, lease_id = _required_token(message, "a report")
    kind = message.WhichOneof("outcome")
    if kind == "success":
        success = message.success
        output = success.output if success.HasField("output") else None
        return token, lease_id, ReportSuccess(output)
    if kind == "failure":
        failure = message.failure
        return (
            token,
            lease_id,
            ReportFailure(
                failure.message,
                failure.retryable if failure.HasField("retryable") else True,
                _seconds(failure.retry_after, "retry_after")
                if failure.HasField("retry_after")
                else None,
                failure.traceback,
            ),
        )
    raise InvalidArgument("a report needs an outcome: success or failure")
