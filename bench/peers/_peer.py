"""The measurements of a PostgreSQL peer: enqueue from this process, run in a worker process.

A peer module provides a :class:`Peer` (install its schema, open an enqueuer, count pending
tasks in SQL, serve as a worker) and exposes ``SYSTEM = PeerSystem(peer)``. The worker always
runs in a separate OS process (``python -m bench.peers._worker MODULE ...``), started by the
measurement process, which enqueues, times, and reads the worker's CPU and peak RSS.

Worker processes import this module too: asyncpg is imported only where the measurement
process needs it, so that it does not weigh on the RSS of a peer that does not use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal, Protocol

from ._harness import (
    EndToEnd,
    Latency,
    Sizes,
    Usage,
    end_to_end_result,
    fresh_database,
    latency_of,
    wait_until_zero,
)

if TYPE_CHECKING:
    import asyncpg

REPO_ROOT = Path(__file__).resolve().parents[2]


class Enqueuer(Protocol):
    async def one(self, index: int) -> None:
        """Enqueue one no-op task carrying ``index``; return once it is committed."""
        ...

    async def many(self, indexes: list[int]) -> None:
        """Enqueue one task per index with the batch API (only if ``Peer.batch_api``)."""
        ...

    async def close(self) -> None: ...


class Peer(Protocol):
    name: str
    """Short name, also the module name under bench.peers."""
    batch_api: bool
    worker_loop: Literal["asyncio", "uvloop"]
    """The event loop the peer's own worker command runs on."""
    pending_sql: str
    """Counts the tasks not yet durably completed (enqueued, available or running)."""

    async def install(self, dsn: str) -> None:
        """Create the peer's tables in a fresh database, with its own migration API."""
        ...

    async def open(self, dsn: str) -> Enqueuer: ...

    async def serve(self, dsn: str, concurrency: int) -> None:
        """Run the peer's worker until cancelled (in the worker process)."""
        ...


@dataclass
class PeerSystem:
    peer: Peer

    @property
    def name(self) -> str:
        return self.peer.name

    async def enqueue_single(self, sizes: Sizes) -> float:
        async with fresh_database(self.name) as dsn:
            await self.peer.install(dsn)
            enqueuer = await self.peer.open(dsn)
            try:
                start = time.perf_counter()
                n = await submit_singly(enqueuer, sizes.single, sizes.submitters)
                elapsed = time.perf_counter() - start
            finally:
                await enqueuer.close()
            await self._expect_pending(dsn, n)
            return n / elapsed

    async def enqueue_batch(self, sizes: Sizes) -> float | None:
        if not self.peer.batch_api:
            return None
        async with fresh_database(self.name) as dsn:
            await self.peer.install(dsn)
            enqueuer = await self.peer.open(dsn)
            try:
                start = time.perf_counter()
                await submit_batches(enqueuer, sizes.batch, sizes.batch_size)
                elapsed = time.perf_counter() - start
            finally:
                await enqueuer.close()
            await self._expect_pending(dsn, sizes.batch)
            return sizes.batch / elapsed

    async def end_to_end(self, sizes: Sizes) -> EndToEnd:
        n = sizes.end_to_end
        async with fresh_database(self.name) as dsn:
            await self.peer.install(dsn)
            enqueuer = await self.peer.open(dsn)
            poller = await _connect(dsn)
            try:
                async with Worker(self.peer.name, dsn, sizes.concurrency, target=n) as worker:
                    await self._warm_up(enqueuer, poller, sizes, worker)
                    before = await worker.usage()
                    enqueuer_before = Usage.of_self()
                    start = time.perf_counter()
                    if self.peer.batch_api:
                        await submit_batches(enqueuer, n, sizes.batch_size)
                    else:
                        await submit_singly(enqueuer, n, sizes.submitters)
                    await worker.done(timeout=worker_timeout(n))
                    # Every task has started; now wait for the last completion to be committed.
                    end = await wait_until_zero(
                        poller,
                        self.peer.pending_sql,
                        interval=0.002,
                        timeout=60,
                        check=worker.check,
                    )
                    enqueuer_after = Usage.of_self()
                    after = await worker.usage()
            finally:
                await poller.close()
                await enqueuer.close()
            return end_to_end_result(
                n, end - start, before, after, (enqueuer_before, enqueuer_after)
            )

    async def latency(self, sizes: Sizes) -> Latency:
        count = int(sizes.rate * sizes.seconds)
        with tempfile.TemporaryDirectory(prefix="cronoq-peers-") as tmp:
            record = Path(tmp) / "starts.txt"
            async with fresh_database(self.name) as dsn:
                await self.peer.install(dsn)
                enqueuer = await self.peer.open(dsn)
                poller = await _connect(dsn)
                try:
                    async with Worker(
                        self.peer.name, dsn, sizes.concurrency, target=count, record=record
                    ) as worker:
                        await self._warm_up(enqueuer, poller, sizes, worker)
                        sent, acks = await open_loop(enqueuer, sizes.rate, count)
                        await worker.done(timeout=worker_timeout(count) + sizes.seconds)
                finally:
                    await poller.close()
                    await enqueuer.close()
            return latency_from_record(record, sent, acks)

    async def _warm_up(
        self, enqueuer: Enqueuer, poller: asyncpg.Connection, sizes: Sizes, worker: Worker
    ) -> None:
        """Run ``sizes.warmup`` tasks (negative indexes) through the worker and wait for them."""
        indexes = list(range(-sizes.warmup, 0))
        if self.peer.batch_api:
            await enqueuer.many(indexes)
        else:
            await asyncio.gather(*(enqueuer.one(i) for i in indexes))
        await wait_until_zero(
            poller, self.peer.pending_sql, interval=0.02, timeout=120, check=worker.check
        )

    async def _expect_pending(self, dsn: str, n: int) -> None:
        conn = await _connect(dsn)
        try:
            stored = await conn.fetchval(self.peer.pending_sql)
        finally:
            await conn.close()
        assert stored == n, f"{self.name}: {stored} tasks stored, expected {n}"


