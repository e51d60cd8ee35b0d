"""The measurements of cronoq-server: three processes, as a service is used.

The server (``python -m cronoq_server serve --config FILE``) runs in a process of its own on the
store of the system's module; this measurement process is its client (``AsyncClient``, over
gRPC, on the loopback); the remote worker (``python -m bench.peers._worker _server TARGET ...``)
is a third process, which attaches to the server over gRPC and runs the no-op tasks. So the
server is to cronoq-server's rows what PostgreSQL is to a peer's: the process that the enqueuer
and the worker both talk to. Its CPU and peak RSS in row 3 are read from /proc (the peers'
PostgreSQL backends are not measured).

As for the peers, every task carries its index as its payload, enqueue rows submit tasks that
are ready at once (no worker is attached, so none runs), and a worker row ends when the worker
has started the last task and then a poll every 2 ms (here ``list`` of the live tasks, through
the client) finds none left: the server answers a read only after the steps before it are
committed, so a task it no longer lists as live has its completion committed.

This module is imported by the worker process too (for :data:`PEER`): nothing here imports the
server's packages, which run only in the server's process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import secrets
import signal
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from cronoq import Status, TaskContext, TaskRequest
from cronoq_client import AsyncClient
from cronoq_client import Worker as RemoteWorker

from ._harness import EndToEnd, Latency, Sizes, Usage, end_to_end_result, probe
from ._peer import (
    Worker,
    latency_from_record,
    open_loop,
    submit_batches,
    submit_singly,
    worker_timeout,
)

StoreSection = Callable[[], AbstractAsyncContextManager[str]]
"""Sets up a fresh store and yields the ``[store]`` section of the server's TOML for it."""

LIVE = (Status.WAITING, Status.SCHEDULED, Status.READY, Status.RUNNING, Status.RETRYING)
POOL = "default"
_STARTUP_TIMEOUT_S = 60.0
_STOP_TIMEOUT_S = 30.0
_PAGE = 5_000
_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')

CONFIG = """\
[listen]
grpc = "127.0.0.1:0"
http = "127.0.0.1:0"

[[pools]]
name = "{pool}"
{pool_options}
[store]
{store}
"""
"""Everything not set here is the server's default (packages/cronoq-server/README.md)."""

AUTH = """
[[auth.identities]]
name = "app"
permissions = ["read", "submit"]
submit_pools = ["{pool}"]
token_sha256 = ["{app}"]

[[auth.identities]]
name = "worker"
permissions = ["work"]
work_pools = ["{pool}"]
token_sha256 = ["{worker}"]
"""
"""The ``_auth`` systems: the enqueuer an identity that may read and submit to the pool, the
worker one that may work on it, so every call pays the token check and every heartbeat and
report the pool check (as bench/auth.py sets it up)."""


@dataclass(frozen=True)
class Tokens:
    app: str
    worker: str

    @classmethod
    def fresh(cls) -> Tokens:
        return cls(secrets.token_urlsafe(32), secrets.token_urlsafe(32))

    def config(self) -> str:
        digest = {t: hashlib.sha256(t.encode()).hexdigest() for t in (self.app, self.worker)}
        return AUTH.format(pool=POOL, app=digest[self.app], worker=digest[self.worker])


def _log_fields(line: str) -> dict[str, str]:
    """The key=value pairs of one of the server's log lines (quoted values unquoted)."""
    return {
        key: json.loads(value) if value.startswith('"') else value
        for key, value in _FIELD.findall(line)
    }


