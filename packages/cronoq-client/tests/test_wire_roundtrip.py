"""Every conversion of cronoq_client._wire, value -> message -> bytes -> message -> value.

What the other end gets must mean what this end gave: the same fields, the same instants and
durations (to the nanosecond where both ends can hold them), the same enums, "none" still
distinct from b"" for outputs, and absent options still absent (so the Scheduler's defaults
apply).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_strategies import (
    TEN_YEARS_NS,
    attempt_infos,
    decoded_request,
    decoded_requests,
    duration_ns,
    durations,
    enum_values,
    explanations,
    instant,
    int64s,
    leased_attempts,
    occurrence_infos,
    optional_texts,
    retry_policies,
    schedule_infos,
    tags,
    task_infos,
    task_requests,
    task_summaries,
    texts,
    tokens,
    utc_datetimes,
    wire,
)

from cronoq import (
    AttemptInfo,
    AttemptToken,
    BytesCodec,
    CancelRequested,
    CatchUpPolicy,
    CodecContext,
    Explanation,
    Hold,
    JsonCodec,
    LeasedAttempt,
    LeaseRenewed,
    MissPolicy,
    OccurrenceInfo,
    OccurrenceOutcome,
    OverlapPolicy,
    Pool,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    TaskInfo,
    TaskRequest,
)
from cronoq.errors import (
    CronoqError,
    InvalidArgument,
    PayloadError,
    SchedulerError,
    StaleAttempt,
    TaskNotFound,
)
from cronoq_client import _wire as w
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._sizes import (
    attempt_bytes,
    attempts_response_to_pb,
    dependants_response_to_pb,
    explanation_response,
    list_response_to_pb,
    occurrences_response_to_pb,
)
from cronoq_client._status import error_from_report_result, report_result, status_of
from cronoq_client._wire import NS_PER_S

ROUND_TRIPS = settings(max_examples=150, deadline=None)


def canonical_request(request: TaskRequest) -> tuple[Any, ...]:
    """A TaskRequest as the Scheduler understands it, comparable across the two ends."""
    return (
        request.kind,
        None if request.payload is None else bytes(request.payload),
        request.pool,
        request.key,
        tuple(request.tags),
        request.name,
        request.priority,
        request.retry,
        None if request.start_at is None else instant(request.start_at),
        MissPolicy(request.miss_policy),
        duration_ns(request.grace),
        None if request.deadline is None else instant(request.deadline),
        None if request.timeout is None else duration_ns(request.timeout),
        tuple(request.after),
    )


@ROUND_TRIPS
@given(task_requests)
def test_task_request_reaches_the_server_as_given(request: TaskRequest) -> None:
    decoded = decoded_request(wire(w.task_request_to_pb(request, BytesCodec())))
    assert canonical_request(decoded) == canonical_request(request)
    for when in (decoded.start_at, decoded.deadline):
        assert when is None or isinstance(when, timedelta) or when.tzinfo is UTC


@ROUND_TRIPS
@given(st.lists(task_requests, max_size=4))
def test_submit_many_keeps_the_order(requests: list[TaskRequest]) -> None:
    message = wire(w.submit_many_request(iter(requests), BytesCodec()))
    decoded = decoded_requests(message)
    assert [canonical_request(r) for r in decoded] == [canonical_request(r) for r in requests]
    one = wire(w.submit_request(requests[0], BytesCodec())) if requests else None
    assert one is None or canonical_request(decoded_request(one.task)) == (
        canonical_request(requests[0])
    )


def test_absent_request_fields_leave_the_scheduler_defaults() -> None:
    decoded = decoded_request(wire(pb.TaskRequest(kind="k")))
    assert decoded == TaskRequest("k")


def test_payload_goes_through_the_client_codec() -> None:
    message = w.task_request_to_pb(TaskRequest("k", {"a": [1, 2]}), JsonCodec())
    assert message.payload == b'{"a":[1,2]}'
    # None is no payload for every codec (JSON's null costs no bytes), as in the Scheduler.
    assert not w.task_request_to_pb(TaskRequest("k", None), JsonCodec()).HasField("payload")
    assert w.task_request_to_pb(TaskRequest("k", b""), BytesCodec()).HasField("payload")


@ROUND_TRIPS
@given(task_infos)
def test_task_info_reaches_the_client_as_the_server_had_it(info: TaskInfo) -> None:
    assert w.task_info_from_pb(wire(w.task_info_to_pb(info)), BytesCodec()) == info


def test_task_info_payload_and_output_use_the_client_codec() -> None:
    info = TaskInfo(
        1, Status.SUCCEEDED, 1, "", "default", "k", None, (), None, 0, b'{"x":1}', b"[]",
        datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC),
        datetime(2030, 1, 1, tzinfo=UTC), (), None,
    )  # fmt: skip
    decoded = w.task_info_from_pb(wire(w.task_info_to_pb(info)), JsonCodec())
    assert (decoded.payload, decoded.output) == ({"x": 1}, [])
    # An output of b"" is an output (a function returned b""); no output is None.
    empty = w.task_info_from_pb(wire(w.task_info_to_pb(_with(info, output=b""))), BytesCodec())
    assert empty.output == b""
    none = w.task_info_from_pb(wire(w.task_info_to_pb(_with(info, output=None))), BytesCodec())
    assert none.output is None
    with pytest.raises(PayloadError, match=r"task 1 \(succeeded: \): JsonCodec cannot decode"):
        w.task_info_from_pb(wire(w.task_info_to_pb(_with(info, output=b"{"))), JsonCodec())


class Bound(BytesCodec):
    """Bytes prefixed with the hex of their CodecContext; refused in any other context."""

    def encode_for(self, value: Any, context: CodecContext) -> bytes:
        return context.to_bytes().hex().encode() + b"|" + self.encode(value)

    def decode_for(self, data: bytes, context: CodecContext) -> bytes:
        made_for, _, value = data.partition(b"|")
        if made_for != context.to_bytes().hex().encode():
            raise PayloadError("made for another context")
        return value


def _contextual(request: TaskRequest) -> bool:
    """Whether the request's kind, pool and key can make a CodecContext (the generated ones
    include the empty and NUL texts the server refuses)."""
    try:
        CodecContext("payload", request.kind, request.pool, request.key)
    except InvalidArgument:
        return False
    return True


@ROUND_TRIPS
@given(st.lists(task_requests.filter(_contextual), max_size=4))
def test_a_context_codec_binds_each_payload_to_the_task_the_server_makes(
    requests: list[TaskRequest],
) -> None:
    """Issue 29 item 3: the client encodes each payload for the kind, pool and key the server
    decodes from the message (its own defaults where a field is absent), one request or many,
    in either form of SubmitMany."""
    codec = Bound()
    for request in requests:
        message = w.task_request_to_pb(request, codec)
        decoded = decoded_request(wire(message))
        context = CodecContext("payload", decoded.kind, decoded.pool, decoded.key)
        if request.payload is not None:
            assert message.payload == codec.encode_for(request.payload, context)
    bulk = [TaskRequest("bulk", request.payload or b"x", "p") for request in requests]
    for many in (requests, bulk):
        for decoded in decoded_requests(wire(w.submit_many_request(many, codec))):
            if decoded.payload is not None:
                context = CodecContext("payload", decoded.kind, decoded.pool, decoded.key)
                codec.decode_for(decoded.payload, context)


def test_a_context_codec_binds_a_schedules_payload_to_its_tasks() -> None:
    codec = Bound()
    for options, pool in (({}, "default"), ({"pool": "billing"}, "billing")):
        message = w.add_schedule_request(codec, "n", "* * * * *", kind="k", payload=b"p", **options)
        context = CodecContext("payload", "k", pool)  # a schedule's tasks have no key
        assert codec.decode_for(w.add_schedule_kwargs(wire(message))["payload"], context) == b"p"


def test_a_context_codec_decodes_a_tasks_payload_and_output_in_their_contexts() -> None:
    codec = Bound()
    payload = codec.encode_for(b"in", CodecContext("payload", "k", "p", "key"))
    output = codec.encode_for(b"out", CodecContext("output", "k", "p", "key", 7))
    info = TaskInfo(
        7, Status.SUCCEEDED, 1, "", "p", "k", "key", (), None, 0, payload, output,
        datetime(2030, 1, 1, tzinfo=UTC), datetime(2030, 1, 1, tzinfo=UTC),
        datetime(2030, 1, 1, tzinfo=UTC), (), None,
    )  # fmt: skip
    decoded = w.task_info_from_pb(wire(w.task_info_to_pb(info)), codec)
    assert (decoded.payload, decoded.output) == (b"in", b"out")
    for moved in (
        _with(info, task_id=8),  # the output of task 7 in task 8's row
        _with(info, key=None),
        _with(info, pool="q"),
        _with(info, output=payload),  # the payload as an output
    ):
        with pytest.raises(PayloadError, match=rf"task {moved.task_id} .*another context"):
            w.task_info_from_pb(wire(w.task_info_to_pb(moved)), codec)
    # A server's message that no context can describe is the task's PayloadError too.
    with pytest.raises(PayloadError, match=r"task 7 .*CodecContext kind must not be empty"):
        w.task_info_from_pb(wire(w.task_info_to_pb(_with(info, kind=""))), codec)


def _with(info: TaskInfo, **changes: Any) -> TaskInfo:
    fields = {name: getattr(info, name) for name in TaskInfo.__dataclass_fields__}
    return TaskInfo(**{**fields, **changes})


@ROUND_TRIPS
@given(task_summaries)
def test_task_summary_round_trips_to_the_nanosecond(summary: Any) -> None:
    assert w.task_summary_from_pb(wire(w.task_summary_to_pb(summary))) == summary


@ROUND_TRIPS
@given(schedule_infos)
def test_schedule_info_round_trips(info: Any) -> None:
    assert w.schedule_info_from_pb(wire(w.schedule_info_to_pb(info))) == info


@ROUND_TRIPS
@given(st.none() | retry_policies())
def test_retry_policy_round_trips(policy: RetryPolicy | None) -> None:
    message = w.retry_to_pb(policy)
    assert (None if message is None else w.retry_from_pb(wire(message))) == policy


def test_absent_retry_fields_are_the_defaults() -> None:
    assert w.retry_from_pb(pb.RetryPolicy()) == RetryPolicy()
    assert w.retry_from_pb(pb.RetryPolicy(jitter=0.0)) == RetryPolicy(jitter=0.0)


@pytest.mark.parametrize("status", list(Status))
def test_every_status_round_trips(status: Status) -> None:
    assert w.status_from_pb(wire(pb.CancelResponse(status=w.status_to_pb(status))).status) is status


def test_every_wire_enum_value_has_a_python_member() -> None:
    # The zero value of each enum is "unspecified"; every other value names a member.
    for wire_enum, kind in (
        (pb.Status, Status),
        (pb.MissPolicy, MissPolicy),
        (pb.OverlapPolicy, OverlapPolicy),
        (pb.CatchUpPolicy, CatchUpPolicy),
    ):
        assert len(wire_enum.keys()) == len(kind) + 1, wire_enum


schedule_options = st.fixed_dictionaries(
    {},
    optional={
        "payload": st.none() | st.binary(max_size=20),
        "pool": texts,
        "timezone": texts,
        "tags": tags,
        "priority": int64s,
        "retry": st.none() | retry_policies(),
        "timeout": st.none() | durations,
        "overlap": enum_values(OverlapPolicy),
        "catch_up": enum_values(CatchUpPolicy),
        "grace": durations,
        "replace": st.booleans(),
    },
)


def canonical_schedule(kwargs: dict[str, Any]) -> dict[str, Any]:
    # The wire always carries tags, priority and replace; their zero values are the defaults.
    result: dict[str, Any] = {"tags": (), "priority": 0, "replace": False}
    for name, value in kwargs.items():
        if value is None:
            continue  # None is "not given" for payload, retry and timeout
        if name in ("timeout", "grace"):
            value = duration_ns(value)
        elif name == "overlap":
            value = OverlapPolicy(value)
        elif name == "catch_up":
            value = CatchUpPolicy(value)
        elif name == "tags":
            value = tuple(value)
        result[name] = value
    return result


@ROUND_TRIPS
@given(texts, texts, texts, schedule_options)
def test_add_schedule_arguments_round_trip(
    name: str, cron: str, kind: str, options: dict[str, Any]
) -> None:
    message = wire(w.add_schedule_request(BytesCodec(), name, cron, kind=kind, **options))
    decoded = w.add_schedule_kwargs(message)
    given_ = {"name": name, "cron": cron, "kind": kind, **options}
    assert canonical_schedule(decoded) == canonical_schedule(given_)
    assert set(decoded) <= {"name", "cron", "kind", "tags", "priority", "replace", *options}


list_options = st.fixed_dictionaries(
    {},
    optional={
        "status": st.none()
        | enum_values(Status)
        | st.lists(enum_values(Status), max_size=3)
        | st.lists(enum_values(Status), max_size=3).map(frozenset),
        "pool": optional_texts,
        "kind": optional_texts,
        "tag": optional_texts,
        "after": st.none() | int64s,
        "before": st.none() | int64s,
        "newest_first": st.none() | st.booleans(),
        "limit": st.none() | int64s,
    },
)


@ROUND_TRIPS
@given(list_options)
def test_list_arguments_round_trip(options: dict[str, Any]) -> None:
    decoded = w.list_kwargs(wire(w.list_request(**options)))
    expected = {k: v for k, v in options.items() if v is not None and v is not False}
    if "status" in expected:
        status = expected["status"]
        items = [status] if isinstance(status, str) else status
        expected["status"] = frozenset(Status(s) for s in items)
    assert decoded == expected


def test_an_empty_status_filter_matches_nothing_rather_than_everything() -> None:
    assert w.list_kwargs(wire(w.list_request(status=[]))) == {"status": frozenset()}
    assert w.list_kwargs(wire(w.list_request())) == {}


@ROUND_TRIPS
@given(st.lists(task_summaries, max_size=4), st.none() | st.integers(1, 6))
def test_list_pages_carry_the_next_after(tasks: list[Any], limit: int | None) -> None:
    page, after = w.list_response(wire(list_response_to_pb(tasks, limit, 1 << 20)))
    assert page == tasks
    full = limit is not None and len(tasks) == limit
    assert after == (tasks[-1].task_id if full else None)


@ROUND_TRIPS
@given(int64s, st.none() | durations)
def test_wait_arguments_round_trip(task_id: int, timeout: Any) -> None:
    decoded = w.wait_kwargs(wire(w.wait_request(task_id, timeout)))
    assert decoded.pop("task_id") == task_id
    assert {k: duration_ns(v) for k, v in decoded.items()} == (
        {} if timeout is None else {"timeout": duration_ns(timeout)}
    )


@ROUND_TRIPS
@given(int64s, optional_texts)
def test_cancel_arguments_round_trip(task_id: int, reason: str | None) -> None:
    decoded = w.cancel_kwargs(wire(w.cancel_request(task_id, reason)))
    assert decoded == {"task_id": task_id, **({} if reason is None else {"reason": reason})}


@ROUND_TRIPS
@given(
    texts,
    st.fixed_dictionaries(
        {}, optional={"timezone": texts, "n": int64s, "after": st.none() | utc_datetimes}
    ),
)
def test_preview_arguments_round_trip(cron: str, options: dict[str, Any]) -> None:
    decoded = w.preview_kwargs(wire(w.preview_request(cron, **options)))
    assert decoded == {"cron": cron, **{k: v for k, v in options.items() if v is not None}}


@ROUND_TRIPS
@given(st.lists(utc_datetimes, max_size=5))
def test_preview_occurrences_round_trip(occurrences: list[datetime]) -> None:
    assert w.preview_response(wire(w.preview_response_to_pb(occurrences))) == occurrences


def test_get_requests_carry_their_argument() -> None:
    assert wire(w.get_request(7)).task_id == 7
    assert wire(w.get_by_key_request("k\x00")).key == "k\x00"


# --- issue 32: explain, occurrences, attempts, dependants, rerun --------------------------


@ROUND_TRIPS
@given(explanations)
def test_an_explanation_reaches_the_client_as_the_server_had_it(explanation: Explanation) -> None:
    assert w.explanation_from_pb(wire(w.explanation_to_pb(explanation))) == explanation


@ROUND_TRIPS
@given(st.lists(occurrence_infos, max_size=4), st.integers(1, 1000))
def test_occurrence_records_reach_the_client_as_the_server_had_them(
    records: list[OccurrenceInfo], asked: int
) -> None:
    message = occurrences_response_to_pb(records, asked, 4 * 1024 * 1024)
    found, following = w.occurrences_response(wire(message))
    assert found == records
    # A page as long as asked may be followed by another, before its last record's time.
    assert following == (records[-1].due_at if records and len(records) == asked else None)


@ROUND_TRIPS
@given(st.lists(attempt_infos, max_size=4))
def test_attempts_reach_the_client_as_the_server_had_them(attempts: list[AttemptInfo]) -> None:
    message = attempts_response_to_pb(attempts, 4 * 1024 * 1024)
    assert w.attempts_response(wire(message)) == (attempts, None)


@ROUND_TRIPS
@given(st.lists(st.integers(1, 2**63 - 1), max_size=5))
def test_dependants_reach_the_client_as_the_server_had_them(task_ids: list[int]) -> None:
    message = dependants_response_to_pb(task_ids, 4 * 1024 * 1024)
    assert w.dependants_response(wire(message)) == (task_ids, None)


@ROUND_TRIPS
@given(texts, st.none() | utc_datetimes, st.none() | int64s)
def test_occurrence_requests_carry_their_arguments(
    name: str, before: datetime | None, limit: int | None
) -> None:
    kwargs = w.list_occurrences_kwargs(wire(w.list_occurrences_request(name, before, limit)))
    expected: dict[str, Any] = {"name": name, "limit": 100 if limit is None else limit}
    if before is not None:
        expected["before"] = before
    assert kwargs == expected


def test_the_task_calls_of_issue_32_carry_their_task_id() -> None:
    assert wire(w.explain_request(7)).task_id == 7
    assert wire(w.rerun_request(8)).task_id == 8
    assert wire(w.get_attempts_request(9, 2)).task_id == 9
    assert wire(w.get_attempts_request(9)).after == 0
    assert wire(w.get_dependants_request(10, after=3)).after == 3


def test_long_replies_end_early_and_name_the_next_page() -> None:
    """Under the smallest limit a server takes (1 KiB): attempts and dependants end where the
    next would not fit, with the ``after`` of the rest; occurrences with the ``before``."""
    limit = 1024
    when = datetime(2030, 1, 1, tzinfo=UTC)
    attempts = [AttemptInfo(n, when, when, "x" * 300) for n in range(1, 6)]
    reply = attempts_response_to_pb(attempts, limit)
    assert reply.ByteSize() <= limit
    sent, following = w.attempts_response(wire(reply))
    assert sent == attempts[: len(sent)] and 0 < len(sent) < 5 and following == len(sent)
    ids = list(range(1, 5000))
    reply_ids = dependants_response_to_pb(ids, limit)
    assert reply_ids.ByteSize() <= limit
    sent_ids, after = w.dependants_response(wire(reply_ids))
    assert sent_ids == ids[: len(sent_ids)] and after == sent_ids[-1]
    records = [
        OccurrenceInfo(
            "s", when - timedelta(minutes=n), when, OccurrenceOutcome.STARTED, n, when, "m" * 200
        )
        for n in range(1, 20)
    ]
    page = occurrences_response_to_pb(records, 100, limit)
    assert page.ByteSize() <= limit
    found, before = w.occurrences_response(wire(page))
    assert found == records[: len(found)] and before == found[-1].due_at
    parents = tuple(range(2**40, 2**40 + 1000))
    waiting = Explanation(1, Status.WAITING, Hold.DEPENDENCIES, "s", when, parents=parents)
    with pytest.raises(PayloadError, match="over the server's message limit of 1024 bytes"):
        explanation_response(waiting, limit)
    with pytest.raises(PayloadError, match="alone exceeds the server's message limit"):
        attempts_response_to_pb([AttemptInfo(1, when, when, "y" * 2000)], limit)


def test_client_refusals_of_issue_32_read_like_the_schedulers() -> None:
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: w.explain_request(2**64), "task_id must be between"),
        (lambda: w.rerun_request("7"), "task_id must be an int"),
        (lambda: w.get_attempts_request(True), "task_id must be an int"),
        (lambda: w.get_dependants_request(1, after=1.5), "after must be an int"),
        (lambda: w.list_occurrences_request("s\udc00"), "schedule name must be valid Unicode"),
        (lambda: w.list_occurrences_request("s", datetime(2030, 1, 1)), "before must be timezone"),
        (lambda: w.list_occurrences_request("s", None, "10"), "limit must be an int"),
    ]
    for call, match in cases:
        with pytest.raises(InvalidArgument, match=match):
            call()


# --- remote workers -------------------------------------------------------------------------


@ROUND_TRIPS
@given(leased_attempts)
def test_leased_attempt_reaches_the_worker_as_leased(attempt: w.RemoteAttempt) -> None:
    """With its parents and their outputs as stored: None (no output) still distinct from
    b"", a parent's key absent or not."""
    assert w.worker_event_from_pb(wire(w.worker_event_to_pb(attempt))) == attempt


