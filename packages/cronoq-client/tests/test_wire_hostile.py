"""Hostile wire values: whatever a peer sends, decoding raises InvalidArgument or nothing.

Messages are generated from their descriptors, every field maybe set to any value its wire
type holds: int64 extremes, unknown enum numbers, NaN and infinities, NUL-bearing and long
strings, Durations and Timestamps of any seconds and nanos. A request that decodes goes on to a
real Scheduler (MemoryStore, BytesCodec), which must refuse it with its own InvalidArgument (or
the answer of a well-formed call: TaskNotFound, StaleAttempt): never another exception. The
client's decoders of replies are held to the same rule, and so is the encoding of hostile
Python values on the client.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any, cast

import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import decoded_request, wire

from cronoq import (
    BytesCodec,
    CheckedTask,
    Codec,
    JsonCodec,
    MemoryStore,
    Pool,
    RemotePool,
    Scheduler,
    TaskContext,
    TaskInfo,
    TaskRequest,
    decode_parent_outputs,
    preview,
)
from cronoq.crypto import EncryptedCodec
from cronoq.errors import (
    InvalidArgument,
    NotRetryable,
    ScheduleNotFound,
    StaleAttempt,
    TaskNotFound,
    WaitTimedOut,
)
from cronoq_client import AsyncClient
from cronoq_client import _wire as w
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._sizes import fitted_task_info, task_data_response
from cronoq_client._status import error_from_report_result

HOSTILE = settings(
    max_examples=200,
    deadline=None,
    # One Scheduler serves every example of a test: sharing it is the point.
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)

_INTS = {
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
}


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [low, high, -1, 0, 1, 999_999_999, 1_000_000_000, 253_402_300_800, -62_135_596_801]
    return st.sampled_from([e for e in edges if low <= e <= high]) | st.integers(low, high)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in _INTS:
        return _ints(*_INTS[field.type])
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        return st.floats() | st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308])
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_STRING:
        # Valid UTF-8 (the wire carries nothing else), with NULs, and sometimes long.
        chars = st.characters(codec="utf-8")
        return (
            st.text(chars, max_size=8)
            | st.text(chars, min_size=250, max_size=300)
            | st.just("a\x00b")
        )
    assert field.type == FieldDescriptor.TYPE_BYTES, field.full_name
    return st.binary(max_size=20)


def _class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


@st.composite
def _message(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> Message:
    message = _class(descriptor)()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        repeated = field.is_repeated
        sub_type = field.message_type
        if sub_type is not None and sub_type.GetOptions().map_entry:
            key_field, value_field = sub_type.fields
            for _ in range(draw(st.integers(0, 2))):
                key = draw(_scalar(key_field))
                if value_field.message_type is None:
                    getattr(message, field.name)[key] = draw(_scalar(value_field))
                else:
                    getattr(message, field.name)[key].CopyFrom(
                        draw(_message(value_field.message_type, depth + 1))
                    )
        elif sub_type is not None:
            if depth > 3:
                continue
            count = draw(st.integers(0, 3)) if repeated else 1
            for _ in range(count):
                sub = draw(_message(sub_type, depth + 1))
                target = getattr(message, field.name)
                (target.add() if repeated else target).CopyFrom(sub)
        elif repeated:
            getattr(message, field.name).extend(draw(st.lists(_scalar(field), max_size=3)))
        else:
            setattr(message, field.name, draw(_scalar(field)))
    # Serialized and parsed again, as the peer's bytes arrive.
    return wire(message)


def messages(cls: type[Message]) -> st.SearchStrategy[Any]:
    return _message(cast(Descriptor, cls.DESCRIPTOR))


# --- a Scheduler to take what decodes -------------------------------------------------------


async def _echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


class Harness:
    """One started Scheduler on a loop of its own, shared by the examples of one test."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.sched = Scheduler(
            [Pool("default", _echo), RemotePool("remote", lease=5.0)],
            store=MemoryStore(),
            codec=BytesCodec(),
            max_payload_bytes=4096,
        )
        self.runner.run(self.sched.start())

    def close(self) -> None:
        self.runner.run(self.sched.close(timeout=1))
        self.runner.close()

    def takes(self, call: Callable[[], Any], *answers: type[Exception]) -> None:
        """``call`` (returning an awaitable) succeeds, or raises InvalidArgument or one of
        ``answers``; the scheduler still runs."""
        self.runner.run(self._takes(call, (InvalidArgument, *answers)))

    async def _takes(self, call: Callable[[], Any], allowed: tuple[type[Exception], ...]) -> None:
        try:
            async with asyncio.timeout(10):
                await call()
        except allowed:
            pass
        assert self.sched.running, self.sched.failure


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


