"""cronoq-server's CPU per task and its profile, on the paths of bench/peers' rows.

Run from the repository root:

    uv run --group bench python -m bench.peers.profile single --rounds 5
    uv run --group bench python -m bench.peers.profile batch --profile /tmp/batch.txt

A fresh server (``python -m cronoq_server serve``, as ``bench.peers`` starts it: its own
process, uvloop, a fresh PostgreSQL database or SQLite file) and this process as its client
(``AsyncClient``, one channel), for one of four loads:

- ``single``: ``Submit`` from 100 concurrent submitters (bench/peers' row 1);
- ``batch``: ``SubmitMany`` of ``--batch-size`` (1,000) tasks, one call at a time (row 2);
- ``end_to_end``: ``SubmitMany`` of 1,000 at a time, run by one remote worker process of 50
  slots (row 3);
- ``start``: a server's start on a store holding ``--tasks`` ready tasks (``_start_round``).

Every environment is compiled to bytecode first, as an installation has it. Each round prints
tasks per second and the server process's CPU (user + system, every thread, from /proc) per
task over the load. With ``--profile PATH``, ``py-spy record --gil`` samples the server at
100 Hz during the load of every round (collapsed stacks of the threads holding the GIL, so
that no idle thread counts, into PATH.<n>.part), and PATH gets their summary: the frames
with the most samples at the top of the stack (self), the frames of cronoq and its libraries
with the most samples anywhere in it (cumulative, each frame once per sample), in % of all
samples, and self time by source file. Python frames only (``--native`` slowed the server
twentyfold): native work counts for the innermost Python frame above it, so ``Runner.run`` is
the event loop's own native work (uvloop, grpcio's Cython core under it). Work outside the GIL
(the kernel's, in system calls) is not sampled: ``perf record -p PID`` shows it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib
import pstats
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from cronoq_client import AsyncClient

from ._envs import compile_bytecode
from ._harness import Sizes
from ._peer import Worker, submit_batches, submit_singly, worker_timeout
from ._server import _MODULE, ServerProcess, ServerSystem, _ClientEnqueuer, _until_finished

LOADS = ("single", "batch", "end_to_end", "start")


async def _round(
    kind: str, system: ServerSystem, sizes: Sizes, profile: Path | None
) -> tuple[float, float]:
    """Tasks per second and the server's CPU µs per task of one round."""
    with tempfile.TemporaryDirectory(prefix="cronoq-profile-") as tmp:
        async with system.store() as section, ServerProcess(section, Path(tmp)) as server:
            enqueuer = _ClientEnqueuer(AsyncClient(server.target))
            try:
                if kind == "single":
                    # Warmed up as bench.peers' rows are not: the profile is of the steady state.
                    await submit_singly(enqueuer, 1_000, sizes.submitters)

                    async def single() -> int:
                        return await submit_singly(enqueuer, sizes.single, sizes.submitters)

                    return await _measured(single, server, profile)
                if kind == "batch":
                    await submit_batches(enqueuer, 2_000, sizes.batch_size)

                    async def batch() -> int:
                        await submit_batches(enqueuer, sizes.batch, sizes.batch_size)
                        return sizes.batch

                    return await _measured(batch, server, profile)
                n = sizes.end_to_end
                async with Worker(_MODULE, server.target, sizes.concurrency, target=n) as worker:
                    await enqueuer.many(list(range(-sizes.warmup, 0)))
                    await _until_finished(
                        enqueuer.client, interval=0.02, timeout=120, check=worker.check
                    )

                    async def end_to_end() -> int:
                        await submit_batches(enqueuer, n, sizes.batch_size)
                        await worker.done(timeout=worker_timeout(n))
                        await _until_finished(
                            enqueuer.client, interval=0.002, timeout=60, check=worker.check
                        )
                        return n

                    return await _measured(end_to_end, server, profile)
            finally:
                await enqueuer.close()


async def _start_round(
    system: ServerSystem, sizes: Sizes, profile: Path | None
) -> tuple[float, float]:
    """Seconds from the server's exec to its first "serving" as the leader, and its CPU
    seconds by then, on a store holding ``sizes.batch`` ready tasks (written by an earlier
    server, stopped with SIGTERM): imports, configuration, the store's connection,
    leadership and the recovery of every task. With ``profile``, the server runs under
    cProfile, whose statistics it writes when it stops (PATH.<n>.pstats)."""
    with tempfile.TemporaryDirectory(prefix="cronoq-profile-") as tmp:
        async with system.store() as section:
            async with ServerProcess(section, Path(tmp)) as first:
                enqueuer = _ClientEnqueuer(AsyncClient(first.target))
                try:
                    await submit_batches(enqueuer, sizes.batch, sizes.batch_size)
                finally:
                    await enqueuer.close()
            options: tuple[str, ...] = ()
            if profile is not None:
                stats = f"{profile}.{time.monotonic_ns()}.pstats"
                options = ("-m", "cProfile", "-o", stats)
            start = time.perf_counter()
            async with ServerProcess(section, Path(tmp), python_options=options) as second:
                elapsed = time.perf_counter() - start
                cpu = second.usage().cpu_s
    return elapsed, cpu


