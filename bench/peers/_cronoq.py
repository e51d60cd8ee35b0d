"""The measurements of cronoq, whichever its store.

cronoq is embedded: the ``Scheduler`` that takes submissions is the one that runs the tasks, in
the same process (there is no separate client yet). So here the measurement process is the
worker process: its CPU time (which includes the submissions) and peak RSS are row 5.
Enqueue rows submit with ``start_at`` an hour ahead, so that nothing runs while they are
measured, as no peer worker runs during those rows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from cronoq import Pool, Scheduler, Status, TaskContext, TaskRequest
from cronoq.store import Store

from ._harness import EndToEnd, Latency, Sizes, Usage, end_to_end_result, latency_of

StoreContext = Callable[[], AbstractAsyncContextManager[Store]]
Executor = Callable[[TaskContext, Any], Any]
LATER = timedelta(hours=1)
"""start_at of enqueue-only rows: durable, and not run while measured."""


async def _noop(ctx: TaskContext, payload: Any) -> None:
    return None


@dataclass
class CronoqSystem:
    name: str
    open_store: StoreContext

    @asynccontextmanager
    async def _running(self, sizes: Sizes, executor: Executor) -> AsyncIterator[Scheduler]:
        async with self.open_store() as store:
            pool = Pool("default", executor, concurrency=sizes.concurrency)
            async with Scheduler([pool], store=store, seed=1) as sched:
                yield sched

    async def enqueue_single(self, sizes: Sizes) -> float:
        async with self._running(sizes, _noop) as sched:
            per = sizes.single // sizes.submitters

            async def submitter() -> None:
                for _ in range(per):
                    await sched.submit("noop", start_at=LATER)

            start = time.perf_counter()
            await asyncio.gather(*(submitter() for _ in range(sizes.submitters)))
            elapsed = time.perf_counter() - start
            n = per * sizes.submitters
            await _expect(sched, Status.SCHEDULED, n)
        return n / elapsed

    async def enqueue_batch(self, sizes: Sizes) -> float:
        n = sizes.batch
        async with self._running(sizes, _noop) as sched:
            start = time.perf_counter()
            for first in range(0, n, sizes.batch_size):
                size = min(sizes.batch_size, n - first)
                await sched.submit_many([TaskRequest("noop", start_at=LATER)] * size)
            elapsed = time.perf_counter() - start
            await _expect(sched, Status.SCHEDULED, n)
        return n / elapsed

    async def end_to_end(self, sizes: Sizes) -> EndToEnd:
        n = sizes.end_to_end
        async with self._running(sizes, _noop) as sched:
            await _warm_up(sched, sizes)
            before = Usage.of_self()
            start = time.perf_counter()
            ids: list[int] = []
            for first in range(0, n, sizes.batch_size):
                size = min(sizes.batch_size, n - first)
                ids += await sched.submit_many([TaskRequest("noop")] * size)
            # Tasks of one pool start in id order: once the last ids are committed as finished,
            # the run is over (checked below, outside the timed part).
            for task_id in sorted(ids)[-1000:]:
                await sched.wait(task_id)
            elapsed = time.perf_counter() - start
            after = Usage.of_self()
            await _expect(sched, Status.SUCCEEDED, n + sizes.warmup)
        return end_to_end_result(n, elapsed, before, after)

    async def latency(self, sizes: Sizes) -> Latency:
        started: dict[int, float] = {}

        async def record(ctx: TaskContext, payload: Any) -> None:
            started.setdefault(ctx.task_id, time.monotonic())

        sent: dict[int, float] = {}
        acks: list[float] = []
        async with self._running(sizes, record) as sched:
            await _warm_up(sched, sizes)

            async def one() -> None:
                t0 = time.monotonic()
                task_id = await sched.submit("noop")
                acks.append(time.monotonic() - t0)
                sent[task_id] = t0

            interval = 1.0 / sizes.rate
            begin = time.monotonic()
            pending: list[asyncio.Task[None]] = []
            for i in range(int(sizes.rate * sizes.seconds)):
                delay = begin + i * interval - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                pending.append(asyncio.create_task(one()))
            await asyncio.gather(*pending)
            for task_id in sent:
                await sched.wait(task_id)
        return latency_of([started[i] - t0 for i, t0 in sent.items()], acks)


async def _warm_up(sched: Scheduler, sizes: Sizes) -> None:
    for task_id in await sched.submit_many([TaskRequest("noop")] * sizes.warmup):
        await sched.wait(task_id)


async def _expect(sched: Scheduler, status: Status, n: int) -> None:
    found = len(await sched.list(status=status, limit=n + 1))
    assert found == n, f"{found} tasks {status}, expected {n}"
    live = [Status.WAITING, Status.READY, Status.RUNNING, Status.RETRYING]
    if status is Status.SUCCEEDED:
        left = len(await sched.list(status=[*live, Status.SCHEDULED], limit=1))
        assert not left, "tasks left unfinished"