def _decoded(decode: Callable[[], Any]) -> Any:
    """What ``decode`` returns, or None if it raised InvalidArgument (anything else fails)."""
    try:
        return decode()
    except InvalidArgument:
        return None


# --- requests, through the Scheduler --------------------------------------------------------


@HOSTILE
@given(messages(pb.SubmitManyRequest))
def test_hostile_submissions(harness: Harness, message: pb.SubmitManyRequest) -> None:
    specs = _decoded(lambda: _specs(message, harness.sched))
    if specs is not None:
        harness.takes(lambda: harness.sched.submit_specs(specs))


def _specs(message: pb.SubmitManyRequest, sched: Scheduler) -> list[CheckedTask]:
    """As the server makes them: decoded and checked by ``sched`` in one pass."""
    w.submit_many_tasks(message)
    return w.submit_many_specs(message, sched, time.time_ns())


@HOSTILE
@given(messages(pb.ListRequest))
def test_hostile_lists(harness: Harness, message: pb.ListRequest) -> None:
    kwargs = _decoded(lambda: w.list_kwargs(message))
    if kwargs is not None:
        harness.takes(lambda: harness.sched.list(**kwargs))


@HOSTILE
@given(messages(pb.WaitRequest))
def test_hostile_waits(harness: Harness, message: pb.WaitRequest) -> None:
    # The harness has no tasks: a good wait is answered TaskNotFound at once.
    kwargs = _decoded(lambda: w.wait_kwargs(message))
    if kwargs is not None:
        harness.takes(lambda: harness.sched.wait(**kwargs), TaskNotFound)


READ_LIMIT = 6_000
"""A message limit the harness's largest payload (4,096 bytes) fits under alone, but not
together with an output as large."""


def _finished_with_payload_and_output(harness: Harness) -> TaskInfo:
    """A task of the harness that succeeded with its payload echoed as its output, both too
    large to be sent together under READ_LIMIT."""

    async def run() -> TaskInfo:
        request = TaskRequest("echo", b"x" * 4096, key=READ_KEY)
        [task_id] = await harness.sched.submit_many([request])
        return await harness.sched.wait(task_id, timeout=10)

    return harness.runner.run(run())


Read = pb.GetRequest | pb.GetByKeyRequest | pb.WaitRequest
READ_KEY = "read-me"


def _reads(task: TaskInfo) -> st.SearchStrategy[Read]:
    """A Get, GetByKey or Wait, wholly arbitrary or naming ``task`` with arbitrary fields
    that ask for its payload and output."""
    arbitrary = messages(pb.GetRequest) | messages(pb.GetByKeyRequest) | messages(pb.WaitRequest)
    flags = st.fixed_dictionaries(
        {"include_payload": st.booleans(), "include_output": st.booleans()}
    )
    return arbitrary | flags.flatmap(
        lambda f: st.sampled_from(
            [
                pb.GetRequest(task_id=task.task_id, **f),
                pb.GetByKeyRequest(key=READ_KEY, **f),
                pb.WaitRequest(task_id=task.task_id, timeout=Duration(), **f),
            ]
        )
    )


