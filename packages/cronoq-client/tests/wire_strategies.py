"""Hypothesis strategies and normal forms shared by the wire tests of cronoq-client."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from fractions import Fraction
from typing import Any, TypeVar, cast

from google.protobuf.message import Message
from hypothesis import strategies as st

from cronoq import (
    AttemptInfo,
    AttemptToken,
    CatchUpPolicy,
    Explanation,
    Hold,
    MissPolicy,
    OccurrenceInfo,
    OccurrenceOutcome,
    OverlapPolicy,
    ParentOutput,
    RetryPolicy,
    ScheduleInfo,
    Scheduler,
    Status,
    TaskInfo,
    TaskRequest,
    TaskSummary,
)
from cronoq_client import _wire as w
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._wire import INT64_MAX, INT64_MIN, NS_PER_S

M = TypeVar("M", bound=Message)

TEN_YEARS_NS = 10 * 366 * 24 * 3600 * NS_PER_S
DURATION_MAX_S = 315_576_000_000

int64s = st.integers(INT64_MIN, INT64_MAX)
# Valid UTF-8 only: a lone surrogate has no wire form (the client refuses it, tested apart).
texts = st.text(st.characters(codec="utf-8"), max_size=12)
optional_texts = st.none() | texts
utc_datetimes = st.datetimes(
    min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59, 999_999)
).map(lambda d: d.replace(tzinfo=UTC))
# Any zone or fixed offset, a day inside the range so that the instant has a UTC datetime.
offsets = st.timedeltas(-timedelta(hours=23, minutes=59), timedelta(hours=23, minutes=59))
aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.timezones() | offsets.map(timezone),
)
# Durations as a client gives them, all with a wire form (the Scheduler refuses some).
durations: st.SearchStrategy[Any] = st.one_of(
    st.integers(-DURATION_MAX_S, DURATION_MAX_S),
    st.floats(-DURATION_MAX_S, DURATION_MAX_S),
    st.timedeltas(timedelta(days=-3_000_000), timedelta(days=3_000_000)),
)
instants: st.SearchStrategy[Any] = aware_datetimes | st.timedeltas(
    timedelta(days=-3_000_000), timedelta(days=3_000_000)
)
tags = st.lists(texts, max_size=3) | st.lists(texts, max_size=3).map(tuple)


@st.composite
def retry_policies(draw: st.DrawFn) -> RetryPolicy:
    initial, maximum = sorted(draw(st.lists(st.integers(0, TEN_YEARS_NS), min_size=2, max_size=2)))
    return RetryPolicy(
        max_attempts=draw(st.integers(1, 1000)),
        initial_ns=initial,
        multiplier=draw(st.floats(1.0, 100.0)),
        max_ns=maximum,
        jitter=draw(st.floats(0.0, 1.0)),
    )


def enum_values(kind: type[StrEnum]) -> st.SearchStrategy[Any]:
    """A member, or its string value (both are what the Scheduler takes)."""
    return st.sampled_from(list(kind)) | st.sampled_from([m.value for m in kind])


task_requests = st.builds(
    TaskRequest,
    kind=texts,
    payload=st.none() | st.binary(max_size=40),
    pool=texts,
    key=optional_texts,
    tags=tags,
    name=optional_texts,
    priority=int64s,
    retry=st.none() | retry_policies(),
    start_at=st.none() | instants,
    miss_policy=enum_values(MissPolicy),
    grace=durations,
    deadline=st.none() | instants,
    timeout=st.none() | durations,
    after=st.lists(int64s, max_size=3),
    limits=st.none() | st.dictionaries(texts, optional_texts, max_size=3),
)

task_infos = st.builds(
    TaskInfo,
    task_id=int64s,
    status=st.sampled_from(list(Status)),
    attempt=int64s,
    message=texts,
    pool=texts,
    kind=texts,
    key=optional_texts,
    tags=st.lists(texts, max_size=3).map(tuple),
    name=optional_texts,
    priority=int64s,
    # A Scheduler with BytesCodec returns a stored b"" payload as None: never b"".
    payload=st.none() | st.binary(min_size=1, max_size=40),
    output=st.none() | st.binary(max_size=40),
    submitted_at=utc_datetimes,
    updated_at=utc_datetimes,
    finished_at=st.none() | utc_datetimes,
    after=st.lists(int64s, max_size=3).map(tuple),
    schedule=optional_texts,
    limits=st.dictionaries(texts, optional_texts, max_size=3).map(
        lambda keys: tuple(sorted(keys.items()))
    ),
    waiting_for=optional_texts,
    started_at=st.none() | utc_datetimes,
    rerun_of=st.none() | int64s,
)

explanations = st.builds(
    Explanation,
    task_id=int64s,
    status=st.sampled_from(list(Status)),
    hold=st.sampled_from(list(Hold)),
    summary=texts,
    since=utc_datetimes,
    until=st.none() | utc_datetimes,
    attempt=int64s,
    parents=st.lists(int64s, max_size=3).map(tuple),
    pool=texts,
    running=st.none() | int64s,
    concurrency=st.none() | int64s,
    limit=optional_texts,
    limit_key=optional_texts,
    worker=optional_texts,
)

occurrence_infos = st.builds(
    OccurrenceInfo,
    schedule=texts,
    due_at=utc_datetimes,
    until=utc_datetimes,
    outcome=st.sampled_from(list(OccurrenceOutcome)),
    task_id=st.none() | int64s,
    decided_at=utc_datetimes,
    message=texts,
)

attempt_infos = st.builds(
    AttemptInfo, attempt=int64s, started_at=utc_datetimes, ended_at=utc_datetimes, message=texts
)

task_summaries = st.builds(
    TaskSummary,
    task_id=int64s,
    status=st.sampled_from(list(Status)),
    attempt=int64s,
    pool=texts,
    kind=texts,
    key=optional_texts,
    tags=st.lists(texts, max_size=3).map(tuple),
    finished_ns=st.none() | st.integers(-62_135_596_800 * NS_PER_S, 253_402_300_800 * NS_PER_S - 1),
    error=optional_texts,
    waiting_for=optional_texts,
)

schedule_infos = st.builds(
    ScheduleInfo,
    name=texts,
    cron=texts,
    timezone=texts,
    kind=texts,
    pool=texts,
    paused=st.booleans(),
    next_run_at=utc_datetimes,
    last_task_id=st.none() | int64s,
    overlap=st.sampled_from(list(OverlapPolicy)),
    catch_up=st.sampled_from(list(CatchUpPolicy)),
)


def wire(message: M) -> M:
    """The message as the other end has it: serialized and parsed again."""
    return type(message).FromString(message.SerializeToString())


class _FieldsOf:
    """Stands in for the Scheduler that the server's decoding hands each task's fields to
    (``task_spec_from_pb``, ``submit_many_specs``): it gives them back unchecked, as the
    TaskRequest they make, so that the decoding is tested apart from the checks."""

    def task_spec(self, now_ns: int, *fields: Any) -> TaskRequest:
        return TaskRequest(*fields)

    def payload_specs(self, template: TaskRequest, payloads: Iterable[bytes]) -> list[TaskRequest]:
        return [replace(template, payload=payload) for payload in payloads]


_FIELDS_OF = cast(Scheduler, _FieldsOf())


def decoded_request(message: pb.TaskRequest) -> TaskRequest:
    """The fields the server decodes from ``message``, as a TaskRequest."""
    return cast(TaskRequest, w.task_spec_from_pb(message, _FIELDS_OF, 0))


def decoded_requests(message: pb.SubmitManyRequest) -> list[TaskRequest]:
    """The fields the server decodes from each task of ``message``, as TaskRequests."""
    w.submit_many_tasks(message)
    return cast(list[TaskRequest], w.submit_many_specs(message, _FIELDS_OF, 0))


def duration_ns(value: timedelta | float) -> int:
    """Seconds or a timedelta in exact nanoseconds (the Scheduler's float arithmetic may differ
    by a nanosecond past 2**52 ns)."""
    if isinstance(value, timedelta):
        return (value.days * 86_400 + value.seconds) * NS_PER_S + value.microseconds * 1000
    return round(Fraction(value) * NS_PER_S)


def instant(value: timedelta | datetime) -> tuple[str, int]:
    """An instant as the Scheduler reads it: a delay, or ns since 1970 by its UTC offset (not
    datetime equality, under which a wall time in a DST gap equals nothing in another zone)."""
    if isinstance(value, timedelta):
        return ("delay", duration_ns(value))
    offset = value.utcoffset()
    assert offset is not None
    return ("at", duration_ns(value.replace(tzinfo=None) - offset - datetime(1970, 1, 1)))


tokens = st.builds(AttemptToken, epoch=int64s, task_id=int64s, attempt=int64s)

parent_outputs = st.builds(
    ParentOutput,
    task_id=int64s,
    kind=texts,
    pool=texts,
    key=optional_texts,
    output=st.none() | st.binary(max_size=20),
)

leased_attempts = st.builds(
    w.RemoteAttempt,
    token=tokens,
    pool=texts,
    kind=texts,
    key=optional_texts,
    tags=st.lists(texts, max_size=3).map(tuple),
    name=optional_texts,
    deadline=st.none() | utc_datetimes,
    # As the Scheduler makes it: nanoseconds / 1e9.
    timeout=st.none() | st.integers(1, TEN_YEARS_NS).map(lambda ns: ns / NS_PER_S),
    payload=st.binary(max_size=40),
    lease_expires_at=utc_datetimes,
    lease_id=st.binary(min_size=16, max_size=16),
    after=st.lists(int64s, max_size=3).map(tuple),
    parent_outputs=st.lists(parent_outputs, max_size=3).map(tuple),
)
"""Attempts as the Attach stream carries them: with their parents' outputs."""

_REQUEST_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "pool": st.just("default") | texts,
    "key": optional_texts,
    "tags": tags,
    "name": optional_texts,
    "priority": int64s,
    "retry": st.none() | retry_policies(),
    "start_at": st.none() | instants,
    "miss_policy": enum_values(MissPolicy),
    "grace": durations,
    "deadline": st.none() | instants,
    "timeout": st.none() | durations,
    "after": st.lists(int64s, max_size=3),
    "limits": st.none() | st.dictionaries(texts, optional_texts, max_size=3),
}


@st.composite
def near_default_requests(draw: st.DrawFn) -> TaskRequest:
    """A request with at most two fields given, the others left at their defaults: the fast
    paths take the request at its defaults, and one field away is where a missing condition
    shows (``task_requests`` gives every field, so never reaches them)."""
    given = draw(st.lists(st.sampled_from(sorted(_REQUEST_FIELDS)), max_size=2, unique=True))
    fields = {name: draw(_REQUEST_FIELDS[name]) for name in given}
    return TaskRequest("k", draw(st.none() | st.binary(max_size=40)), **fields)
