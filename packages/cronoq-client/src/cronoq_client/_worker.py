"""The remote worker runtime: runs attempts of remote pools leased by a cronoq server.

The executor contract is a local ``Pool``'s: ``async def fn(ctx, payload)`` runs on the loop and
is cancelled (``asyncio.CancelledError``) when its attempt is asked to stop; a plain function
runs in a thread and polls ``ctx.cancelled``; ``TaskError`` controls the retry; any other
exception is a retryable failure; an attempt that returns after it was asked to stop ends as a
failure with the reason.

The worker holds one Attach stream (attempts and cancellations arrive on it, a batch per
message under load) and makes unary HeartbeatMany calls (the heartbeats of the attempts due
together, from one loop: ``_heartbeats.py``) and ReportMany calls (the reports that finish
while one call is in flight leave together in the next: ``_reports.py``), each on whatever
connection is current. When the stream ends or fails, it opens a new connection (the next
target, when there are several, so that a balancer picks a replica again) after a backoff with
full jitter, and reattaches naming the attempts it still runs, which it goes on heartbeating
and reporting.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import grpc

from cronoq import (
    AttemptToken,
    BytesCodec,
    CancelRequested,
    Codec,
    CodecContext,
    LeasedAttempt,
    LeaseRenewed,
    Raised,
    TaskContext,
    TaskError,
    binds_context,
    call_catching,
    decode_parent_outputs,
    decode_with,
    encode_with,
)
from cronoq.errors import (
    InvalidArgument,
    PayloadError,
    PermissionDenied,
    SchedulerError,
    StaleAttempt,
    Unauthenticated,
)
from cronoq_client._channel import (
    Channels,
    Connection,
    closed_under_call,
    message_limit,
    targets_of,
)
from cronoq_client._client import DEFAULT_MAX_MESSAGE_BYTES
from cronoq_client._credentials import Tls, credentials
from cronoq_client._heartbeats import Heartbeats
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._proto import cronoq_pb2_grpc as pb_grpc
from cronoq_client._reports import Reports
from cronoq_client._retry import Backoff, Verdict, judge
from cronoq_client._status import error_from_rpc, error_info
from cronoq_client._wire import (
    Attached,
    RemoteAttempt,
    ReportFailure,
    ReportSuccess,
    UnreadableAttempt,
    attach_request,
    report_request,
    worker_events_from_pb,
)

if TYPE_CHECKING:  # the otel extra, imported only when tracing is on
    from opentelemetry.trace import TracerProvider

    from cronoq.tracing import Tracing

__all__ = ["Worker"]

log = logging.getLogger("cronoq_client.worker")

TaskFunction = Callable[[TaskContext, Any], Awaitable[Any]] | Callable[[TaskContext, Any], Any]

MAX_MESSAGE = 64 * 1024
"""Characters of a failure message the server accepts (the Scheduler's limit)."""
_BACKOFF = Backoff()
_CHANNEL_CLOSE_GRACE_S = 1.0
"""An old connection's calls get this long to finish once a new connection replaced it."""
_STOPPING = "the worker is stopping"
_REPORT_MANY = "/cronoq.v1.WorkerService/ReportMany"


def _truncate(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    marker = f"... ({len(message)} characters, truncated)"
    return message[: MAX_MESSAGE - len(marker)] + marker


def _failure(raised: Raised) -> ReportFailure:
    """The report of an attempt that raised, with its traceback (formatted here, where the
    frames are: the server only bounds it again)."""
    exc = raised.error
    if isinstance(exc, TaskError):
        return ReportFailure(_truncate(exc.message), exc.retryable, exc.retry_after)
    return ReportFailure(_truncate(f"{type(exc).__name__}: {exc}"), traceback=raised.traceback)


def _is_async(fn: object) -> bool:
    # A callable object with ``async def __call__`` is async too (as for a local Pool).
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


@dataclass(slots=True)
class _Attempt:
    """An attempt this worker runs (mutable: its lease and state change as it runs)."""

    leased: LeasedAttempt
    ctx: TaskContext
    lease_s: float
    lease_end: float
    """Loop time after which the server no longer holds the lease (as last renewed)."""
    task: asyncio.Task[None] | None = None
    executing: bool = True
    """The function still runs: a cancellation interrupts it (not the report that follows)."""
    stale: bool = False
    """The worker is stopping and gave up on it: it ends without a report."""


class Worker:
    """Runs the attempts of remote pools, ``slots`` at a time, until stopped.

    ``target`` is ``host:port``, or a list of them, tried in turn on reconnect (as for
    ``AsyncClient``). ``pools`` maps each remote pool's name to its function. ``codec`` decodes
    payloads and encodes outputs, as the submitting client's codec does (default
    ``BytesCodec``). ``tls`` and ``token``: the credentials, as for ``AsyncClient`` (also from
    the environment); credentials the server refuses make ``run()`` raise ``Unauthenticated``
    or ``PermissionDenied`` at once. ``worker_id`` names the
    worker in the server's logs (default ``host:pid``). ``max_message_bytes``: the largest
    message its channel takes (default 4 MiB, as the server's); a server whose limit is higher
    refuses the worker (INVALID_ARGUMENT), since an attempt could be too large for it.

    ``await run()`` works until ``stop()`` (or SIGTERM, when run in the main thread): the first
    stop drains (no new attempt; the running ones finish and report), a second one cancels the
    running attempts, which are then lost and retried after their lease.

    ``tracing``: an OpenTelemetry span for each attempt, a child of its task's submission when
    that was traced, and one for each report (``docs/tracing.md``; needs ``cronoq[otel]``):
    True for the global tracer provider's, or a ``TracerProvider``. Off by default.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        pools: Mapping[str, TaskFunction],
        *,
        slots: int = 10,
        codec: Codec | None = None,
        tls: grpc.ChannelCredentials | Tls | bool | None = None,
        token: str | None = None,
        worker_id: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tracing: bool | TracerProvider = False,
    ) -> None:
        targets = targets_of(target)
        self._max_message_bytes = message_limit(max_message_bytes)
        if not isinstance(pools, Mapping) or not pools:
            raise InvalidArgument("pools must map at least one pool name to its function")
        for name, fn in pools.items():
            if not isinstance(name, str) or not callable(fn):
                raise InvalidArgument(f"pools must map names to functions, got {name!r}: {fn!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvalidArgument(f"slots must be a positive int, got {slots!r}")
        self._pools = dict(pools)
        self._async = {name: _is_async(fn) for name, fn in self._pools.items()}
        self._slots = slots
        self._codec: Codec = codec if codec is not None else BytesCodec()
        self._binds = binds_context(self._codec)
        self._channels = Channels(
            targets,
            credentials(tls, token),
            self._max_message_bytes,
            retire_grace=_CHANNEL_CLOSE_GRACE_S,
        )
        self._stubs: tuple[int, pb_grpc.WorkerServiceAsyncStub] | None = None
        self._reports = Reports(self._current, self._max_message_bytes)
        self._heartbeats = Heartbeats(
            self._current, self._reconnect, self._renewed, self._stale, self._max_message_bytes
        )
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}"
        self._attempts: dict[AttemptToken, _Attempt] = {}
        self._leases: dict[str, float] = {}
        self._stopping = asyncio.Event()
        self._aborting = asyncio.Event()
        self._running = False
        self._threads: ThreadPoolExecutor | None = None
        self._attached = asyncio.Event()
        self._refusals: set[asyncio.Task[None]] = set()
        self._tracing: Tracing | None = None
        if tracing is not False:  # cronoq.tracing (and OpenTelemetry) imported only if asked
            from cronoq.tracing import Tracing

            self._tracing = Tracing.of(tracing)

    # --- control ----------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Attempts this worker runs now."""
        return len(self._attempts)

    async def attached(self) -> None:
        """Return once an Attach stream is established (for tests and readiness checks)."""
        await self._attached.wait()

    def stop(self) -> None:
        """First call: drain (take no new attempt, let the running ones finish and report).
        Second call: cancel the running attempts and return without reporting them."""
        if not self._stopping.is_set():
            log.info("worker draining", extra={"worker": self.worker_id, "running": self.running})
            self._stopping.set()
        elif not self._aborting.is_set():
            log.info("worker stopping now", extra={"worker": self.worker_id})
            self._aborting.set()

    async def run(self) -> None:
        """Attach and run attempts until stopped; see the class. Raises InvalidArgument if the
        server refuses the attachment for good (an unknown pool, a pool that is not remote), and
        Unauthenticated or PermissionDenied if it refuses the worker's credentials."""
        if self._running:
            raise RuntimeError("this Worker is already running")
        self._running = True
        loop = asyncio.get_running_loop()
        handled = threading.current_thread() is threading.main_thread()
        if handled:
            loop.add_signal_handler(signal.SIGTERM, self.stop)
        if not all(self._async.values()):
            # Never more threads than slots: the server sends no more attempts than that.
            self._threads = ThreadPoolExecutor(self._slots, thread_name_prefix="cronoq-worker")
        attach = loop.create_task(self._attach_loop(), name="cronoq-worker-attach")
        try:
            stopping = loop.create_task(self._stopping.wait())
            try:
                await asyncio.wait((attach, stopping), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopping.cancel()
            if attach.done():
                attach.result()  # a refusal for good
            attach.cancel()
            await asyncio.gather(attach, return_exceptions=True)
            await self._drain()
        finally:
            attach.cancel()
            await self._abandon_all()
            if handled:
                loop.remove_signal_handler(signal.SIGTERM)
            if self._threads is not None:
                # A thread cannot be stopped: it was told by its ctx and is left to finish.
                self._threads.shutdown(wait=False, cancel_futures=True)
            await self._heartbeats.close()
            await self._reports.close()
            await self._channels.close()
            self._running = False

    async def _drain(self) -> None:
        aborting = asyncio.ensure_future(self._aborting.wait())
        try:
            while self._attempts and not self._aborting.is_set():
                tasks = {a.task for a in self._attempts.values() if a.task is not None}
                await asyncio.wait({*tasks, aborting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborting.cancel()
        if not self._attempts:
            log.info("worker drained", extra={"worker": self.worker_id})

    async def _abandon_all(self) -> None:
        tasks = []
        for attempt in self._attempts.values():
            attempt.stale = True  # no report: the lease runs out and the server retries it
            attempt.ctx.cancel_reason = attempt.ctx.cancel_reason or _STOPPING
            if attempt.task is not None:
                attempt.task.cancel()
                tasks.append(attempt.task)
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- connections ------------------------------------------------------------------------

    def _current(self) -> tuple[Connection, pb_grpc.WorkerServiceAsyncStub]:
        connection = self._channels.current()
        if self._stubs is None or self._stubs[0] != connection.generation:
            self._stubs = (connection.generation, pb_grpc.WorkerServiceStub(connection.channel))
        return connection, self._stubs[1]

    def _reconnect(self, failed: Connection) -> None:
        """A new connection (to the next target), unless a call that saw the same failure
        made one already; calls in flight on the old one get a grace period."""
        self._channels.replace(failed)

    # --- the Attach stream ------------------------------------------------------------------

    async def _attach_loop(self) -> None:
        failures = 0
        while True:
            connection, stub = self._current()
            request = attach_request(
                self.worker_id,
                self._pools,
                self._slots,
                running=tuple((t, a.leased.lease_id) for t, a in self._attempts.items()),
                max_message_bytes=self._max_message_bytes,
            )
            call = stub.Attach(request)
            attached = False
            try:
                async for message in call:
                    for event in worker_events_from_pb(message):
                        if isinstance(event, Attached):
                            attached = True
                            failures = 0
                            self._leases.update(event.leases)
                            self._attached.set()
                            log.info(
                                "worker attached",
                                extra={"worker": self.worker_id, "epoch": event.epoch},
                            )
                        elif isinstance(event, LeasedAttempt):
                            self._start(event)
                        elif isinstance(event, UnreadableAttempt):
                            self._refuse(event)
                        else:
                            self._cancel(event)
                log.info("attach stream ended; reconnecting", extra={"worker": self.worker_id})
            except grpc.RpcError as err:
                error = error_from_rpc(err)
                if (not attached and _refused_for_good(err, error)) or isinstance(
                    error, Unauthenticated | PermissionDenied
                ):
                    raise error from None
                log.info("attach failed; reconnecting: %s", error, extra={"worker": self.worker_id})
            except InvalidArgument as exc:  # a malformed event: the server is not one we know
                log.warning("bad worker event; reconnecting: %s", exc)
            except asyncio.CancelledError:
                if not closed_under_call():
                    raise
                # A heartbeat's or report's reconnect retired this stream's channel: attach
                # again on the new one (the attempts running keep their slots).
                log.info("attach stream closed by a reconnect", extra={"worker": self.worker_id})
            finally:
                call.cancel()  # no new attempt on this stream, whatever ended it
            self._attached.clear()
            await asyncio.sleep(_BACKOFF.delay(failures))
            failures += 1
            self._reconnect(connection)

    # --- attempts ---------------------------------------------------------------------------

    def _start(self, leased: LeasedAttempt) -> None:
        if leased.token in self._attempts:
            return  # sent again after a reconnect: it runs already
        loop = asyncio.get_running_loop()
        lease_s = self._leases.get(leased.pool)
        if lease_s is None:
            lease_s = max((leased.lease_expires_at - datetime.now(UTC)).total_seconds(), 0.03)
        ctx = TaskContext(
            leased.token.task_id,
            leased.token.attempt,
            leased.pool,
            leased.kind,
            leased.key,
            leased.tags,
            leased.name,
            leased.deadline,
        )
        attempt = _Attempt(leased, ctx, lease_s, loop.time() + lease_s)
        self._attempts[leased.token] = attempt
        attempt.task = loop.create_task(self._run(attempt), name=f"cronoq-attempt-{ctx.task_id}")
        self._heartbeats.add(leased.token, leased.lease_id, lease_s)

    def _refuse(self, event: UnreadableAttempt) -> None:
        """Report an attempt this worker cannot read as failed (for good: any worker of this
        release reads the same bytes alike), in the background, as a report of a run."""
        log.error(
            "attempt could not be read; reporting it failed: %s",
            event.reason,
            extra={"task_id": event.token.task_id},
        )
        message = f"worker {self.worker_id} could not read the attempt: {event.reason}"
        failure = ReportFailure(_truncate(message), retryable=False)
        request = report_request(event.token, event.lease_id, failure)
        lease_s = self._leases.get(event.pool, 0.0)
        deadline = asyncio.get_running_loop().time() + lease_s
        task = asyncio.get_running_loop().create_task(self._send_refusal(request, deadline))
        self._refusals.add(task)
        task.add_done_callback(self._refusals.discard)

    async def _send_refusal(self, request: pb.ReportRequest, deadline: float) -> None:
        # Sent once: if it is lost, the attempt's lease runs out and the next try of it is
        # refused again (and the task fails after its attempts).
        await self._reports.send(request, deadline)

    def _cancel(self, event: CancelRequested) -> None:
        attempt = self._attempts.get(event.token)
        if attempt is not None:
            self._interrupt(attempt, event.reason)

    def _interrupt(self, attempt: _Attempt, reason: str) -> None:
        if attempt.ctx.cancel_reason is not None:
            return
        attempt.ctx.cancel_reason = reason
        if attempt.executing and self._async[attempt.leased.pool] and attempt.task is not None:
            attempt.task.cancel(reason)

    async def _run(self, attempt: _Attempt) -> None:
        if self._tracing is None:
            await self._run_attempt(attempt)
            return
        leased = attempt.leased
        with self._tracing.attempt(
            leased.trace_context, leased.pool, leased.token.task_id, leased.token.attempt
        ):
            await self._run_attempt(attempt)

    async def _run_attempt(self, attempt: _Attempt) -> None:
        token = attempt.leased.token
        try:
            try:
                result = await self._execute(attempt)
            except asyncio.CancelledError:
                if attempt.stale:
                    raise  # abandoned: nobody waits for this attempt any more
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                result = ReportFailure(attempt.ctx.cancel_reason or "cancelled")
            attempt.executing = False
            if attempt.stale:
                log.info("attempt abandoned", extra={"task_id": token.task_id})
                return
            if attempt.ctx.cancel_reason is not None and isinstance(result, ReportSuccess):
                # It returned after being asked to stop: as a local Pool's attempt does, it
                # ends cancelled (a thread cannot be interrupted).
                result = ReportFailure(attempt.ctx.cancel_reason)
            await self._settle(attempt, result)
        finally:
            self._heartbeats.remove(token)
            self._attempts.pop(token, None)

    async def _execute(self, attempt: _Attempt) -> ReportSuccess | ReportFailure:
        leased = attempt.leased
        payload_context = output_context = None
        try:
            if self._binds:
                # As the submitter encoded the payload (it knew no task id), and as get() and
                # wait() decode the output (for this task). InvalidArgument: a kind or pool
                # no context can have (the server is not trusted with them).
                kind, pool, key = leased.kind, leased.pool, leased.key
                payload_context = CodecContext("payload", kind, pool, key)
                output_context = CodecContext("output", kind, pool, key, leased.token.task_id)
            value = (
                None
                if leased.payload == b""
                else decode_with(self._codec, leased.payload, "payload", payload_context)
            )
        except InvalidArgument as exc:  # PayloadError is one
            return ReportFailure(f"payload could not be decoded: {exc}", retryable=False)
        if isinstance(leased, RemoteAttempt) and leased.parent_outputs:
            refused = self._decode_parents(attempt.ctx, leased)
            if refused is not None:
                return refused
        fn = self._pools.get(leased.pool)
        if fn is None:  # the server sent a pool this worker did not attach to: a server bug
            return ReportFailure(f"worker {self.worker_id} has no function for {leased.pool!r}")
        try:
            if self._async[leased.pool]:
                result = await fn(attempt.ctx, value)
            else:
                loop = asyncio.get_running_loop()
                call: Callable[..., Any] = call_catching
                # A thread does not inherit the attempt's span; the span's wrapper goes
                # outside the catch, so no traceback shows its frame.
                if self._tracing is not None:
                    call = self._tracing.in_context(call_catching)
                result = await loop.run_in_executor(self._threads, call, fn, attempt.ctx, value)
                if isinstance(result, Raised):
                    return _failure(result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _failure(Raised.of(exc))
        if result is None:
            return ReportSuccess(None)
        try:
            return ReportSuccess(encode_with(self._codec, result, "output", output_context))
        except PayloadError as exc:
            return ReportFailure(_truncate(str(exc)), retryable=False)

    def _decode_parents(self, ctx: TaskContext, leased: RemoteAttempt) -> ReportFailure | None:
        """Fill ``ctx.parent_outputs`` as a local pool's attempt gets them: decoded here, by
        the codec that runs the task, each bound to its parent. An output the codec refuses
        fails the attempt for good (every attempt would read the same bytes); the error names
        the parent."""
        try:
            ctx.parent_outputs = decode_parent_outputs(self._codec, leased.parent_outputs)
        except InvalidArgument as exc:
            return ReportFailure(_truncate(str(exc)), retryable=False)
        return None

    # --- heartbeats and reports -------------------------------------------------------------

    def _renewed(self, token: AttemptToken, sent: float, renewed: LeaseRenewed) -> None:
        attempt = self._attempts.get(token)
        if attempt is None:
            return
        attempt.lease_end = sent + attempt.lease_s
        if renewed.cancel_reason is not None:
            # A stopped attempt goes on heartbeating: the server holds its slot and its
            # task (no retry starts) until the function returns and it is reported.
            self._interrupt(attempt, renewed.cancel_reason)

    def _stale(self, token: AttemptToken, error: StaleAttempt) -> None:
        """The server no longer holds the attempt: stop its function. It is still reported
        once the function returns (answered stale), which frees its slot on the server: until
        then the server gives this worker no attempt in its place."""
        attempt = self._attempts.get(token)
        if attempt is None or not attempt.executing:
            return
        log.info(
            "attempt is stale (%s): stopping it",
            error.reason,
            extra={"task_id": attempt.ctx.task_id},
        )
        self._interrupt(attempt, f"the attempt is no longer current: {error}")

    async def _settle(self, attempt: _Attempt, result: ReportSuccess | ReportFailure) -> None:
        """Report the outcome, recorded on the attempt's span and in a span of the report's
        own when tracing."""
        if self._tracing is None:
            await self._report(attempt, result)
            return
        if isinstance(result, ReportFailure):
            self._tracing.outcome(result.message, result.retryable)
        else:
            self._tracing.outcome(None)
        token = attempt.leased.token
        with self._tracing.settle(attempt.leased.pool, token.task_id, token.attempt, _REPORT_MANY):
            await self._report(attempt, result)

    async def _report(self, attempt: _Attempt, result: ReportSuccess | ReportFailure) -> None:
        """Report until a server answers it, until the worker stops (a report is idempotent:
        a repeat of an applied one is answered stale and changes nothing). Not only while the
        lease lasts as this worker last heard it: a new leader holds the attempt for a whole
        lease from its takeover, and a finished attempt whose report waits for it must not
        run again."""
        token = attempt.leased.token
        lease_id = attempt.leased.lease_id
        request = report_request(token, lease_id, result)
        failures = 0
        while not attempt.stale:
            connection, answer = await self._reports.send(request, attempt.lease_end)
            if answer is None:
                return
            if isinstance(answer, grpc.RpcError):
                error = error_from_rpc(answer)
                definite = judge(answer, idempotent=True) is Verdict.RAISE
            else:  # this report alone: refused, unless nothing is known (see Answer)
                error, definite = answer, not isinstance(answer, SchedulerError)
            if isinstance(error, StaleAttempt):
                log.info(
                    "report answered stale (%s): the attempt's outcome is not this one",
                    error.reason,
                    extra={"task_id": token.task_id},
                )
                return
            if definite:
                if isinstance(result, ReportSuccess) and isinstance(error, InvalidArgument):
                    # An output the server refuses (too large): the attempt fails instead.
                    result = ReportFailure(_truncate(f"output refused: {error}"), False)
                    request = report_request(token, lease_id, result)
                    continue
                log.error("report refused: %s", error, extra={"task_id": token.task_id})
                return
            log.info("report failed; retrying: %s", error, extra={"task_id": token.task_id})
            self._reconnect(connection)
            await asyncio.sleep(_BACKOFF.delay(failures))
            failures += 1


def _refused_for_good(err: grpc.RpcError, error: Exception) -> bool:
    """The server itself refused the attachment as bad input (an unknown pool, too many slots),
    which every retry would meet again; a message too large for the stream or any other
    failure of the transport is not the worker's to give up on."""
    return (
        judge(err, idempotent=True) is Verdict.RAISE
        and isinstance(error, InvalidArgument)
        and error_info(err) is not None
    )
