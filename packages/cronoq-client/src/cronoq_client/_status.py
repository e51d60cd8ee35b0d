"""The errors of the wire protocol: cronoq's exceptions as gRPC statuses, and back.

A failed call carries a status code, a message (the exception's) and, in the
``grpc-status-details-bin`` trailer, a ``google.rpc.Status`` holding one ``google.rpc.ErrorInfo``
of domain ``cronoq`` whose reason names the exception precisely:

==========================================  ====================  ==============================
core exception                              code                  reason
==========================================  ====================  ==============================
InvalidArgument                             INVALID_ARGUMENT      INVALID_ARGUMENT
UnknownPool / InvalidCron / UnknownTimeZone INVALID_ARGUMENT      UNKNOWN_POOL / INVALID_CRON /
/ UnknownDependency / PayloadError                                UNKNOWN_TIME_ZONE /
                                                                  UNKNOWN_DEPENDENCY /
                                                                  PAYLOAD_ERROR
DuplicateSchedule                           ALREADY_EXISTS        DUPLICATE_SCHEDULE
TaskNotFound / ScheduleNotFound             NOT_FOUND             TASK_NOT_FOUND /
                                                                  SCHEDULE_NOT_FOUND
AdmissionRejected                           RESOURCE_EXHAUSTED    ADMISSION_REJECTED
LimitFull (an AdmissionRejected)            RESOURCE_EXHAUSTED    LIMIT_FULL
UnknownLimit                                INVALID_ARGUMENT      UNKNOWN_LIMIT
WaitTimedOut                                DEADLINE_EXCEEDED     WAIT_TIMED_OUT
StaleAttempt                                FAILED_PRECONDITION   STALE_ATTEMPT (metadata ``why``:
                                                                  its ``reason``)
NotRetryable                                FAILED_PRECONDITION   NOT_RETRYABLE
NoOutbox (an InvalidArgument: the server    FAILED_PRECONDITION   NO_OUTBOX
ingests no outbox)
Unauthenticated                             UNAUTHENTICATED       UNAUTHENTICATED
PermissionDenied                            PERMISSION_DENIED     PERMISSION_DENIED (metadata
                                                                  ``permission``)
(a standby; the server says so itself)      UNAVAILABLE           STANDBY
SchedulerStopped, applied=False             UNAVAILABLE           STOPPING
SchedulerError, applied=False               UNAVAILABLE           NOT_APPLIED
SchedulerError or SchedulerStopped, applied UNAVAILABLE           NOT_DURABLE (metadata
None: may have been applied                                       ``stopped`` = ``true`` for a
                                                                  SchedulerStopped)
any other exception (a bug)                 INTERNAL              INTERNAL
==========================================  ====================  ==============================

``error_from_rpc()`` turns a failed call back into the exception the embedded Scheduler
raises; ``outcome()`` says whether the call may have been applied, which is what a client's
retry depends on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import Enum, StrEnum
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cronoq.errors import (
    AdmissionRejected,
    CronoqError,
    DuplicateSchedule,
    InvalidArgument,
    InvalidCron,
    LimitFull,
    NotRetryable,
    PayloadError,
    PermissionDenied,
    ScheduleNotFound,
    SchedulerError,
    SchedulerStopped,
    StaleAttempt,
    TaskNotFound,
    Unauthenticated,
    UnknownDependency,
    UnknownLimit,
    UnknownPool,
    UnknownTimeZone,
    WaitTimedOut,
)
from cronoq_client._proto import cronoq_pb2 as pb

__all__ = [
    "DETAILS_KEY",
    "DOMAIN",
    "MAX_MESSAGE_BYTES",
    "NoOutbox",
    "Outcome",
    "Reason",
    "cut_text",
    "error_from_report_result",
    "error_from_rpc",
    "outcome",
    "refused_for_good",
    "report_result",
    "request_too_large",
    "rich_status",
    "rpc_error_of",
    "status_for",
    "status_of",
    "too_large",
]

DOMAIN = "cronoq"
DETAILS_KEY = "grpc-status-details-bin"
MAX_MESSAGE_BYTES = 1024
"""A status message is cut to this many UTF-8 bytes. It travels twice in the trailers (as
``grpc-message``, percent-encoded: up to 3 bytes per byte, and inside the base64 details), and
trailers beyond the receiver's metadata limit (8 KiB by default) lose the whole status."""


