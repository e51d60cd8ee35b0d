"""The HTTP server over real sockets: each endpoint, errors, and clients that misbehave."""

from __future__ import annotations

import asyncio
import json
import logging
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

IDLE = 0.3


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
        Address("127.0.0.1", 0), readiness=state.ready, registry=registry, idle_timeout=IDLE
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
    assert version in ("HTTP/1.0", "HTTP/1.1")  # 1.0: a request whose version is unknown
    headers = {}
    for line in lines:
        name, _, value = line.partition(": ")
        headers[name.lower()] = value
    assert int(headers["content-length"]) == len(body) or not body
    return Response(int(status), headers, body)


async def get(port: int, path: str, *headers: str, method: str = "GET") -> Response:
    request = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
    request += "".join(f"{header}\r\n" for header in headers) + "\r\n"
    return parse(await exchange(port, request.encode()))


async def test_healthz(server: HttpServer) -> None:
    response = await get(server.port, "/healthz")
    assert response.status == 200
    assert json.loads(response.body) == {"status": "alive"}
    assert response.headers["content-type"] == "application/json"
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


async def test_readyz_names_the_cause(server: HttpServer, state: State) -> None:
    state.readiness = Readiness(False, "store_failed", "the file is damaged")
    response = await get(server.port, "/readyz")
    assert response.status == 503
    assert json.loads(response.body) == {
        "ready": False,
        "reason": "store_failed",
        "cause": "the file is damaged",
    }


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
        assert set(response.headers["allow"].split(",")) == {"GET", "HEAD"}
        assert json.loads(response.body) == {"error": "method not allowed"}


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n",  # a TLS hello, by mistake
    ],
)
async def test_malformed_requests_are_400_and_no_error(
    server: HttpServer, request_bytes: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    assert parse(await exchange(server.port, request_bytes)).status == 400
    # The client's fault: no ERROR (nor traceback) that a client could fill the log with.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_oversized_headers_are_400_and_no_error(
    server: HttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 16384 + b"\r\n\r\n"
    assert parse(await exchange(server.port, request)).status == 400
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_keep_alive_serves_several_requests_on_one_connection(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        for _ in range(3):
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200 OK\r\n")
                length = int(parse(head).headers["content-length"])
                assert json.loads(await reader.readexactly(length)) == {"status": "alive"}
    finally:
        writer.close()


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n"])
async def test_an_idle_or_slow_client_is_disconnected(server: HttpServer, sent: bytes) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    started = time.monotonic()
    writer.write(sent)  # nothing, or headers that never end
    async with asyncio.timeout(5):
        assert await reader.read(-1) == b""  # returns once the server closed the connection
    writer.close()
    assert IDLE * 0.9 <= time.monotonic() - started < IDLE + 1.0


async def test_many_idle_connections_do_not_starve_probes(state: State) -> None:
    """Regression (issue 24, item 3): 64 idle connections made every /healthz fail."""
    async with HttpServer(
        Address("127.0.0.1", 0), readiness=state.ready, registry=CollectorRegistry()
    ) as http:
        idle = [await asyncio.open_connection("127.0.0.1", http.port) for _ in range(200)]
        try:
            for _ in range(5):
                assert (await get(http.port, "/healthz")).status == 200
        finally:
            for _, writer in idle:
                writer.close()


async def test_close_ends_open_connections(state: State) -> None:
    http = HttpServer(
        Address("127.0.0.1", 0),
        readiness=state.ready,
        registry=CollectorRegistry(),
        idle_timeout=60.0,
    )
    await http.start()
    port = http.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # then kept alive
    async with asyncio.timeout(5):
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 OK")
        await http.close()
        await reader.read(-1)
        assert reader.at_eof()
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)


async def test_a_busy_port_is_an_oserror(state: State) -> None:
    async with HttpServer(
        Address("127.0.0.1", 0), readiness=state.ready, registry=CollectorRegistry()
    ) as first:
        second = HttpServer(
            Address("127.0.0.1", first.port), readiness=state.ready, registry=CollectorRegistry()
        )
        with pytest.raises(OSError, match="address already in use"):
            await second.start()
        await second.close()  # nothing to close: start() cleaned up


async def test_many_concurrent_requests(state: State) -> None:
    async with HttpServer(
        Address("127.0.0.1", 0), readiness=state.ready, registry=CollectorRegistry()
    ) as http:
        responses = await asyncio.gather(*(get(http.port, "/healthz") for _ in range(50)))
    assert {r.status for r in responses} == {200}