def _looked_up(
    harness: Harness, lookup: Callable[[], Awaitable[TaskInfo | None]]
) -> TaskInfo | None:
    """The task ``lookup`` finds in the harness's Scheduler, or None where it refuses the
    request (InvalidArgument, TaskNotFound, WaitTimedOut); the scheduler still runs."""

    async def run() -> TaskInfo | None:
        try:
            return await lookup()
        except (InvalidArgument, TaskNotFound, WaitTimedOut):
            return None

    found = harness.runner.run(run())
    assert harness.sched.running, harness.sched.failure
    return found


def _sent_as_asked(asked: bool, value: bytes | None, sent: bytes | None, omitted: bool) -> None:
    """A payload or output is in the reply, whole, or flagged as left out, exactly when it
    was asked for and the task has one."""
    assert sent is None or not omitted
    assert (sent is not None or omitted) is (asked and value is not None)
    assert sent is None or sent == value


@HOSTILE
@given(st.data())
def test_hostile_task_reads_send_what_is_asked_within_the_limit(
    harness: Harness, data: st.DataObject
) -> None:
    """As the server answers Get, GetByKey and Wait: the task read by the Scheduler, then the
    payload and output each sent only if asked, one that does not fit left out and flagged
    (the payload first); the reply fits the limit and the client decodes it."""
    task = _finished_with_payload_and_output(harness)
    message: Read = data.draw(_reads(task))
    sched = harness.sched
    match message:
        case pb.GetRequest():
            found = _looked_up(harness, lambda: sched.get(message.task_id))
        case pb.GetByKeyRequest():
            found = _looked_up(harness, lambda: sched.get_by_key(message.key))
        case pb.WaitRequest():
            kwargs = _decoded(lambda: w.wait_kwargs(message))
            found = None if kwargs is None else _looked_up(harness, lambda: sched.wait(**kwargs))
    if found is None:
        return
    payload, output = message.include_payload, message.include_output
    reply = fitted_task_info(found, payload=payload, output=output, limit=READ_LIMIT)
    assert reply.ByteSize() <= READ_LIMIT
    sent_payload = reply.payload if reply.HasField("payload") else None
    _sent_as_asked(payload, found.payload, sent_payload, reply.payload_omitted)
    sent_output = reply.output if reply.HasField("output") else None
    _sent_as_asked(output, found.output, sent_output, reply.output_omitted)
    # The payload is left out first: the output only if the task does not fit without it.
    assert not reply.output_omitted or reply.payload_omitted or not reply.HasField("payload")
    w.task_info_from_pb(wire(reply), BytesCodec())


@HOSTILE
@given(st.data())
def test_hostile_task_data_requests_send_the_value_alone(
    harness: Harness, data: st.DataObject
) -> None:
    """As the server answers GetTaskData (which refuses a choice other than PAYLOAD or OUTPUT
    itself, see test_server_calls): the value chosen is sent alone, whole, within the limit."""
    task = _finished_with_payload_and_output(harness)
    # Any task id a peer may send, or this task's.
    task_ids = st.just(task.task_id) | messages(pb.GetTaskDataRequest).map(lambda m: m.task_id)
    choice = data.draw(st.sampled_from([pb.TASK_DATA_PAYLOAD, pb.TASK_DATA_OUTPUT]))
    message = wire(pb.GetTaskDataRequest(task_id=data.draw(task_ids), data=choice))
    found = _looked_up(harness, lambda: harness.sched.get(message.task_id))
    if found is None:
        return
    value = found.payload if message.data == pb.TASK_DATA_PAYLOAD else found.output
    reply = task_data_response(value, found.task_id, READ_LIMIT)
    assert reply.ByteSize() <= READ_LIMIT
    assert (reply.data if reply.HasField("data") else None) == value


@HOSTILE
@given(messages(pb.CancelRequest))
def test_hostile_cancels(harness: Harness, message: pb.CancelRequest) -> None:
    kwargs = _decoded(lambda: w.cancel_kwargs(message))
    if kwargs is not None:
        harness.takes(lambda: harness.sched.cancel(**kwargs), TaskNotFound)