@ROUND_TRIPS
@given(leased_attempts)
def test_a_leased_attempt_without_outputs_reaches_the_worker_as_one_with_none(
    attempt: w.RemoteAttempt,
) -> None:
    """The server sends the scheduler's own LeasedAttempt when it has no parents: the worker
    reads it as a RemoteAttempt with no outputs, every other field as it was."""
    fields = {name: getattr(attempt, name) for name in LeasedAttempt.__dataclass_fields__}
    plain = LeasedAttempt(**fields)
    expected = w.RemoteAttempt.carrying(plain, ())
    assert w.worker_event_from_pb(wire(w.worker_event_to_pb(plain))) == expected


@ROUND_TRIPS
@given(tokens, texts)
def test_cancel_request_reaches_the_worker(token: AttemptToken, reason: str) -> None:
    event = CancelRequested(token, reason)
    assert w.worker_event_from_pb(wire(w.worker_event_to_pb(event))) == event


@ROUND_TRIPS
@given(
    int64s,
    st.dictionaries(texts, st.integers(1, TEN_YEARS_NS).map(lambda ns: ns / NS_PER_S), max_size=3),
)
def test_attached_round_trips(epoch: int, leases: dict[str, float]) -> None:
    event = w.Attached(epoch, leases)
    assert w.worker_event_from_pb(wire(w.worker_event_to_pb(event))) == event


