"""The Prometheus collector against real schedulers on a MemoryStore, running real tasks: the
values are what happened, and counters stay monotonic when the scheduler is replaced. (The
outbox's series against a real server on PostgreSQL: test_server_outbox.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from outbox_rows import QuarantineLog, wait_until
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from server_process import config_toml, running_server

from cronoq import MemoryStore, Pool, RetryPolicy, Scheduler, TaskContext, TaskError
from cronoq.errors import TaskNotFound
from cronoq_client import AsyncClient, Worker
from cronoq_server import Address
from cronoq_server._http import HttpServer, Readiness
from cronoq_server._metrics import SchedulerCollector, metrics_registry

Labels = frozenset[tuple[str, str]]
FAST_RETRY = RetryPolicy(max_attempts=3, initial_ns=1_000_000, jitter=0.0)


def scrape(registry: CollectorRegistry) -> dict[str, dict[Labels, float]]:
    """Sample name -> {labels: value}, from the text exposition as Prometheus reads it."""
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = frozenset(sample.labels.items())
            samples.setdefault(sample.name, {})[labels] = sample.value
    return samples


def by(samples: Mapping[Labels, float], *names: str) -> dict[tuple[str, ...], float]:
    """The samples keyed by the values of the labels ``names`` (and no others)."""
    keyed = {}
    for labels, value in samples.items():
        as_dict = dict(labels)
        assert as_dict.keys() == set(names)
        keyed[tuple(as_dict[name] for name in names)] = value
    return keyed


def pools() -> list[Pool]:
    async def ok(ctx: TaskContext, payload: bytes | None) -> bytes:
        return b"done"

    async def flaky(ctx: TaskContext, payload: bytes | None) -> bytes:
        if ctx.attempt == 1:
            raise TaskError("first attempt fails")
        return b"done"

    async def doomed(ctx: TaskContext, payload: bytes | None) -> None:
        raise TaskError("never works", retryable=False)

    return [Pool("fast", ok), Pool("flaky", flaky), Pool("doomed", doomed)]


def new_collector(
    workers: list[int], pools: tuple[str, ...] = ()
) -> tuple[SchedulerCollector, CollectorRegistry]:
    """A collector; with no ``pools`` configured only the series the schedulers made show."""
    collector = SchedulerCollector(lambda: workers[0], pools)
    registry = CollectorRegistry()
    registry.register(collector)
    return collector, registry


async def run_tasks(scheduler: Scheduler, fast: int, flaky: int, doomed: int) -> None:
    ids = [await scheduler.submit("k", pool="fast") for _ in range(fast)]
    ids += [await scheduler.submit("k", pool="flaky", retry=FAST_RETRY) for _ in range(flaky)]
    ids += [await scheduler.submit("k", pool="doomed", retry=FAST_RETRY) for _ in range(doomed)]
    async with asyncio.timeout(10):
        for task_id in ids:
            await scheduler.wait(task_id)


async def test_values_match_what_the_scheduler_did() -> None:
    workers = [0]
    collector, registry = new_collector(workers)
    async with Scheduler(pools(), store=MemoryStore()) as scheduler:
        collector.watch(scheduler)
        await run_tasks(scheduler, fast=3, flaky=2, doomed=1)
        workers[0] = 4
        samples = scrape(registry)
        assert by(samples["cronoq_tasks_submitted_total"], "pool") == {
            ("fast",): 3,
            ("flaky",): 2,
            ("doomed",): 1,
        }
        assert by(samples["cronoq_tasks_finished_total"], "pool", "status") == {
            ("fast", "succeeded"): 3,
            ("flaky", "succeeded"): 2,
            ("doomed", "failed"): 1,
        }
        assert by(samples["cronoq_task_retries_total"], "pool") == {("flaky",): 2}
        assert by(samples["cronoq_tasks_dead_lettered_total"], "pool") == {("doomed",): 1}
        assert samples.get("cronoq_attempts_lost_total", {}) == {}
        assert samples["cronoq_leader"] == {frozenset(): 1}
        assert samples["cronoq_epoch"] == {frozenset(): scheduler.epoch}
        assert samples["cronoq_workers_connected"] == {frozenset(): 4}
        # Attempts started: 3 + 2 * 2 + 1; each waited from ready to start.
        starts = samples["cronoq_start_delay_seconds_count"][frozenset()]
        assert starts == 8
        assert samples["cronoq_start_delay_seconds_bucket"][frozenset({("le", "+Inf")})] == 8
        commits = samples["cronoq_commit_seconds_count"][frozenset()]
        assert commits >= 6  # at least one per submit call
        assert samples["cronoq_commit_batch_size_count"][frozenset()] == commits
        assert samples["cronoq_commit_batch_size_sum"][frozenset()] >= 6 + 8 + 8
        buckets = samples["cronoq_commit_seconds_bucket"]
        cumulative = [
            value for _, value in sorted((float(dict(k)["le"]), v) for k, v in buckets.items())
        ]
        assert cumulative == sorted(cumulative), "buckets are cumulative"
        assert cumulative[-1] == commits
        # Nothing is queued or running once every task finished.
        assert all(value == 0 for value in samples.get("cronoq_queue_depth", {}).values())
        assert all(value == 0 for value in samples.get("cronoq_attempts_running", {}).values())
        for name, series in samples.items():
            for labels in series:
                assert {key for key, _ in labels} <= {"pool", "status", "le"}, name


async def test_queue_depth_and_running_are_live() -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def blocking(ctx: TaskContext, payload: bytes | None) -> None:
        started.set()
        await release.wait()

    collector, registry = new_collector([0])
    async with Scheduler([Pool("slow", blocking, concurrency=1)]) as scheduler:
        collector.watch(scheduler)
        first = await scheduler.submit("k", pool="slow")
        second = await scheduler.submit("k", pool="slow")
        await scheduler.submit("k", pool="slow", start_at=timedelta(hours=1))
        async with asyncio.timeout(10):
            await started.wait()
        samples = scrape(registry)
        assert by(samples["cronoq_queue_depth"], "pool", "status") == {
            ("slow", "running"): 1,
            ("slow", "ready"): 1,
            ("slow", "scheduled"): 1,
        }
        assert by(samples["cronoq_attempts_running"], "pool") == {("slow",): 1}
        release.set()
        async with asyncio.timeout(10):
            await scheduler.wait(first)
            await scheduler.wait(second)
        samples = scrape(registry)
        assert by(samples["cronoq_queue_depth"], "pool", "status") == {("slow", "scheduled"): 1}


async def test_counters_stay_monotonic_across_scheduler_swaps() -> None:
    collector, registry = new_collector([0])
    store = MemoryStore()
    first = Scheduler(pools(), store=store)
    await first.start()
    collector.watch(first)
    await run_tasks(first, fast=2, flaky=1, doomed=1)
    before = scrape(registry)
    first_epoch = first.epoch

    # A standby in the same cluster: watched while it waits for leadership.
    standby = Scheduler(pools(), store=store.connect_another())
    starting = asyncio.create_task(standby.start())
    await first.close()
    collector.watch(standby)
    waiting = scrape(registry)
    for name in ("cronoq_tasks_submitted_total", "cronoq_tasks_finished_total"):
        assert waiting[name] == before[name], "the retired scheduler's counts are kept"
    async with asyncio.timeout(10):
        await starting
    leading = scrape(registry)
    assert leading["cronoq_leader"] == {frozenset(): 1}
    assert standby.epoch is not None and first_epoch is not None
    assert leading["cronoq_epoch"] == {frozenset(): standby.epoch}
    assert standby.epoch > first_epoch
    await run_tasks(standby, fast=3, flaky=0, doomed=0)
    after = scrape(registry)
    assert by(after["cronoq_tasks_submitted_total"], "pool") == {
        ("fast",): 5,
        ("flaky",): 1,
        ("doomed",): 1,
    }
    assert by(after["cronoq_tasks_finished_total"], "pool", "status") == {
        ("fast", "succeeded"): 5,
        ("flaky", "succeeded"): 1,
        ("doomed", "failed"): 1,
    }
    assert (
        after["cronoq_start_delay_seconds_count"][frozenset()]
        == before["cronoq_start_delay_seconds_count"][frozenset()] + 3
    )

    # It steps down: no scheduler for a while, then it leads again with a new one.
    await standby.close()
    collector.watch(None)
    between = scrape(registry)
    assert between["cronoq_leader"] == {frozenset(): 0}
    assert "cronoq_epoch" not in between
    assert between["cronoq_tasks_submitted_total"] == after["cronoq_tasks_submitted_total"]
    again = Scheduler(pools(), store=store.connect_another())
    async with again:
        collector.watch(again)
        await run_tasks(again, fast=1, flaky=0, doomed=0)
        final = scrape(registry)
    assert by(final["cronoq_tasks_submitted_total"], "pool")[("fast",)] == 6
    for name, series in final.items():
        if name.endswith(("_total", "_count", "_sum", "_bucket")):
            for labels, value in series.items():
                assert value >= before.get(name, {}).get(labels, 0), (name, labels)
                assert value >= after.get(name, {}).get(labels, 0), (name, labels)


async def test_the_outbox_series_sum_the_leaders_counters_and_show_the_current_ones_figures() -> (
    None
):
    """On a server whose store has an outbox: its counters from the first scrape (0 on a
    standby), summed over the schedulers the process had; its gauges the leader's last read of
    the outbox, absent without a leader. Without an outbox, no outbox series at all."""
    collector = SchedulerCollector(lambda: 0, ("fast",), outbox=True)
    registry = CollectorRegistry()
    registry.register(collector)
    samples = scrape(registry)
    assert samples["cronoq_outbox_ingested_total"] == {frozenset(): 0}
    assert samples["cronoq_outbox_quarantined_total"] == {frozenset(): 0}
    assert "cronoq_outbox_depth" not in samples  # no leader: nothing read

    store = MemoryStore(outbox=True)
    outbox = store.outbox
    assert outbox is not None
    with QuarantineLog.watching() as log:
        first = Scheduler(pools(), store=store)
        await first.start()
        collector.watch(first)
        bad = outbox.put("k", b"", pool="nowhere")
        outbox.put("k", b"", pool="fast", key="from-the-outbox")

        async def ingested() -> bool:
            return await first.get_by_key("from-the-outbox") is not None

        await log.quarantined(bad)
        await wait_until(ingested, "the good row's task")

        def counted() -> bool:  # the ingest counts a row once its submission has answered
            figures = first.metrics(gauges=False)
            return figures.outbox_ingested == 1 and figures.outbox_depth is not None

        await wait_until(counted, "the good row counted and the outbox read")
        figures = first.metrics(gauges=False)
        samples = scrape(registry)
        assert samples["cronoq_outbox_ingested_total"] == {frozenset(): 1}
        assert samples["cronoq_outbox_quarantined_total"] == {frozenset(): 1}
        assert samples["cronoq_outbox_depth"] == {frozenset(): figures.outbox_depth}
        assert samples["cronoq_outbox_quarantined_rows"] == {
            frozenset(): figures.outbox_quarantine_depth
        }
        assert set(samples["cronoq_outbox_oldest_age_seconds"]) == {frozenset()}

        # A new leader counts from zero: the process's counters go on from the first's.
        await first.close()
        collector.watch(None)
        between = scrape(registry)
        assert between["cronoq_outbox_quarantined_total"] == {frozenset(): 1}
        assert "cronoq_outbox_depth" not in between
        async with Scheduler(pools(), store=store.connect_another()) as second:
            collector.watch(second)
            await log.quarantined(outbox.put("k", b"", pool="nowhere"))
            samples = scrape(registry)
        assert samples["cronoq_outbox_quarantined_total"] == {frozenset(): 2}
        assert samples["cronoq_outbox_ingested_total"] == {frozenset(): 1}

    plain, plain_registry = new_collector([0], ("fast",))
    async with Scheduler(pools(), store=MemoryStore(outbox=True)) as scheduler:
        plain.watch(scheduler)
        assert not [name for name in scrape(plain_registry) if name.startswith("cronoq_outbox")]


async def test_a_draining_leader_keeps_counting_after_it_is_replaced() -> None:
    """The server stops watching a leader when it starts draining; the attempts it finishes
    while draining still count."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def blocking(ctx: TaskContext, payload: bytes | None) -> None:
        started.set()
        await release.wait()

    collector, registry = new_collector([0])
    scheduler = Scheduler([Pool("slow", blocking)])
    await scheduler.start()
    collector.watch(scheduler)
    await scheduler.submit("k", pool="slow")
    async with asyncio.timeout(10):
        await started.wait()
    closing = asyncio.create_task(scheduler.close(timeout=10))
    collector.watch(None)
    assert "cronoq_tasks_finished_total" not in scrape(registry)
    release.set()
    async with asyncio.timeout(10):
        await closing
    for _ in range(2):  # the stopped scheduler is folded in once, not once per scrape
        samples = scrape(registry)
        assert by(samples["cronoq_tasks_finished_total"], "pool", "status") == {
            ("slow", "succeeded"): 1
        }
        assert by(samples["cronoq_tasks_submitted_total"], "pool") == {("slow",): 1}
        assert samples["cronoq_leader"] == {frozenset(): 0}
    assert collector._retiring == [], "a stopped scheduler is not kept alive"