_TASK_READS = st.sampled_from(
    [pb.ExplainRequest, pb.GetAttemptsRequest, pb.GetDependantsRequest, pb.RerunRequest]
)


@HOSTILE
@given(_TASK_READS.flatmap(messages))
def test_hostile_calls_on_a_task_of_issue_32(
    harness: Harness,
    message: pb.ExplainRequest | pb.GetAttemptsRequest | pb.GetDependantsRequest | pb.RerunRequest,
) -> None:
    """As the server answers them: the task id goes to the Scheduler as it is (an attempt
    number or id to page ``after`` is only compared). The harness's one task is finished."""
    _finished_with_payload_and_output(harness)
    sched = harness.sched
    match message:
        case pb.ExplainRequest():
            harness.takes(lambda: sched.explain(message.task_id), TaskNotFound)
        case pb.GetAttemptsRequest():
            harness.takes(lambda: sched.attempts(message.task_id), TaskNotFound)
        case pb.GetDependantsRequest():
            harness.takes(lambda: sched.dependants(message.task_id), TaskNotFound)
        case pb.RerunRequest():
            harness.takes(lambda: sched.rerun(message.task_id), TaskNotFound, NotRetryable)


@HOSTILE
@given(messages(pb.ListOccurrencesRequest))
def test_hostile_occurrence_reads(harness: Harness, message: pb.ListOccurrencesRequest) -> None:
    kwargs = _decoded(lambda: w.list_occurrences_kwargs(message))
    if kwargs is not None:
        harness.takes(lambda: harness.sched.occurrences(**kwargs), ScheduleNotFound)


_CODECS: list[Codec] = [
    JsonCodec(),
    BytesCodec(),
    EncryptedCodec({"k1": EncryptedCodec.generate_key()}, "k1"),
]


@HOSTILE
@given(messages(pb.Attempt), st.sampled_from(_CODECS))
def test_hostile_parent_outputs_decode_or_raise_invalid_argument(
    message: pb.Attempt, codec: Codec
) -> None:
    """What a worker does with an attempt's parents: any kind, pool, key and bytes a server
    sends decode with the worker's codec, or raise InvalidArgument (the attempt then fails)."""
    event = _decoded(lambda: w.worker_event_from_pb(pb.WorkerEvent(attempt=message)))
    if isinstance(event, w.RemoteAttempt):
        _decoded(lambda: decode_parent_outputs(codec, event.parent_outputs))


@HOSTILE
@given(messages(pb.AddScheduleRequest))
def test_hostile_schedules(harness: Harness, message: pb.AddScheduleRequest) -> None:
    kwargs = _decoded(lambda: w.add_schedule_kwargs(message))
    if kwargs is not None:
        harness.takes(lambda: harness.sched.add_schedule(**kwargs))


@HOSTILE
@given(messages(pb.PreviewScheduleRequest))
def test_hostile_previews(message: pb.PreviewScheduleRequest) -> None:
    kwargs = _decoded(lambda: w.preview_kwargs(message))
    if kwargs is not None:
        _decoded(lambda: preview(**kwargs))


@HOSTILE
@given(messages(pb.AttachRequest))
def test_hostile_attaches(harness: Harness, message: pb.AttachRequest) -> None:
    kwargs = _decoded(lambda: w.attach_kwargs(message))

    async def attach() -> None:
        harness.sched.attach(**kwargs).close()

    if kwargs is not None:
        harness.takes(attach)


@HOSTILE
@given(messages(pb.HeartbeatRequest))
def test_hostile_heartbeats(harness: Harness, message: pb.HeartbeatRequest) -> None:
    decoded = _decoded(lambda: w.heartbeat_token(message))
    if decoded is not None:
        token, lease_id = decoded
        harness.takes(lambda: harness.sched.heartbeat(token, lease_id=lease_id), StaleAttempt)


