"""``AsyncClient``: the calls of ``cronoq.Scheduler`` against a cronoq-server over gRPC."""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, TypeVar

import grpc
from grpc import aio

from cronoq import (
    AttemptInfo,
    BytesCodec,
    Codec,
    Explanation,
    LimitInfo,
    OccurrenceInfo,
    PoolInfo,
    ScheduleInfo,
    Status,
    TaskInfo,
    TaskRequest,
    TaskSummary,
    WorkerInfo,
)
from cronoq.errors import (
    CronoqError,
    DuplicateSchedule,
    InvalidArgument,
    ScheduleNotFound,
    SchedulerError,
    SchedulerStopped,
)
from cronoq_client import _wire as wire
from cronoq_client._channel import (
    CLOSED_UNDER_CALL,
    Channels,
    Connection,
    closed_under_call,
    message_limit,
    stall_timeout_of,
    targets_of,
)
from cronoq_client._credentials import Tls, credentials
from cronoq_client._outbox import OutboxStatus, QuarantinedOutboxRow
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._proto import cronoq_pb2_grpc as pb_grpc
from cronoq_client._retry import Backoff, Verdict, judge, never_handled, never_sent
from cronoq_client._status import Outcome, error_from_rpc, outcome
from cronoq_client._submits import Submits

__all__ = ["DEFAULT_STALL_TIMEOUT", "WAIT_MARGIN", "AsyncClient", "Unreachable"]

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
DEFAULT_STALL_TIMEOUT = 2.0
"""Seconds a connection may carry calls without any answer, a health check's included, before
the client leaves it (see ``_channel``)."""
RETRY_PAUSE_MAX = 0.5
"""The longest pause between two tries of a call (full jitter below it): a failover is over
within the store's lease, and a client that backed off further would only add its pause to it.
A standby refuses a call for the cost of its authentication check."""
WAIT_MARGIN = 5.0
"""Seconds a ``wait`` call's gRPC deadline runs past its wait, so that the server's
WaitTimedOut (a definite answer) arrives before the transport's DEADLINE_EXCEEDED."""

_R = TypeVar("_R")