@ROUND_TRIPS
@given(
    texts,
    st.lists(texts, max_size=3),
    st.integers(1, w.MAX_WORKER_SLOTS),  # fewer are refused (test_server_calls' bad cases)
    st.lists(st.tuples(tokens, st.binary(max_size=20)), max_size=3),
)
def test_attach_arguments_round_trip(
    worker_id: str, pools: list[str], slots: int, running: list[tuple[AttemptToken, bytes]]
) -> None:
    message = wire(w.attach_request(worker_id, pools, slots, running))
    assert message.worker_id == worker_id
    assert w.attach_kwargs(message) == {
        "pools": tuple(pools),
        "slots": slots,
        "running": tuple(running),
        "name": worker_id,  # what explain shows for its attempts
    }


@ROUND_TRIPS
@given(
    st.lists(
        st.one_of(leased_attempts, st.builds(CancelRequested, tokens, texts)),
        min_size=1,
        max_size=4,
    )
)
def test_a_stream_message_carries_its_events_in_order(
    events: list[w.RemoteAttempt | CancelRequested],
) -> None:
    assert w.worker_events_from_pb(wire(w.worker_events_to_pb(events))) == events


def test_a_stream_message_without_events_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="at least one event"):
        w.worker_events_from_pb(pb.AttachResponse())


