"""Benchmarks of the core with MemoryStore: throughput, engine steps, memory per task.

Run:  uv run python bench/engine.py            (all three, 5 rounds; medians)
      uv run python bench/engine.py --quick    (smaller, for a smoke run)

(a) end to end: N no-op tasks through a Scheduler over MemoryStore, pool concurrency 1,000,
    submitted with ``submit_many`` (chunks of 1,000) and with single ``submit`` calls from 100
    concurrent submitters; timed until the last completion is committed.
(b) the pure engine: transitions per second (submit, start, succeed: 3 per task), steps of
    1,000 inputs, no driver and no store.
(c) memory per idle task: tracemalloc over 1,000,000 tasks scheduled an hour ahead in a bare
    engine (the shared empty payload is excluded by construction).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from cronoq import MemoryStore, Pool, Scheduler, TaskContext, TaskRequest
from cronoq._engine import (
    AttemptReport,
    AttemptSucceeded,
    Engine,
    EngineConfig,
    PoolConfig,
    SubmitTasks,
)
from cronoq._model import NS_PER_S, TaskSpec


async def _noop(ctx: TaskContext, payload: Any) -> None:
    return None


async def end_to_end(n: int, *, batch: bool, submitters: int = 100) -> float:
    """Tasks per second from the first submission to the last committed completion."""
    pool = Pool("default", _noop, concurrency=1000)
    async with Scheduler([pool], store=MemoryStore(), seed=1) as sched:
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
        # Waiting on every id would measure the waits; the tasks run in id order within one
        # pool, so once the last id is committed as finished, every earlier one is too.
        for task_id in sorted(ids)[-1000:]:
            await sched.wait(task_id)
        elapsed = time.perf_counter() - start
    return len(ids) / elapsed


def engine_transitions(n: int) -> float:
    """Pure engine transitions per second: submit, start and succeed each of n tasks."""
    engine = Engine(EngineConfig([PoolConfig("default", concurrency=1000)], seed=1), epoch=1)
    spec = TaskSpec("default", "noop", b"")
    now = 1_000 * NS_PER_S
    reply = object()
    pending_reports: list[AttemptReport] = []
    done = 0
    start = time.perf_counter()
    submitted = 0
    while done < n:
        inputs: list[Any] = pending_reports
        if submitted < n:
            size = min(1000, n - submitted)
            inputs = [*inputs, SubmitTasks([spec] * size, reply)]
            submitted += size
        result = engine.step(now, inputs)
        done += len(pending_reports)
        ok = AttemptSucceeded(None)
        pending_reports = [AttemptReport(d.token, ok) for d in result.dispatches]
        now += 1_000_000
    elapsed = time.perf_counter() - start
    return 3 * n / elapsed


def memory_per_idle_task(n: int) -> float:
    """Bytes per task scheduled in the future, measured with tracemalloc."""
    config = EngineConfig([PoolConfig("default", concurrency=10)], seed=1)
    now = 1_000 * NS_PER_S
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    engine = Engine(config, epoch=1)
    reply = object()
    later = now + 3600 * NS_PER_S
    for offset in range(0, n, 10_000):
        # Distinct start times, as real submissions have; the payload is one shared b"".
        specs = [
            TaskSpec("default", "noop", b"", start_at_ns=later + offset + i) for i in range(10_000)
        ]
        engine.step(now, [SubmitTasks(specs, reply)])  # its mutations are dropped: "committed"
        del specs
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert engine.live_count == n
    return (after - before) / n


def _median(runs: int, measure: Callable[[], float]) -> tuple[float, list[float]]:
    values = [measure() for _ in range(runs)]
    return statistics.median(values), values


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    n_e2e = 10_000 if args.quick else 100_000
    n_engine = 100_000 if args.quick else 300_000
    n_memory = 100_000 if args.quick else 1_000_000

    print(f"python {sys.version.split()[0]}, {rounds} rounds, medians (all runs in brackets)")
    rows = [
        (
            f"(a) end to end, submit_many, {n_e2e:,} tasks",
            "tasks/s",
            lambda: asyncio.run(end_to_end(n_e2e, batch=True)),
            30_000,
        ),
        (
            f"(a) end to end, single submits x100, {n_e2e:,} tasks",
            "tasks/s",
            lambda: asyncio.run(end_to_end(n_e2e, batch=False)),
            None,
        ),
        (
            f"(b) engine transitions, {n_engine:,} tasks",
            "transitions/s",
            lambda: engine_transitions(n_engine),
            200_000,
        ),
    ]
    for label, unit, measure, target in rows:
        median, values = _median(rounds, measure)
        shown = ", ".join(f"{v:,.0f}" for v in values)
        goal = f"  target >= {target:,} ({median / target:.2f}x)" if target else ""
        print(f"{label:<52} {median:>12,.0f} {unit} [{shown}]{goal}")
    median, values = _median(max(1, rounds // 2), lambda: memory_per_idle_task(n_memory))
    shown = ", ".join(f"{v:,.0f}" for v in values)
    label = f"(c) memory per idle task, {n_memory:,} tasks"
    print(f"{label:<52} {median:>12,.0f} bytes [{shown}]  target <= 600 ({median / 600:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
