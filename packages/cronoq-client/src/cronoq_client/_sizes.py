"""What fits in one message: the accounting behind the server's promise that every message it
must send (an attempt on the Attach stream, a task, a payload or output alone, a page of a
list) fits in its message limit.

A payload is accepted only if the attempt that carries it fits. An output always fits alone
in a ``GetTaskDataResponse``: the report that brought it was a larger message under the same
limit. Get, GetByKey and Wait leave out a payload or output that
would not fit with the rest of the task, and say so; List ends a page early. So nothing the
server accepted is ever impossible to send, which is what a limit on the requests alone
(gRPC's own) cannot promise: an attempt and a task carry more than the request that made them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.message import Message

from cronoq import (
    LEASE_ID_BYTES,
    AttemptInfo,
    Explanation,
    LimitInfo,
    OccurrenceInfo,
    TaskInfo,
    TaskRequest,
    TaskSummary,
)
from cronoq.errors import PayloadError
from cronoq.store import QuarantinedRow, TaskSpec
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._wire import (
    attempt_info_to_pb,
    explanation_to_pb,
    limit_info_to_pb,
    occurrence_to_pb,
    quarantined_row_to_pb,
    task_info_to_pb,
    task_summary_to_pb,
)

__all__ = [
    "MAX_LIST_PAGE",
    "TOKEN_RESERVE_BYTES",
    "attempt_bytes",
    "attempts_response_to_pb",
    "check_attempts_fit",
    "dependants_response_to_pb",
    "explanation_response",
    "fitted_task_info",
    "list_limits_response_to_pb",
    "list_response_to_pb",
    "max_data_bytes",
    "occurrences_response_to_pb",
    "outbox_quarantine_response_to_pb",
    "task_data_response",
]

_INT64_MAX = 2**63 - 1
# The largest values of a Timestamp and a Duration the protocol carries (a datetime's last
# second; protobuf's longest Duration): an attempt's instants are counted at their largest.
_LATEST = timestamp_pb2.Timestamp(seconds=253_402_300_799, nanos=999_999_999)
_LONGEST = duration_pb2.Duration(seconds=315_576_000_000, nanos=999_999_999)
_LARGEST_TOKEN = pb.AttemptToken(
    epoch=_INT64_MAX, task_id=_INT64_MAX, attempt=_INT64_MAX, lease_id=bytes(LEASE_ID_BYTES)
)

TOKEN_RESERVE_BYTES = 64
"""Room kept in every attempt message for fields a later version may add to its token, so
that a payload accepted now still fits when they are sent (the lease id is counted above)."""

MAX_LIST_PAGE = 1_000
"""Most tasks one List reply carries: a longer page ends early, with a next-page token. The
page is made on the server's event loop, about 10 µs a task (the engine's summaries and their
messages): 10,000 held every other call for 0.1-0.15 s, 1,000 for some 15 ms."""

_VARINT_GROWTH = 4
"""Bytes a length prefix can grow by (1 byte for a small message, 5 for the largest)."""


def _attempt_message(attempt: pb.Attempt) -> int:
    return pb.AttachResponse(events=[pb.WorkerEvent(attempt=attempt)]).ByteSize()


_ATTEMPT_EXTRA = (
    _attempt_message(
        pb.Attempt(
            token=_LARGEST_TOKEN,
            pool="default",
            deadline=_LATEST,
            timeout=_LONGEST,
            lease_expires_at=_LATEST,
        )
    )
    + 3 * _VARINT_GROWTH  # the prefixes of Attempt, WorkerEvent and the event in the response
    + TOKEN_RESERVE_BYTES
)
"""The most an attempt's stream message adds to the fields of the TaskRequest it came from:
the token, the lease's expiry, a deadline as an instant, the default pool's name, and the
framing. Every other field of an attempt is one of the request's, encoded the same way."""


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def attempt_bytes(request: TaskSpec | TaskRequest) -> int:
    """The most bytes the Attach stream message that carries this task's attempt alone can
    take: its fields as they are, its token's numbers and instants at their largest, and
    TOKEN_RESERVE_BYTES. ``request``: a submitted task, or a schedule's template as decoded
    from the wire (str fields, bytes payload)."""
    deadline: object
    timeout: object
    if isinstance(request, TaskSpec):
        deadline, timeout = request.deadline_ns, request.timeout_ns
    else:
        deadline, timeout = request.deadline, request.timeout
    attempt = pb.Attempt(
        token=_LARGEST_TOKEN,
        pool=request.pool,
        kind=request.kind,
        tags=request.tags,
        lease_expires_at=_LATEST,
    )
    if request.key is not None:
        attempt.key = request.key
    if request.name is not None:
        attempt.name = request.name
    if deadline is not None:
        attempt.deadline.CopyFrom(_LATEST)
    if timeout is not None:
        attempt.timeout.CopyFrom(_LONGEST)
    if request.payload:
        attempt.payload = request.payload
    if request.after:
        attempt.after.extend(request.after)
    if request.trace_context is not None:
        attempt.traceparent = request.trace_context.traceparent
        if request.trace_context.tracestate:
            attempt.tracestate = request.trace_context.tracestate
    return _attempt_message(attempt) + TOKEN_RESERVE_BYTES


