"""What every system module shares: sizes, results, fresh databases, and the no-op task's probe.

This module is imported by the runner, by each measurement process and by each worker process,
so it imports nothing heavy at module level (asyncpg only inside the functions that need it).
"""

from __future__ import annotations

import os
import resource
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    import asyncpg

ADMIN_DSN = os.environ.get("CRONOQ_BENCH_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
DB_PREFIX = "cronoq_peers_"


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each row does."""

    single: int
    """Row 1: tasks enqueued by single calls, split evenly over ``submitters``."""
    batch: int
    """Row 2: tasks enqueued with the batch API, ``batch_size`` per call, one call at a time."""
    end_to_end: int
    """Row 3 (and 5): tasks enqueued up front, then run by one worker at ``concurrency``."""
    seconds: float
    """Row 4: how long the steady ``rate`` lasts."""
    submitters: int = 100
    batch_size: int = 1000
    concurrency: int = 50
    rate: float = 200.0
    warmup: int = 100
    """Tasks run through a worker before a worker measurement starts (not counted)."""

    @classmethod
    def full(cls) -> Sizes:
        return cls(single=20_000, batch=100_000, end_to_end=20_000, seconds=10.0)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(single=1_000, batch=5_000, end_to_end=2_000, seconds=2.0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class EndToEnd:
    tasks_per_s: float
    cpu_us_per_task: float
    """CPU (user + system) of the worker process per task, over the timed run."""
    peak_rss_mib: float
    """The worker process's peak resident set over its whole life."""
    enqueuer_cpu_us_per_task: float | None = None
    """CPU of the enqueuing process per task (None for cronoq: it enqueues in the worker)."""
    server_cpu_us_per_task: float | None = None
    """CPU of the cronoq-server process per task over the timed run (None for the others)."""
    server_peak_rss_mib: float | None = None
    """The cronoq-server process's peak resident set over its whole life."""


@dataclass(frozen=True, slots=True)
class Latency:
    """Milliseconds: enqueue call to executor start, and enqueue call to its acknowledgement."""

    start_p50: float
    start_p99: float
    ack_p50: float
    ack_p99: float


class System(Protocol):
    """The interface every system module exposes as ``SYSTEM``.

    Each method runs in a fresh measurement process and sets up (and drops) its own fresh
    database, SQLite file or memory store.
    """

    name: str

    async def enqueue_single(self, sizes: Sizes) -> float:
        """Row 1: tasks/s of durable single-call enqueues from ``sizes.submitters`` coroutines."""
        ...

    async def enqueue_batch(self, sizes: Sizes) -> float | None:
        """Row 2: tasks/s of durable batch enqueues; None if the system has no batch API."""
        ...

    async def end_to_end(self, sizes: Sizes) -> EndToEnd:
        """Rows 3 and 5: from the first enqueue to the last durable completion, one worker."""
        ...

    async def latency(self, sizes: Sizes) -> Latency:
        """Row 4: an open loop of single enqueues at ``sizes.rate`` for ``sizes.seconds``."""
        ...


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def latency_of(to_start: list[float], acks: list[float]) -> Latency:
    """Percentiles in ms of two lists of seconds."""
    return Latency(
        start_p50=percentile(to_start, 50) * 1000,
        start_p99=percentile(to_start, 99) * 1000,
        ack_p50=percentile(acks, 50) * 1000,
        ack_p99=percentile(acks, 99) * 1000,
    )


@dataclass(frozen=True, slots=True)
class Usage:
    """CPU seconds (user + system) and peak RSS (KiB) of one process."""

    cpu_s: float
    max_rss_kib: int

    @classmethod
    def of_self(cls) -> Usage:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return cls(ru.ru_utime + ru.ru_stime, ru.ru_maxrss)

    @classmethod
    def of_pid(cls, pid: int) -> Usage:
        """Another process's, from Linux's /proc (CPU in clock ticks: 10 ms steps)."""
        proc = Path("/proc") / str(pid)
        # The command name (field 2) may hold spaces: count the fields after its ")".
        fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        peak = next(
            int(line.split()[1])
            for line in (proc / "status").read_text().splitlines()
            if line.startswith("VmHWM:")
        )
        return cls(ticks / os.sysconf("SC_CLK_TCK"), peak)

    def line(self) -> str:
        return f"STATS {self.cpu_s:.6f} {self.max_rss_kib}"

    @classmethod
    def parse(cls, line: str) -> Usage:
        _, cpu, rss = line.split()
        return cls(float(cpu), int(rss))


def end_to_end_result(
    n: int,
    elapsed: float,
    before: Usage,
    after: Usage,
    enqueuer: tuple[Usage, Usage] | None = None,
    server: tuple[Usage, Usage] | None = None,
) -> EndToEnd:
    def per_task(usage: tuple[Usage, Usage] | None) -> float | None:
        return None if usage is None else (usage[1].cpu_s - usage[0].cpu_s) / n * 1e6

    return EndToEnd(
        tasks_per_s=n / elapsed,
        cpu_us_per_task=(after.cpu_s - before.cpu_s) / n * 1e6,
        peak_rss_mib=after.max_rss_kib / 1024,
        enqueuer_cpu_us_per_task=per_task(enqueuer),
        server_cpu_us_per_task=per_task(server),
        server_peak_rss_mib=None if server is None else server[1].max_rss_kib / 1024,
    )


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


async def check_durability(dsn: str) -> dict[str, str]:
    """The settings that make a commit durable; raise unless they are all on."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        settings = {
            name: str(await conn.fetchval(f"SHOW {name}"))
            for name in ("synchronous_commit", "fsync")
        }
    finally:
        await conn.close()
    for name, value in settings.items():
        assert value == "on", f"{name} is {value!r} in {dsn}: the figures would prove nothing"
    return settings


@asynccontextmanager
async def fresh_database(tag: str) -> AsyncIterator[str]:
    """CREATE DATABASE for one measurement, yield its DSN, then drop it (with its sessions)."""
    import asyncpg

    name = f"{DB_PREFIX}{tag}_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(ADMIN_DSN)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = _with_database(ADMIN_DSN, name)
    try:
        # A database (or role) level setting would show here: assert it in every fresh database.
        await check_durability(dsn)
        yield dsn
    finally:
        admin = await asyncpg.connect(ADMIN_DSN)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def wait_until_zero(
    conn: asyncpg.Connection,
    count_sql: str,
    *,
    interval: float,
    timeout: float,
    check: Callable[[], None] | None = None,
) -> float:
    """Poll ``count_sql`` on ``conn`` until it returns 0; the ``perf_counter()`` when it did.

    ``check`` is called at every poll (it raises if the worker died, say).
    """
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        left = await conn.fetchval(count_sql)
        now = time.perf_counter()
        if left == 0:
            return now
        if check is not None:
            check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} tasks still pending after {timeout} s: {count_sql}")
        await asyncio.sleep(interval)


class _Probe:
    """What the no-op task of every peer does in the worker process.

    Tasks with a negative index are warm-up tasks and are ignored. Otherwise the probe counts
    starts, writes ``DONE`` on stdout when the expected count has started, and in latency runs
    appends ``index monotonic-time`` to the record file (one unbuffered write per task).
    """

    def __init__(self) -> None:
        self.target = 0
        self.count = 0
        self.record_fd: int | None = None

    def started(self, index: int) -> None:
        if index < 0:
            return
        now = time.monotonic()
        if self.record_fd is not None:
            os.write(self.record_fd, f"{index} {now:.9f}\n".encode())
        self.count += 1
        if self.count == self.target:
            os.write(1, f"DONE {now:.9f}\n".encode())


probe = _Probe()
