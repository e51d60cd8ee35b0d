"""A remote worker's heartbeats, sent in batches by one loop.

Each attempt keeps its own due time, a third of its lease after the send that last renewed it.
When the earliest falls due, every attempt due within a quarter of its own interval after now
goes with it in one HeartbeatMany call (renewing a little early is harmless), so a worker makes
a few calls per interval whatever its slot count, and a lone attempt's heartbeat still leaves at
its due time. Calls run side by side: one that hangs delays only its own attempts.

Per attempt, as a loop per attempt had it: after a failure, again soon (jittered backoff, at
most the interval: after a failover the new leader holds the attempt for one lease from its
takeover, and the worker must find it within that lease), each try bounded to half the
interval so that a frozen replica costs little; a stale answer stops heartbeating it; a
retryable failure replaces the connection; a call cut by a closed channel (a reconnect) is
tried again on the new one. A server that does
not know HeartbeatMany (UNIMPLEMENTED: an older release) gets one Heartbeat call per attempt,
for as long as that connection lasts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from cronoq import AttemptToken, LeaseRenewed
from cronoq.errors import CronoqError, InvalidArgument, SchedulerError, StaleAttempt
from cronoq_client._channel import CLOSED_UNDER_CALL, Connection, closed_under_call
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._proto import cronoq_pb2_grpc as pb_grpc
from cronoq_client._retry import Backoff, Verdict, judge
from cronoq_client._status import error_from_rpc, too_large
from cronoq_client._wire import (
    MAX_HEARTBEATS_PER_CALL,
    heartbeat_request,
    heartbeat_result_from_pb,
    lease_renewed_from_pb,
)

__all__ = ["Heartbeats"]

log = logging.getLogger("cronoq_client.worker")

_BACKOFF = Backoff()
EARLY = 0.25
"""An attempt joins a call up to this fraction of its interval before it is due."""
_FRAMING_BYTES = 8
"""Beyond a heartbeat's own size: its tag and length in the request."""

Answer = LeaseRenewed | CronoqError
"""Renewed, or why not: StaleAttempt stops the heartbeats of the attempt, anything else is a
failure, tried again soon."""


@dataclass(slots=True)
class _Beat:
    """One attempt's heartbeat schedule (mutable: it moves at each answer)."""

    token: AttemptToken
    request: pb.HeartbeatRequest
    interval: float
    due: float
    """Loop time of the next try."""
    timeout: float
    failures: int = 0
    sending: bool = False

    def renewed(self, sent: float) -> None:
        self.due, self.timeout, self.failures = sent + self.interval, self.interval, 0

    def failed(self, now: float, wait: float, *, closed: bool) -> None:
        # Until one succeeds: soon again, each try bounded to half the usual time, except
        # after a reconnect cut the call short.
        self.due = now + min(self.interval, wait)
        self.failures += 1
        if not closed:
            self.timeout = self.interval / 2