class Unreachable(SchedulerError):
    """No server could be reached within the client's ``connect_timeout``: every try of the
    call failed before any connection carried it (refused, a name that does not resolve, a
    handshake nobody answered). Nothing was applied (``applied=False``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, applied=False)


if TYPE_CHECKING:
    # Only in the generated stubs (.pyi): the type of a stub made on an aio channel.
    Stub = pb_grpc.SchedulerServiceAsyncStub
    from opentelemetry.trace import TracerProvider

    from cronoq.tracing import Tracing

Metadata = list[tuple[str, str]]
_SUBMIT = "/cronoq.v1.SchedulerService/Submit"
_SUBMIT_MANY = "/cronoq.v1.SchedulerService/SubmitMany"


class AsyncClient:
    """A client of cronoq-server with the calls of ``cronoq.Scheduler``: same names,
    arguments, return values and exceptions.

    ``target`` is ``"host:port"`` or a list of replicas (tried in turn). ``timeout`` bounds
    every call, its retries included. ``tls``: False for plaintext, True for TLS with the
    system's roots, ``cronoq_client.Tls`` (PEM files: the server's CA, a client certificate
    for mTLS) or ``grpc.ChannelCredentials``; None: from ``CRONOQ_TLS_*``, else plaintext.
    ``token``: the bearer token sent with every call (None: ``CRONOQ_TOKEN`` or the file named
    by ``CRONOQ_TOKEN_FILE``, else none). Credentials the server refuses fail the call at once
    with ``Unauthenticated`` or ``PermissionDenied``, never retried. Payloads and outputs go
    through ``codec`` (``BytesCodec`` by default), on this side: the server stores bytes.

    A call is retried, with backoff and on a new connection, while nothing was applied (a
    standby's or stopping leader's answer, a connection that could not be made) and, when its
    outcome is unknown (the leader could not confirm it durable, the connection broke), only if
    it is idempotent: reads, cancel, schedule calls, and a submit whose every task has a key.
    A submit without a key whose outcome is unknown raises ``SchedulerError`` with
    ``applied=None`` at once. After any unknown outcome the next call goes on a new connection
    (to the next target; behind a balancer, a new pick), so that a client does not stay on a
    frozen replica; calls in flight on the old one may still finish there.

    ``connect_timeout``: seconds a call keeps trying while no server has answered it at all
    (every connection refused, a name that does not resolve, a handshake nobody answers);
    past them it raises ``SchedulerError`` with ``applied=False`` naming the targets tried.
    None (the default) lets ``timeout`` bound these retries too, so that a program or worker
    rides out a server's restart; the ``cronoq`` command sets a few seconds, so that a person
    learns at once that nothing listens there. Once a server answered a try (a standby's
    refusal, a connection broken mid-call), the call is retried until ``timeout``.

    ``stall_timeout``: a connection that carries calls and answers nothing, not even a health
    check, for this many seconds (a frozen or cut-off replica) is left: its calls in flight end
    as cut mid-call (retried if idempotent, else ``applied=None``), and those that never left go
    on a new connection. None never leaves one before the call's own deadline.

    Concurrent ``submit`` calls share gRPC calls: one leaves at once when none is in flight,
    those that arrive meanwhile leave together in one SubmitEach when it returns, each with its
    own answer, exceptions, timeout and retries, as if it went alone (``docs/server.md``).

    ``tracing``: OpenTelemetry spans of submissions, whose trace context goes to the server
    with each Submit and SubmitMany, so that the tasks' attempts join their traces
    (``docs/tracing.md``; needs ``cronoq[otel]``): True for the global tracer provider's, or a
    ``TracerProvider``. Off by default; on, each submit goes alone.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        codec: Codec | None = None,
        tls: grpc.ChannelCredentials | Tls | bool | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tracing: bool | TracerProvider = False,
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
        if connect_timeout is not None and (
            isinstance(connect_timeout, bool)
            or not isinstance(connect_timeout, int | float)
            or not 0 < connect_timeout < 1e9
        ):
            raise InvalidArgument(
                "connect_timeout must be a positive number of seconds or None, "
                f"got {connect_timeout!r}"
            )
        self._connect_timeout = None if connect_timeout is None else float(connect_timeout)
        max_message_bytes = message_limit(max_message_bytes)
        secrets = credentials(tls, token)
        self._codec: Codec = BytesCodec() if codec is None else codec
        self._timeout = float(timeout)
        self._backoff = Backoff(cap=RETRY_PAUSE_MAX)
        self._targets = targets_of(target)
        self._channels = Channels(
            self._targets,
            secrets,
            max_message_bytes,
            timeout,
            stall_timeout=stall_timeout_of(stall_timeout),
        )
        self._submits = Submits(max_message_bytes)
        self._tracing: Tracing | None = None
        if tracing is not False:  # cronoq.tracing (and OpenTelemetry) imported only if asked
            from cronoq.tracing import Tracing

            self._tracing = Tracing.of(tracing)

    @property
    def codec(self) -> Codec:
        return self._codec

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection; calls in flight are cancelled, later calls raise
        ``SchedulerStopped``."""
        await self._submits.close()
        await self._channels.close()

    # --- the retry loop ---------------------------------------------------------------------

    async def _call(
        self,
        send: Callable[[Stub, float | None], Awaitable[_R]],
        *,
        idempotent: bool,
        seconds: float | Literal["client"] | None = "client",
        settle: Callable[[CronoqError, float | None], Awaitable[_R]] | None = None,
    ) -> _R:
        """Send until answered, retrying by the rule of ``_retry`` within ``seconds`` (by
        default the client's timeout; None: no deadline). ``settle`` decides a definite answer
        to a repeat of the call when an earlier try may have been applied (returns the
        result, or raises), within the seconds left: the error may be that try's trace."""
        loop = asyncio.get_running_loop()
        budget = self._timeout if seconds == "client" else seconds
        began = loop.time()
        deadline = None if budget is None else began + budget
        # Until a server answers some try, the connect timeout bounds the retries too.
        connect_by = None if self._connect_timeout is None else began + self._connect_timeout
        attempt = 0
        unknown = False  # once a try may have applied, no later answer can say it did not
        while True:
            if self._channels.closed:
                raise SchedulerStopped("the client is closed", applied=None if unknown else False)
            connection = self._channels.current()
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            failed: aio.AioRpcError | None = None
            try:
                return await self._channels.watched(connection, send(connection.stub, remaining))
            except aio.AioRpcError as err:
                if judge(err, idempotent=idempotent) is Verdict.RAISE:
                    if outcome(err) is Outcome.UNKNOWN:
                        # The replica may be frozen or cut off (a deadline, a broken
                        # connection, a commit it could not confirm): the next call goes on a
                        # new connection, where a balancer may pick another replica. Calls in
                        # flight on this one keep it for the grace period.
                        self._channels.replace(connection)
                    error = error_from_rpc(err)
                    if unknown and settle is not None:
                        left = None if deadline is None else max(0.0, deadline - loop.time())
                        return await settle(error, left)
                    raise _answer(error, unknown) from err
                unknown = unknown or (
                    outcome(err) is Outcome.UNKNOWN and not (never_sent(err) or never_handled(err))
                )
                if not never_sent(err):
                    connect_by = None  # a server answered: only the call's deadline now
                failed = err
            except asyncio.CancelledError:
                if not closed_under_call():
                    raise
                if connection.carried_nothing:
                    # Abandoned before it reached any server (a frozen replica's kernel took
                    # the TCP connection): the request never left, retried at once.
                    if deadline is not None and loop.time() >= deadline:
                        raise SchedulerError(
                            f"{_cut_off(connection)} (after {attempt + 1} tries in {budget:g} s)",
                            applied=None if unknown else False,
                        ) from None
                    attempt += 1
                    if connect_by is not None and loop.time() >= connect_by:
                        raise self._unreachable(began, attempt, _cut_off(connection)) from None
                    continue
                connect_by = None
                # Another call's reconnect retired this channel, or it stalled and was
                # abandoned: the request may have been applied, as for a connection broken
                # mid-call.
                if not idempotent:
                    raise SchedulerError(_cut_off(connection), applied=None) from None
                unknown = True
            except aio.UsageError as err:
                # A closing channel refused the call: it never left. Unless the client is
                # closed, that channel was one another call retired while this one waited
                # its turn (a submit queued behind a call in flight): on the current one.
                if self._channels.closed or self._channels.current() is connection:
                    applied = None if unknown else False
                    raise SchedulerStopped("the client is closed", applied=applied) from err
                continue
            self._channels.replace(connection)
            pause = self._backoff.delay(attempt)
            attempt += 1
            if connect_by is not None and failed is not None:
                if loop.time() >= connect_by:
                    raise self._unreachable(began, attempt, _reason(failed)) from failed
                pause = min(pause, connect_by - loop.time())  # one last try at the limit
            if deadline is not None and loop.time() + pause >= deadline:
                raise _answer(_final(failed, attempt, budget), unknown) from failed
            await asyncio.sleep(pause)

    def _unreachable(self, began: float, attempts: int, reason: str) -> Unreachable:
        took = asyncio.get_running_loop().time() - began
        tries = "1 try" if attempts == 1 else f"{attempts} tries"
        return Unreachable(
            f"no cronoq server answered at {', '.join(self._targets)} "
            f"({tries} in {took:.1f} s; last error: {reason})"
        )

    async def _submit_call(
        self,
        rpc: str,
        pools: builtins.list[str],
        send: Callable[[Stub, float | None, Metadata | None], Awaitable[_R]],
        *,
        idempotent: bool,
    ) -> _R:
        """A Submit or SubmitMany call, in a span whose context the server stores with the
        tasks when tracing is on."""
        if self._tracing is None:
            return await self._call(
                lambda stub, timeout: send(stub, timeout, None), idempotent=idempotent
            )
        with self._tracing.submit(pools, len(pools), rpc) as span:
            metadata: Metadata = []
            self._tracing.inject(span, metadata)
            reply = await self._call(
                lambda stub, timeout: send(stub, timeout, metadata), idempotent=idempotent
            )
            if isinstance(reply, pb.SubmitResponse):
                self._tracing.submitted(span, [reply.task_id])
            return reply

    # --- tasks ------------------------------------------------------------------------------

    async def submit(self, kind: str, payload: Any = None, **options: Any) -> int:
        """Submit one task; return its id (the existing task's id if its key is held)."""
        try:
            request = TaskRequest(kind, payload, **options)
        except TypeError as exc:
            raise InvalidArgument(str(exc)) from None
        message = wire.submit_request(request, self._codec)
        idempotent = message.task.HasField("key")
        if self._tracing is None:
            # Sent with the submissions of this client's other callers that overlap it (see
            # _submits), each judged and retried as its own Submit would be.
            return await self._call(
                lambda stub, timeout: self._submits.submit(stub, message, timeout),
                idempotent=idempotent,
            )
        # Traced, each submission goes alone: its span's context travels in the call's
        # metadata, which a SubmitEach has one of.
        reply = await self._submit_call(
            _SUBMIT,
            [_pool(message.task)],
            lambda stub, timeout, metadata: stub.Submit(
                message, timeout=timeout, metadata=metadata
            ),
            idempotent=idempotent,
        )
        return reply.task_id

    async def submit_many(self, requests: Iterable[TaskRequest]) -> builtins.list[int]:
        """Submit several tasks in one step: all are accepted, or none is. A server takes at
        most ``protocol.MAX_SUBMIT_MANY_TASKS`` (1,000) tasks per call (and 5,000 dependencies
        and tags in all), so that no call holds its event loop long: a larger batch is refused
        whole with ``InvalidArgument``; split it (with keys, each call is safe to retry)."""
        message = wire.submit_many_request(requests, self._codec)
        if not message.tasks and not message.payloads:
            return []
        reply = await self._submit_call(
            _SUBMIT_MANY,
            [_pool(task) for task in message.tasks]
            or [_pool(message.common)] * len(message.payloads),
            lambda stub, timeout, metadata: stub.SubmitMany(
                message, timeout=timeout, metadata=metadata
            ),
            # The compact form carries no key: its tasks are never all keyed.
            idempotent=bool(message.tasks) and all(task.HasField("key") for task in message.tasks),
        )
        sent = len(message.tasks) + len(message.payloads)
        if len(reply.task_ids) != sent:
            # A server of another release may not know the form sent (see docs/server.md).
            raise SchedulerError(
                f"the server answered {len(reply.task_ids)} task ids for {sent} tasks; "
                "upgrade the servers and clients of a deployment together",
                applied=None,
            )
        return list(reply.task_ids)

    async def get(
        self, task_id: int, *, include_payload: bool = True, include_output: bool = True
    ) -> TaskInfo:
        """The task with this id. Raises TaskNotFound if it is unknown or pruned.

        ``include_payload=False`` / ``include_output=False``: that value is not sent and reads
        None, which spares the transfer of a large one. A value too large to travel with the
        rest of the task is fetched alone (a second call)."""
        message = wire.get_request(
            task_id, include_payload=include_payload, include_output=include_output
        )
        reply = await self._call(
            lambda stub, timeout: stub.Get(message, timeout=timeout), idempotent=True
        )
        return await self._task(reply)

    async def get_by_key(
        self, key: str, *, include_payload: bool = True, include_output: bool = True
    ) -> TaskInfo | None:
        """The task holding ``key`` (live or finished within the retention), or None; the
        options are ``get``'s."""
        message = wire.get_by_key_request(
            key, include_payload=include_payload, include_output=include_output
        )
        reply = await self._call(
            lambda stub, timeout: stub.GetByKey(message, timeout=timeout), idempotent=True
        )
        return await self._task(reply.task) if reply.HasField("task") else None

    async def wait(
        self,
        task_id: int,
        timeout: float | None = None,
        *,
        include_payload: bool = True,
        include_output: bool = True,
    ) -> TaskInfo:
        """Wait until the task is terminal; return it with its output. Past ``timeout``
        seconds, ``WaitTimedOut``. The call's deadline is the longer of ``timeout`` and the
        client's, plus WAIT_MARGIN; with ``timeout=None`` it has none. The options are
        ``get``'s."""
        include = {"include_payload": include_payload, "include_output": include_output}
        wire.wait_request(task_id, timeout, **include)  # refuse bad arguments before any wait
        loop = asyncio.get_running_loop()
        until = None if timeout is None else loop.time() + _seconds(timeout)

        def send(stub: Stub, remaining: float | None) -> Awaitable[pb.TaskInfo]:
            # A retry waits only for what is left of the caller's timeout.
            left = None if until is None else max(0.0, until - loop.time())
            return stub.Wait(wire.wait_request(task_id, left, **include), timeout=remaining)

        seconds = None if timeout is None else max(_seconds(timeout), self._timeout) + WAIT_MARGIN
        reply = await self._call(send, idempotent=True, seconds=seconds)
        return await self._task(reply)

    async def _task(self, reply: pb.TaskInfo) -> TaskInfo:
        """The task of a reply, with the payload or output the server left out because it
        did not fit in one message with the rest fetched alone."""
        if reply.payload_omitted:
            payload = await self._task_data(reply.task_id, pb.TASK_DATA_PAYLOAD)
            if payload is not None:
                reply.payload = payload
        if reply.output_omitted:
            output = await self._task_data(reply.task_id, pb.TASK_DATA_OUTPUT)
            if output is not None:
                reply.output = output
        return wire.task_info_from_pb(reply, self._codec)

    async def _task_data(self, task_id: int, data: pb.TaskData.ValueType) -> bytes | None:
        message = wire.task_data_request(task_id, data)
        reply = await self._call(
            lambda stub, timeout: stub.GetTaskData(message, timeout=timeout), idempotent=True
        )
        return reply.data if reply.HasField("data") else None

    async def list(
        self,
        *,
        status: Status | str | Iterable[Status | str] | None = None,
        pool: str | None = None,
        kind: str | None = None,
        tag: str | None = None,
        limit: int | None = None,
        after: int | None = None,
        before: int | None = None,
        newest_first: bool = False,
    ) -> builtins.list[TaskSummary]:
        """Tasks in ascending id order, or the newest first: ids above ``after`` and below
        ``before``, ``limit`` at most (None: all). The server sends long lists in pages
        (``MAX_LIST_PAGE`` tasks, or fewer when they would not fit in a message): this asks
        for the next page until it has them all."""
        found: builtins.list[TaskSummary] = []
        cursor: int | None = None
        while True:
            left = None if limit is None else limit - len(found)
            message = wire.list_request(
                status=status,
                pool=pool,
                kind=kind,
                tag=tag,
                limit=left,
                after=after,
                before=before,
                newest_first=newest_first,
            )
            if cursor is not None:
                # The page token, not a bound: a server that predates the bounds still pages
                # on (in its own order) instead of sending the first page again and again.
                message.page_token = str(cursor)
            tasks, cursor = wire.list_response(await self._list_page(message))
            found.extend(tasks)
            if cursor is None or (limit is not None and len(found) >= limit):
                return found

    async def _list_page(self, message: pb.ListRequest) -> pb.ListResponse:
        return await self._call(
            lambda stub, timeout: stub.List(message, timeout=timeout), idempotent=True
        )

    async def cancel(self, task_id: int, reason: str = "cancelled by request") -> Status:
        """Cancel a task; return its status (``running`` while its attempt stops)."""
        message = wire.cancel_request(task_id, reason)
        reply = await self._call(
            lambda stub, timeout: stub.Cancel(message, timeout=timeout), idempotent=True
        )
        return wire.status_from_pb(reply.status)

    # --- schedules --------------------------------------------------------------------------

    async def add_schedule(
        self, name: str, cron: str, *, kind: str, **options: Any
    ) -> ScheduleInfo:
        """Create a recurring schedule (or replace one of that name with ``replace=True``);
        the options are those of ``Scheduler.add_schedule``."""
        message = wire.add_schedule_request(self._codec, name, cron, kind=kind, **options)

        async def settle(error: CronoqError, seconds: float | None) -> pb.ScheduleInfo:
            # A repeat whose first try may have made the schedule: the schedule found under
            # its name is that try's if it shows what was asked (a ScheduleInfo shows the cron,
            # zone, kind, pool and policies; not the payload, tags or retry policy).
            if not isinstance(error, DuplicateSchedule):
                raise error
            try:
                found = await self._schedule_named(message.name, seconds)
            except CronoqError as exc:
                raise SchedulerError(
                    f"an earlier try may have added schedule {message.name!r}; "
                    f"it could not be checked: {exc}",
                    applied=None,
                ) from exc
            if found is not None and _as_asked(found, message):
                return found
            raise error

        # Idempotent: a repeat never makes a second schedule (with replace, it replaces the
        # schedule with the same).
        reply = await self._call(
            lambda stub, timeout: stub.AddSchedule(message, timeout=timeout),
            idempotent=True,
            settle=settle,
        )
        return wire.schedule_info_from_pb(reply)

    async def _schedule_named(self, name: str, seconds: float | None) -> pb.ScheduleInfo | None:
        reply = await self._call(
            lambda stub, timeout: stub.ListSchedules(pb.ListSchedulesRequest(), timeout=timeout),
            idempotent=True,
            seconds=seconds,
        )
        return next((s for s in reply.schedules if s.name == name), None)

    async def pause_schedule(self, name: str) -> ScheduleInfo:
        message = pb.PauseScheduleRequest(name=_name(name))
        reply = await self._call(
            lambda stub, timeout: stub.PauseSchedule(message, timeout=timeout), idempotent=True
        )
        return wire.schedule_info_from_pb(reply)

    async def resume_schedule(self, name: str) -> ScheduleInfo:
        """Resume from the next occurrence after now; those missed while paused do not run."""
        message = pb.ResumeScheduleRequest(name=_name(name))
        reply = await self._call(
            lambda stub, timeout: stub.ResumeSchedule(message, timeout=timeout), idempotent=True
        )
        return wire.schedule_info_from_pb(reply)

    async def remove_schedule(self, name: str) -> None:
        """Remove a schedule; tasks it already created carry on."""
        message = pb.RemoveScheduleRequest(name=_name(name))

        async def settle(error: CronoqError, seconds: float | None) -> pb.RemoveScheduleResponse:
            # A repeat whose first try may have removed it: gone is what was asked.
            if isinstance(error, ScheduleNotFound):
                return pb.RemoveScheduleResponse()
            raise error

        await self._call(
            lambda stub, timeout: stub.RemoveSchedule(message, timeout=timeout),
            idempotent=True,
            settle=settle,
        )

    async def list_schedules(self) -> builtins.list[ScheduleInfo]:
        message = pb.ListSchedulesRequest()
        reply = await self._call(
            lambda stub, timeout: stub.ListSchedules(message, timeout=timeout), idempotent=True
        )
        return [wire.schedule_info_from_pb(s) for s in reply.schedules]

    async def preview(
        self, cron: str, timezone: str = "UTC", n: int = 10, *, after: datetime | None = None
    ) -> builtins.list[datetime]:
        """The next ``n`` occurrences of a cron expression (as ``cronoq.preview``), computed by
        the server, so that its cron rules and time zone data decide."""
        message = wire.preview_request(cron, timezone=timezone, n=n, after=after)
        reply = await self._call(
            lambda stub, timeout: stub.PreviewSchedule(message, timeout=timeout), idempotent=True
        )
        return wire.preview_response(reply)

    # --- operator calls (issue 21) ----------------------------------------------------------

    async def pause_pool(self, name: str) -> PoolInfo:
        """Start no new attempt in this pool until it is resumed; running ones finish. Durable
        (it survives a failover). Needs the ``admin`` permission."""
        message = pb.PausePoolRequest(name=wire._text(name, "pool"))
        reply = await self._call(
            lambda stub, timeout: stub.PausePool(message, timeout=timeout), idempotent=True
        )
        return wire.pool_info_from_pb(reply)

    async def resume_pool(self, name: str) -> PoolInfo:
        """Let a paused pool start attempts again. Needs the ``admin`` permission."""
        message = pb.ResumePoolRequest(name=wire._text(name, "pool"))
        reply = await self._call(
            lambda stub, timeout: stub.ResumePool(message, timeout=timeout), idempotent=True
        )
        return wire.pool_info_from_pb(reply)

    async def list_pools(self) -> builtins.list[PoolInfo]:
        """Every pool of the server: concurrency, pause, attempts running, live tasks by status."""
        message = pb.ListPoolsRequest()
        reply = await self._call(
            lambda stub, timeout: stub.ListPools(message, timeout=timeout), idempotent=True
        )
        return [wire.pool_info_from_pb(p) for p in reply.pools]

    async def list_limits(self, *, keys: int = 20) -> builtins.list[LimitInfo]:
        """Every limit of the server (docs/limits.md): its bound, keys in use, attempts
        running, starts in the current rate window and tasks waiting, with its ``keys``
        (0..1000) busiest keys. A reply too large for the server's message limit leaves some
        keys out (the server flags them; this list holds those it sent)."""
        message = wire.list_limits_request(keys)
        reply = await self._call(
            lambda stub, timeout: stub.ListLimits(message, timeout=timeout), idempotent=True
        )
        return [wire.limit_info_from_pb(info) for info in reply.limits]

    async def retry(self, task_id: int, *, include_payload: bool = True) -> TaskInfo:
        """Make a failed or cancelled task live again (``Scheduler.retry``); raises
        ``NotRetryable`` for a live or succeeded task. Needs the ``admin`` permission. Not
        repeated when its outcome is unknown (a repeat would be refused: the task is live)."""
        message = pb.RetryRequest(
            task_id=wire._int64(task_id, "task_id"),
            include_payload=wire._flag(include_payload, "include_payload"),
        )
        reply = await self._call(
            lambda stub, timeout: stub.Retry(message, timeout=timeout), idempotent=False
        )
        return await self._task(reply)

    async def rerun(self, task_id: int) -> int:
        """Run a finished task again as a new task (``Scheduler.rerun``): the new task's id,
        whose ``TaskInfo.rerun_of`` names this one. Raises ``NotRetryable`` for a live task,
        one another live task's key blocks, or one whose parent failed. Needs the ``admin``
        permission. Not repeated when its outcome is unknown (a repeat could make a second
        task)."""
        message = wire.rerun_request(task_id)
        reply = await self._call(
            lambda stub, timeout: stub.Rerun(message, timeout=timeout), idempotent=False
        )
        return reply.task_id

    async def trigger_schedule(self, name: str) -> int | None:
        """Run one occurrence of the schedule now, through its overlap policy: the task it
        created, or None if the policy skipped it. Needs the ``admin`` permission. Not
        repeated when its outcome is unknown (a repeat could run a second occurrence)."""
        message = pb.TriggerScheduleRequest(name=_name(name))
        reply = await self._call(
            lambda stub, timeout: stub.TriggerSchedule(message, timeout=timeout),
            idempotent=False,
        )
        return reply.task_id if reply.HasField("task_id") else None

    async def list_workers(self) -> builtins.list[WorkerInfo]:
        """The workers attached to the leader now, oldest first."""
        message = pb.ListWorkersRequest()
        reply = await self._call(
            lambda stub, timeout: stub.ListWorkers(message, timeout=timeout), idempotent=True
        )
        return [wire.worker_info_from_pb(w) for w in reply.workers]

    # --- why a task is where it is (issue 32) -----------------------------------------------

    async def explain(self, task_id: int) -> Explanation:
        """What holds the task now, since when, and what would release it
        (``Scheduler.explain``). Raises TaskNotFound if it is unknown or pruned. Needs the
        ``read`` permission."""
        message = wire.explain_request(task_id)
        reply = await self._call(
            lambda stub, timeout: stub.Explain(message, timeout=timeout), idempotent=True
        )
        return wire.explanation_from_pb(reply)

    async def occurrences(
        self, name: str, *, before: datetime | None = None, limit: int = 100
    ) -> builtins.list[OccurrenceInfo]:
        """The schedule's occurrence ledger, newest first (``Scheduler.occurrences``): only
        records due before ``before``, at most ``limit`` (1 to 1,000); the next page is
        ``before=`` the last record's ``due_at``. A page the server ended early (its message
        limit) is followed until ``limit`` records or the last one. Raises ScheduleNotFound if
        no such schedule exists and none is recorded. Needs the ``read`` permission."""
        found: builtins.list[OccurrenceInfo] = []
        message = wire.list_occurrences_request(name, before, limit)
        while True:
            records, following = wire.occurrences_response(await self._occurrences_page(message))
            found.extend(records)
            if following is None or not records or len(found) >= limit:
                return found
            _advanced(before is not None and following >= before, "ListOccurrences")
            before = following
            message = wire.list_occurrences_request(name, following, limit - len(found))

    async def attempts(self, task_id: int) -> builtins.list[AttemptInfo]:
        """The task's attempts that ended without success, oldest first
        (``Scheduler.attempts``): the latest 25 the store keeps. Raises TaskNotFound if the
        task is unknown or pruned. Needs the ``read`` permission."""
        found: builtins.list[AttemptInfo] = []
        message = wire.get_attempts_request(task_id)
        last: int | None = None
        while True:
            attempts, after = wire.attempts_response(await self._attempts_page(message))
            found.extend(attempts)
            if after is None or not attempts:
                return found
            _advanced(last is not None and after <= last, "GetAttempts")
            last = after
            message = wire.get_attempts_request(task_id, after)

    async def dependants(self, task_id: int) -> builtins.list[int]:
        """The ids of the tasks that depend on this one, ascending, as the leader's memory
        knows them (``Scheduler.dependants``: empty for a task finished before it recovered,
        or before the retention). Raises TaskNotFound if the task is unknown or pruned. Needs
        the ``read`` permission."""
        found: builtins.list[int] = []
        message = wire.get_dependants_request(task_id)
        last: int | None = None
        while True:
            task_ids, after = wire.dependants_response(await self._dependants_page(message))
            found.extend(task_ids)
            if after is None or not task_ids:
                return found
            _advanced(last is not None and after <= last, "GetDependants")
            last = after
            message = wire.get_dependants_request(task_id, after)

    async def _occurrences_page(
        self, message: pb.ListOccurrencesRequest
    ) -> pb.ListOccurrencesResponse:
        return await self._call(
            lambda stub, timeout: stub.ListOccurrences(message, timeout=timeout), idempotent=True
        )

    async def _attempts_page(self, message: pb.GetAttemptsRequest) -> pb.GetAttemptsResponse:
        return await self._call(
            lambda stub, timeout: stub.GetAttempts(message, timeout=timeout), idempotent=True
        )

    async def _dependants_page(self, message: pb.GetDependantsRequest) -> pb.GetDependantsResponse:
        return await self._call(
            lambda stub, timeout: stub.GetDependants(message, timeout=timeout), idempotent=True
        )

    # --- the outbox -------------------------------------------------------------------------

    async def outbox_status(self) -> OutboxStatus:
        """The leader's outbox: rows waiting, the oldest one's age, rows quarantined, and what
        this leader ingested and quarantined. ``NoOutbox`` (an ``InvalidArgument``) from a
        server that ingests none. Needs the ``read`` permission."""
        message = pb.OutboxStatusRequest()
        reply = await self._call(
            lambda stub, timeout: stub.OutboxStatus(message, timeout=timeout), idempotent=True
        )
        return wire.outbox_status_from_pb(reply)

    async def outbox_quarantine(
        self, *, after: int = 0, limit: int = 100
    ) -> builtins.list[QuarantinedOutboxRow]:
        """Quarantined outbox rows with ids above ``after``, in id order, at most ``limit``
        (1 to 1,000), each with the reason it could not become a task; the next page is
        ``after=`` the last id. A page the server ended early (its message limit) is followed
        until ``limit`` rows or the last one. Needs the ``read`` permission."""
        found: builtins.list[QuarantinedOutboxRow] = []
        message = wire.outbox_quarantine_request(after, limit)
        while True:
            rows, next_after = wire.outbox_quarantine_response(await self._quarantine_page(message))
            found.extend(rows)
            if next_after is None or not rows or len(found) >= limit:
                return found
            message = wire.outbox_quarantine_request(next_after, limit - len(found))

    async def _quarantine_page(
        self, message: pb.ListOutboxQuarantineRequest
    ) -> pb.ListOutboxQuarantineResponse:
        return await self._call(
            lambda stub, timeout: stub.ListOutboxQuarantine(message, timeout=timeout),
            idempotent=True,
        )

    async def requeue_outbox(self, row_ids: Iterable[int]) -> int:
        """Move quarantined rows (at most 1,000 ids) back to the outbox once their cause is
        fixed; the leader ingests them again. Returns how many moved (an id not in the
        quarantine counts none). Repeated when its outcome is unknown, which moves nothing
        twice: the count is then the last try's. Needs the ``admin`` permission."""
        message = pb.RequeueOutboxRequest(row_ids=wire.outbox_row_ids(row_ids))
        reply = await self._call(
            lambda stub, timeout: stub.RequeueOutbox(message, timeout=timeout), idempotent=True
        )
        return reply.count

    async def discard_outbox(self, row_ids: Iterable[int]) -> int:
        """Delete quarantined rows (at most 1,000 ids) for good; returns how many. Repeated
        when its outcome is unknown, as ``requeue_outbox`` is. Needs the ``admin``
        permission."""
        message = pb.DiscardOutboxRequest(row_ids=wire.outbox_row_ids(row_ids))
        reply = await self._call(
            lambda stub, timeout: stub.DiscardOutbox(message, timeout=timeout), idempotent=True
        )
        return reply.count


_DEFAULT_POOL = TaskRequest("").pool


def _pool(task: pb.TaskRequest) -> str:
    """The pool a wire task names (left out at its default)."""
    return task.pool or _DEFAULT_POOL


def _as_asked(found: pb.ScheduleInfo, asked: pb.AddScheduleRequest) -> bool:
    """The schedule shows what the request asked for, as far as a ScheduleInfo tells (a
    field the request left out is the server's default, which the client does not judge)."""
    if (found.cron, found.kind) != (asked.cron, asked.kind):
        return False
    if asked.HasField("pool") and found.pool != asked.pool:
        return False
    if asked.HasField("timezone") and found.timezone != asked.timezone:
        return False
    overlap, catch_up = asked.overlap, asked.catch_up
    return (overlap == pb.OVERLAP_POLICY_UNSPECIFIED or found.overlap == overlap) and (
        catch_up == pb.CATCH_UP_POLICY_UNSPECIFIED or found.catch_up == catch_up
    )


def _name(name: object) -> str:
    return wire._text(name, "schedule name")


def _seconds(timeout: float | timedelta) -> float:
    """The wait's timeout as float seconds (wait_request has checked it is a duration; a
    timedelta is accepted as the embedded Scheduler accepts it)."""
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _answer(error: CronoqError, unknown: bool) -> CronoqError:
    """``error``, but "may have been applied" if an earlier try of the call may have been."""
    if unknown and isinstance(error, SchedulerError) and error.applied is False:
        error.applied = None
    return error


def _cut_off(connection: Connection) -> str:
    """Why a call's connection was closed under it."""
    if connection.carried_nothing:
        return "no server answered on the connection (a frozen replica?): the call never left"
    if connection.abandoned:
        return (
            "the connection stalled: the server answered nothing, not even a health check, "
            "so the client left it (a frozen or cut-off replica)"
        )
    return CLOSED_UNDER_CALL


def _reason(err: aio.AioRpcError) -> str:
    """The last clause of a connect failure's text ("Connection refused", "Domain name not
    found"): gRPC core's prefixes ("failed to connect to all addresses; last error: UNKNOWN:
    ipv4:...: Failed to connect to remote host:") say nothing more to a person."""
    details = (err.details() or "").strip()
    return details.rsplit(": ", 1)[-1].strip("[] ") or details or err.code().name


def _final(err: aio.AioRpcError | None, attempts: int, budget: float | None) -> CronoqError:
    """The exception for a call whose deadline ran out while it was being retried (``err``:
    the last try's failure; None: its channel was closed under it)."""
    tried = f"(after {attempts} tries in {budget:g} s)" if budget is not None else ""
    if err is None:
        return SchedulerError(f"{CLOSED_UNDER_CALL} {tried}", applied=None)
    if never_sent(err):
        # The connect failure is certain to have applied nothing, which error_from_rpc (seeing
        # a plain UNAVAILABLE) cannot know.
        return SchedulerError(
            f"no connection could be made {tried}: {err.details()}", applied=False
        )
    if never_handled(err):
        return SchedulerError(f"the server stopped before it took the call {tried}", applied=False)
    found = error_from_rpc(err)
    if isinstance(found, SchedulerError):
        found.args = (f"{found} {tried}",)
    return found


def _advanced(stuck: bool, call: str) -> None:
    """A server whose next page does not move past the last would be asked forever."""
    if stuck:
        raise InvalidArgument(
            f"the server's {call} answer does not page forward; is it a cronoq server of "
            "this release?"
        )
