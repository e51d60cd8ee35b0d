"""Tracing (cronoq[otel]) of an embedded Scheduler, with the SDK's in-memory exporter: one
trace from ``submit()`` to the attempt, the spans' attributes, and the trace context a task
stores (and only when tracing is on)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from cronoq import (
    InvalidArgument,
    MemoryStore,
    Pool,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskError,
    TaskRequest,
    TraceContext,
)
from cronoq.store import decode_task_spec, encode_task_options
from cronoq.tracing import Tracing

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def test_one_trace_from_submit_to_the_attempt(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    inside: list[int] = []

    async def greet(ctx: TaskContext, payload: bytes | None) -> None:
        inside.append(trace.get_current_span().get_span_context().trace_id)

    def blocking(ctx: TaskContext, payload: bytes | None) -> None:  # runs on a thread
        inside.append(trace.get_current_span().get_span_context().trace_id)

    store = MemoryStore()
    pools = [Pool("default", greet), Pool("threads", blocking)]
    async with Scheduler(pools, store=store, tracing=provider) as sched:
        task_id = await sched.submit("greet")
        await sched.wait(task_id, timeout=10)
        [other, third] = await sched.submit_many(
            [TaskRequest("greet", pool="threads"), TaskRequest("greet", pool="threads")]
        )
        await sched.wait(other, timeout=10)
        await sched.wait(third, timeout=10)
        stored = await store.get_task(task_id)

    [submit] = named(exporter, "submit default")
    [run] = named(exporter, "run default")
    [dispatch] = named(exporter, "dispatch default")
    assert submit.kind is SpanKind.PRODUCER and run.kind is SpanKind.CONSUMER
    assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert dispatch.parent is not None and dispatch.parent.span_id == submit.context.span_id
    assert [link.context.span_id for link in run.links] == [submit.context.span_id]
    assert dict(submit.attributes or {}) == {
        "messaging.system": "cronoq",
        "messaging.operation.type": "create",
        "messaging.operation.name": "submit",
        "messaging.destination.name": "default",
        "messaging.message.id": str(task_id),
    }
    assert dict(run.attributes or {}) == {
        "messaging.system": "cronoq",
        "messaging.destination.name": "default",
        "messaging.message.id": str(task_id),
        "messaging.operation.type": "process",
        "messaging.operation.name": "run",
        "cronoq.attempt.number": 1,
        "cronoq.attempt.outcome": "succeeded",
    }
    # The task stored the submission's context; the function ran inside the attempt's span,
    # on the loop and on a thread alike.
    assert stored is not None and stored.spec.trace_context is not None
    assert stored.spec.trace_context.traceparent.split("-")[2] == format(
        submit.context.span_id, "016x"
    )
    [batch] = named(exporter, "submit threads")
    assert batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 2
    assert "messaging.message.id" not in batch.attributes
    runs = named(exporter, "run threads")
    assert {r.parent.span_id for r in runs if r.parent} == {batch.context.span_id}
    assert inside == [submit.context.trace_id, batch.context.trace_id, batch.context.trace_id]
    commits = named(exporter, "commit")
    assert commits and all(c.parent is None for c in commits)
    sizes = [(c.attributes or {})["cronoq.commit.mutations"] for c in commits]
    assert all(isinstance(size, int) and size >= 1 for size in sizes), sizes


async def test_attempt_outcomes_and_a_submitters_context(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def flaky(ctx: TaskContext, payload: bytes | None) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("not yet")
        raise TaskError("gave up", retryable=False)

    store = MemoryStore()
    retry = RetryPolicy(max_attempts=3, initial_ns=0, max_ns=0)
    async with Scheduler([Pool("default", flaky)], store=store, tracing=provider) as sched:
        given = TraceContext(PARENT, "vendor=opaque")
        # A context the caller brings (cronoq-server brings its client's) is kept as it is,
        # and needs no span of the scheduler's own.
        task_id = await sched.submit("x", retry=retry, trace_context=given)
        with pytest.raises(InvalidArgument, match="trace_context must be a TraceContext"):
            await sched.submit("x", trace_context=PARENT)
        await sched.wait(task_id, timeout=10)
        stored = await store.get_task(task_id)
    assert stored is not None and stored.spec.trace_context == given
    assert not named(exporter, "submit default")
    first, second = sorted(named(exporter, "run default"), key=lambda s: s.start_time or 0)
    for span in (first, second):
        assert span.context.trace_id == int(PARENT.split("-")[1], 16)
        assert span.parent is not None and span.parent.span_id == int(PARENT.split("-")[2], 16)
        assert span.status.status_code is StatusCode.ERROR
    assert (first.attributes or {})["cronoq.attempt.retryable"] is True
    assert (first.attributes or {})["error.type"] == "retryable"
    assert first.status.description == "RuntimeError: not yet"
    assert (second.attributes or {})["cronoq.attempt.number"] == 2
    assert (second.attributes or {})["cronoq.attempt.retryable"] is False


async def test_off_by_default_no_context_is_stored_and_no_span_is_made(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def fn(ctx: TaskContext, payload: bytes | None) -> None:
        return None

    store = MemoryStore()
    # Even with a global SDK provider in place and a span current, nothing is traced.
    tracer = provider.get_tracer("test")
    async with Scheduler([Pool("default", fn)], store=store) as sched:
        with tracer.start_as_current_span("caller"):
            task_id = await sched.submit("x")
        await sched.wait(task_id, timeout=10)
        stored = await store.get_task(task_id)
    assert stored is not None and stored.spec.trace_context is None
    assert encode_task_options(stored.spec) == "{}"
    assert [s.name for s in exporter.get_finished_spans()] == ["caller"]


async def test_a_submission_inside_a_span_is_its_child(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async def fn(ctx: TaskContext, payload: bytes | None) -> None:
        await asyncio.sleep(0)

    tracer = provider.get_tracer("test")
    async with Scheduler([Pool("default", fn)], tracing=provider) as sched:
        with tracer.start_as_current_span("request") as request:
            task_id = await sched.submit("x")
        await sched.wait(task_id, timeout=10)
    [submit] = named(exporter, "submit default")
    assert submit.parent is not None and submit.parent.span_id == request.get_span_context().span_id


def test_trace_contexts_are_checked_and_round_trip_through_the_options() -> None:
    options = json.dumps({"traceparent": PARENT, "tracestate": "a=1"})
    spec = decode_task_spec("p", "k", None, b"", options)
    assert spec.trace_context == TraceContext(PARENT, "a=1")
    assert decode_task_spec("p", "k", None, b"", encode_task_options(spec)) == spec
    for bad in ("", PARENT.upper(), PARENT[:-1], "01" + PARENT[2:], PARENT.replace("4bf9", "0000")
                .replace("2f3577b34da6a3ce929d0e0e4736", "0" * 28)):  # fmt: skip
        with pytest.raises(InvalidArgument, match="traceparent"):
            TraceContext(bad)
        assert TraceContext.from_headers(bad, "a=1") is None
    with pytest.raises(InvalidArgument, match="tracestate"):
        TraceContext(PARENT, "x" * 513)
    with pytest.raises(InvalidArgument, match="tracestate"):
        TraceContext(PARENT, "a=\x00")
    # A bad tracestate is dropped, the parent kept (W3C Trace Context).
    assert TraceContext.from_headers(PARENT, "é") == TraceContext(PARENT)
    assert TraceContext.from_metadata([("traceparent", PARENT), ("other", "x")]) == TraceContext(
        PARENT
    )
    with pytest.raises(ValueError, match="traceparent"):
        decode_task_spec("p", "k", None, b"", '{"traceparent":"nope"}')
    with pytest.raises(InvalidArgument, match="tracing must be a bool or"):
        Tracing.of("yes")


async def test_a_traced_thread_functions_traceback_starts_at_the_function(
    provider: TracerProvider,
) -> None:
    """The span's context wrapper runs outside the catch: no frame of cronoq's in it."""

    def crash(ctx: TaskContext, payload: bytes | None) -> None:
        raise RuntimeError("in a thread")

    once = RetryPolicy(max_attempts=1)
    async with Scheduler([Pool("default", crash)], tracing=provider) as sched:
        info = await sched.wait(await sched.submit("x", retry=once), timeout=10)
    assert info.traceback is not None
    first_frame = info.traceback.splitlines()[1]
    assert first_frame.startswith(f'  File "{__file__}"') and first_frame.endswith("in crash")