@ROUND_TRIPS
@given(st.integers(0, 2**63 - 1))
def test_the_workers_message_limit_reaches_the_server(limit: int) -> None:
    message = wire(w.attach_request("w", ["p"], 1, max_message_bytes=limit))
    assert w.attach_message_limit(message) == (limit or None)


@ROUND_TRIPS
@given(
    st.one_of(
        st.builds(
            StaleAttempt, texts, reason=st.sampled_from(["epoch", "attempt", "lease", "finished"])
        ),
        st.builds(InvalidArgument, texts),
        st.builds(PayloadError, texts),
        st.builds(TaskNotFound, texts),
    )
)
def test_a_refused_report_is_answered_with_its_exception(refusal: CronoqError) -> None:
    result = wire(report_result(refusal))
    error = error_from_report_result(result)
    assert type(error) is type(refusal)
    assert str(error) == status_of(refusal)[1]
    if isinstance(refusal, StaleAttempt):
        assert isinstance(error, StaleAttempt) and error.reason == refusal.reason


def test_an_accepted_report_has_no_error() -> None:
    assert error_from_report_result(wire(report_result(None))) is None


lease_ids = st.binary(min_size=16, max_size=16)


@ROUND_TRIPS
@given(tokens, lease_ids)
def test_heartbeat_carries_the_token_and_its_lease_id(token: AttemptToken, lease_id: bytes) -> None:
    assert w.heartbeat_token(wire(w.heartbeat_request(token, lease_id))) == (token, lease_id)


