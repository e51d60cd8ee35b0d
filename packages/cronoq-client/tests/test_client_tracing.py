"""One trace from ``AsyncClient.submit`` to the attempt a remote ``Worker`` ran, across a
failover: the client's submission span is in this process, the servers are real processes
(whose own spans cannot reach this process's in-memory exporter), and the worker's spans are
here again; the worker's span of the attempt is a child of the client's span only if its
context went through the server's metadata, its store and the Attempt message."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from server_process import config_toml, running_server
from server_thread import threaded_server

from cronoq import Status, TaskContext, TaskError
from cronoq_client import AsyncClient, Client, Worker

WAIT_S = 30.0


@pytest.fixture
def spans() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def _run_one(target: str, provider: TracerProvider, fn: object) -> None:
    worker = Worker(target, {"default": fn}, tracing=provider)  # type: ignore[dict-item]
    running = asyncio.create_task(worker.run())
    try:
        async with AsyncClient(target, timeout=WAIT_S) as client:
            info = await client.wait(await _only_task(client), timeout=WAIT_S)
            assert info.status in (Status.SUCCEEDED, Status.FAILED)
    finally:
        worker.stop()
        await asyncio.wait_for(running, WAIT_S)


async def _only_task(client: AsyncClient) -> int:
    [summary] = await client.list()
    return summary.task_id


async def test_one_trace_from_submit_through_a_failover_to_the_remote_attempt(
    tmp_path: Path, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    # Both servers trace too (into their own no-op provider): the interceptor and the traced
    # scheduler are on the path, and the context still reaches the worker.
    config = config_toml(
        f'[store]\nkind = "sqlite"\npath = "{tmp_path / "cronoq.db"}"\n',
        tables="[tracing]\nenabled = true\n",
    )
    async with running_server(tmp_path, config) as first:
        await first.wait_for("leading")
        async with AsyncClient(first.target, timeout=WAIT_S, tracing=provider) as client:
            task_id = await client.submit("greet", b"hi")
    # No worker ever saw the task on the first server: the second one, a new leader on the
    # same file, dispatches it from what the store kept.
    seen: list[str] = []

    async def greet(ctx: TaskContext, payload: bytes | None) -> None:
        seen.append(format(trace_id_now(), "032x"))

    async with running_server(tmp_path, config) as second:
        await second.wait_for("leading")
        await _run_one(second.target, provider, greet)

    [submit] = _named(exporter, "submit default")
    [run] = _named(exporter, "run default")
    [report] = _named(exporter, "report default")
    assert submit.kind is SpanKind.PRODUCER and run.kind is SpanKind.CONSUMER
    assert submit.attributes is not None and run.attributes is not None
    assert submit.attributes["messaging.message.id"] == str(task_id)
    assert submit.attributes["rpc.method"] == "Submit"
    assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert run.context.trace_id == submit.context.trace_id
    assert [link.context.span_id for link in run.links] == [submit.context.span_id]
    assert run.attributes["messaging.message.id"] == str(task_id)
    assert run.attributes["cronoq.attempt.number"] == 1
    assert run.attributes["cronoq.attempt.outcome"] == "succeeded"
    assert report.parent is not None and report.parent.span_id == run.context.span_id
    # The function ran inside the attempt's span: its own spans join the same trace.
    assert seen == [format(submit.context.trace_id, "032x")]


def trace_id_now() -> int:
    from opentelemetry import trace

    return trace.get_current_span().get_span_context().trace_id


async def test_a_failed_remote_attempt_is_an_error_span_and_untraced_clients_send_nothing(
    tmp_path: Path, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    config = config_toml('[store]\nkind = "memory"\n')

    def doomed(ctx: TaskContext, payload: bytes | None) -> None:  # a thread function
        raise TaskError("no such greeting", retryable=False)

    async with running_server(tmp_path, config) as server:
        await server.wait_for("leading")
        async with AsyncClient(server.target, timeout=WAIT_S) as client:  # not tracing
            await client.submit_many([])
            await client.submit("greet")
        await _run_one(server.target, provider, doomed)
    assert not _named(exporter, "submit default")
    [run] = _named(exporter, "run default")
    # Without a stored context the attempt starts a trace of its own.
    assert run.parent is None and not run.links
    assert run.status.status_code is StatusCode.ERROR
    assert run.status.description == "no such greeting"
    assert run.attributes is not None
    assert run.attributes["cronoq.attempt.outcome"] == "failed"
    assert run.attributes["cronoq.attempt.retryable"] is False


def test_the_sync_client_submits_in_its_callers_span(
    tmp_path: Path, spans: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    with (
        threaded_server(tmp_path) as server,
        Client(server.target, tracing=provider) as client,
        tracer.start_as_current_span("request") as request,
    ):
        client.submit("greet")
    [submit] = _named(exporter, "submit default")
    assert submit.parent is not None
    assert submit.parent.span_id == request.get_span_context().span_id