class Reason(StrEnum):
    """The ``ErrorInfo.reason`` of every status a cronoq server sends."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    UNKNOWN_POOL = "UNKNOWN_POOL"
    INVALID_CRON = "INVALID_CRON"
    UNKNOWN_TIME_ZONE = "UNKNOWN_TIME_ZONE"
    UNKNOWN_DEPENDENCY = "UNKNOWN_DEPENDENCY"
    PAYLOAD_ERROR = "PAYLOAD_ERROR"
    DUPLICATE_SCHEDULE = "DUPLICATE_SCHEDULE"
    TASK_NOT_FOUND = "TASK_NOT_FOUND"
    SCHEDULE_NOT_FOUND = "SCHEDULE_NOT_FOUND"
    ADMISSION_REJECTED = "ADMISSION_REJECTED"
    LIMIT_FULL = "LIMIT_FULL"
    UNKNOWN_LIMIT = "UNKNOWN_LIMIT"
    WAIT_TIMED_OUT = "WAIT_TIMED_OUT"
    STALE_ATTEMPT = "STALE_ATTEMPT"
    NOT_RETRYABLE = "NOT_RETRYABLE"
    NO_OUTBOX = "NO_OUTBOX"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    STANDBY = "STANDBY"
    """This replica does not lead: nothing was applied; retry on a new connection."""
    STOPPING = "STOPPING"
    """The leader is shutting down or stepped down: nothing was applied; retry elsewhere."""
    NOT_APPLIED = "NOT_APPLIED"
    """The leader could not take the call (its store failed first): nothing was applied."""
    NOT_DURABLE = "NOT_DURABLE"
    """The call may have been applied but could not be confirmed durable."""
    INTERNAL = "INTERNAL"
    """A bug in the server."""


Code = grpc.StatusCode


class NoOutbox(InvalidArgument):
    """The server ingests no outbox, so its outbox calls have nothing to act on. An
    ``InvalidArgument``, as the embedded ``Scheduler``'s outbox calls raise without one; on the
    wire FAILED_PRECONDITION, since the request is right and the server's configuration is
    what refuses it."""


# The exceptions with a fixed status, by class; looked up along the exception's MRO, so a
# subclass (DuplicateSchedule is an InvalidArgument) finds its own row before its base's.
_BY_CLASS: dict[type[BaseException], tuple[grpc.StatusCode, Reason]] = {
    InvalidArgument: (Code.INVALID_ARGUMENT, Reason.INVALID_ARGUMENT),
    UnknownPool: (Code.INVALID_ARGUMENT, Reason.UNKNOWN_POOL),
    InvalidCron: (Code.INVALID_ARGUMENT, Reason.INVALID_CRON),
    UnknownTimeZone: (Code.INVALID_ARGUMENT, Reason.UNKNOWN_TIME_ZONE),
    UnknownDependency: (Code.INVALID_ARGUMENT, Reason.UNKNOWN_DEPENDENCY),
    PayloadError: (Code.INVALID_ARGUMENT, Reason.PAYLOAD_ERROR),
    DuplicateSchedule: (Code.ALREADY_EXISTS, Reason.DUPLICATE_SCHEDULE),
    TaskNotFound: (Code.NOT_FOUND, Reason.TASK_NOT_FOUND),
    ScheduleNotFound: (Code.NOT_FOUND, Reason.SCHEDULE_NOT_FOUND),
    AdmissionRejected: (Code.RESOURCE_EXHAUSTED, Reason.ADMISSION_REJECTED),
    LimitFull: (Code.RESOURCE_EXHAUSTED, Reason.LIMIT_FULL),
    UnknownLimit: (Code.INVALID_ARGUMENT, Reason.UNKNOWN_LIMIT),
    WaitTimedOut: (Code.DEADLINE_EXCEEDED, Reason.WAIT_TIMED_OUT),
    StaleAttempt: (Code.FAILED_PRECONDITION, Reason.STALE_ATTEMPT),
    NotRetryable: (Code.FAILED_PRECONDITION, Reason.NOT_RETRYABLE),
    NoOutbox: (Code.FAILED_PRECONDITION, Reason.NO_OUTBOX),
    Unauthenticated: (Code.UNAUTHENTICATED, Reason.UNAUTHENTICATED),
    PermissionDenied: (Code.PERMISSION_DENIED, Reason.PERMISSION_DENIED),
}


def cut_text(text: str, limit: int) -> str:
    """``text`` as valid UTF-8 (a lone surrogate escaped) of at most ``limit`` bytes, ending
    with ``...`` when it was cut."""
    data = text.encode("utf-8", "backslashreplace")
    if len(data) <= limit:
        return data.decode("utf-8")
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def _message(text: str) -> str:
    return cut_text(text, MAX_MESSAGE_BYTES)


def _classify(exc: BaseException) -> tuple[grpc.StatusCode, Reason, dict[str, str]]:
    for cls in type(exc).__mro__:
        if cls in _BY_CLASS:
            code, reason = _BY_CLASS[cls]
            if isinstance(exc, StaleAttempt):
                return code, reason, {"why": exc.reason}
            if isinstance(exc, PermissionDenied):
                return code, reason, {"permission": exc.permission}
            return code, reason, {}
    if isinstance(exc, SchedulerError):
        if exc.applied is False:
            stopped = isinstance(exc, SchedulerStopped)
            return Code.UNAVAILABLE, Reason.STOPPING if stopped else Reason.NOT_APPLIED, {}
        metadata = {"stopped": "true"} if isinstance(exc, SchedulerStopped) else {}
        return Code.UNAVAILABLE, Reason.NOT_DURABLE, metadata
    return Code.INTERNAL, Reason.INTERNAL, {}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str, str]:
    """The status code, message and ErrorInfo reason for an exception of a Scheduler call.

    The message is the exception's own (bounded, see MAX_MESSAGE_BYTES); for an exception that
    is not cronoq's (a bug), it names the exception's type.
    """
    code, reason, _ = _classify(exc)
    text = str(exc) if isinstance(exc, CronoqError) else f"internal error: {exc!r}"
    return code, _message(text), reason.value


def rich_status(
    code: grpc.StatusCode, message: str, reason: str, metadata: Mapping[str, str] | None = None
) -> grpc.Status:
    """A status for ``context.abort_with_status``: code, message, and the ErrorInfo in the
    details trailer. The server also uses it directly, for a standby (``Reason.STANDBY``)."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata or {})
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(code=code.value[0], message=_message(message), details=[detail])
    result: grpc.Status = rpc_status.to_status(status)
    return result