@ROUND_TRIPS
@given(utc_datetimes, optional_texts, st.booleans())
def test_lease_renewed_round_trips(expires: datetime, reason: str | None, stopped: bool) -> None:
    renewed = LeaseRenewed(expires, reason, stopped)
    assert w.lease_renewed_from_pb(wire(w.lease_renewed_to_pb(renewed))) == renewed


@ROUND_TRIPS
@given(utc_datetimes, optional_texts, st.booleans())
def test_a_renewal_in_a_heartbeat_many_round_trips(
    expires: datetime, reason: str | None, stopped: bool
) -> None:
    renewed = LeaseRenewed(expires, reason, stopped)
    assert w.heartbeat_result_from_pb(wire(w.heartbeat_result(renewed))) == renewed


@ROUND_TRIPS
@given(texts, st.sampled_from(["epoch", "attempt", "lease", "finished", "unknown"]))
def test_a_refused_heartbeat_in_a_heartbeat_many_is_its_exception(message: str, why: str) -> None:
    error = w.heartbeat_result_from_pb(wire(w.heartbeat_result(StaleAttempt(message, why))))
    assert isinstance(error, StaleAttempt) and (str(error), error.reason) == (message, why)


def test_a_heartbeat_result_with_neither_outcome_is_a_failure_not_a_renewal() -> None:
    for result in (pb.HeartbeatResult(), pb.HeartbeatResult(refused=pb.ReportResult())):
        error = w.heartbeat_result_from_pb(wire(result))
        assert isinstance(error, SchedulerError) and error.applied is None, error