@HOSTILE
@given(messages(pb.ReportRequest))
def test_hostile_reports(harness: Harness, message: pb.ReportRequest) -> None:
    decoded = _decoded(lambda: w.report_from_pb(message))
    if decoded is None:
        return
    token, lease_id, outcome = decoded
    if isinstance(outcome, w.ReportSuccess):
        harness.takes(
            lambda: harness.sched.report_success(token, outcome.output, lease_id=lease_id),
            StaleAttempt,
        )
    else:
        harness.takes(
            lambda: harness.sched.report_failure(
                token,
                outcome.message,
                lease_id=lease_id,
                retryable=outcome.retryable,
                retry_after=outcome.retry_after,
            ),
            StaleAttempt,
        )


# --- replies, on the client -----------------------------------------------------------------


REPLIES: list[tuple[type[Message], Callable[[Any], object]]] = [
    (pb.TaskInfo, lambda m: w.task_info_from_pb(m, JsonCodec())),
    (pb.TaskSummary, w.task_summary_from_pb),
    (pb.ScheduleInfo, w.schedule_info_from_pb),
    (pb.ListResponse, w.list_response),
    (pb.PreviewScheduleResponse, w.preview_response),
    (pb.CancelResponse, lambda m: w.status_from_pb(m.status)),
    (pb.WorkerEvent, w.worker_event_from_pb),
    (pb.AttachResponse, w.worker_events_from_pb),
    (pb.ReportResult, error_from_report_result),
    (pb.HeartbeatResponse, w.lease_renewed_from_pb),
    (pb.HeartbeatResult, w.heartbeat_result_from_pb),
    (pb.RetryPolicy, w.retry_from_pb),
    (pb.Explanation, w.explanation_from_pb),
    (pb.ListOccurrencesResponse, w.occurrences_response),
    (pb.GetAttemptsResponse, w.attempts_response),
    (pb.GetDependantsResponse, w.dependants_response),
    (pb.ParentOutput, w.parent_output_from_pb),
]


@pytest.mark.parametrize(("cls", "decode"), REPLIES, ids=[c.__name__ for c, _ in REPLIES])
def test_hostile_replies_decode_or_raise_invalid_argument(
    cls: type[Message], decode: Callable[[Any], object]
) -> None:
    @HOSTILE
    @given(messages(cls))
    def check(message: Message) -> None:
        _decoded(lambda: decode(message))

    check()


@HOSTILE
@given(st.binary(max_size=60))
def test_bytes_that_are_no_message_are_invalid_argument(data: bytes) -> None:
    for cls in (pb.SubmitRequest, pb.TaskInfo, pb.WorkerEvent, pb.ReportRequest):
        _decoded(lambda cls=cls: w.parse(cls, data))  # type: ignore[misc]


def test_bad_utf8_is_invalid_argument_not_a_decode_error() -> None:
    data = pb.TaskRequest(kind="ab").SerializeToString().replace(b"ab", b"\xff\xfe")
    with pytest.raises(InvalidArgument, match="not a valid TaskRequest"):
        w.parse(pb.TaskRequest, data)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (pb.WaitRequest(task_id=1, timeout=Duration(seconds=1, nanos=-1)), "nanos must be within"),
        (pb.WaitRequest(task_id=1, timeout=Duration(nanos=1_000_000_000)), "nanos must be within"),
        (pb.PreviewScheduleRequest(after=Timestamp(seconds=2**62)), "outside years 1..9999"),
        (pb.PreviewScheduleRequest(after=Timestamp(nanos=-1)), "nanos must be 0..999999999"),
        (pb.ListRequest(page_token="12a"), "page_token must be the next_page_token"),
        (pb.ListRequest(page_token="9" * 5000), "page_token must be"),
        (
            pb.ListRequest(statuses=pb.StatusFilter(statuses=[pb.STATUS_UNSPECIFIED])),
            "a status of the filter is unspecified",
        ),
        (
            pb.ListRequest(statuses=pb.StatusFilter(statuses=[pb.Status.ValueType(42)])),
            r"is an unknown value \(42\)",
        ),
        (pb.HeartbeatRequest(), "a heartbeat needs the token"),
        (pb.ReportRequest(token=pb.AttemptToken(epoch=1)), "a report needs an outcome"),
    ],
)
def test_undecodable_values_say_what_is_wrong(message: Message, match: str) -> None:
    decoders: dict[type[Message], Callable[[Any], object]] = {
        pb.WaitRequest: w.wait_kwargs,
        pb.PreviewScheduleRequest: w.preview_kwargs,
        pb.ListRequest: w.list_kwargs,
        pb.HeartbeatRequest: w.heartbeat_token,
        pb.ReportRequest: w.report_from_pb,
    }
    with pytest.raises(InvalidArgument, match=match):
        decoders[type(message)](wire(message))


