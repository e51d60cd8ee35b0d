"""One cronoq node on a PostgreSQL schema, for the real-process tests (``test_pg_processes.py``).

Run as ``python pg_node.py DSN --config '{"schema": ..., "lock_poll": 0.05, ...}' [load]``. It
opens a ``PgStore``, waits for leadership through a ``Scheduler`` and, once leading, submits a
steady load. It reports on stdout, one flushed line per event:

    OPEN <pid>                  the store is open; the node now waits for leadership (a standby)
    LEADING <monotonic>         this node leads (the scheduler started: it has recovered)
    ACK <id>                    a submission returned (durably acknowledged)
    ERR <type> <message>        an operation raised (a submission, or opening / starting)
    LOST <failure>              leadership was lost (the scheduler stopped by itself)
    CLOSED                      SIGTERM was handled: the scheduler and the store were closed

``<monotonic>`` is ``time.monotonic()``, a clock every process on the machine shares.

The test side is ``Node``: it starts a node as an OS process and reads its lines as they come.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from cronoq import Pool, Scheduler, TaskContext
from cronoq_store_postgres import PgStore, PgStoreConfig

__all__ = ["Node"]


def emit(*parts: object) -> None:
    sys.stdout.write(" ".join(str(p) for p in parts).replace("\n", " | ") + "\n")
    sys.stdout.flush()


async def noop(ctx: TaskContext, payload: bytes) -> None:
    return None


async def submit_loop(scheduler: Scheduler, interval: float) -> None:
    while scheduler.running:
        try:
            task_id = await scheduler.submit("load", b"payload")
        except Exception as exc:
            emit("ERR", type(exc).__name__, exc)
        else:
            emit("ACK", task_id)
        await asyncio.sleep(interval)


async def main(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        store = await PgStore.connect(args.dsn, PgStoreConfig(**json.loads(args.config)))
    except Exception as exc:
        emit("ERR", type(exc).__name__, exc)
        return 1
    emit("OPEN", os.getpid())
    scheduler = Scheduler(
        [Pool("default", noop, concurrency=100)], store=store, commit_timeout=args.commit_timeout
    )
    starting = asyncio.ensure_future(scheduler.start())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():  # SIGTERM while a standby
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        await store.close()
        emit("CLOSED")
        return 0
    failure = starting.exception()
    if failure is not None:
        emit("ERR", type(failure).__name__, failure)
        await store.close()
        return 1
    emit("LEADING", repr(time.monotonic()))
    load = [asyncio.ensure_future(submit_loop(scheduler, args.interval))
            for _ in range(args.submitters)]  # fmt: skip
    lost = asyncio.ensure_future(scheduler.leadership_lost())
    await asyncio.wait({lost, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not stop.is_set():
        emit("LOST", repr(scheduler.failure))
    for task in load:
        task.cancel()
    await asyncio.gather(*load, return_exceptions=True)
    await scheduler.close(timeout=2.0)
    await store.close()
    if stop.is_set():
        emit("CLOSED")
    stopping.cancel()
    lost.cancel()
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("dsn")
    parser.add_argument("--config", default="{}", help="PgStoreConfig fields, as JSON")
    parser.add_argument("--commit-timeout", type=float, default=5.0)
    parser.add_argument("--submitters", type=int, default=0, help="concurrent submit loops")
    parser.add_argument("--interval", type=float, default=0.0, help="pause after each submit")
    return parser.parse_args(argv)


# --- the test side -------------------------------------------------------------------------


class Node:
    """A node process, its stdout lines as they come, and ways to wait on them."""

    def __init__(self, process: asyncio.subprocess.Process, name: str) -> None:
        self.process = process
        self.name = name
        self.lines: list[str] = []
        self.stderr = b""
        self.eof = False
        """Every line of stdout was read (the process ended, or closed it)."""
        self._changed = asyncio.Condition()
        self._readers = [
            asyncio.ensure_future(self._read_stdout()),
            asyncio.ensure_future(self._read_stderr()),
        ]

    @classmethod
    async def start(
        cls,
        dsn: str,
        config: PgStoreConfig,
        name: str,
        submitters: int = 0,
        interval: float = 0.0,
        commit_timeout: float = 5.0,
    ) -> Node:
        fields = {
            field: getattr(config, field)
            for field in ("schema", "lock_poll", "keepalive", "session_timeout",
                          "command_timeout", "lock_timeout")
        }  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(Path(__file__)),
            dsn,
            "--config",
            json.dumps(fields),
            "--submitters",
            str(submitters),
            "--interval",
            str(interval),
            "--commit-timeout",
            str(commit_timeout),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(process, name)

    async def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            async with self._changed:
                self.lines.append(raw.decode().rstrip("\n"))
                self._changed.notify_all()
        async with self._changed:
            self.eof = True
            self._changed.notify_all()

    async def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        self.stderr = await self.process.stderr.read()

    def matching(self, prefix: str) -> list[str]:
        return [line for line in self.lines if line.split(" ", 1)[0] == prefix]

    @property
    def acked(self) -> list[int]:
        return [int(line.split()[1]) for line in self.matching("ACK")]

    @property
    def leading_since(self) -> float | None:
        """The monotonic time this node said it leads, if it did."""
        leading = self.matching("LEADING")
        return float(leading[0].split()[1]) if leading else None

    async def wait_for(self, prefix: str, count: int = 1, timeout: float = 10.0) -> str:
        """The ``count``-th line starting with ``prefix``, once it came."""
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(
                    lambda: len(self.matching(prefix)) >= count or self.eof
                )
        except TimeoutError:
            raise AssertionError(f"{self}: no {count}x {prefix} within {timeout}s") from None
        found = self.matching(prefix)
        assert len(found) >= count, f"{self} ended without {count}x {prefix}"
        return found[count - 1]

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)

    async def finished(self, timeout: float = 10.0) -> int:
        """Wait for the process to end and every line of it to be read; its exit code."""
        async with asyncio.timeout(timeout):
            code = await self.process.wait()
            await asyncio.gather(*self._readers)
        return code

    def __str__(self) -> str:
        return (
            f"node {self.name} (pid {self.process.pid}, last lines {self.lines[-5:]}, "
            f"stderr {self.stderr[-2000:]!r})"
        )


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