@ROUND_TRIPS
@given(tokens, lease_ids, st.none() | st.binary(max_size=20))
def test_success_report_round_trips(
    token: AttemptToken, lease_id: bytes, output: bytes | None
) -> None:
    decoded = w.report_from_pb(wire(w.report_request(token, lease_id, w.ReportSuccess(output))))
    assert decoded == (token, lease_id, w.ReportSuccess(output))


@ROUND_TRIPS
@given(tokens, lease_ids, texts, st.booleans(), st.none() | durations, texts)
def test_failure_report_round_trips(
    token: AttemptToken,
    lease_id: bytes,
    message: str,
    retryable: bool,
    retry_after: Any,
    traceback: str,
) -> None:
    failure = w.ReportFailure(message, retryable, retry_after, traceback)
    got_token, got_lease_id, got = w.report_from_pb(
        wire(w.report_request(token, lease_id, failure))
    )
    assert (got_token, got_lease_id) == (token, lease_id)
    assert isinstance(got, w.ReportFailure)
    assert (got.message, got.retryable, got.traceback) == (message, retryable, traceback)
    assert (None if got.retry_after is None else duration_ns(got.retry_after)) == (
        None if retry_after is None else duration_ns(retry_after)
    )


def test_a_failure_without_retryable_is_retryable() -> None:
    message = pb.ReportRequest(token=pb.AttemptToken(epoch=1, task_id=1, attempt=1))
    message.failure.message = "boom"
    assert w.report_from_pb(wire(message))[2] == w.ReportFailure("boom", retryable=True)


