"""Helpers for tests of several ``cronoq-server`` processes on one store.

A TCP balancer that sends each new connection to the next replica (as a balancer that routes
to every replica does); a keyed submitter (on ``AsyncClient``) and an echo function for a
``Worker``, both of which reach the leader through it on their own; probes of the HA serving rules
(``/readyz``, gRPC health, how long a replica keeps a connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc
from grpc_health.v1 import health_pb2
from server_pg import PG_DSN
from server_process import ServerProcess

from cronoq import RetryPolicy, TaskContext
from cronoq_client import AsyncClient

CALL_TIMEOUT_S = 2.0
QUICK_RETRY = RetryPolicy(max_attempts=5, initial_ns=50_000_000, jitter=0.0)
"""An attempt lost with its leader is retried at once, not after the default second."""


def new_channel(target: str) -> grpc.aio.Channel:
    """A channel with a connection of its own: grpcio shares connections between channels to
    one target by default, and a client that retries "on a new connection" must get one so
    that the balancer picks a replica again."""
    return grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def log_time(line: dict[str, str]) -> float:
    """The Unix time of a server log line (its ``ts``, to the millisecond)."""
    return datetime.fromisoformat(line["ts"]).replace(tzinfo=UTC).timestamp()


# --- stores -------------------------------------------------------------------------------


def sqlite_store(path: str, *, lease_ttl: float) -> str:
    return (
        f'[store]\nkind = "sqlite"\npath = "{path}"\nlock_poll_s = 0.05\n'
        f"lease_renew_s = {lease_ttl / 6}\nlease_ttl_s = {lease_ttl}\nbusy_timeout_s = 1.0\n"
    )


def pg_store(schema: str) -> str:
    # A killed leader's session ends with its process, and PostgreSQL frees its lock at once:
    # what the standby waits for is lock_poll, not session_timeout.
    return (
        f'[store]\nkind = "postgres"\ndsn = "{PG_DSN}"\nschema = "{schema}"\n'
        "lock_poll_s = 0.05\nkeepalive_s = 0.2\nsession_timeout_s = 2.0\n"
        "lock_timeout_s = 0.5\ncommand_timeout_s = 5.0\npool_size = 2\n"
    )


# --- the balancer -------------------------------------------------------------------------


class Balancer:
    """A TCP balancer: each new connection goes to the next replica, round robin, whether it
    lives or not; bytes are copied both ways; when either side closes, both are closed (a
    replica that refuses the connection gets the client's closed at once)."""

    def __init__(self, ports: Sequence[int]) -> None:
        self._ports = tuple(ports)
        self._next = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.routed: list[int] = []
        """The replica port of each connection, in the order they came."""

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> Balancer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self._ports[self._next % len(self._ports)]
        self._next += 1
        self.routed.append(port)
        self._writers.add(writer)
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                return
            self._writers.add(up_writer)
            try:
                copies = (
                    asyncio.ensure_future(_copy(reader, up_writer)),
                    asyncio.ensure_future(_copy(up_reader, writer)),
                )
                _, pending = await asyncio.wait(copies, return_when=asyncio.FIRST_COMPLETED)
                for copy in pending:
                    copy.cancel()
                await asyncio.gather(*copies, return_exceptions=True)
            finally:
                self._writers.discard(up_writer)
                up_writer.transport.abort()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()


# --- probes -------------------------------------------------------------------------------


async def http_get(url: str) -> tuple[int, dict[str, Any]]:
    """Status and JSON body of ``GET url`` (on a connection the request asks to close)."""
    host, _, rest = url.removeprefix("http://").partition("/")
    name, _, port = host.partition(":")
    reader, writer = await asyncio.open_connection(name, int(port))
    try:
        writer.write(f"GET /{rest} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        async with asyncio.timeout(5):
            response = await reader.read(-1)
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def _health_check(
    channel: grpc.aio.Channel,
) -> grpc.aio.UnaryUnaryMultiCallable[
    health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
]:
    # The typing stubs of grpcio-health-checking give HealthStub no methods.
    return channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )


async def health(target: str) -> int:
    """The gRPC health status of the whole server ("")."""
    async with grpc.aio.insecure_channel(target) as channel:
        reply = await _health_check(channel)(
            health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT_S
        )
    return reply.status


_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_GOAWAY = 7


@dataclass(frozen=True, slots=True)
class Held:
    """How long a server kept a raw HTTP/2 connection, from connect, in seconds."""

    goaway: float | None
    """When its GOAWAY arrived (None: none did)."""
    closed: float | None
    """When it closed the connection (None: still open at the probe's end)."""


async def hold_http2(port: int, limit: float) -> Held:
    """Open a TCP connection, send the HTTP/2 preface and SETTINGS (a client that then does
    nothing), and time the server's GOAWAY and close, up to ``limit`` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    goaway: float | None = None
    buffer = b""
    try:
        writer.write(_PREFACE + _EMPTY_SETTINGS)
        await writer.drain()
        async with asyncio.timeout(limit):
            while data := await reader.read(65536):
                buffer += data
                while len(buffer) >= 9:
                    length = int.from_bytes(buffer[:3], "big")
                    if len(buffer) < 9 + length:
                        break
                    if buffer[3] == _GOAWAY and goaway is None:
                        goaway = time.monotonic() - started
                    buffer = buffer[9 + length :]
        return Held(goaway, time.monotonic() - started)
    except TimeoutError:
        return Held(goaway, None)
    except ConnectionResetError:
        return Held(goaway, time.monotonic() - started)
    finally:
        writer.transport.abort()


async def channel_lifetime(target: str, limit: float) -> float | None:
    """Seconds from opening a channel until its connection ends (the channel leaves READY),
    with a health check every 50 ms on it; None if it was still connected after ``limit``."""
    async with new_channel(target) as channel:
        check = _health_check(channel)
        started = time.monotonic()
        await check(health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT_S)
        assert channel.get_state() is grpc.ChannelConnectivity.READY
        while (elapsed := time.monotonic() - started) < limit:
            if channel.get_state() is not grpc.ChannelConnectivity.READY:
                return elapsed
            with contextlib.suppress(grpc.aio.AioRpcError):
                await check(health_pb2.HealthCheckRequest(service=""), timeout=0.2)
            await asyncio.sleep(0.05)
        return None


async def first_of(
    servers: Sequence[ServerProcess], event: Callable[[ServerProcess], Awaitable[object]]
) -> ServerProcess:
    """The first of ``servers`` whose ``event`` (say ``lambda s: s.leading()``) comes."""
    waits = {asyncio.ensure_future(event(s)): s for s in servers}
    try:
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        first = done.pop()
        first.result()
        return waits[first]
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


# --- load: a client and a worker ------------------------------------------------------------------


@dataclass
class Progress:
    """Counters that tests await, in place of sleeping."""

    acked: dict[str, int] = field(default_factory=dict)
    """Acknowledged submissions: key -> task id."""
    runs: list[float] = field(default_factory=list)
    """Monotonic times at which the worker ran an attempt."""
    marks: dict[str, float] = field(default_factory=dict)
    """Monotonic times of named moments (see :meth:`mark`)."""
    first_ack_after: dict[str, float] = field(default_factory=dict)
    """Monotonic time of the first acknowledgement of a submission begun after each mark."""
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic()

    async def changed(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def until(self, condition: Callable[[Progress], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: condition(self))

    async def ran(self) -> None:
        self.runs.append(time.monotonic())
        await self.changed()

    async def ack(self, key: str, task_id: int, begun: float) -> None:
        self.acked[key] = task_id
        for name, at in self.marks.items():
            if begun >= at:
                self.first_ack_after.setdefault(name, time.monotonic())
        await self.changed()


async def submit_keyed(
    client: AsyncClient, prefix: str, progress: Progress, pause: float, stop: asyncio.Event
) -> None:
    """Submit tasks with the keys ``prefix-0``, ``prefix-1`` ... one after another until
    ``stop`` is set. The client retries each on its own (with its key a submit is idempotent),
    so every key tried is acknowledged when this returns."""
    for n in itertools.count():
        if stop.is_set():
            return
        key = f"{prefix}-{n}"
        begun = time.monotonic()
        task_id = await client.submit("ha", key.encode(), key=key, retry=QUICK_RETRY)
        await progress.ack(key, task_id, begun)
        await asyncio.sleep(pause)


def echo(progress: Progress) -> Callable[[TaskContext, bytes], Awaitable[bytes]]:
    """A pool function for ``Worker``: the attempt succeeds at once, its payload the output."""

    async def run(ctx: TaskContext, payload: bytes) -> bytes:
        await progress.ran()
        return payload

    return run