async def _measured(
    run: Callable[[], Awaitable[int]], server: ServerProcess, profile: Path | None
) -> tuple[float, float]:
    spy = None
    if profile is not None:
        spy = await asyncio.create_subprocess_exec(
            "py-spy", "record", "--pid", str(server.pid), "--rate", "100", "--nolineno", "--gil",
            "--format", "raw", "--output", f"{profile}.{time.monotonic_ns()}.part",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        await asyncio.sleep(0.5)  # py-spy attaches before the load starts
    before = server.usage()
    start = time.perf_counter()
    n = await run()
    elapsed = time.perf_counter() - start
    after = server.usage()
    if spy is not None:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
        await spy.wait()
    return n / elapsed, (after.cpu_s - before.cpu_s) / n * 1e6


def summarise(raw_files: list[Path], top: int = 25) -> str:
    """The summary of py-spy's collapsed stacks (``frame;frame;... count`` lines)."""
    self_time: collections.Counter[str] = collections.Counter()
    cumulative: collections.Counter[str] = collections.Counter()
    by_file: collections.Counter[str] = collections.Counter()
    total = 0
    for raw in raw_files:
        for line in raw.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack:
                continue
            count = int(count_text)
            frames = stack.split(";")
            total += count
            self_time[frames[-1]] += count
            by_file[_file_of(frames[-1])] += count
            for frame in set(frames):
                if _file_of(frame).startswith(_OURS_AND_LIBRARIES):
                    cumulative[frame] += count
    lines = [f"{total} samples"]
    for title, counter in (
        ("self (top of the stack)", self_time),
        ("cumulative (anywhere in the stack; cronoq's and its libraries' frames)", cumulative),
        ("self by file", by_file),
    ):
        lines.append(f"\n{title}:")
        lines += [
            f"{count / total * 100:6.1f}%  {frame}" for frame, count in counter.most_common(top)
        ]
    return "\n".join(lines) + "\n"


_OURS_AND_LIBRARIES = ("cronoq", "asyncpg", "grpc", "google", "prometheus_client")
"""The frames the cumulative list shows: not the entry points (runpy, asyncio's runner,
threading), which every sample of their thread has."""


def _file_of(frame: str) -> str:
    """``Submit (cronoq_server/_service.py)`` -> ``cronoq_server/_service.py``, with the path
    shortened to its package."""
    _, _, where = frame.rpartition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/src/", "/lib/python3.11/"):
        if marker in where:
            return where.rsplit(marker, 1)[1]
    return where


def _each_round(
    measure: Callable[[], Coroutine[Any, Any, tuple[float, float]]],
    rounds: int,
    shown: Callable[[float, float], str],
) -> tuple[list[float], list[float]]:
    """Both figures of ``measure`` in each round, each round on an event loop of its own."""
    firsts, seconds = [], []
    for index in range(rounds):
        first, second = asyncio.run(measure())
        firsts.append(first)
        seconds.append(second)
        print(f"round {index + 1}: {shown(first, second)}", file=sys.stderr, flush=True)
    return firsts, seconds


def _starts(system: ServerSystem, sizes: Sizes, rounds: int, profile: Path | None) -> int:
    times, cpus = _each_round(
        lambda: _start_round(system, sizes, profile),
        rounds,
        lambda elapsed, cpu: f"leading after {elapsed:.3f} s, server CPU {cpu:.2f} s",
    )
    print(
        f"{system.name} start with {sizes.batch:,} tasks: leading after "
        f"{statistics.median(times):.3f} s [{', '.join(f'{t:.3f}' for t in times)}], server "
        f"CPU {statistics.median(cpus):.2f} s [{', '.join(f'{c:.2f}' for c in cpus)}]",
        flush=True,
    )
    if profile is not None:
        files = sorted(str(p) for p in profile.parent.glob(f"{profile.name}.*.pstats"))
        if not files:
            raise SystemExit(f"no statistics written next to {profile}: see the server's log")
        with profile.open("w") as out:
            pstats.Stats(*files, stream=out).sort_stats("cumulative").print_stats(60)
        print(f"profile (cProfile, cumulative) in {profile}")
    return 0


def _summarised(profile: Path | None) -> None:
    if profile is not None:
        parts = sorted(profile.parent.glob(f"{profile.name}.*.part"))
        profile.write_text(summarise(parts))
        print(f"profile summary in {profile} ({len(parts)} recordings)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("load", choices=LOADS)
    parser.add_argument("--store", choices=("pg", "sqlite"), default="pg")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=None, help="tasks per round")
    parser.add_argument(
        "--profile", type=Path, default=None, help="summary file (py-spy; cProfile's for start)"
    )
    parser.add_argument("--batch-size", type=int, default=1_000, help="tasks per SubmitMany")
    args = parser.parse_args()
    if args.profile is not None:
        # Absolute: the server runs in a temporary directory, deleted after each round.
        args.profile = args.profile.resolve()
    compile_bytecode(sys.executable)
    n = args.tasks
    sizes = Sizes(
        single=n or 20_000,
        batch=n or 100_000,
        end_to_end=n or 20_000,
        seconds=10.0,
        batch_size=args.batch_size,
    )
    module = "cronoq_server_pg" if args.store == "pg" else "cronoq_server_sqlite"
    system: ServerSystem = importlib.import_module(f"bench.peers.{module}").SYSTEM
    if args.load == "start":
        return _starts(system, sizes, args.rounds, args.profile)
    rates, cpus = _each_round(
        lambda: _round(args.load, system, sizes, args.profile),
        args.rounds,
        lambda rate, cpu: f"{rate:,.0f} tasks/s, server CPU {cpu:,.1f} µs per task",
    )
    print(
        f"{system.name} {args.load}: {statistics.median(rates):,.0f} tasks/s "
        f"[{', '.join(f'{r:,.0f}' for r in rates)}], server CPU {statistics.median(cpus):,.1f} "
        f"µs per task [{', '.join(f'{c:,.1f}' for c in cpus)}]",
        flush=True,
    )
    _summarised(args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