def test_a_failure_message_with_a_lone_surrogate_is_still_reported() -> None:
    token = AttemptToken(1, 2, 3)
    message = w.report_request(token, bytes(16), w.ReportFailure("bad \udc00 byte"))
    assert wire(message).failure.message == "bad \\udc00 byte"


def test_an_attempts_parents_count_in_the_size_its_submission_must_fit() -> None:
    """An attempt carries its task's ``after``: the size a submission is checked against
    counts it, so an accepted task's attempt always fits (its parents' outputs, which no
    submission can count, the server checks as it sends them)."""
    after = tuple(range(2**62, 2**62 + 1000))
    largest = 2**63 - 1
    attempt = LeasedAttempt(
        AttemptToken(largest, largest, largest), "default", "k", None, (), None, None, None,
        b"x" * 100, datetime(9999, 12, 31, tzinfo=UTC), bytes(16), after=after,
    )  # fmt: skip
    sent = pb.AttachResponse(events=[w.worker_event_to_pb(attempt)]).ByteSize()
    counted = attempt_bytes(TaskRequest("k", b"x" * 100, after=after))
    assert sent <= counted
    assert (
        counted - attempt_bytes(TaskRequest("k", b"x" * 100)) == pb.Attempt(after=after).ByteSize()
    )


def test_an_empty_payload_is_no_payload_on_the_wire() -> None:
    attempt = LeasedAttempt(
        AttemptToken(1, 2, 3), "p", "k", None, (), None, None, None, b"",
        datetime(2030, 1, 1, tzinfo=UTC), bytes(16),
    )  # fmt: skip
    message = w.worker_event_to_pb(attempt)
    assert not message.attempt.HasField("payload")
    assert w.worker_event_from_pb(wire(message)) == w.RemoteAttempt.carrying(attempt, ())


