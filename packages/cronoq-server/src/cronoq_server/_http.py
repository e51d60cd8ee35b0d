"""The HTTP side of the server: ``GET /healthz``, ``GET /readyz`` and ``GET /metrics``.

A minimal HTTP/1.1 server on asyncio streams, one request per connection (every response says
``Connection: close``): probes and Prometheus scrapes need no more, and a connection that never
outlives its request cannot be held open by a client. A client gets ``request_timeout`` seconds
from accepting to the end of its headers (a slow or silent client gets 408), the headers may
take ``max_header_bytes`` (431 beyond), and at most ``max_connections`` are served at once
(further ones are closed unanswered) so that slow clients cannot exhaust file descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cronoq_server._config import Address

__all__ = ["HttpServer", "Readiness"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Readiness:
    """What ``/readyz`` answers: 200 when ``ready``, else 503; ``reason`` says why, in a word
    (``leading``, ``standby``, ``draining``, ``stepped_down``, ``starting``)."""

    ready: bool
    reason: str


_REQUEST_LINE = re.compile(rb"(?P<method>[A-Z]{1,16}) (?P<target>/\S{0,2048}) HTTP/1\.[01]")
_REASONS = {
    200: "OK",
    401: "Unauthorized",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_JSON = "application/json"


class HttpServer:
    """``async with HttpServer(address, readiness=..., registry=...) as http:`` serves until
    the block ends; :attr:`port` is the bound port (useful with port 0)."""

    def __init__(
        self,
        address: Address,
        *,
        readiness: Callable[[], Readiness],
        registry: CollectorRegistry,
        request_timeout: float = 5.0,
        max_header_bytes: int = 8192,
        max_connections: int = 64,
        metrics_auth: Callable[[str], bool] | None = None,
    ) -> None:
        self._address = address
        self._readiness = readiness
        self._registry = registry
        self._request_timeout = request_timeout
        self._max_header_bytes = max_header_bytes
        self._max_connections = max_connections
        self._metrics_auth = metrics_auth
        """None: /metrics is open; else it takes the Authorization header's value."""
        self._connections: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self._address.host, self._address.port, limit=self._max_header_bytes
        )

    @property
    def port(self) -> int:
        """The port of the first listening socket (``localhost`` may bind two, IPv4 and 6)."""
        assert self._server is not None, "start() first"
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def close(self) -> None:
        """Stop listening and end the connections still open."""
        if self._server is None:
            return
        self._server.close()
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self._max_connections:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(reader, writer)
            await self._linger(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nobody to answer
        finally:
            self._connections.discard(task)
            writer.transport.abort()

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Send the response's last bytes, then end the connection cleanly.

        Closing a socket with unread input makes the kernel reset the connection, and a reset
        can destroy the response before the client read it (a 431 answers a request that is
        still arriving): so shut down our side, and read what the client still sends until it
        closes too, within the request timeout.
        """
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._request_timeout):
                await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()
                while await reader.read(65536):
                    pass
                writer.close()
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self._request_timeout):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            _respond(writer, _error(408, "request timeout"))
        except asyncio.LimitOverrunError:
            _respond(writer, _error(431, "headers too large"))
        else:
            _respond(writer, *self._handle(head[:-4].split(b"\r\n")))

    def _handle(self, lines: list[bytes]) -> tuple[_Response, bool]:
        """The response to a request's head, and whether it is for HEAD (no body)."""
        request = _REQUEST_LINE.fullmatch(lines[0])
        if request is None or not all(_HEADER.fullmatch(line) for line in lines[1:]):
            return _error(400, "malformed request"), False
        method = request["method"].decode()
        path = request["target"].split(b"?", 1)[0].decode("latin-1")
        if path not in ("/healthz", "/readyz", "/metrics"):
            return _error(404, "not found"), False
        if method not in ("GET", "HEAD"):
            return _error(405, "method not allowed", ("Allow", "GET, HEAD")), False
        if path == "/metrics" and not self._metrics_allowed(lines[1:]):
            challenge = ("WWW-Authenticate", 'Bearer realm="cronoq"')
            return _error(401, "a bearer token of the metrics permission is required", challenge), (
                method == "HEAD"
            )
        return self._route(path, _header(lines[1:], b"accept")), method == "HEAD"

    def _metrics_allowed(self, headers: list[bytes]) -> bool:
        return self._metrics_auth is None or self._metrics_auth(_header(headers, b"authorization"))

    def _route(self, path: str, accept: str) -> _Response:
        if path == "/healthz":
            return _Response(200, _JSON, b'{"status":"alive"}')
        if path == "/readyz":
            try:
                readiness = self._readiness()
            except Exception:
                log.exception("the readiness callback failed")
                readiness = Readiness(False, "error")
            body = json.dumps({"ready": readiness.ready, "reason": readiness.reason})
            return _Response(200 if readiness.ready else 503, _JSON, body.encode())
        encoder, content_type = choose_encoder(accept)
        try:
            return _Response(200, content_type, encoder(self._registry))
        except Exception:
            log.exception("collecting the metrics failed")
            return _error(500, "collecting the metrics failed")


@dataclass(frozen=True, slots=True)
class _Response:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _error(status: int, error: str, *headers: tuple[str, str]) -> _Response:
    return _Response(status, _JSON, json.dumps({"error": error}).encode(), headers)


def _respond(writer: asyncio.StreamWriter, response: _Response, head_only: bool = False) -> None:
    lines = [
        f"HTTP/1.1 {response.status} {_REASONS[response.status]}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Cache-Control: no-store",
        "Connection: close",
        *(f"{name}: {value}" for name, value in response.headers),
    ]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    if not head_only:
        writer.write(response.body)


_HEADER = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[ \t]*[^\r\n]*")


def _header(lines: list[bytes], name: bytes) -> str:
    for line in lines:
        key, _, value = line.partition(b":")
        if key.lower() == name:
            return value.strip().decode("latin-1")
    return ""