def check_attempts_fit(
    message: Message, requests: Sequence[TaskSpec | TaskRequest], limit: int
) -> None:
    """``PayloadError`` naming the first task whose attempt would not fit in a stream message
    of ``limit`` bytes; ``message`` is the request that carried the tasks.

    Each attempt holds its task's fields, which the message holds too, and adds at most
    ``_ATTEMPT_EXTRA``: a message that much below the limit needs no more. Otherwise a task
    too large must be nearly the whole message, so the others together are smaller than that
    extra, which a long batch cannot be: only a batch of a few tasks is measured, task by task.
    """
    if message.ByteSize() + _ATTEMPT_EXTRA <= limit or len(requests) > _ATTEMPT_EXTRA // 2 + 1:
        return
    for index, request in enumerate(requests):
        size = attempt_bytes(request)
        if size <= limit:
            continue
        which = "the task" if len(requests) == 1 else f"task {index} of the {len(requests)}"
        payload = len(request.payload or b"")
        room = max(payload - (size - limit), 0)
        raise PayloadError(
            f"{which} cannot be sent to a worker: its attempt would take {size} bytes with its "
            f"{payload}-byte payload, over the server's message limit of {limit} bytes; its "
            f"payload may be at most {room} bytes (or raise limits.max_message_bytes)"
        )


def max_data_bytes(limit: int) -> int:
    """The largest payload or output a ``GetTaskDataResponse`` of ``limit`` bytes carries."""
    size = limit - 1 - _varint_bytes(limit)  # the field's tag, and its length's prefix
    while size + 1 + 1 + _varint_bytes(size + 1) <= limit:
        size += 1
    return size


def fitted_task_info(info: TaskInfo, *, payload: bool, output: bool, limit: int) -> pb.TaskInfo:
    """The task as a reply of at most ``limit`` bytes, with the payload and output only if
    asked for. One asked for that does not fit is left out and flagged (the payload first:
    the caller submitted it), for ``GetTaskData`` to send alone."""
    message = task_info_to_pb(info)
    if not payload:
        message.ClearField("payload")
    if not output:
        message.ClearField("output")
    if message.ByteSize() > limit and message.HasField("payload"):
        message.ClearField("payload")
        message.payload_omitted = True
    if message.ByteSize() > limit and message.HasField("output"):
        message.ClearField("output")
        message.output_omitted = True
    if message.ByteSize() <= limit:
        return message
    raise PayloadError(
        f"task {info.task_id} takes {message.ByteSize()} bytes without its payload and output, "
        f"over the server's message limit of {limit} bytes (raise limits.max_message_bytes)"
    )


def task_data_response(value: bytes | None, task_id: int, limit: int) -> pb.GetTaskDataResponse:
    """A payload or output alone; one stored before its limit applied may still not fit."""
    if value is not None and len(value) > max_data_bytes(limit):
        raise PayloadError(
            f"task {task_id}'s value is {len(value)} bytes, over the server's message limit of "
            f"{limit} bytes (raise limits.max_message_bytes)"
        )
    message = pb.GetTaskDataResponse()
    if value is not None:
        message.data = value
    return message


def list_response_to_pb(
    tasks: Sequence[TaskSummary], asked: int | None, limit: int
) -> pb.ListResponse:
    """A List reply of at most ``limit`` bytes: the tasks in order while they fit (at least
    one), with a next-page token when it ended early or is as long as ``asked``."""
    message = pb.ListResponse()
    size = 0
    for summary in tasks:
        encoded = task_summary_to_pb(summary)
        # The token (a task id) and each task's tag and length prefix.
        size += encoded.ByteSize() + 1 + _varint_bytes(encoded.ByteSize())
        if size + 2 + 20 > limit:
            if not message.tasks:
                raise PayloadError(
                    f"task {summary.task_id}'s summary alone exceeds the server's message "
                    f"limit of {limit} bytes (raise limits.max_message_bytes)"
                )
            break
        message.tasks.append(encoded)
    full = len(message.tasks) < len(tasks) or (asked is not None and len(tasks) == asked)
    if full and message.tasks:
        message.next_page_token = str(message.tasks[-1].task_id)
    return message


def list_limits_response_to_pb(infos: Sequence[LimitInfo], limit: int) -> pb.ListLimitsResponse:
    """A ListLimits reply of at most ``limit`` bytes: every limit with its totals, then their
    busiest keys while they fit (each limit's own, in turn, the busiest first); a limit whose
    keys were cut says so (``keys_omitted``)."""
    message = pb.ListLimitsResponse(limits=[limit_info_to_pb(i, keys=False) for i in infos])
    size = message.ByteSize()
    if size > limit:
        raise PayloadError(
            f"the {len(infos)} limits alone exceed the server's message limit of {limit} bytes "
            "(raise limits.max_message_bytes)"
        )
    # Each key adds its own size and framing, and may lengthen its limit's length prefix.
    for info, encoded in zip(infos, message.limits, strict=True):
        for use in info.keys:
            key = limit_info_to_pb(replace(info, keys=(use,))).keys[0]
            cost = key.ByteSize() + 1 + _varint_bytes(key.ByteSize()) + 5
            if size + cost + 2 > limit:
                encoded.keys_omitted = True
                break
            encoded.keys.append(key)
            size += cost
    return message