async def test_watching_the_same_scheduler_again_counts_nothing_twice() -> None:
    collector, registry = new_collector([0])
    async with Scheduler(pools()) as scheduler:
        collector.watch(scheduler)
        await run_tasks(scheduler, fast=1, flaky=0, doomed=0)
        collector.watch(scheduler)
        assert by(scrape(registry)["cronoq_tasks_submitted_total"], "pool") == {("fast",): 1}


async def test_metrics_over_http_with_the_process_metrics() -> None:
    collector = SchedulerCollector(lambda: 2, ("fast", "flaky", "doomed"))
    async with (
        Scheduler(pools()) as scheduler,
        HttpServer(
            Address("127.0.0.1", 0),
            readiness=lambda: Readiness(scheduler.leading, "leading"),
            registry=metrics_registry(collector),
        ) as http,
    ):
        collector.watch(scheduler)
        await run_tasks(scheduler, fast=1, flaky=0, doomed=0)
        reader, writer = await asyncio.open_connection("127.0.0.1", http.port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(5):
            raw = await reader.read(-1)
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    names = {family.name for family in text_string_to_metric_families(body.decode())}
    assert {"cronoq_tasks_submitted", "cronoq_leader", "cronoq_workers_connected"} <= names
    assert {"process_resident_memory_bytes", "python_info", "python_gc_objects_collected"} <= names


async def test_every_configured_pool_has_its_series_at_zero_from_the_start() -> None:
    """Regression (issue 24): a pool's series appeared only once it had counted something, so
    a rate over it was missing rather than 0, and a standby showed none."""
    collector, registry = new_collector([0], ("fast", "flaky", "doomed"))
    configured = {("fast",), ("flaky",), ("doomed",)}
    final = {"succeeded", "failed", "cancelled"}
    live = {"waiting", "scheduled", "ready", "running", "retrying"}
    for leading in (False, True):  # a standby, then the leader before any task
        async with contextlib.AsyncExitStack() as stack:
            if leading:
                collector.watch(await stack.enter_async_context(Scheduler(pools())))
            samples = scrape(registry)
            for name in (
                "cronoq_tasks_submitted_total",
                "cronoq_task_retries_total",
                "cronoq_tasks_dead_lettered_total",
                "cronoq_attempts_lost_total",
                "cronoq_attempts_running",
            ):
                assert by(samples[name], "pool") == dict.fromkeys(configured, 0), name
            finished = by(samples["cronoq_tasks_finished_total"], "pool", "status")
            assert finished == {(p, s): 0 for (p,) in configured for s in final}
            depth = by(samples["cronoq_queue_depth"], "pool", "status")
            assert depth == {(p, s): 0 for (p,) in configured for s in live}
    async with Scheduler(pools()) as scheduler:
        collector.watch(scheduler)
        await run_tasks(scheduler, fast=2, flaky=0, doomed=0)
        submitted = by(scrape(registry)["cronoq_tasks_submitted_total"], "pool")
    assert submitted == {("fast",): 2, ("flaky",): 0, ("doomed",): 0}


async def ran(ctx: TaskContext, payload: bytes) -> bytes:
    return payload


async def test_grpc_calls_are_counted_by_method_and_code(tmp_path: Path) -> None:
    submit, get = "cronoq.v1.SchedulerService/Submit", "cronoq.v1.SchedulerService/Get"
    async with running_server(tmp_path, config_toml("")) as server:
        await server.leading()
        async with AsyncClient(server.target) as client:
            # Each method twice: its observed handler is made once, then reused.
            await client.submit("k", b"x")
            task_id = await client.submit("k", b"x")
            await client.get(task_id)
            with pytest.raises(TaskNotFound):
                await client.get(task_id + 1)
            # A response stream is observed when it ends: one Attach, ended by the worker.
            worker = Worker(server.target, {"default": ran}, slots=1)
            working = asyncio.create_task(worker.run())
            await client.wait(task_id, timeout=10)
            worker.stop()
            await asyncio.wait_for(working, 10)
        async with grpc.aio.insecure_channel(server.target) as channel:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/cronoq.v1.NoSuchService/Call"
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(b"")
            assert caught.value.code() is grpc.StatusCode.UNIMPLEMENTED
        reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        async with asyncio.timeout(5):
            raw = await reader.read(-1)
        writer.close()
    samples: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(raw.partition(b"\r\n\r\n")[2].decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    calls = by(samples["cronoq_grpc_calls_total"], "method", "code")
    assert calls[(submit, "OK")] == 2
    assert calls[(get, "OK")] == 1
    assert calls[(get, "NOT_FOUND")] == 1
    assert calls[("unknown", "UNIMPLEMENTED")] == 1
    # Every method and code is a series from the start, at 0 until it happens.
    assert calls[(get, "INTERNAL")] == 0
    assert calls[("cronoq.v1.WorkerService/Attach", "RESOURCE_EXHAUSTED")] == 0
    assert len({method for method, _ in calls}) > 10
    assert not any(method.startswith("cronoq.v1.NoSuchService") for method, _ in calls)
    counts = by(samples["cronoq_grpc_call_seconds_count"], "method")
    assert counts[(submit,)] == 2 and counts[(get,)] == 2
    attach = "cronoq.v1.WorkerService/Attach"
    assert sum(n for (method, _), n in calls.items() if method == attach) == 1
    assert counts[(attach,)] == 1
