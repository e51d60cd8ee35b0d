"""The submission conversions run for every task of every call, so they are written for speed:
no dict of keywords, no Fraction, no empty list handed to a message. These tests hold them to
the plain forms they replaced (kept here as the reference): the same message or request, or the
same exception with the same text, for any input."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest
from google.protobuf import duration_pb2
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_wire_hostile import BAD_VALUES, FIELDS, messages
from wire_strategies import (
    decoded_request,
    decoded_requests,
    near_default_requests,
    task_requests,
    wire,
)

from cronoq import BytesCodec, MissPolicy, Pool, Scheduler, TaskContext, TaskRequest, encode_with
from cronoq.errors import InvalidArgument, UnknownPool
from cronoq.store import TaskSpec
from cronoq_client import _wire as w
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._wire import NS_PER_S

DIFFERENTIAL = settings(max_examples=400, deadline=None)


def _outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("returned", call())
    except Exception as exc:
        return ("raised", type(exc), str(exc))


# --- the reference forms ----------------------------------------------------------------


def _reference_to_pb(request: object) -> bytes:
    if not isinstance(request, TaskRequest):
        raise InvalidArgument(f"expected a TaskRequest, got {type(request).__name__}")
    message = pb.TaskRequest(
        kind=w._text(request.kind, "kind"),
        pool=w._text(request.pool, "pool"),
        tags=[w._text(t, "tag") for t in w._items(request.tags, "tags", "a list or tuple of str")],
        priority=w._int64(request.priority, "priority"),
        miss_policy=pb.MissPolicy.ValueType(
            w._enum_to_pb(request.miss_policy, MissPolicy, w._MISS, "miss_policy")
        ),
        grace=w._duration(request.grace, "grace"),
        after=[
            w._int64(i, "a dependency id")
            for i in w._items(request.after, "after", "a list of task ids")
        ],
    )
    if request.payload is not None:
        message.payload = encode_with(BytesCodec(), request.payload, "payload")
    if request.key is not None:
        message.key = w._text(request.key, "key")
    if request.name is not None:
        message.name = w._text(request.name, "name")
    retry = w.retry_to_pb(request.retry)
    if retry is not None:
        message.retry.CopyFrom(retry)
    if request.start_at is not None:
        w._set_instant(message, "start_time", "start_delay", request.start_at, "start_at")
    if request.deadline is not None:
        w._set_instant(message, "deadline_time", "deadline_delay", request.deadline, "deadline")
    if request.timeout is not None:
        message.timeout.CopyFrom(w._duration(request.timeout, "timeout"))
    if request.limits is not None:
        if not isinstance(request.limits, Mapping):
            given = type(request.limits).__name__
            raise InvalidArgument(f"limits must be a mapping of limit name to key, got {given}")
        for name in w._items(request.limits, "limits", "a mapping of limit name to key"):
            key = request.limits[name]
            message.limits.append(
                pb.LimitKey(
                    name=w._text(name, "limit name"),
                    key=None if key is None else w._text(key, f"limit {name!r} key"),
                )
            )
    return message.SerializeToString(deterministic=True)


def _reference_from_pb(message: pb.TaskRequest) -> TaskRequest:
    fields: dict[str, Any] = {
        "kind": message.kind,
        "tags": tuple(message.tags),
        "priority": message.priority,
        "after": tuple(message.after),
    }
    for name in ("payload", "pool", "key", "name"):
        if message.HasField(name):
            fields[name] = getattr(message, name)
    if message.HasField("retry"):
        fields["retry"] = w.retry_from_pb(message.retry)
    start = message.WhichOneof("start_at")
    if start == "start_time":
        fields["start_at"] = w._datetime(message.start_time, "start_at")
    elif start == "start_delay":
        fields["start_at"] = w._delay(message.start_delay, "start_at")
    if message.miss_policy != pb.MISS_POLICY_UNSPECIFIED:
        fields["miss_policy"] = w._enum_from_pb(message.miss_policy, w._MISS_BACK, "miss_policy")
    if message.HasField("grace"):
        fields["grace"] = w._seconds(message.grace, "grace")
    end = message.WhichOneof("deadline")
    if end == "deadline_time":
        fields["deadline"] = w._datetime(message.deadline_time, "deadline")
    elif end == "deadline_delay":
        fields["deadline"] = w._delay(message.deadline_delay, "deadline")
    if message.HasField("timeout"):
        fields["timeout"] = w._seconds(message.timeout, "timeout")
    if message.limits:
        if len(message.limits) > w.MAX_TASK_LIMITS:
            raise InvalidArgument(
                f"a task takes at most {w.MAX_TASK_LIMITS} limits (its pool's included), "
                f"got {len(message.limits)}"
            )
        names = [entry.name for entry in message.limits]
        for index, name in enumerate(names):
            if name in names[:index]:
                raise InvalidArgument(f"limits name limit {w._shown(name)} twice")
        fields["limits"] = {e.name: e.key if e.HasField("key") else None for e in message.limits}
    return TaskRequest(**fields)


def _typed(request: TaskRequest) -> tuple[Any, ...]:
    """Equal, and of the same types: timedelta(60) == 60.0 is False anyway, but 1 == 1.0."""
    values = [getattr(request, name) for name in FIELDS]
    return (*values, *(type(v) for v in values))


# --- the tests --------------------------------------------------------------------------


# Ties: k / 1024 seconds is k * 976,562.5 ns exactly, so odd k round half to even.
_TIES = st.integers(-(2**40), 2**40).map(lambda k: k / 1024)


@DIFFERENTIAL
@given(st.floats(allow_nan=False, allow_infinity=False) | _TIES)
def test_float_nanoseconds_are_the_exact_rounding(value: float) -> None:
    assert w._float_ns(value) == round(Fraction(value) * w.NS_PER_S)


@DIFFERENTIAL
@given(st.integers(-315_576_000_000 * w.NS_PER_S, 315_576_000_000 * w.NS_PER_S))
def test_durations_of_nanoseconds_are_the_signed_split(ns: int) -> None:
    seconds, nanos = divmod(abs(ns), w.NS_PER_S)
    sign = -1 if ns < 0 else 1
    expected = duration_pb2.Duration(seconds=sign * seconds, nanos=sign * nanos)
    assert w._duration_of_ns(ns) == expected


def _as_the_server_reads(data: bytes) -> tuple[Any, ...]:
    """The request the server decodes from ``data``, its grace in nanoseconds: a grace sent
    as 60 s comes back a timedelta, a grace left out the default 60.0, the same to the
    Scheduler."""
    request = _reference_from_pb(pb.TaskRequest.FromString(data))
    grace = request.grace
    ns = (
        w._float_ns(grace)
        if isinstance(grace, float)
        else grace // timedelta(microseconds=1) * 1000
    )
    return (*_typed(replace(request, grace=None)), ns)


def _encodes_as_the_reference_does(request: Callable[[], TaskRequest]) -> None:
    """Fields at their default are left out of the message (the server reads absence as the
    default): the server must read the same request, and a bad one fail the same way."""

    def encoded() -> bytes:
        message = w.task_request_to_pb(request(), BytesCodec())
        return message.SerializeToString(deterministic=True)

    ours, reference = _outcome(encoded), _outcome(lambda: _reference_to_pb(request()))
    if ours[0] == reference[0] == "returned":
        assert _as_the_server_reads(ours[1]) == _as_the_server_reads(reference[1])
        assert len(ours[1]) <= len(reference[1])
    else:
        assert ours == reference


@DIFFERENTIAL
@given(task_requests)
def test_requests_encode_to_what_the_reference_does(request: TaskRequest) -> None:
    _encodes_as_the_reference_does(lambda: request)


@DIFFERENTIAL
@given(near_default_requests())
def test_requests_near_their_defaults_encode_to_what_the_reference_does(
    request: TaskRequest,
) -> None:
    _encodes_as_the_reference_does(lambda: request)


@DIFFERENTIAL
@given(st.dictionaries(st.sampled_from(FIELDS), BAD_VALUES, min_size=1, max_size=3))
def test_hostile_requests_fail_as_the_reference_does(fields: dict[str, Any]) -> None:
    if any(hasattr(v, "__next__") for v in fields.values()):
        return  # read by the first side; the endless-iterable tests cover them
    # Made afresh for each side: a request holding an iterable must not be read twice.
    _encodes_as_the_reference_does(lambda: TaskRequest(**{"kind": "k", **fields}))


def test_a_request_at_its_defaults_is_its_kind_and_payload_alone() -> None:
    message = w.task_request_to_pb(TaskRequest("k", b"p"), BytesCodec())
    assert message == pb.TaskRequest(kind="k", payload=b"p")


@DIFFERENTIAL
@given(messages(pb.TaskRequest))
def test_any_message_decodes_as_the_reference_does(message: pb.TaskRequest) -> None:
    ours = _outcome(lambda: _typed(decoded_request(message)))
    assert ours == _outcome(lambda: _typed(_reference_from_pb(message)))


@DIFFERENTIAL
@given(task_requests)
def test_client_requests_decode_as_the_reference_does(request: TaskRequest) -> None:
    message = pb.TaskRequest.FromString(
        w.task_request_to_pb(request, BytesCodec()).SerializeToString()
    )
    assert _typed(decoded_request(message)) == _typed(_reference_from_pb(message))


def test_instants_decode_to_their_python_forms() -> None:
    message = pb.TaskRequest(kind="k")
    message.start_delay.seconds = 5
    message.deadline_time.seconds = 86_400
    decoded = decoded_request(message)
    assert decoded.start_at == timedelta(seconds=5)
    assert isinstance(decoded.deadline, datetime) and decoded.deadline.timestamp() == 86_400


# --- the compact form of SubmitMany ---------------------------------------------------------


def _task_by_task(requests: list[object]) -> list[tuple[Any, ...]]:
    """What the server reads from the task-by-task form of these requests (the reference)."""
    messages = [w.task_request_to_pb(r, BytesCodec()) for r in requests]
    return [_typed(decoded_request(wire_message)) for wire_message in messages]


# Few kinds, pools and payloads, so that lists often share all but their payloads.
_BULK = st.builds(
    TaskRequest,
    st.sampled_from(["k", "k2"]),
    st.binary(max_size=4) | st.none(),
    st.sampled_from(["default", "p"]),
)


@DIFFERENTIAL
@given(st.lists(_BULK | near_default_requests() | task_requests, max_size=6))
def test_submit_many_reads_as_the_task_by_task_form(requests: list[TaskRequest]) -> None:
    message = pb.SubmitManyRequest.FromString(
        w.submit_many_request(requests, BytesCodec()).SerializeToString()
    )
    ours = _outcome(lambda: [_typed(r) for r in decoded_requests(message)])
    assert ours == _outcome(lambda: _task_by_task(list(requests)))
    compact = (
        len(requests) > 1
        and all(
            r.only_kind_payload_pool and r.payload is not None and (r.kind, r.pool) == (
                requests[0].kind, requests[0].pool
            )
            for r in requests
        )
    )  # fmt: skip
    assert message.HasField("common") == compact
    assert not (message.tasks and message.payloads)


@DIFFERENTIAL
@given(st.lists(st.sampled_from(["k", "k", 7, "\ud800", ""]), min_size=2, max_size=4))
def test_a_bad_kind_in_a_bulk_list_fails_as_the_task_by_task_form(kinds: list[Any]) -> None:
    requests = [TaskRequest(kind, b"p") for kind in kinds]
    ours = _outcome(lambda: w.submit_many_request(requests, BytesCodec()))
    reference = _outcome(lambda: [w.task_request_to_pb(r, BytesCodec()) for r in requests])
    assert ours[0] == reference[0]
    assert ours[0] == "returned" or ours == reference


@DIFFERENTIAL
@given(st.lists(st.binary(max_size=3) | st.just(object()), min_size=2, max_size=4))
def test_a_bad_payload_in_a_bulk_list_fails_as_the_task_by_task_form(payloads: list[Any]) -> None:
    requests = [TaskRequest("k", payload) for payload in payloads]
    ours = _outcome(lambda: w.submit_many_request(requests, BytesCodec()))
    reference = _outcome(lambda: [w.task_request_to_pb(r, BytesCodec()) for r in requests])
    assert ours[0] == reference[0]
    assert ours[0] == "returned" or ours == reference


@DIFFERENTIAL
@given(task_requests, st.lists(st.binary(max_size=4), max_size=4))
def test_a_compact_message_of_any_common_request_reads_as_its_tasks(
    common: TaskRequest, payloads: list[bytes]
) -> None:
    common_pb = w.task_request_to_pb(replace(common, payload=None), BytesCodec())
    message = pb.SubmitManyRequest(common=common_pb, payloads=payloads)
    expected = [_typed(replace(decoded_request(common_pb), payload=p)) for p in payloads]
    assert [_typed(r) for r in decoded_requests(message)] == expected


@pytest.mark.parametrize(
    "head",
    [[], [TaskRequest("k", b"p")] * 3, [TaskRequest("k", b"p", key="a")]],
    ids=["first", "after-bulk", "after-full"],
)
def test_a_bad_item_of_an_endless_iterable_is_reported_when_read(head: list[TaskRequest]) -> None:
    requests: Iterator[Any] = itertools.chain(head, [42], itertools.repeat(TaskRequest("k", b"x")))
    with pytest.raises(InvalidArgument, match="expected a TaskRequest, got int"):
        w.submit_many_request(requests, BytesCodec())


def test_a_message_beyond_the_batch_limit_is_refused_before_decoding() -> None:
    too_many = pb.SubmitManyRequest(common=pb.TaskRequest(kind="k"), payloads=[b""] * 100_001)
    with pytest.raises(InvalidArgument, match="100001 tasks in one call; the server takes at most"):
        decoded_requests(too_many)
    assert len(decoded_requests(pb.SubmitManyRequest(tasks=[pb.TaskRequest(kind="k")]))) == 1


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (
            pb.SubmitManyRequest(tasks=[pb.TaskRequest(kind="k")], common=pb.TaskRequest(kind="k")),
            "tasks and common are both set",
        ),
        (pb.SubmitManyRequest(payloads=[b"p"]), "payloads given without common"),
        (
            pb.SubmitManyRequest(common=pb.TaskRequest(kind="k", payload=b"x"), payloads=[b"p"]),
            "common.payload is set",
        ),
    ],
)
def test_a_message_mixing_the_forms_is_refused(message: pb.SubmitManyRequest, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        decoded_requests(message)


# --- one pass from the message to the engine's input ----------------------------------------
# The server decodes each task into the arguments of Scheduler.task_spec, which checks them
# once, with no TaskRequest in between. The reference is the path it replaced: the plain
# decoding into a TaskRequest, then every check of the embedded Scheduler's submit_many
# (Scheduler._spec). Same spec, or the same exception with the same text, for any message.


async def _noop(ctx: TaskContext, payload: Any) -> None:
    pass


_NOW_NS = 1_700_000_000 * NS_PER_S
_SERVER = Scheduler(
    [Pool("default", _noop), Pool("slow", _noop)], codec=BytesCodec(), max_payload_bytes=8
)
"""As the server's Scheduler (BytesCodec), with a payload limit the generated payloads pass
and exceed."""


def _toward_the_checks(draw: st.DrawFn, message: pb.TaskRequest) -> pb.TaskRequest:
    """A hostile request, often with a known pool and a plain kind: most random pools are
    unknown, which is refused before any other field is checked."""
    pool = draw(st.sampled_from(["absent", "default", "slow", "as drawn"]))
    if pool == "absent":
        message.ClearField("pool")
    elif pool != "as drawn":
        message.pool = pool
    if draw(st.booleans()):
        message.kind = "k"
    return message


@st.composite
def _server_requests(draw: st.DrawFn) -> pb.TaskRequest:
    return _toward_the_checks(draw, draw(messages(pb.TaskRequest)))


@st.composite
def _server_batches(draw: st.DrawFn) -> pb.SubmitManyRequest:
    message: pb.SubmitManyRequest = draw(messages(pb.SubmitManyRequest))
    for task in message.tasks:
        _toward_the_checks(draw, task)
    if message.HasField("common"):
        _toward_the_checks(draw, message.common)
    return message


def _reference_specs(message: pb.SubmitManyRequest) -> list[TaskSpec]:
    """Each task decoded and checked in turn: the first bad task is the one reported (the path
    replaced decoded them all first, so a later task's decoding error came before an earlier
    task's check; the call was refused either way)."""
    w.submit_many_tasks(message)  # the form and the bounds: unchanged
    if message.HasField("common"):
        common = _reference_from_pb(message.common)
        return [_SERVER._spec(replace(common, payload=p), _NOW_NS) for p in message.payloads]
    return [_SERVER._spec(_reference_from_pb(task), _NOW_NS) for task in message.tasks]


def _specs(message: pb.SubmitManyRequest) -> list[TaskSpec]:
    w.submit_many_tasks(message)
    return [task.spec for task in w.submit_many_specs(message, _SERVER, _NOW_NS)]


@DIFFERENTIAL
@given(_server_requests())
def test_a_task_is_checked_once_as_the_embedded_scheduler_checks_it(
    message: pb.TaskRequest,
) -> None:
    ours = _outcome(lambda: w.task_spec_from_pb(message, _SERVER, _NOW_NS).spec)
    assert ours == _outcome(lambda: _SERVER._spec(_reference_from_pb(message), _NOW_NS))


@DIFFERENTIAL
@given(_server_batches())
def test_a_submit_many_is_checked_once_as_the_embedded_scheduler_checks_it(
    message: pb.SubmitManyRequest,
) -> None:
    # A compact message without payloads submits nothing; its common request is checked
    # even so (the reference, which checked each task's request, checked none).
    assume(message.payloads or not message.HasField("common"))
    assert _outcome(lambda: _specs(message)) == _outcome(lambda: _reference_specs(message))


@DIFFERENTIAL
@given(task_requests, st.lists(st.binary(max_size=12), max_size=3))
def test_a_compact_message_is_checked_once_as_its_tasks_are(
    common: TaskRequest, payloads: list[bytes]
) -> None:
    common_pb = w.task_request_to_pb(replace(common, payload=None, pool="default"), BytesCodec())
    message = wire(pb.SubmitManyRequest(common=common_pb, payloads=payloads))
    assume(payloads)
    assert _outcome(lambda: _specs(message)) == _outcome(lambda: _reference_specs(message))


def test_a_compact_message_without_payloads_still_has_its_common_request_checked() -> None:
    message = pb.SubmitManyRequest(common=pb.TaskRequest(kind="", pool="nope"))
    with pytest.raises(UnknownPool, match="unknown pool 'nope'"):
        _specs(message)
    assert _specs(pb.SubmitManyRequest(common=pb.TaskRequest(kind="k"))) == []