class Heartbeats:
    """Renews the leases of a worker's attempts on its current connection."""

    def __init__(
        self,
        current: Callable[[], tuple[Connection, pb_grpc.WorkerServiceAsyncStub]],
        reconnect: Callable[[Connection], None],
        renewed: Callable[[AttemptToken, float, LeaseRenewed], None],
        stale: Callable[[AttemptToken, StaleAttempt], None],
        max_message_bytes: int,
    ) -> None:
        """``renewed(token, sent, renewal)``: the lease was renewed by a call sent at loop time
        ``sent``. ``stale(token, error)``: the server no longer holds the attempt (its
        heartbeats stop)."""
        self._current = current
        self._reconnect = reconnect
        self._renewed = renewed
        self._stale = stale
        self._max_bytes = max_message_bytes
        self._beats: dict[AttemptToken, _Beat] = {}
        self._changed = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._unary_on: int | None = None
        """The generation of a connection whose server answered HeartbeatMany UNIMPLEMENTED."""

    def add(self, token: AttemptToken, lease_id: bytes, lease_s: float) -> None:
        """Heartbeat this attempt every third of ``lease_s`` from now on."""
        interval = lease_s / 3
        due = asyncio.get_running_loop().time() + interval
        request = heartbeat_request(token, lease_id)
        self._beats[token] = _Beat(token, request, interval, due, interval)
        self._wake()

    def remove(self, token: AttemptToken) -> None:
        """Stop heartbeating this attempt (an answer still in flight is ignored)."""
        self._beats.pop(token, None)

    async def close(self) -> None:
        tasks = [*self._calls, *([self._loop] if self._loop is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._beats.clear()

    def _wake(self) -> None:
        self._changed.set()
        if self._loop is None or self._loop.done():
            self._loop = asyncio.get_running_loop().create_task(
                self._run(), name="cronoq-worker-heartbeats"
            )

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._beats:
            self._changed.clear()
            waiting = [beat for beat in self._beats.values() if not beat.sending]
            now = loop.time()
            if waiting and min(beat.due for beat in waiting) <= now:
                due = [beat for beat in waiting if beat.due - EARLY * beat.interval <= now]
                for batch in self._batches(due):
                    for beat in batch:
                        beat.sending = True
                    call = loop.create_task(self._call(batch), name="cronoq-worker-heartbeat")
                    self._calls.add(call)
                    call.add_done_callback(self._calls.discard)
                continue
            # Until the earliest is due, or an attempt comes or an answer moves a due time.
            first = min((beat.due for beat in waiting), default=None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if first is None else first - now):
                    await self._changed.wait()

    def _batches(self, due: list[_Beat]) -> list[list[_Beat]]:
        """``due`` in calls of at most the server's count and this worker's message size."""
        batches: list[list[_Beat]] = [[]]
        size = 0
        for beat in due:
            each = beat.request.ByteSize() + _FRAMING_BYTES
            full = len(batches[-1]) >= MAX_HEARTBEATS_PER_CALL or size + each > self._max_bytes
            if batches[-1] and full:
                batches.append([])
                size = 0
            batches[-1].append(beat)
            size += each
        return batches

    async def _call(self, batch: list[_Beat]) -> None:
        loop = asyncio.get_running_loop()
        connection, stub = self._current()
        sent = loop.time()
        timeout = min(beat.timeout for beat in batch)
        closed = False
        try:
            answers = await self._send(connection, stub, batch, timeout)
        except asyncio.CancelledError:
            if not closed_under_call():
                raise
            closed = True
            answers = [SchedulerError(CLOSED_UNDER_CALL, applied=None)] * len(batch)
        except Exception as exc:  # a bug below us: still an answer, never a beat left sending
            log.exception("HeartbeatMany failed")
            failure = SchedulerError(f"the heartbeat call failed: {exc!r}", applied=None)
            answers = [failure] * len(batch)
        now = loop.time()
        # A few tenths of a second, jittered against other workers, one draw for the call: the
        # attempts that failed together are tried again together.
        wait = _BACKOFF.delay(min(max(beat.failures for beat in batch), 3))
        failed: CronoqError | None = None
        for beat, answer in zip(batch, answers, strict=True):
            if self._beats.get(beat.token) is not beat:
                continue  # the attempt ended meanwhile
            beat.sending = False
            if isinstance(answer, LeaseRenewed):
                beat.renewed(sent)
                self._renewed(beat.token, sent, answer)
            elif isinstance(answer, StaleAttempt):
                del self._beats[beat.token]
                self._stale(beat.token, answer)
            else:
                beat.failed(now, wait, closed=closed)
                failed = answer
        if failed is not None:
            log.info("heartbeat failed (%d attempts in the call): %s", len(batch), failed)
        self._wake()

    async def _send(
        self,
        connection: Connection,
        stub: pb_grpc.WorkerServiceAsyncStub,
        batch: list[_Beat],
        timeout: float,
    ) -> list[Answer]:
        """An answer for each heartbeat of ``batch``."""
        if self._unary_on == connection.generation:
            return await self._send_each(connection, stub, batch, timeout)
        request = pb.HeartbeatManyRequest(heartbeats=[beat.request for beat in batch])
        try:
            reply = await stub.HeartbeatMany(request, timeout=timeout)
        except grpc.RpcError as err:
            if (
                isinstance(err, grpc.aio.AioRpcError)
                and err.code() is grpc.StatusCode.UNIMPLEMENTED
            ):
                # An older server: one Heartbeat per attempt while this connection lasts (the
                # next one may reach another replica, of another release).
                self._unary_on = connection.generation
                return await self._send_each(connection, stub, batch, timeout)
            if too_large(err) and len(batch) > 1:
                # The server's limit is below this worker's: in halves, now and from now on.
                self._max_bytes = max(request.ByteSize() // 2, 1)
                half = len(batch) // 2
                first, second = await asyncio.gather(
                    self._send(connection, stub, batch[:half], timeout),
                    self._send(connection, stub, batch[half:], timeout),
                )
                return first + second
            return [self._failed(connection, err)] * len(batch)
        if len(reply.results) != len(batch):
            # A server that does not keep the protocol: nothing is known of these heartbeats.
            error = SchedulerError(
                f"the server answered {len(reply.results)} results for {len(batch)} heartbeats",
                applied=None,
            )
            return [error] * len(batch)
        return [heartbeat_result_from_pb(result) for result in reply.results]

    async def _send_each(
        self,
        connection: Connection,
        stub: pb_grpc.WorkerServiceAsyncStub,
        batch: list[_Beat],
        timeout: float,
    ) -> list[Answer]:
        async def one(beat: _Beat) -> Answer:
            try:
                reply = await stub.Heartbeat(beat.request, timeout=timeout)
                return lease_renewed_from_pb(reply)
            except grpc.RpcError as err:
                return self._failed(connection, err)
            except InvalidArgument as exc:  # an unreadable renewal: as a failed call
                return SchedulerError(f"the server answered an unreadable renewal: {exc}")
            except asyncio.CancelledError:
                if not closed_under_call():
                    raise
                return SchedulerError(CLOSED_UNDER_CALL, applied=None)

        return list(await asyncio.gather(*(one(beat) for beat in batch)))

    def _failed(self, connection: Connection, err: grpc.RpcError) -> CronoqError:
        if judge(err, idempotent=True) is Verdict.RETRY:
            self._reconnect(connection)
        return error_from_rpc(err)
