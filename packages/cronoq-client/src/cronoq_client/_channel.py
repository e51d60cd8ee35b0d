"""The client's connection: one gRPC channel at a time, replaced by a new one to the next target
when a call must be retried, so that a balancer (or the list of replicas) picks again."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from grpc import aio

from cronoq.errors import InvalidArgument
from cronoq_client._credentials import Credentials
from cronoq_client._proto import cronoq_pb2_grpc as pb_grpc

__all__ = ["Channels", "Connection", "closed_under_call", "message_limit"]

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


@dataclass(frozen=True, slots=True)
class Connection:
    channel: aio.Channel
    stub: pb_grpc.SchedulerServiceAsyncStub
    generation: int


def targets_of(target: str | Sequence[str]) -> tuple[str, ...]:
    targets = (target,) if isinstance(target, str) else tuple(target)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise InvalidArgument(
            f"target must be 'host:port' or a non-empty list of them, got {target!r}"
        )
    return targets


KEEPALIVE_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000


class Channels:
    """The current channel, opened on first use; ``replace`` opens the next one."""

    def __init__(
        self,
        targets: tuple[str, ...],
        credentials: Credentials,
        max_message_bytes: int,
        retire_grace: float,
    ) -> None:
        self._targets = targets
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
        return self._current

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