def outbox_quarantine_response_to_pb(
    rows: Sequence[QuarantinedRow], asked: int, limit: int
) -> pb.ListOutboxQuarantineResponse:
    """A ListOutboxQuarantine reply of at most ``limit`` bytes: the rows in order while they
    fit (at least one), with ``next_after`` when it ended early or is as long as ``asked``."""
    message = pb.ListOutboxQuarantineResponse()
    size = 0
    for row in rows:
        encoded = quarantined_row_to_pb(row)
        size += encoded.ByteSize() + 1 + _varint_bytes(encoded.ByteSize())
        if size + 1 + 10 > limit:  # next_after: its tag and an int64's longest varint
            if not message.rows:
                raise PayloadError(
                    f"outbox row {row.row_id} alone exceeds the server's message limit of "
                    f"{limit} bytes (raise limits.max_message_bytes)"
                )
            break
        message.rows.append(encoded)
    if message.rows and (len(message.rows) < len(rows) or len(rows) == asked):
        message.next_after = message.rows[-1].row_id
    return message


_NEXT_BEFORE_BYTES = pb.ListOccurrencesResponse(next_before=_LATEST).ByteSize()
_NEXT_AFTER_BYTES = 1 + 10
"""An optional int64's tag and its longest varint (``next_after`` of a reply)."""


def explanation_response(explanation: Explanation, limit: int) -> pb.Explanation:
    """An Explain reply; one larger than ``limit`` (a task of a thousand unfinished parents
    under a tiny limit, whose ``Get`` fails alike) is refused."""
    message = explanation_to_pb(explanation)
    if message.ByteSize() > limit:
        raise PayloadError(
            f"the explanation of task {explanation.task_id} takes {message.ByteSize()} bytes, "
            f"over the server's message limit of {limit} bytes (raise limits.max_message_bytes)"
        )
    return message


def occurrences_response_to_pb(
    records: Sequence[OccurrenceInfo], asked: int, limit: int
) -> pb.ListOccurrencesResponse:
    """A ListOccurrences reply of at most ``limit`` bytes: the records in order (the newest
    first) while they fit (at least one), with ``next_before`` when it ended early or is as
    long as ``asked``."""
    message = pb.ListOccurrencesResponse()
    size = 0
    for record in records:
        encoded = occurrence_to_pb(record)
        size += encoded.ByteSize() + 1 + _varint_bytes(encoded.ByteSize())
        if size + _NEXT_BEFORE_BYTES > limit:
            if not message.occurrences:
                raise PayloadError(
                    f"the occurrence record of {record.due_at.isoformat()} alone exceeds the "
                    f"server's message limit of {limit} bytes (raise limits.max_message_bytes)"
                )
            break
        message.occurrences.append(encoded)
    if message.occurrences and (len(message.occurrences) < len(records) or len(records) == asked):
        message.next_before.CopyFrom(message.occurrences[-1].due_at)
    return message


def attempts_response_to_pb(attempts: Sequence[AttemptInfo], limit: int) -> pb.GetAttemptsResponse:
    """A GetAttempts reply of at most ``limit`` bytes: the attempts in order (the oldest
    first) while they fit (at least one), with ``next_after`` when it ended early. An attempt's
    message is bounded (64 Ki characters and its kept traceback), but 25 of them need not fit
    in one reply."""
    message = pb.GetAttemptsResponse()
    size = 0
    for attempt in attempts:
        encoded = attempt_info_to_pb(attempt)
        size += encoded.ByteSize() + 1 + _varint_bytes(encoded.ByteSize())
        if size + _NEXT_AFTER_BYTES > limit:
            if not message.attempts:
                raise PayloadError(
                    f"attempt {attempt.attempt} alone exceeds the server's message limit of "
                    f"{limit} bytes (raise limits.max_message_bytes)"
                )
            message.next_after = message.attempts[-1].attempt
            break
        message.attempts.append(encoded)
    return message


def dependants_response_to_pb(task_ids: Sequence[int], limit: int) -> pb.GetDependantsResponse:
    """A GetDependants reply of at most ``limit`` bytes: the ids in order while they fit, with
    ``next_after`` when it ended early (a task may have any number of dependants)."""
    message = pb.GetDependantsResponse()
    packed = 0  # the packed field's content: each id's varint
    taken = 0
    for task_id in task_ids:
        grown = packed + _varint_bytes(task_id)
        if 1 + _varint_bytes(grown) + grown + _NEXT_AFTER_BYTES > limit:
            break
        packed, taken = grown, taken + 1
    if task_ids and not taken:  # below any limit the configuration allows (1 KiB)
        raise PayloadError(f"no task id fits in the server's message limit of {limit} bytes")
    message.task_ids.extend(task_ids[:taken])
    if taken < len(task_ids):
        message.next_after = task_ids[taken - 1]
    return message