def test_a_huge_delay_is_refused_while_decoding() -> None:
    message = pb.TaskRequest(kind="k", start_delay=Duration(seconds=2**62))
    with pytest.raises(InvalidArgument, match="start_at: a delay of 4611686018427387904 seconds"):
        decoded_request(wire(message))


def test_values_the_scheduler_refuses_reach_it_as_they_are() -> None:
    message = pb.TaskRequest(
        kind="a\x00b", pool="", priority=2**40, grace=Duration(seconds=-5), after=[-1]
    )
    request = decoded_request(wire(message))
    assert (request.kind, request.pool, request.priority, request.after) == (
        "a\x00b", "", 2**40, (-1,)
    )  # fmt: skip
    assert request.grace == timedelta(seconds=-5)


# --- hostile Python values, on the client ---------------------------------------------------


class _RaisingZone(tzinfo):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        raise RuntimeError("no offset")

    def dst(self, dt: datetime | None) -> timedelta:
        return timedelta(0)

    def tzname(self, dt: datetime | None) -> str:
        return "raising"


# Factories: an iterator drawn by one example must not be half-read by the next.
_BAD: list[Callable[[], object]] = [
        lambda: None, lambda: True, lambda: 1.5, lambda: math.nan, lambda: math.inf,
        lambda: -math.inf, lambda: 1e300, lambda: 10**400, lambda: -(10**400), lambda: 2**63,
        lambda: "x\udc00", lambda: "", lambda: "a\x00", lambda: b"bytes", object, lambda: [1, "a"],
        lambda: "a,b", lambda: datetime(2030, 1, 1),
        lambda: datetime(2030, 1, 1, tzinfo=_RaisingZone()), lambda: timedelta(days=999_999_999),
        lambda: datetime(2030, 1, 1, tzinfo=timezone(timedelta(hours=5))),
        lambda: timedelta(seconds=-1), itertools.count, lambda: itertools.repeat("t"),
        lambda: range(1, 10**18), lambda: ["ok", "x\udc00"],
]  # fmt: skip
BAD_VALUES = st.sampled_from(_BAD).map(lambda make: make())
FIELDS = [
    "kind", "payload", "pool", "key", "tags", "name", "priority", "retry", "start_at",
    "miss_policy", "grace", "deadline", "timeout", "after", "limits",
]  # fmt: skip


@HOSTILE
@given(st.dictionaries(st.sampled_from(FIELDS), BAD_VALUES, min_size=1, max_size=3))
def test_hostile_client_values_raise_invalid_argument_or_encode(fields: dict[str, Any]) -> None:
    request = TaskRequest(**{"kind": "k", **fields})
    _decoded(lambda: w.task_request_to_pb(request, BytesCodec()))
    _decoded(lambda: w.list_request(**{k: v for k, v in fields.items() if k in ("pool", "kind")}))
    options = {k: v for k, v in fields.items() if k in ("pool", "tags", "priority", "timeout")}
    _decoded(lambda: w.add_schedule_request(BytesCodec(), "n", "* * * * *", kind="k", **options))
    _decoded(lambda: w.wait_request(fields.get("priority", 1), fields.get("timeout")))
    _decoded(lambda: w.preview_request("* * * * *", after=fields.get("start_at")))
    task_id, after = fields.get("priority", 1), fields.get("after", 0)
    _decoded(lambda: w.explain_request(task_id))
    _decoded(lambda: w.rerun_request(task_id))
    _decoded(lambda: w.get_attempts_request(task_id, after))
    _decoded(lambda: w.get_dependants_request(task_id, after))
    _decoded(
        lambda: w.list_occurrences_request(
            fields.get("name", "s"), fields.get("start_at"), fields.get("priority")
        )
    )


