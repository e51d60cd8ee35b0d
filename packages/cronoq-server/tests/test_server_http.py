"""The HTTP server over real sockets: each endpoint, errors, and clients that misbehave."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from cronoq_server import Address
from cronoq_server._http import HttpServer, Readiness

TIMEOUT = 0.3


class State:
    def __init__(self) -> None:
        self.readiness = Readiness(False, "standby")
        self.broken = False
        self.scrapes = 0

    def ready(self) -> Readiness:
        if self.broken:
            raise RuntimeError("the readiness callback is broken")
        return self.readiness


class Sample(Collector):
    def __init__(self, state: State) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        self.state.scrapes += 1
        yield GaugeMetricFamily("test_scrapes", "Scrapes so far.", value=self.state.scrapes)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


@pytest.fixture
def state() -> State:
    return State()


@pytest_asyncio.fixture
async def server(state: State) -> AsyncIterator[HttpServer]:
    registry = CollectorRegistry()
    registry.register(Sample(state))
    async with HttpServer(
        Address("127.0.0.1", 0),
        readiness=state.ready,
        registry=registry,
        request_timeout=TIMEOUT,
        max_header_bytes=1024,
        max_connections=4,
    ) as http:
        yield http


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request``, return everything until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        async with asyncio.timeout(5):
            return await reader.read(-1)
    finally:
        writer.close()


def parse(raw: bytes) -> Response:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers = {}
    for line in lines:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    assert int(headers["content-length"]) == len(body) or not body
    return Response(int(status), headers, body)


async def get(port: int, path: str, *headers: str, method: str = "GET") -> Response:
    request = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n"
    request += "".join(f"{header}\r\n" for header in headers) + "\r\n"
    return parse(await exchange(port, request.encode()))


async def test_healthz(server: HttpServer) -> None:
    response = await get(server.port, "/healthz")
    assert response.status == 200
    assert json.loads(response.body) == {"status": "alive"}
    assert response.headers["content-type"] == "application/json"
    assert response.headers["connection"] == "close"
    assert response.headers["cache-control"] == "no-store"


async def test_readyz_follows_the_callback(server: HttpServer, state: State) -> None:
    response = await get(server.port, "/readyz")
    assert response.status == 503
    assert json.loads(response.body) == {"ready": False, "reason": "standby"}
    state.readiness = Readiness(True, "leading")
    response = await get(server.port, "/readyz?verbose=1")
    assert response.status == 200
    assert json.loads(response.body) == {"ready": True, "reason": "leading"}
    state.readiness = Readiness(False, "draining")
    assert json.loads((await get(server.port, "/readyz")).body)["reason"] == "draining"


async def test_readyz_when_the_callback_fails(server: HttpServer, state: State) -> None:
    state.readiness = Readiness(True, "leading")
    state.broken = True
    response = await get(server.port, "/readyz")
    assert response.status == 503
    assert json.loads(response.body) == {"ready": False, "reason": "error"}


async def test_metrics_in_prometheus_text_format(server: HttpServer, state: State) -> None:
    for expected in (1, 2):
        response = await get(server.port, "/metrics")
        assert response.status == 200
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        (family,) = text_string_to_metric_families(response.body.decode())
        assert family.name == "test_scrapes"
        assert family.samples[0].value == expected
    assert state.scrapes == 2


async def test_metrics_in_openmetrics_when_asked(server: HttpServer) -> None:
    response = await get(server.port, "/metrics", "Accept: application/openmetrics-text")
    assert response.status == 200
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.body.endswith(b"# EOF\n")


async def test_head_has_headers_and_no_body(server: HttpServer) -> None:
    response = await get(server.port, "/healthz", method="HEAD")
    assert response.status == 200
    assert response.headers["content-length"] == str(len(b'{"status":"alive"}'))
    assert response.body == b""


async def test_unknown_path_is_404(server: HttpServer) -> None:
    for path in ("/", "/health", "/metrics/x", "/readyz/"):
        response = await get(server.port, path)
        assert response.status == 404, path
        assert json.loads(response.body) == {"error": "not found"}


async def test_other_methods_are_405(server: HttpServer) -> None:
    for method in ("POST", "PUT", "DELETE", "OPTIONS"):
        response = await get(server.port, "/metrics", "Content-Length: 0", method=method)
        assert response.status == 405, method
        assert response.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz\r\n\r\n",  # no version
        b"GET /healthz HTTP/2.0\r\n\r\n",
        b"get /healthz HTTP/1.1\r\n\r\n",
        b"GET healthz HTTP/1.1\r\n\r\n",
        b"GET  /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n folded: header\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello, by mistake
        b"\r\n\r\n",
    ],
)
async def test_malformed_requests_are_400(server: HttpServer, request_bytes: bytes) -> None:
    response = parse(await exchange(server.port, request_bytes))
    assert response.status == 400
    assert json.loads(response.body) == {"error": "malformed request"}


async def test_oversized_headers_are_431(server: HttpServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
    response = parse(await exchange(server.port, request))
    assert response.status == 431


async def test_a_slow_client_gets_408_and_is_disconnected(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    started = time.monotonic()
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
    await writer.drain()
    async with asyncio.timeout(5):
        raw = await reader.read(-1)  # returns once the server closed the connection
    elapsed = time.monotonic() - started
    writer.close()
    assert parse(raw).status == 408
    # Lingering for the client's own close lasts at most one more request timeout.
    assert TIMEOUT * 0.9 <= elapsed < 2 * TIMEOUT + 1.0


async def test_a_silent_client_is_disconnected(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    async with asyncio.timeout(5):
        raw = await reader.read(-1)
    writer.close()
    assert parse(raw).status == 408


async def test_connections_beyond_the_limit_are_closed_at_once(server: HttpServer) -> None:
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(4)]
    try:
        # Let the server accept the four, so the next one is the fifth. The server offers no
        # event for it (nothing but this test needs one): its loop runs while this one yields.
        async with asyncio.timeout(5):
            while len(server._connections) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        started = time.monotonic()
        async with asyncio.timeout(5):
            with contextlib.suppress(ConnectionResetError):  # abort() resets: just as closed
                assert await reader.read(-1) == b""
        assert time.monotonic() - started < TIMEOUT
        writer.close()
    finally:
        for _, idle_writer in idle:
            idle_writer.close()
    # The slots free once the idle ones are gone: a request succeeds again.
    async with asyncio.timeout(5):
        while server._connections:  # noqa: ASYNC110 (as above)
            await asyncio.sleep(0)
    assert (await get(server.port, "/healthz")).status == 200


async def test_close_ends_open_connections(state: State) -> None:
    http = HttpServer(
        Address("127.0.0.1", 0),
        readiness=state.ready,
        registry=CollectorRegistry(),
        request_timeout=60.0,
    )
    await http.start()
    port = http.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    async with asyncio.timeout(5):
        while not http._connections:  # noqa: ASYNC110 (no event to await: see above)
            await asyncio.sleep(0)
    async with asyncio.timeout(5):
        await http.close()
        assert await reader.read(-1) == b""
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_many_concurrent_requests(state: State) -> None:
    async with HttpServer(
        Address("127.0.0.1", 0), readiness=state.ready, registry=CollectorRegistry()
    ) as http:
        responses = await asyncio.gather(*(get(http.port, "/healthz") for _ in range(50)))
    assert {r.status for r in responses} == {200}
