"""The client's connection: one gRPC channel at a time, replaced by a new one to the next target
when a call must be retried, so that a balancer (or the list of replicas) picks again.

A connection can also stall: its replica frozen (SIGSTOP, a paused VM) or cut off by a partition
that sends no reset. TCP then stays open, the kernel of a frozen host even accepts new
connections, and a call waits for its whole deadline, the calls queued behind it with it.
Keepalive notices too late (a server permits a ping every few seconds at best). So each
connection that carries calls is watched (``Channels.watched``): when none of its calls got an
answer for half the stall timeout, a health check goes on it, and if that is not answered
within the other half, the connection is abandoned: closed at once, so that its calls end
(``closed_under_call``) and are judged as cut mid-call, and replaced, so that the next call and
every call that never left go to a new connection. A connection that never answered anything
and whose channel never went past its first CONNECTING (no transport was ever up: a frozen
process's kernel took the TCP connection and nothing answered the handshake) carried nothing:
its calls end as never sent (``Connection.carried_nothing``), so that a retry is safe even
without a key.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc import aio

from cronoq.errors import InvalidArgument
from cronoq_client._credentials import Credentials
from cronoq_client._proto import cronoq_pb2_grpc as pb_grpc

__all__ = ["Channels", "Connection", "closed_under_call", "message_limit", "stall_timeout_of"]

_R = TypeVar("_R")

MAX_GRPC_MESSAGE_BYTES = 2**31 - 1
"""gRPC's limit: message lengths are signed 32-bit."""


def message_limit(value: object) -> int:
    """``max_message_bytes`` of a client or worker, checked."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"max_message_bytes must be an int, got {type(value).__name__}")
    if not 1 <= value <= MAX_GRPC_MESSAGE_BYTES:
        raise InvalidArgument(
            f"max_message_bytes must be from 1 to {MAX_GRPC_MESSAGE_BYTES}, got {value}"
        )
    return value


CLOSED_UNDER_CALL = "the connection was closed while the call was in flight (a reconnect)"


def closed_under_call() -> bool:
    """For an ``asyncio.CancelledError`` out of a gRPC call: True if nobody cancelled this
    task, so its channel was closed under the call. grpc.aio ends the calls of a channel that
    closes so, and ``Channels.replace`` closes a retired channel after its grace: for the
    caller this is a connection broken mid-call, to be judged as one, not a cancellation."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def stall_timeout_of(value: object) -> float | None:
    """``stall_timeout`` of a client, checked: positive seconds, or None (never abandon)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise InvalidArgument(
            f"stall_timeout must be a positive number of seconds or None, got {value!r}"
        )
    return float(value)


@dataclass(slots=True)
class _Liveness:
    """What a connection's watchdog knows of it (mutable, unlike the connection)."""

    began: dict[int, float] = field(default_factory=dict)
    """Loop time at which each watched call in flight began, by a serial number."""
    answered_at: float | None = None
    """Loop time of the last answer the server sent on it (None: never)."""
    past_connecting: bool = False
    """The channel's state went past its first CONNECTING (to READY, or anything else that a
    transport may have been up for): a call may have been sent on it."""
    abandoned: bool = False
    carried_nothing: bool = False
    watchdog: asyncio.Task[None] | None = None


@dataclass(frozen=True, slots=True)
class Connection:
    channel: aio.Channel
    stub: pb_grpc.SchedulerServiceAsyncStub
    generation: int
    liveness: _Liveness = field(default_factory=_Liveness)

    @property
    def abandoned(self) -> bool:
        """The watchdog closed it: its replica answered nothing, not even a health check."""
        return self.liveness.abandoned

    @property
    def carried_nothing(self) -> bool:
        """Abandoned before it ever reached a server: no call on it was sent."""
        return self.liveness.carried_nothing


def targets_of(target: str | Sequence[str]) -> tuple[str, ...]:
    targets = (target,) if isinstance(target, str) else tuple(target)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise InvalidArgument(
            f"target must be 'host:port' or a non-empty list of them, got {target!r}"
        )
    return targets


KEEPALIVE_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_HEALTH_ANY_SERVICE = b""
"""An empty HealthCheckRequest: the server as a whole (any answer, even NOT_SERVING, will do)."""
_NO_ANSWER = (
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
)
"""A probe's failures that are not an answer of a server."""


def _identity(data: bytes) -> bytes:
    return data


