"""Limits (issue 31): what they cost dispatch, and how long a cold key waits behind a hot one.

Run:  uv run python bench/limits.py              (5 rounds; medians)
      uv run python bench/limits.py --quick      (smaller, for a smoke run)
      uv run python bench/limits.py --only a --shape keys --rounds 1   (one shape, to profile)

(a) end to end: N no-op tasks through a Scheduler over MemoryStore, pool concurrency 1,000,
    ``submit_many`` in chunks of 1,000, timed until the last completion is committed, with each
    shape of limits below; every shape is measured once per round, the shapes interleaved, so
    that load on the machine falls on each alike, and each is shown against no limits.
(b) the pure engine (no driver, no store, as bench/engine.py's row (b)): transitions per
    second (submit, start, succeed) with the same shapes, steps of 1,000 inputs.

    The shapes: no limits; 1 limit per task (a global concurrency limit of 1,000,000, which
    never binds); 3 limits per task (two such concurrency limits and a rate of 1,000,000 starts
    per second, none binding); a per-key concurrency limit (10 per key) over 10,000 keys, task
    i taking key i mod 10,000 (10 tasks per key at 100,000 tasks; round-robin across keys keeps
    it from binding). Target of issue 31: at most 15% slower than no limits at 10,000 keys.

(c) a cold key behind a hot one: HOT no-op tasks of one key submitted in one ``submit_many``,
    then one task of another key; how long from that submission until the cold task starts, and
    how many hot tasks started meanwhile. Pool concurrency 10 in every case, so that the hot
    key fills the pool:
    - FIFO: no limits; the cold task queues behind every hot task.
    - lanes: a per-key concurrency limit of 10 (the pool's): the hot key fills the pool, the
      limit itself does not bind, and dispatch takes the keys' lanes in turn.
    - limit binds: a per-key concurrency limit of 5: the hot key's lane is parked on its gate
      while 5 of its tasks run, and the pool's other slots are free for the cold key.

(d) a binding limit over many lanes: the pure engine's starts per second while a global
    concurrency limit of 10 binds over 100, 1,000 and 5,000 per-key lanes (20,000 tasks): a
    freed slot brings back as many parked lanes as it has room for, not every one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _common import row

from cronoq import Limit, MemoryStore, Pool, Scheduler, TaskContext, TaskRequest
from cronoq._engine import (
    AttemptReport,
    AttemptSucceeded,
    Engine,
    EngineConfig,
    PoolConfig,
    SubmitTasks,
)
from cronoq._model import NS_PER_S, TaskSpec

KEYS = 10_000
NEVER = 1_000_000  # a concurrency or rate no run reaches


@dataclass(frozen=True)
class Shape:
    name: str
    """For ``--shape``."""
    label: str
    limits: tuple[Limit, ...]
    task_limits: Callable[[int], dict[str, str | None] | None]
    """The limits task ``i`` names (with its keys); None, as most submissions, for none."""


SHAPES = [
    Shape("none", "no limits", (), lambda i: None),
    Shape(
        "one",
        "1 limit per task (global, not binding)",
        (Limit("global", concurrency=NEVER),),
        lambda i: {"global": None},
    ),
    Shape(
        "three",
        "3 limits per task (2 concurrency, 1 rate; none binding)",
        (
            Limit("global", concurrency=NEVER),
            Limit("region", concurrency=NEVER),
            Limit("api", rate=NEVER, per=1.0),
        ),
        lambda i: {"global": None, "region": None, "api": None},
    ),
    Shape(
        "keys",
        f"per-key limit, {KEYS:,} keys (10 running per key)",
        (Limit("tenant", concurrency=10, per_key=True),),
        lambda i: {"tenant": f"tenant-{i % KEYS}"},
    ),
]


# --- (a) end to end -------------------------------------------------------------------------


async def end_to_end(shape: Shape, n: int) -> float:
    """Tasks per second from the first submission to the last committed completion."""
    finished: list[int] = []
    done = asyncio.Event()

    async def noop(ctx: TaskContext, payload: Any) -> None:
        finished.append(ctx.task_id)
        if len(finished) == n:
            done.set()

    store = MemoryStore()
    pool = Pool("default", noop, concurrency=1000)
    async with Scheduler([pool], store=store, seed=1, limits=shape.limits) as sched:
        start = time.perf_counter()
        for offset in range(0, n, 1000):
            size = min(1000, n - offset)
            await sched.submit_many(
                [TaskRequest("noop", limits=shape.task_limits(offset + i)) for i in range(size)]
            )
        # Lanes start tasks out of id order (round-robin across keys), so the run is over when
        # every function has returned and the last ones to return are committed as finished.
        await done.wait()
        for task_id in finished[-1000:]:
            await sched.wait(task_id)
        elapsed = time.perf_counter() - start
    await store.close()
    return n / elapsed


# --- (b) the pure engine ----------------------------------------------------------------------


def engine_transitions(shape: Shape, n: int) -> float:
    """Pure engine transitions per second: submit, start and succeed each of n tasks."""
    config = EngineConfig([PoolConfig("default", concurrency=1000)], seed=1, limits=shape.limits)
    engine = Engine(config, epoch=1)
    # One spec per key, shared by the key's tasks as bench/engine.py shares one: a list of n
    # specs would only give the collector more objects to walk than a real queue holds.
    specs = [
        TaskSpec("default", "noop", b"", limits=tuple(sorted((shape.task_limits(i) or {}).items())))
        for i in range(min(n, KEYS))
    ]
    now = 1_000 * NS_PER_S
    reply = object()
    pending: list[AttemptReport] = []
    done = submitted = 0
    ok = AttemptSucceeded(None)
    start = time.perf_counter()
    while done < n:
        inputs: list[Any] = pending
        if submitted < n:
            size = min(1000, n - submitted)
            chunk = [specs[i % KEYS] for i in range(submitted, submitted + size)]
            inputs = [*inputs, SubmitTasks(chunk, reply)]
            submitted += size
        result = engine.step(now, inputs)
        done += len(pending)
        pending = [AttemptReport(d.token, ok) for d in result.dispatches]
        now += 1_000_000
    elapsed = time.perf_counter() - start
    return 3 * n / elapsed


# --- (d) a binding limit over many lanes --------------------------------------------------------


def binding_limit(lanes: int, n: int) -> float:
    """Pure engine starts per second while a global concurrency limit of 10 binds over
    ``lanes`` per-key lanes (tenant i mod lanes, each key's own limit 1): every freed slot
    must bring back a parked lane, and only as many as it has room for."""
    limits = (Limit("global", concurrency=10), Limit("tenant", concurrency=1, per_key=True))
    config = EngineConfig([PoolConfig("default", concurrency=1000)], seed=1, limits=limits)
    engine = Engine(config, epoch=1)
    specs = [
        TaskSpec("default", "noop", b"", limits=(("global", None), ("tenant", f"k{i}")))
        for i in range(lanes)
    ]
    now = 1_000 * NS_PER_S
    result = engine.step(now, [SubmitTasks([specs[i % lanes] for i in range(n)], object())])
    ok = AttemptSucceeded(None)
    starts = 0
    start = time.perf_counter()
    while result.dispatches:
        starts += len(result.dispatches)
        now += 1_000_000
        result = engine.step(now, [AttemptReport(d.token, ok) for d in result.dispatches])
    return starts / (time.perf_counter() - start)


# --- (c) a cold key behind a hot one ----------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    label: str
    limits: tuple[Limit, ...]


SPREADS = [
    Spread("FIFO (no limits)", ()),
    Spread(
        "lanes (per-key concurrency 10 = the pool's)",
        (Limit("tenant", concurrency=10, per_key=True),),
    ),
    Spread("limit binds (per-key concurrency 5)", (Limit("tenant", concurrency=5, per_key=True),)),
]


async def cold_behind_hot(spread: Spread, hot: int) -> tuple[float, int, int]:
    """(ms from the cold task's submission to its start, hot starts meanwhile, hot tasks not
    yet started when it was submitted)."""
    starts = 0
    cold_started = asyncio.Event()
    cold_at = 0.0
    cold_starts = 0

    async def noop(ctx: TaskContext, payload: Any) -> None:
        nonlocal starts, cold_at, cold_starts
        if payload == b"cold":
            cold_at = time.perf_counter()
            cold_starts = starts
            cold_started.set()
        else:
            starts += 1

    def limits(key: str) -> dict[str, str | None] | None:
        return {"tenant": key} if spread.limits else None

    store = MemoryStore()
    pool = Pool("default", noop, concurrency=10)
    async with Scheduler([pool], store=store, seed=1, limits=spread.limits) as sched:
        ids = await sched.submit_many(
            [TaskRequest("noop", b"hot", limits=limits("hot")) for _ in range(hot)]
        )
        before = starts
        submitted = time.perf_counter()
        await sched.submit("noop", b"cold", limits=limits("cold"))
        await cold_started.wait()
        delay = cold_at - submitted
        # The hot tasks start in id order (one lane): the last one ends last.
        await sched.wait(ids[-1])
    await store.close()
    return delay * 1000, cold_starts - before, hot - before


# --- the run ----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 rounds")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--tasks", type=int, default=None, help="tasks per run of (a) and (b)")
    parser.add_argument("--hot", type=int, default=None, help="hot tasks of (c)")
    parser.add_argument(
        "--only", choices=["a", "b", "c", "d"], action="append", help="measure only these (repeat)"
    )
    parser.add_argument(
        "--shape",
        choices=[shape.name for shape in SHAPES],
        action="append",
        help="only these shapes in (a) and (b) (repeat; for a profiler); ratios need 'none'",
    )
    args = parser.parse_args()
    rounds = args.rounds or (3 if args.quick else 5)
    n = args.tasks or (10_000 if args.quick else 100_000)
    hot = args.hot or (2_000 if args.quick else 20_000)
    only = set(args.only or "abcd")
    shapes = [s for s in SHAPES if args.shape is None or s.name in args.shape]

    print(f"python {sys.version.split()[0]}, {rounds} rounds, medians (all runs in brackets)")
    if "a" in only:
        print(f"\n(a) end to end, submit_many, {n:,} tasks, pool concurrency 1,000 (tasks/s)")
        interleaved(shapes, rounds, "tasks/s", lambda shape: asyncio.run(end_to_end(shape, n)))
    if "b" in only:
        print(f"\n(b) pure engine, {n:,} tasks (transitions/s)")
        interleaved(shapes, rounds, "tr/s", lambda shape: engine_transitions(shape, n))
    if "c" in only:
        print(f"\n(c) a cold key behind {hot:,} hot tasks, pool concurrency 10")
        results: dict[str, list[tuple[float, int, int]]] = {s.label: [] for s in SPREADS}
        for _ in range(rounds):
            for spread in SPREADS:
                results[spread.label].append(asyncio.run(cold_behind_hot(spread, hot)))
        for label, runs in results.items():
            ms = [r[0] for r in runs]
            behind = [float(r[1]) for r in runs]
            waiting = statistics.median(r[2] for r in runs)
            shown = ", ".join(f"{v:,.1f}" for v in ms)
            print(
                f"{label:<58} {statistics.median(ms):>10,.1f} ms [{shown}]  "
                f"hot starts before it: {statistics.median(behind):,.0f} "
                f"[{', '.join(f'{v:,.0f}' for v in behind)}] of {waiting:,.0f} waiting",
                flush=True,
            )
    if "d" in only:
        tasks = 2_000 if args.quick else 20_000
        print(f"\n(d) a global concurrency limit of 10 binding over per-key lanes, {tasks:,} tasks")
        for lanes in (100, 1_000, 5_000):
            values = [binding_limit(lanes, tasks) for _ in range(rounds)]
            row(f"{lanes:,} lanes", statistics.median(values), "starts/s", values, "")
    return 0


def interleaved(
    shapes: list[Shape], rounds: int, unit: str, measure: Callable[[Shape], float]
) -> None:
    """Each shape once per round, in turn; then per shape its median and its ratio to no
    limits' (when that shape was measured)."""
    results: dict[str, list[float]] = {shape.name: [] for shape in shapes}
    for _ in range(rounds):
        for shape in shapes:
            results[shape.name].append(measure(shape))
    base = statistics.median(results["none"]) if "none" in results else None
    for shape in shapes:
        values = results[shape.name]
        median = statistics.median(values)
        note = ""
        if base is not None and shape.name != "none":
            note = f"  {median / base:.2f}x no limits ({(1 - median / base) * 100:+.1f}% slower)"
            if shape.name == "keys":
                note += f"  target >= 0.85x: {'met' if median / base >= 0.85 else 'MISSED'}"
        row(shape.label, median, unit, values, note)


if __name__ == "__main__":
    sys.exit(main())