async def test_the_calls_of_issue_32_refuse_bad_arguments_before_any_call() -> None:
    """Each new call of AsyncClient checks its arguments as the wire builders do, before it
    connects: against a port where nothing listens, a bad value is InvalidArgument at once."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        target = f"127.0.0.1:{unused.getsockname()[1]}"
    async with AsyncClient(target, timeout=1.0, connect_timeout=0.5) as client:
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: client.explain(cast(Any, "1")),
            lambda: client.rerun(2**64),
            lambda: client.attempts(cast(Any, 1.5)),
            lambda: client.dependants(cast(Any, None)),
            lambda: client.occurrences(cast(Any, 7)),
            lambda: client.occurrences("s\udc00"),
            lambda: client.occurrences("s", before=datetime(2030, 1, 1)),
            lambda: client.occurrences("s", limit=cast(Any, True)),
        ]
        for call in calls:
            with pytest.raises(InvalidArgument):
                await call()


def test_an_endless_iterable_is_refused_not_read_forever() -> None:
    endless: Any = itertools.repeat("t")
    with pytest.raises(InvalidArgument, match=r"more than 1000000 items"):
        w.task_request_to_pb(TaskRequest("k", tags=endless), BytesCodec())
    with pytest.raises(InvalidArgument, match=r"more than 1000000 items"):
        w.list_request(status=itertools.repeat("ready"))


def test_client_refusals_read_like_the_schedulers() -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: w.get_request(2**64), "task_id must be between"),
        (lambda: w.get_by_key_request("k\udc00"), "key must be valid Unicode"),
        (lambda: w.wait_request(1, math.nan), "timeout must be finite"),
        (lambda: w.wait_request(1, True), "timeout must be seconds"),
        (
            lambda: w.task_request_to_pb(
                TaskRequest("k", start_at=datetime(2030, 1, 1)), BytesCodec()
            ),
            "start_at must be timezone-aware, got naive 2030-01-01T00:00:00",
        ),
        (
            lambda: w.task_request_to_pb(
                TaskRequest("k", deadline=datetime(2030, 1, 1, tzinfo=_RaisingZone())),
                BytesCodec(),
            ),
            r"its tzinfo \(_RaisingZone\) failed in utcoffset\(\): RuntimeError",
        ),
        (
            lambda: w.task_request_to_pb(TaskRequest("k", miss_policy="never"), BytesCodec()),
            "miss_policy must be one of 'run_late', 'skip', got 'never'",
        ),
        (lambda: w.list_request(status="done"), "status must be among waiting"),
        (lambda: w.list_request(colour="red"), "list got unknown options: colour"),
        (
            lambda: w.add_schedule_request(BytesCodec(), "n", "* * * * *", kind="k", every=1),
            "add_schedule got unknown options: every",
        ),
        (
            lambda: w.task_request_to_pb(TaskRequest("k", payload="text"), BytesCodec()),
            "BytesCodec encodes bytes, got str",
        ),
        (
            lambda: w.task_request_to_pb(TaskRequest("k", retry=cast(Any, 3)), BytesCodec()),
            "retry must be",
        ),
        (lambda: w.task_request_to_pb(object(), BytesCodec()), "expected a TaskRequest"),
    ]
    for call, match in cases:
        with pytest.raises(InvalidArgument, match=match):
            call()


def test_hostile_decoders_keep_utc() -> None:
    message = pb.PreviewScheduleRequest(cron="* * * * *", after=Timestamp(nanos=1500))
    assert w.preview_kwargs(wire(message))["after"] == datetime(1970, 1, 1, 0, 0, 0, 1, UTC)