class Channels:
    """The current channel, opened on first use; ``replace`` opens the next one."""

    def __init__(
        self,
        targets: tuple[str, ...],
        credentials: Credentials,
        max_message_bytes: int,
        retire_grace: float,
        stall_timeout: float | None = None,
    ) -> None:
        self._targets = targets
        self._stall_timeout = stall_timeout
        self._serial = 0
        self._tasks: set[asyncio.Task[None]] = set()
        """Watchdogs and state observers, cancelled by ``close``."""
        self._credentials = credentials
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            # grpcio shares connections between channels to one target through a global
            # subchannel pool: a "new" channel would reuse the connection to the replica that
            # just refused the call. A channel of its own makes a new TCP connection.
            ("grpc.use_local_subchannel_pool", 1),
            # A server that vanished without a FIN (a dead host, a partition) is noticed in
            # seconds, not at the next call or never (a worker's idle Attach stream).
            ("grpc.keepalive_time_ms", KEEPALIVE_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        self._retire_grace = retire_grace
        self._next = 0
        self._generation = 0
        self._current: Connection | None = None
        self._retired: dict[asyncio.Task[None], aio.Channel] = {}
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def current(self) -> Connection:
        if self._current is None:
            target = self._targets[self._next % len(self._targets)]
            self._next += 1
            self._generation += 1
            secure, interceptors = self._credentials.channel, self._credentials.interceptors
            if secure is None:
                channel = aio.insecure_channel(
                    target, options=self._options, interceptors=interceptors
                )
            else:
                channel = aio.secure_channel(
                    target, secure, options=self._options, interceptors=interceptors
                )
            stub = pb_grpc.SchedulerServiceStub(channel)
            self._current = Connection(channel, stub, self._generation)
            if self._stall_timeout is not None:
                self._spawn(self._observe(self._current), "cronoq-client-connection-state")
        return self._current

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    async def _observe(connection: Connection) -> None:
        """Note when the channel's state goes past its first CONNECTING. Any change counts,
        not only to READY: a transport that came up and went at once (a GOAWAY) may have
        carried a call, and a change seen late may already have passed through READY."""
        channel, live = connection.channel, connection.liveness
        state = channel.get_state()
        if state is grpc.ChannelConnectivity.IDLE:
            await channel.wait_for_state_change(state)
            state = channel.get_state()
        if state is grpc.ChannelConnectivity.CONNECTING:
            await channel.wait_for_state_change(state)
        live.past_connecting = True

    async def watched(self, connection: Connection, call: Awaitable[_R]) -> _R:
        """Await ``call``, one made on ``connection``, under its watchdog (see the module's
        text). An answer of the server (a result, or an error it sent) proves it alive."""
        if self._stall_timeout is None:
            return await call
        live = connection.liveness
        loop = asyncio.get_running_loop()
        self._serial += 1
        serial = self._serial
        live.began[serial] = loop.time()
        if live.watchdog is None and not live.abandoned:
            live.watchdog = self._spawn(
                self._watch(connection, self._stall_timeout), "cronoq-client-watchdog"
            )
        try:
            result = await call
        except aio.AioRpcError as err:
            if err.code() not in _NO_ANSWER or err.trailing_metadata():
                live.answered_at = loop.time()
            raise
        else:
            live.answered_at = loop.time()
            return result
        finally:
            del live.began[serial]

    async def _watch(self, connection: Connection, stall_timeout: float) -> None:
        """Abandon ``connection`` if it answers nothing for ``stall_timeout`` while it carries
        watched calls; ends when it carries none."""
        live = connection.liveness
        loop = asyncio.get_running_loop()
        half = stall_timeout / 2
        try:
            while live.began and not self._closed:
                quiet_since = min(live.began.values())
                if live.answered_at is not None:
                    quiet_since = max(quiet_since, live.answered_at)
                wait = quiet_since + half - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                probed = loop.time()
                answered = await self._answers(connection.channel, half)
                if answered or (live.answered_at is not None and live.answered_at >= probed):
                    # The server answered the probe, or a call while the probe waited: alive.
                    live.answered_at = max(probed, live.answered_at or probed)
                    continue
                if answered is None and loop.time() < quiet_since + stall_timeout:
                    # A retired channel, closing in its grace, takes no probe: its calls get
                    # the whole stall timeout to be answered.
                    await asyncio.sleep(quiet_since + stall_timeout - loop.time())
                    continue
                await self._abandon(connection)
                return
        finally:
            live.watchdog = None

    @staticmethod
    async def _answers(channel: aio.Channel, seconds: float) -> bool | None:
        """Whether the server at the other end of ``channel`` answers a health check; None if
        none can be sent (the channel is closing)."""
        check = channel.unary_unary(
            _HEALTH_CHECK, request_serializer=_identity, response_deserializer=_identity
        )
        try:
            await check(_HEALTH_ANY_SERVICE, timeout=seconds)
        except aio.AioRpcError as err:
            return err.code() not in _NO_ANSWER
        except aio.UsageError:
            return None
        return True

    async def _abandon(self, connection: Connection) -> None:
        """Close a stalled connection now (its calls end), and open a new one for what
        comes next, unless another call did already."""
        live = connection.liveness
        live.abandoned = True
        if self._current is not None and self._current.generation == connection.generation:
            self._current = None
        for task, channel in list(self._retired.items()):
            if channel is connection.channel:
                task.cancel()  # its grace would keep the calls waiting
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # Judged just before the close, with no await between: a handshake that completes in
        # between (the replica resuming in that instant) is the one case this cannot rule out.
        live.carried_nothing = (
            live.answered_at is None
            and not live.past_connecting
            and connection.channel.get_state() is grpc.ChannelConnectivity.CONNECTING
        )
        await connection.channel.close()

    def replace(self, failed: Connection) -> None:
        """Drop the channel a failed call used, unless another call already did.

        The old channel is closed with a grace period, not at once: other calls in flight on it
        may be fine (a leader that answered one call NOT_APPLIED still answers the others), and
        closing would cancel them, which for a submit without a key is an unknown outcome.
        """
        if self._current is None or self._current.generation != failed.generation:
            return
        self._current = None
        task = asyncio.get_running_loop().create_task(failed.channel.close(self._retire_grace))
        self._retired[task] = failed.channel
        task.add_done_callback(lambda done: self._retired.pop(done, None))

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        current, self._current = self._current, None
        if current is not None:
            await current.channel.close()
        retired = list(self._retired.items())
        for task, _ in retired:
            task.cancel()
        # A close cancelled in its grace period leaves the channel closing: closing it again
        # without grace cancels its calls and frees it.
        await asyncio.gather(*(task for task, _ in retired), return_exceptions=True)
        for _, channel in retired:
            await channel.close()
