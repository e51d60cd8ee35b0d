"""Measurements shared by the benchmark scripts: end-to-end throughput and latency."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cronoq import Pool, Scheduler, TaskContext, TaskRequest
from cronoq.store import Store

StoreFactory = Callable[[], Awaitable[Store]]


async def _noop(ctx: TaskContext, payload: Any) -> None:
    return None


async def end_to_end(
    open_store: StoreFactory, n: int, *, batch: bool, submitters: int = 100, tracing: Any = False
) -> float:
    """Tasks per second from the first submission to the last committed completion
    (``tracing``: the Scheduler's argument)."""
    pool = Pool("default", _noop, concurrency=1000)
    store = await open_store()
    # Passed only when asked for, so trees from before tracing existed run this too
    # (bench/engine_ab.py --measure).
    traced: dict[str, Any] = {"tracing": tracing} if tracing is not False else {}
    async with Scheduler([pool], store=store, seed=1, **traced) as sched:
        start = time.perf_counter()
        if batch:
            ids: list[int] = []
            for offset in range(0, n, 1000):
                size = min(1000, n - offset)
                ids += await sched.submit_many([TaskRequest("noop")] * size)
        else:
            per = n // submitters

            async def submitter() -> list[int]:
                return [await sched.submit("noop") for _ in range(per)]

            chunks = await asyncio.gather(*(submitter() for _ in range(submitters)))
            ids = [i for chunk in chunks for i in chunk]
        # Waiting on every id would measure the waits; tasks of one pool start in id order, so
        # once the last ids are committed as finished, the run is over.
        for task_id in sorted(ids)[-1000:]:
            await sched.wait(task_id)
        elapsed = time.perf_counter() - start
    await store.close()
    return len(ids) / elapsed


async def latency(open_store: StoreFactory, rate: float, seconds: float) -> dict[str, float]:
    """Submit at a steady rate; percentiles (ms) of submit-to-start and of the acknowledgement."""
    started: dict[int, float] = {}
    submitted: dict[int, float] = {}
    acks: list[float] = []

    async def record(ctx: TaskContext, payload: Any) -> None:
        started[ctx.task_id] = time.perf_counter()

    store = await open_store()
    async with Scheduler([Pool("default", record, concurrency=1000)], store=store) as sched:
        interval = 1.0 / rate
        begin = time.perf_counter()
        pending: list[asyncio.Task[None]] = []

        async def one() -> None:
            t0 = time.perf_counter()
            task_id = await sched.submit("noop")
            acks.append(time.perf_counter() - t0)
            submitted[task_id] = t0

        for i in range(int(rate * seconds)):
            # Open loop: a slow acknowledgement does not delay the next submission.
            delay = begin + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append(asyncio.create_task(one()))
        await asyncio.gather(*pending)
        for task_id in sorted(submitted)[-50:]:
            await sched.wait(task_id)
    await store.close()
    to_start = [started[i] - t0 for i, t0 in submitted.items()]
    return {
        "start_p50": _percentile(to_start, 50) * 1000,
        "start_p99": _percentile(to_start, 99) * 1000,
        "ack_p50": _percentile(acks, 50) * 1000,
        "ack_p99": _percentile(acks, 99) * 1000,
    }


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def median_of(rounds: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    values = [measure() for _ in range(rounds)]
    return statistics.median(values), values


def row(label: str, median: float, unit: str, values: list[float], note: str = "") -> None:
    shown = ", ".join(f"{v:,.0f}" for v in values)
    print(f"{label:<58} {median:>12,.0f} {unit} [{shown}]{note}", flush=True)