class ServerProcess:
    """``python -m cronoq_server serve`` on a config of its own, until it leads and serves."""

    def __init__(
        self,
        store: str,
        directory: Path,
        tokens: Tokens | None = None,
        pool_options: str = "",
        python_options: tuple[str, ...] = (),
    ) -> None:
        """``pool_options``: more TOML lines of the pool's table (``lease_s = 6``);
        ``python_options``: the interpreter's, before ``-m cronoq_server`` (``-X importtime``)."""
        self.config = directory / "server.toml"
        auth = "" if tokens is None else tokens.config()
        config = CONFIG.format(pool=POOL, pool_options=pool_options, store=store)
        self.config.write_text(config + auth)
        self.directory = directory
        self.process: asyncio.subprocess.Process | None = None
        self.port: int | None = None
        self.http_port: int | None = None
        self.leading: asyncio.Future[None] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.tail: deque[str] = deque(maxlen=40)
        self.python_options = python_options

    @property
    def target(self) -> str:
        assert self.port is not None
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def __aenter__(self) -> ServerProcess:
        self.leading = asyncio.get_running_loop().create_future()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, *self.python_options, "-m", "cronoq_server", "serve",
            "--config", str(self.config),
            cwd=self.directory,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        self.reader = asyncio.create_task(self._read())
        try:
            async with asyncio.timeout(_STARTUP_TIMEOUT_S):
                await self.leading
        except BaseException:
            await self._stop()
            raise
        return self

    async def _read(self) -> None:
        """Keep the log's tail; learn the port and the moment it serves as the leader."""
        assert self.process is not None and self.process.stderr is not None
        assert self.leading is not None
        while line := (await self.process.stderr.readline()).decode(errors="replace"):
            self.tail.append(line)
            fields = _log_fields(line)
            if fields.get("msg") == "listening":
                self.port = int(fields["grpc_port"])
                self.http_port = int(fields["http_port"])
            elif (
                fields.get("msg") == "serving"
                and fields.get("role") == "leading"
                and not self.leading.done()
            ):
                self.leading.set_result(None)
        if not self.leading.done():
            self.leading.set_exception(RuntimeError(f"cronoq-server exited: {self.log_tail()}"))

    def log_tail(self) -> str:
        return "".join(self.tail)[-2000:]

    def check(self) -> None:
        """Raise if the server process has exited."""
        assert self.process is not None
        if self.process.returncode is not None or (self.reader is not None and self.reader.done()):
            raise RuntimeError(f"cronoq-server exited: {self.log_tail()}")

    def usage(self) -> Usage:
        return Usage.of_pid(self.pid)

    async def _stop(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(_STOP_TIMEOUT_S):
                await self.process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        if self.reader is not None:
            await self.reader

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stop()
        if exc is not None and not isinstance(exc, asyncio.CancelledError):
            print(f"cronoq-server log:\n{self.log_tail()}", file=sys.stderr)


def _payload(index: int) -> bytes:
    return str(index).encode()


class _ClientEnqueuer:
    """The peers' enqueuer interface over ``AsyncClient``: ``Submit`` and ``SubmitMany``."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def one(self, index: int) -> None:
        await self.client.submit("noop", _payload(index))

    async def many(self, indexes: list[int]) -> None:
        await self.client.submit_many([TaskRequest("noop", _payload(i)) for i in indexes])

    async def close(self) -> None:
        await self.client.close()


@dataclass
class ServerSystem:
    name: str
    store: StoreSection
    auth: bool = False
    """Bearer tokens on: the measuring process is the ``app`` identity, the worker process (which
    reads its token from ``CRONOQ_TOKEN``, as a deployed worker would) the ``worker`` one."""

    @contextlib.asynccontextmanager
    async def _serving(self) -> AsyncIterator[tuple[ServerProcess, _ClientEnqueuer]]:
        tokens = Tokens.fresh() if self.auth else None
        if tokens is not None:
            os.environ["CRONOQ_TOKEN"] = tokens.worker  # for the worker process, started later
        with tempfile.TemporaryDirectory(prefix="cronoq-peers-server-") as tmp:
            async with (
                self.store() as section,
                ServerProcess(section, Path(tmp), tokens) as server,
            ):
                token = None if tokens is None else tokens.app
                enqueuer = _ClientEnqueuer(AsyncClient(server.target, token=token))
                try:
                    yield server, enqueuer
                finally:
                    await enqueuer.close()

    async def enqueue_single(self, sizes: Sizes) -> float:
        async with self._serving() as (_, enqueuer):
            start = time.perf_counter()
            n = await submit_singly(enqueuer, sizes.single, sizes.submitters)
            elapsed = time.perf_counter() - start
            await _expect(enqueuer.client, Status.READY, n)
        return n / elapsed

    async def enqueue_batch(self, sizes: Sizes) -> float:
        async with self._serving() as (_, enqueuer):
            start = time.perf_counter()
            await submit_batches(enqueuer, sizes.batch, sizes.batch_size)
            elapsed = time.perf_counter() - start
            await _expect(enqueuer.client, Status.READY, sizes.batch)
        return sizes.batch / elapsed

    async def end_to_end(self, sizes: Sizes) -> EndToEnd:
        n = sizes.end_to_end
        async with self._serving() as (server, enqueuer):
            client = enqueuer.client
            async with Worker(_MODULE, server.target, sizes.concurrency, target=n) as worker:
                await _warm_up(enqueuer, sizes, worker)
                before = await worker.usage()
                server_before = server.usage()
                enqueuer_before = Usage.of_self()
                start = time.perf_counter()
                await submit_batches(enqueuer, n, sizes.batch_size)
                await worker.done(timeout=worker_timeout(n))
                # Every task has started; now wait for the last completion to be committed.
                end = await _until_finished(client, interval=0.002, timeout=60, check=worker.check)
                enqueuer_after = Usage.of_self()
                server_after = server.usage()
                after = await worker.usage()
            await _expect(client, Status.SUCCEEDED, n + sizes.warmup)
        return end_to_end_result(
            n,
            end - start,
            before,
            after,
            (enqueuer_before, enqueuer_after),
            (server_before, server_after),
        )

    async def latency(self, sizes: Sizes) -> Latency:
        count = int(sizes.rate * sizes.seconds)
        with tempfile.TemporaryDirectory(prefix="cronoq-peers-") as tmp:
            record = Path(tmp) / "starts.txt"
            async with (
                self._serving() as (server, enqueuer),
                Worker(
                    _MODULE, server.target, sizes.concurrency, target=count, record=record
                ) as worker,
            ):
                await _warm_up(enqueuer, sizes, worker)
                sent, acks = await open_loop(enqueuer, sizes.rate, count)
                await worker.done(timeout=worker_timeout(count) + sizes.seconds)
                # Not timed: with the last reports in, the server has no attempt to drain.
                await _until_finished(
                    enqueuer.client, interval=0.02, timeout=60, check=worker.check
                )
            return latency_from_record(record, sent, acks)


async def _warm_up(enqueuer: _ClientEnqueuer, sizes: Sizes, worker: Worker) -> None:
    """Run ``sizes.warmup`` tasks (negative indexes) through the worker and wait for them."""
    await enqueuer.many(list(range(-sizes.warmup, 0)))
    await _until_finished(enqueuer.client, interval=0.02, timeout=120, check=worker.check)


async def _until_finished(
    client: AsyncClient, *, interval: float, timeout: float, check: Callable[[], None]
) -> float:
    """Poll until the server lists no live task; the ``perf_counter()`` when it did."""
    deadline = time.monotonic() + timeout
    while True:
        left = await client.list(status=LIVE, limit=1)
        now = time.perf_counter()
        if not left:
            return now
        check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"tasks still live after {timeout} s, the first {left[0]}")
        await asyncio.sleep(interval)


async def _expect(client: AsyncClient, status: Status, n: int) -> None:
    found, after = 0, 0
    while page := await client.list(status=status, limit=_PAGE, after=after):
        found += len(page)
        after = page[-1].task_id
    assert found == n, f"{found} tasks {status}, expected {n}"
    if status is Status.SUCCEEDED:
        assert not await client.list(status=LIVE, limit=1), "tasks left unfinished"


# --- the worker process -------------------------------------------------------------------

_MODULE = "_server"
"""This module, as the worker process imports it (``python -m bench.peers._worker _server``)."""


class _RemoteWorker:
    """The worker process's side: ``cronoq_client.Worker`` with one pool, attached to the
    server (one Attach stream; a Report per attempt; heartbeats as the Worker schedules
    them)."""

    worker_loop: Literal["asyncio", "uvloop"] = "asyncio"

    async def serve(self, target: str, concurrency: int) -> None:
        async def noop(ctx: TaskContext, payload: bytes) -> None:
            probe.started(int(payload))

        await RemoteWorker(target, pools={POOL: noop}, slots=concurrency).run()
        raise RuntimeError("the remote worker stopped")


PEER = _RemoteWorker()