def status_for(exc: BaseException) -> grpc.Status:
    """``rich_status`` of the exception, metadata included (StaleAttempt's ``why``)."""
    code, _, metadata = _classify(exc)
    _, message, reason = status_of(exc)
    return rich_status(code, message, reason, metadata)


def refused_for_good(exc: BaseException) -> bool:
    """The exception is a definite answer (``Outcome.ANSWERED`` on the client): nothing was
    applied and another try gets the same. A ReportMany answers these report by report."""
    _, reason, _ = _classify(exc)
    return reason not in _NOT_APPLIED and reason not in _UNCERTAIN


def report_result(refusal: BaseException | None) -> pb.ReportResult:
    """One report's result in a ReportMany: accepted (None) or refused for good; also any
    failure of one submission of a SubmitEach, as its Submit's status would carry it."""
    if refusal is None:
        return pb.ReportResult()
    _, message, reason = status_of(refusal)
    return pb.ReportResult(reason=reason, message=message, metadata=_classify(refusal)[2])


# --- the client side ------------------------------------------------------------------------


class Outcome(Enum):
    """What a failed call tells about its effect, for the client's retry rule."""

    NOT_APPLIED = "not_applied"
    """Nothing was applied and another try may succeed: retry any call, on a new connection."""
    UNKNOWN = "unknown"
    """The call may have been applied: retry it only if it is idempotent."""
    ANSWERED = "answered"
    """A definite answer (bad input, not found, stale token, ...): retrying gives the same."""


_NOT_APPLIED = frozenset({Reason.STANDBY, Reason.STOPPING, Reason.NOT_APPLIED})
_UNCERTAIN = frozenset({Reason.NOT_DURABLE, Reason.INTERNAL})
# Codes that, without a cronoq ErrorInfo, leave the outcome open: a proxy, the transport or
# grpcio itself (a broken connection, a deadline) may answer with them before or after the
# server applied the call.
_UNCERTAIN_CODES = frozenset(
    {
        Code.UNAVAILABLE,
        Code.DEADLINE_EXCEEDED,
        Code.CANCELLED,
        Code.UNKNOWN,
        Code.INTERNAL,
        Code.ABORTED,
        Code.DATA_LOSS,
        Code.RESOURCE_EXHAUSTED,
    }
)


