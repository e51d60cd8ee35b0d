"""The error mapping both ways, through a real grpc.aio server and channel.

A tiny servicer answers ``SchedulerService/Get`` by aborting with the status of the exception
the request's task id picks; the client turns the failed call back into an exception, which
must be the one the embedded Scheduler raises: same class, message and attributes. Plain
statuses (a proxy's, grpcio's own: message too large, connection refused) are mapped too.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from cronoq.errors import (
    AdmissionRejected,
    CronoqError,
    DuplicateSchedule,
    InvalidArgument,
    InvalidCron,
    PayloadError,
    ScheduleNotFound,
    SchedulerError,
    SchedulerStopped,
    StaleAttempt,
    TaskNotFound,
    UnknownDependency,
    UnknownPool,
    UnknownTimeZone,
    WaitTimedOut,
)
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._proto import cronoq_pb2_grpc
from cronoq_client._status import (
    MAX_MESSAGE_BYTES,
    Outcome,
    Reason,
    error_from_rpc,
    error_info,
    outcome,
    rich_status,
    status_for,
    status_of,
)

Code = grpc.StatusCode

# (exception the server's Scheduler raised, code, reason, outcome for the client)
MAPPED: list[tuple[BaseException, grpc.StatusCode, Reason, Outcome]] = [
    (InvalidArgument("kind must not be empty"), Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT,
     Outcome.ANSWERED),
    (UnknownPool("unknown pool 'x'; configured: default"), Code.INVALID_ARGUMENT,
     Reason.UNKNOWN_POOL, Outcome.ANSWERED),
    (InvalidCron("bad cron"), Code.INVALID_ARGUMENT, Reason.INVALID_CRON, Outcome.ANSWERED),
    (UnknownTimeZone("no zone Mars/Base"), Code.INVALID_ARGUMENT, Reason.UNKNOWN_TIME_ZONE,
     Outcome.ANSWERED),
    (UnknownDependency("no task 9"), Code.INVALID_ARGUMENT, Reason.UNKNOWN_DEPENDENCY,
     Outcome.ANSWERED),
    (PayloadError("the payload is 9 bytes encoded; the limit is 4"), Code.INVALID_ARGUMENT,
     Reason.PAYLOAD_ERROR, Outcome.ANSWERED),
    (DuplicateSchedule("schedule 'n' exists"), Code.ALREADY_EXISTS, Reason.DUPLICATE_SCHEDULE,
     Outcome.ANSWERED),
    (TaskNotFound("no task 5"), Code.NOT_FOUND, Reason.TASK_NOT_FOUND, Outcome.ANSWERED),
    (ScheduleNotFound("no schedule 'n'"), Code.NOT_FOUND, Reason.SCHEDULE_NOT_FOUND,
     Outcome.ANSWERED),
    (AdmissionRejected("pool default holds 10 live tasks"), Code.RESOURCE_EXHAUSTED,
     Reason.ADMISSION_REJECTED, Outcome.ANSWERED),
    (WaitTimedOut("task 3 is still running"), Code.DEADLINE_EXCEEDED, Reason.WAIT_TIMED_OUT,
     Outcome.ANSWERED),
    *[
        (StaleAttempt(f"stale: {why}", why), Code.FAILED_PRECONDITION, Reason.STALE_ATTEMPT,
         Outcome.ANSWERED)
        for why in ("epoch", "attempt", "lease", "finished", "unknown")
    ],
    (SchedulerStopped("the scheduler is closing"), Code.UNAVAILABLE, Reason.STOPPING,
     Outcome.NOT_APPLIED),
    (SchedulerStopped("stopped mid-commit", applied=None), Code.UNAVAILABLE, Reason.NOT_DURABLE,
     Outcome.UNKNOWN),
    (SchedulerError("the store failed first", applied=False), Code.UNAVAILABLE,
     Reason.NOT_APPLIED, Outcome.NOT_APPLIED),
    (SchedulerError("commit not confirmed"), Code.UNAVAILABLE, Reason.NOT_DURABLE,
     Outcome.UNKNOWN),
]  # fmt: skip

STANDBY = len(MAPPED)
BUG = STANDBY + 1
LONG = BUG + 1
SURROGATE = LONG + 1
LONG_TEXT = "é" * 10_000  # 20,000 bytes: over any trailer limit unless cut


def _exception_for(task_id: int) -> BaseException:
    if task_id < len(MAPPED):
        return MAPPED[task_id][0]
    if task_id == BUG:
        return RuntimeError("a bug")
    if task_id == LONG:
        return InvalidArgument(LONG_TEXT)
    return InvalidArgument("bad \udc00 text")


async def _get(request: pb.GetRequest, context: aio.ServicerContext[Any, Any]) -> pb.TaskInfo:
    if request.task_id == STANDBY:
        await context.abort_with_status(
            rich_status(Code.UNAVAILABLE, "this replica is a standby", Reason.STANDBY)
        )
    await context.abort_with_status(status_for(_exception_for(request.task_id)))


PLAIN_CODES = [
    (Code.INVALID_ARGUMENT, InvalidArgument, None, Outcome.ANSWERED),
    (Code.UNAVAILABLE, SchedulerError, None, Outcome.UNKNOWN),
    (Code.DEADLINE_EXCEEDED, SchedulerError, None, Outcome.UNKNOWN),
    (Code.INTERNAL, SchedulerError, None, Outcome.UNKNOWN),
    (Code.RESOURCE_EXHAUSTED, SchedulerError, None, Outcome.UNKNOWN),
    (Code.NOT_FOUND, SchedulerError, False, Outcome.ANSWERED),
    (Code.PERMISSION_DENIED, SchedulerError, False, Outcome.ANSWERED),
]


async def _cancel(
    request: pb.CancelRequest, context: aio.ServicerContext[Any, Any]
) -> pb.CancelResponse:
    """A status without cronoq's ErrorInfo, as a proxy or grpcio itself would answer."""
    await context.abort(PLAIN_CODES[request.task_id][0], "plain words")


