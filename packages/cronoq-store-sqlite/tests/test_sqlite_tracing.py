"""The trace context a task stores survives a restart of its scheduler on a SQLite file: the
attempt that the next scheduler runs is a child of the first one's submission span."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cronoq import Pool, Scheduler, TaskContext
from cronoq_store_sqlite import SqliteStore


async def test_the_stored_context_survives_a_restart(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    path = tmp_path / "cronoq.db"
    ran: list[int] = []

    async def fn(ctx: TaskContext, payload: bytes | None) -> None:
        ran.append(ctx.task_id)

    # The first scheduler's pool is paused: it commits the task and never starts it.
    first = Scheduler([Pool("default", fn)], store=await SqliteStore.open(path), tracing=provider)
    async with first:
        await first.pause_pool("default")
        task_id = await first.submit("x")
    second = Scheduler([Pool("default", fn)], store=await SqliteStore.open(path), tracing=provider)
    async with second:
        await second.resume_pool("default")
        await second.wait(task_id, timeout=10)
    provider.shutdown()
    assert ran == [task_id]
    [submit] = [s for s in exporter.get_finished_spans() if s.name == "submit default"]
    [run] = [s for s in exporter.get_finished_spans() if s.name == "run default"]
    assert run.parent is not None and run.parent.span_id == submit.context.span_id
    assert run.context.trace_id == submit.context.trace_id