async def _connect(dsn: str) -> asyncpg.Connection:
    import asyncpg

    return await asyncpg.connect(dsn)


def worker_timeout(n: int) -> float:
    """Generous: 100 tasks/s at least, and never under two minutes."""
    return max(120.0, n / 100)


def latency_from_record(record: Path, sent: dict[int, float], acks: list[float]) -> Latency:
    """Enqueue-to-start from the worker's record of starts (``index monotonic-time`` lines)."""
    starts: dict[int, float] = {}
    for line in record.read_text().splitlines():
        index, at = line.split()
        starts.setdefault(int(index), float(at))  # a re-run keeps its first start
    missing = set(sent) - set(starts)
    assert not missing, f"{len(missing)} tasks never started"
    return latency_of([starts[i] - t0 for i, t0 in sent.items()], acks)


async def submit_singly(enqueuer: Enqueuer, n: int, submitters: int) -> int:
    per = n // submitters

    async def submitter(first: int) -> None:
        for index in range(first, first + per):
            await enqueuer.one(index)

    await asyncio.gather(*(submitter(k * per) for k in range(submitters)))
    return per * submitters


async def submit_batches(enqueuer: Enqueuer, n: int, size: int) -> None:
    for first in range(0, n, size):
        await enqueuer.many(list(range(first, min(n, first + size))))


async def open_loop(
    enqueuer: Enqueuer, rate: float, count: int
) -> tuple[dict[int, float], list[float]]:
    """Enqueue ``count`` tasks at ``rate``; a slow acknowledgement does not delay the next."""
    sent: dict[int, float] = {}
    acks: list[float] = []

    async def one(index: int) -> None:
        t0 = time.monotonic()
        await enqueuer.one(index)
        acks.append(time.monotonic() - t0)
        sent[index] = t0

    interval = 1.0 / rate
    begin = time.monotonic()
    pending: list[asyncio.Task[None]] = []
    for index in range(count):
        delay = begin + index * interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(one(index)))
    await asyncio.gather(*pending)
    return sent, acks


class Worker:
    """The worker of ``bench.peers.MODULE.PEER`` in a process of its own, connected to
    ``address`` (a DSN, or a gRPC target); lines on its stdout say DONE and STATS."""

    def __init__(
        self,
        module: str,
        address: str,
        concurrency: int,
        *,
        target: int,
        record: Path | None = None,
    ) -> None:
        self.args = [
            sys.executable, "-m", "bench.peers._worker", module, address, str(concurrency),
            str(target), str(record) if record else "-",
        ]  # fmt: skip
        self.process: asyncio.subprocess.Process | None = None
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.done_line: asyncio.Future[str] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __aexit__)

    async def __aenter__(self) -> Worker:
        self.done_line = asyncio.get_running_loop().create_future()
        self.process = await asyncio.create_subprocess_exec(
            *self.args,
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self.stderr,
        )
        self.reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        assert self.done_line is not None
        while line := (await self.process.stdout.readline()).decode():
            if line.startswith("DONE") and not self.done_line.done():
                self.done_line.set_result(line)
            else:
                await self.lines.put(line)
        if not self.done_line.done():
            self.done_line.set_exception(RuntimeError(f"worker exited: {self._stderr_tail()}"))
        await self.lines.put("")

    def check(self) -> None:
        """Raise if the worker process has exited (its stdout is closed)."""
        assert self.process is not None
        if self.process.returncode is not None or (self.reader is not None and self.reader.done()):
            raise RuntimeError(f"worker exited: {self._stderr_tail()}")

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-2000:]

    async def usage(self) -> Usage:
        """The worker's CPU time and peak RSS so far (its stats thread answers on stdin)."""
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(b"STATS\n")
        await self.process.stdin.drain()
        async with asyncio.timeout(30):
            while True:
                line = await self.lines.get()
                if not line:
                    raise RuntimeError(f"worker exited: {self._stderr_tail()}")
                if line.startswith("STATS"):
                    return Usage.parse(line)

    async def done(self, timeout: float) -> None:
        """Wait until the worker has started every counted task."""
        assert self.done_line is not None
        async with asyncio.timeout(timeout):
            await self.done_line

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        await self.process.wait()
        if self.reader is not None:
            await self.reader
        if exc is not None and not isinstance(exc, asyncio.CancelledError):
            tail = self._stderr_tail().strip()
            if tail:
                print(f"worker stderr:\n{tail}", file=sys.stderr)
        self.stderr.close()