def _code(err: grpc.RpcError) -> grpc.StatusCode:
    code = err.code() if isinstance(err, grpc.aio.AioRpcError | grpc.Call) else None
    return code if isinstance(code, grpc.StatusCode) else Code.UNKNOWN


def _details(err: grpc.RpcError) -> str:
    details = err.details() if isinstance(err, grpc.aio.AioRpcError | grpc.Call) else None
    return details if isinstance(details, str) else ""


def _trailers(err: grpc.RpcError) -> Iterable[tuple[str, Any]]:
    if isinstance(err, grpc.aio.AioRpcError | grpc.Call):
        return err.trailing_metadata() or ()
    return ()


def error_info(err: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The cronoq ErrorInfo of a failed call; None if it has none (or an unreadable one)."""
    for key, value in _trailers(err):
        if key != DETAILS_KEY or not isinstance(value, bytes):
            continue
        try:
            for detail in status_pb2.Status.FromString(value).details:
                info = error_details_pb2.ErrorInfo()
                # Unpack is False for a detail of another type (a RetryInfo, say).
                if detail.Unpack(info) and info.domain == DOMAIN:
                    return info
        except DecodeError:
            return None
    return None


def _reason(info: error_details_pb2.ErrorInfo | None) -> Reason | None:
    if info is None:
        return None
    try:
        return Reason(info.reason)
    except ValueError:
        return None  # a reason of a newer server: judged by its code alone


def outcome(err: grpc.RpcError) -> Outcome:
    """Whether a failed call applied nothing, may have applied, or was answered.

    The rule: a cronoq reason decides when there is one. STANDBY, STOPPING and NOT_APPLIED
    applied nothing; NOT_DURABLE and INTERNAL may have applied; every other reason is a
    definite answer. Without one (a proxy, the transport, or grpcio answered), the code decides:
    UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED, UNKNOWN, INTERNAL, ABORTED, DATA_LOSS and
    RESOURCE_EXHAUSTED (but a message over the size limit, which is a definite answer) may have
    applied; every other code is a definite answer. In particular a plain UNAVAILABLE is
    UNKNOWN: grpcio reports a connection refused before the request left and a connection
    broken after the server applied it alike, so a client that knows better (it saw the
    connection fail to open) must decide that itself.
    """
    reason = _reason(error_info(err))
    if reason is not None:
        if reason in _NOT_APPLIED:
            return Outcome.NOT_APPLIED
        return Outcome.UNKNOWN if reason in _UNCERTAIN else Outcome.ANSWERED
    code = _code(err)
    if code in _UNCERTAIN_CODES and not _too_large(code, _details(err)):
        return Outcome.UNKNOWN
    return Outcome.ANSWERED


def too_large(err: grpc.RpcError) -> bool:
    """The call was refused because its message is over the receiver's size limit."""
    return _too_large(_code(err), _details(err))


def request_too_large(err: grpc.RpcError) -> bool:
    """The request was over a size limit, so no handler ran: refused by the server on receipt,
    or by this client before it sent it. (Over the limit on the way back, the handler ran.)"""
    details = _details(err)
    return too_large(err) and (
        "SERVER: Received message" in details or "CLIENT: Sent message" in details
    )


def _too_large(code: grpc.StatusCode, details: str) -> bool:
    # grpcio's own words for a message over a channel's or server's max message size.
    return code is Code.RESOURCE_EXHAUSTED and "larger than max" in details


def _scheduler_error(message: str, applied: bool | None) -> SchedulerError:
    return SchedulerError(message, applied=applied)


def _stopped(message: str, applied: bool | None) -> SchedulerError:
    return SchedulerStopped(message, applied=applied)


_BY_REASON: dict[Reason, Callable[[str, Mapping[str, str]], CronoqError]] = {
    Reason.INVALID_ARGUMENT: lambda m, _: InvalidArgument(m),
    Reason.NOT_RETRYABLE: lambda m, _: NotRetryable(m),
    Reason.NO_OUTBOX: lambda m, _: NoOutbox(m),
    Reason.UNKNOWN_POOL: lambda m, _: UnknownPool(m),
    Reason.INVALID_CRON: lambda m, _: InvalidCron(m),
    Reason.UNKNOWN_TIME_ZONE: lambda m, _: UnknownTimeZone(m),
    Reason.UNKNOWN_DEPENDENCY: lambda m, _: UnknownDependency(m),
    Reason.PAYLOAD_ERROR: lambda m, _: PayloadError(m),
    Reason.DUPLICATE_SCHEDULE: lambda m, _: DuplicateSchedule(m),
    Reason.TASK_NOT_FOUND: lambda m, _: TaskNotFound(m),
    Reason.SCHEDULE_NOT_FOUND: lambda m, _: ScheduleNotFound(m),
    Reason.ADMISSION_REJECTED: lambda m, _: AdmissionRejected(m),
    Reason.LIMIT_FULL: lambda m, _: LimitFull(m),
    Reason.UNKNOWN_LIMIT: lambda m, _: UnknownLimit(m),
    Reason.WAIT_TIMED_OUT: lambda m, _: WaitTimedOut(m),
    Reason.STALE_ATTEMPT: lambda m, meta: StaleAttempt(m, reason=meta.get("why", "unknown")),
    Reason.UNAUTHENTICATED: lambda m, _: Unauthenticated(m),
    Reason.PERMISSION_DENIED: lambda m, meta: PermissionDenied(m, meta.get("permission", "")),
    Reason.STANDBY: lambda m, _: _scheduler_error(m, False),
    Reason.STOPPING: lambda m, _: _stopped(m, False),
    Reason.NOT_APPLIED: lambda m, _: _scheduler_error(m, False),
    Reason.NOT_DURABLE: lambda m, meta: (
        _stopped(m, None) if meta.get("stopped") == "true" else _scheduler_error(m, None)
    ),
    Reason.INTERNAL: lambda m, _: _scheduler_error(m, None),
}


def error_from_report_result(result: pb.ReportResult) -> CronoqError | None:
    """None if the report was accepted, else the exception a Report call would have raised."""
    if not result.reason:
        return None
    try:
        reason = Reason(result.reason)
    except ValueError:  # a reason of a newer server: nothing this client can judge, so the
        # worker treats it as it treats any SchedulerError (retried while the lease lasts)
        return SchedulerError(f"{result.reason}: {result.message}", applied=False)
    return _BY_REASON[reason](result.message, result.metadata)


_CODE_OF_REASON: dict[str, grpc.StatusCode] = {
    **{reason.value: code for code, reason in _BY_CLASS.values()},
    **{reason.value: Code.UNAVAILABLE for reason in (*_NOT_APPLIED, Reason.NOT_DURABLE)},
    Reason.INTERNAL.value: Code.INTERNAL,
}


def rpc_error_of(refusal: pb.ReportResult) -> grpc.aio.AioRpcError:
    """The failed call whose status ``report_result`` carried: a SubmitEach's answer for one
    submission, as its Submit would have failed. A reason this client does not know (a newer
    server's) has code UNKNOWN: an outcome the client does not take for an answer."""
    status = rich_status(
        _CODE_OF_REASON.get(refusal.reason, Code.UNKNOWN),
        refusal.message,
        refusal.reason,
        refusal.metadata,
    )
    return grpc.aio.AioRpcError(
        status.code,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(*status.trailing_metadata),
        details=status.details,
    )


def tls_refused(err: grpc.RpcError) -> bool:
    """The connection failed in the TLS handshake: this client does not trust the server's
    certificate (or the name in it), and no retry will change that."""
    return _code(err) is Code.UNAVAILABLE and "handshake failed" in _details(err).lower()


def error_from_rpc(err: grpc.RpcError) -> CronoqError:
    """The exception the embedded Scheduler raises for what this failed call reports.

    With a cronoq ErrorInfo: the class of its reason, with the server's message (and
    StaleAttempt's ``reason``, SchedulerError's ``applied``). Without one, by code:
    INVALID_ARGUMENT is InvalidArgument, a message over the size limit PayloadError; every
    other code a SchedulerError whose ``applied`` follows ``outcome()`` (False for a definite
    answer, since nothing was applied; None when unknown), its message naming the code.
    """
    info = error_info(err)
    reason = _reason(info)
    details = _details(err)
    if info is not None and reason is not None:
        return _BY_REASON[reason](details, info.metadata)
    code = _code(err)
    if code is Code.INVALID_ARGUMENT:
        return InvalidArgument(details)
    if _too_large(code, details):
        return PayloadError(details)
    if tls_refused(err):
        return Unauthenticated(
            f"the TLS handshake with the server failed; check tls= (the CA of the server's "
            f"certificate, the name it is for): {details}"
        )
    applied = None if outcome(err) is Outcome.UNKNOWN else False
    return _scheduler_error(f"{code.name}: {details}" if details else code.name, applied)