async def _submit(request: pb.SubmitRequest, context: object) -> pb.SubmitResponse:
    return pb.SubmitResponse(task_id=1)


def _handlers() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        "cronoq.v1.SchedulerService",
        {
            "Get": grpc.unary_unary_rpc_method_handler(
                _get, pb.GetRequest.FromString, pb.TaskInfo.SerializeToString
            ),
            "Cancel": grpc.unary_unary_rpc_method_handler(
                _cancel, pb.CancelRequest.FromString, pb.CancelResponse.SerializeToString
            ),
            "Submit": grpc.unary_unary_rpc_method_handler(
                _submit, pb.SubmitRequest.FromString, pb.SubmitResponse.SerializeToString
            ),
        },
    )


async def _serve(options: list[tuple[str, Any]] | None = None) -> tuple[aio.Server, str]:
    server = aio.server(options=options)
    server.add_generic_rpc_handlers((_handlers(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def target() -> AsyncIterator[str]:
    server, address = await _serve()
    yield address
    await server.stop(None)


async def _failed(call: Callable[[], Awaitable[object]]) -> aio.AioRpcError:
    with pytest.raises(aio.AioRpcError) as caught:
        await asyncio.wait_for(call(), timeout=10)
    return caught.value


async def _get_error(target: str, task_id: int) -> aio.AioRpcError:
    async with aio.insecure_channel(target) as channel:
        stub = cronoq_pb2_grpc.SchedulerServiceStub(channel)
        return await _failed(lambda: stub.Get(pb.GetRequest(task_id=task_id), timeout=10))


def _same(got: CronoqError, expected: BaseException) -> None:
    assert type(got) is type(expected)
    assert str(got) == str(expected)
    if isinstance(expected, StaleAttempt):
        assert isinstance(got, StaleAttempt)
        assert got.reason == expected.reason
    if isinstance(expected, SchedulerError):
        assert isinstance(got, SchedulerError)
        assert got.applied is expected.applied


@pytest.mark.parametrize(
    ("exc", "code", "reason", "result"),
    MAPPED,
    ids=[f"{type(m[0]).__name__}-{m[2]}" for m in MAPPED],
)
async def test_each_mapped_exception_comes_back_as_itself(
    target: str, exc: BaseException, code: grpc.StatusCode, reason: Reason, result: Outcome
) -> None:
    assert status_of(exc) == (code, str(exc), reason.value)
    err = await _get_error(target, MAPPED.index((exc, code, reason, result)))
    assert err.code() is code
    assert err.details() == str(exc)
    info = error_info(err)
    assert info is not None
    assert (info.domain, info.reason) == ("cronoq", reason.value)
    _same(error_from_rpc(err), exc)
    assert outcome(err) is result


async def test_a_standby_applied_nothing(target: str) -> None:
    err = await _get_error(target, STANDBY)
    assert err.code() is Code.UNAVAILABLE
    got = error_from_rpc(err)
    assert type(got) is SchedulerError
    assert (str(got), got.applied) == ("this replica is a standby", False)
    assert outcome(err) is Outcome.NOT_APPLIED


async def test_a_server_bug_is_internal_and_may_have_applied(target: str) -> None:
    assert status_of(RuntimeError("a bug")) == (
        Code.INTERNAL,
        "internal error: RuntimeError('a bug')",
        "INTERNAL",
    )
    err = await _get_error(target, BUG)
    assert err.code() is Code.INTERNAL
    got = error_from_rpc(err)
    assert type(got) is SchedulerError
    assert got.applied is None
    assert outcome(err) is Outcome.UNKNOWN


async def test_a_long_message_is_cut_and_the_status_survives(target: str) -> None:
    err = await _get_error(target, LONG)
    got = error_from_rpc(err)
    assert type(got) is InvalidArgument
    text = str(got)
    assert text.endswith("...")
    assert LONG_TEXT.startswith(text[:-3])
    assert len(text.encode()) <= MAX_MESSAGE_BYTES


async def test_a_lone_surrogate_in_a_message_is_escaped(target: str) -> None:
    got = error_from_rpc(await _get_error(target, SURROGATE))
    assert (type(got), str(got)) == (InvalidArgument, "bad \\udc00 text")


@pytest.mark.parametrize(
    ("code", "cls", "applied", "result"), PLAIN_CODES, ids=[c[0].name for c in PLAIN_CODES]
)
async def test_a_status_without_error_info_is_judged_by_its_code(
    target: str,
    code: grpc.StatusCode,
    cls: type[CronoqError],
    applied: bool | None,
    result: Outcome,
) -> None:
    async with aio.insecure_channel(target) as channel:
        stub = cronoq_pb2_grpc.SchedulerServiceStub(channel)
        index = [c[0] for c in PLAIN_CODES].index(code)
        err = await _failed(lambda: stub.Cancel(pb.CancelRequest(task_id=index), timeout=10))
    assert (err.code(), error_info(err)) == (code, None)
    got = error_from_rpc(err)
    assert type(got) is cls
    assert "plain words" in str(got)
    if isinstance(got, SchedulerError):
        assert got.applied is applied
        assert code.name in str(got)
    assert outcome(err) is result


async def test_a_message_over_the_clients_send_limit_is_a_payload_error(target: str) -> None:
    options = [("grpc.max_send_message_length", 100)]
    async with aio.insecure_channel(target, options=options) as channel:
        stub = cronoq_pb2_grpc.SchedulerServiceStub(channel)
        request = pb.SubmitRequest(task=pb.TaskRequest(kind="k", payload=b"x" * 200))
        err = await _failed(lambda: stub.Submit(request, timeout=10))
    assert err.code() is Code.RESOURCE_EXHAUSTED
    assert type(error_from_rpc(err)) is PayloadError
    assert outcome(err) is Outcome.ANSWERED


async def test_a_message_over_the_servers_receive_limit_is_a_payload_error() -> None:
    server, address = await _serve([("grpc.max_receive_message_length", 100)])
    try:
        async with aio.insecure_channel(address) as channel:
            stub = cronoq_pb2_grpc.SchedulerServiceStub(channel)
            small = await stub.Submit(pb.SubmitRequest(task=pb.TaskRequest(kind="k")), timeout=10)
            assert small.task_id == 1
            request = pb.SubmitRequest(task=pb.TaskRequest(kind="k", payload=b"x" * 200))
            err = await _failed(lambda: stub.Submit(request, timeout=10))
    finally:
        await server.stop(None)
    assert err.code() is Code.RESOURCE_EXHAUSTED
    got = error_from_rpc(err)
    assert type(got) is PayloadError
    assert "larger than max" in str(got)
    assert outcome(err) is Outcome.ANSWERED


async def test_a_refused_connection_is_an_unknown_outcome() -> None:
    with socket.socket() as probe:  # a port nothing listens on once the probe is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = cronoq_pb2_grpc.SchedulerServiceStub(channel)
        err = await _failed(lambda: stub.Get(pb.GetRequest(task_id=1), timeout=10))
    assert err.code() is Code.UNAVAILABLE
    got = error_from_rpc(err)
    assert type(got) is SchedulerError
    assert got.applied is None
    assert outcome(err) is Outcome.UNKNOWN


def _sync_get(target: str, task_id: int) -> grpc.RpcError:
    with grpc.insecure_channel(target) as channel:
        stub = cronoq_pb2_grpc.SchedulerServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Get(pb.GetRequest(task_id=task_id), timeout=10)
        return caught.value


async def test_a_blocking_channel_error_maps_the_same(target: str) -> None:
    for index in (0, MAPPED.index(next(m for m in MAPPED if m[2] is Reason.STALE_ATTEMPT))):
        err = await asyncio.to_thread(_sync_get, target, index)
        assert not isinstance(err, aio.AioRpcError)
        _same(error_from_rpc(err), MAPPED[index][0])
        assert outcome(err) is MAPPED[index][3]


def test_an_unreadable_details_trailer_is_ignored() -> None:
    metadata = aio.Metadata(("grpc-status-details-bin", b"\xff\xff not a status"))
    err = aio.AioRpcError(Code.UNAVAILABLE, aio.Metadata(), metadata, details="broken")
    assert error_info(err) is None
    got = error_from_rpc(err)
    assert (type(got), str(got)) == (SchedulerError, "UNAVAILABLE: broken")
    assert outcome(err) is Outcome.UNKNOWN


def test_every_reason_comes_back_from_its_status() -> None:
    # The reverse table covers every reason a server may send.
    for reason in Reason:
        status = rich_status(Code.UNAVAILABLE, "m", reason, {"why": "epoch"})
        err = aio.AioRpcError(
            Code.UNAVAILABLE, aio.Metadata(), aio.Metadata(*status.trailing_metadata), "m"
        )
        assert isinstance(error_from_rpc(err), CronoqError)
        assert error_info(err) is not None