# --- through a real Scheduler ---------------------------------------------------------------


async def _hold(ctx: TaskContext, payload: Any) -> Any:
    return payload


async def test_a_remote_submission_is_the_embedded_one() -> None:
    """The client's request through the server's BytesCodec Scheduler, and its TaskInfo back
    through the client's codec, equal the same calls on an embedded JsonCodec Scheduler."""
    request = TaskRequest(
        "email", {"to": "ada"}, key="k1", tags=["a", "b"], name="n", priority=-3,
        retry=RetryPolicy.exponential(5, initial=0.5), start_at=timedelta(hours=1),
        grace=timedelta(seconds=7), timeout=1.5, deadline=datetime.now(UTC) + timedelta(days=30),
    )  # fmt: skip
    no_payload = TaskRequest("ping", pool="default", start_at=timedelta(hours=1))
    pools = [Pool("default", _hold)]
    async with (
        Scheduler(pools, codec=JsonCodec()) as embedded,
        Scheduler(pools, codec=BytesCodec()) as server,
    ):
        local = [await embedded.get(i) for i in await embedded.submit_many([request, no_payload])]
        message = wire(w.submit_many_request([request, no_payload], JsonCodec()))
        w.submit_many_tasks(message)
        ids = await server.submit_specs(w.submit_many_specs(message, server, time.time_ns()))
        remote = [
            w.task_info_from_pb(wire(w.task_info_to_pb(await server.get(i))), JsonCodec())
            for i in ids
        ]
    for mine, theirs in zip(local, remote, strict=True):
        assert _with(theirs, submitted_at=None, updated_at=None) == _with(
            mine, submitted_at=None, updated_at=None
        )
    assert remote[1].payload is None


async def test_a_context_codec_encodes_a_remote_payload_as_the_embedded_scheduler_does() -> None:
    """The bytes a client's context codec sends are those an embedded Scheduler with that
    codec stores for the same request: the two bind a payload to the same context."""
    requests = [
        TaskRequest("email", b"to ada", key="k1", start_at=timedelta(hours=1)),
        TaskRequest("email", b"to bob", pool="mail", start_at=timedelta(hours=1)),
        TaskRequest("email", b"to eve", pool="mail"),
    ]
    pools = [Pool("default", _hold), Pool("mail", _hold)]
    async with Scheduler(pools, codec=Bound()) as embedded:
        await embedded.pause_pool("mail")
        for request in requests:
            (task_id,) = await embedded.submit_many([request])
            record = await embedded.store.get_task(task_id)
            assert record is not None
            assert record.spec.payload == w.task_request_to_pb(request, Bound()).payload
