"""The server's span of each gRPC call (``[tracing] enabled``): a child of the caller's
``traceparent``, with the RPC conventions' attributes and status. A real grpc.aio server in
this process, so that its spans reach the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from cronoq.tracing import Tracing
from cronoq_server import load_config, render_config
from cronoq_server._grpc_tracing import TracingInterceptor

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
SERVICE = "cronoq.v1.SchedulerService"


async def _echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    if request == b"bad":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad input")
    if request == b"down":
        await context.abort(grpc.StatusCode.UNAVAILABLE, "standby")
    return request


async def _stream(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.write(request)


@pytest.fixture
async def served() -> AsyncIterator[tuple[grpc.aio.Channel, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = grpc.aio.server(interceptors=[TracingInterceptor(Tracing(provider))])
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        "Submit": grpc.unary_unary_rpc_method_handler(_echo),
        "Watch": grpc.unary_stream_rpc_method_handler(_stream),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel, exporter
    finally:
        await server.stop(0)
        provider.shutdown()


async def test_each_call_is_a_server_span_in_the_callers_trace(
    served: tuple[grpc.aio.Channel, InMemorySpanExporter],
) -> None:
    channel, exporter = served
    submit: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
        f"/{SERVICE}/Submit"
    )
    assert await submit(b"ok", metadata=(("traceparent", PARENT),)) == b"ok"
    refusals = ((b"bad", grpc.StatusCode.INVALID_ARGUMENT), (b"down", grpc.StatusCode.UNAVAILABLE))
    for request, code in refusals:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await submit(request)
        assert raised.value.code() is code
    watch: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
        f"/{SERVICE}/Watch"
    )
    assert [reply async for reply in watch(b"w")] == [b"w"]
    ok, bad, down, stream = exporter.get_finished_spans()
    assert ok.name == f"{SERVICE}/Submit" and ok.kind is SpanKind.SERVER
    assert ok.context.trace_id == int(PARENT.split("-")[1], 16)
    assert ok.parent is not None and ok.parent.span_id == int(PARENT.split("-")[2], 16)
    assert dict(ok.attributes or {}) == {
        "rpc.system": "grpc",
        "rpc.service": SERVICE,
        "rpc.method": "Submit",
        "rpc.grpc.status_code": 0,
    }
    assert ok.status.status_code is StatusCode.UNSET
    # A client's mistake is not the server's error; a server that cannot serve is.
    assert (bad.attributes or {})["rpc.grpc.status_code"] == 3
    assert bad.status.status_code is StatusCode.UNSET and bad.parent is None
    assert (down.attributes or {})["rpc.grpc.status_code"] == 14
    assert down.status.status_code is StatusCode.ERROR
    assert stream.name == f"{SERVICE}/Watch"
    assert (stream.attributes or {})["rpc.grpc.status_code"] == 0


def test_tracing_is_off_unless_configured_and_rendered() -> None:
    assert not load_config(None, {}).tracing.enabled
    config = load_config(None, {"CRONOQ_TRACING__ENABLED": "true"})
    assert config.tracing.enabled
    assert "[tracing]\nenabled = true  # env CRONOQ_TRACING__ENABLED" in render_config(config)
