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
import sys
import time
import tracemalloc
from typing import Any

from _common import end_to_end, median_of, row

from cronoq import MemoryStore
from cronoq._engine import (
    AttemptReport,
    AttemptSucceeded,
    Engine,
    EngineConfig,
    PoolConfig,
    SubmitTasks,
)
from cronoq._model import NS_PER_S, TaskSpec


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


async def memory() -> MemoryStore:
    return MemoryStore()


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
            lambda: asyncio.run(end_to_end(memory, n_e2e, batch=True)),
            30_000,
        ),
        (
            f"(a) end to end, single submits x100, {n_e2e:,} tasks",
            "tasks/s",
            lambda: asyncio.run(end_to_end(memory, n_e2e, batch=False)),
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
        median, values = median_of(rounds, measure)
        goal = f"  target >= {target:,} ({median / target:.2f}x)" if target else ""
        row(label, median, unit, values, goal)
    median, values = median_of(max(1, rounds // 2), lambda: memory_per_idle_task(n_memory))
    label = f"(c) memory per idle task, {n_memory:,} tasks"
    row(label, median, "bytes", values, f"  target <= 600 ({median / 600:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
