"""One cronoq node on a SQLite file, for the real-process tests (``test_sqlite_processes.py``).

Run as ``python sqlite_node.py DB --config '{"lease_ttl": 1.5, ...}' [load options]``. It opens
a ``SqliteStore``, waits for leadership through a ``Scheduler`` and, once leading, submits the
load its options ask for. It reports on stdout, one flushed line per event:

    OPEN <pid>              the store is open; the node now waits for leadership (a standby)
    LEADING <epoch>         this node leads (the scheduler started)
    ACK <id>                a submission returned (durably acknowledged)
    RUN <id> <attempt>      an attempt of a "block" task started
    ERR <type> <message>    an operation raised (a submission, or opening / starting)
    LOADDONE <acks>         the ``--duration`` of submit load is over
    LOST <failure>          leadership was lost (the scheduler stopped by itself)
    LOG <level> <message>   a warning or error logged by cronoq
    CLOSED                  SIGTERM was handled: ``scheduler.close()`` and ``store.close()`` ran
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading

from cronoq import Pool, RetryPolicy, Scheduler, TaskContext, TaskRequest
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig

_out = threading.Lock()
# Set when the node stops, so that the blocking attempts' threads end and the process can exit.
_release = threading.Event()


def emit(*parts: object) -> None:
    line = " ".join(str(p) for p in parts).replace("\n", " | ")
    with _out:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class _EmitWarnings(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        emit("LOG", record.levelname, record.name, record.getMessage())


def block(ctx: TaskContext, payload: bytes) -> bytes:
    """A blocking attempt (run in a thread) that lasts until it is cancelled or the node ends."""
    emit("RUN", ctx.task_id, ctx.attempt)
    while not ctx.cancelled and not _release.is_set():
        _release.wait(0.05)
    return b"released"


async def noop(ctx: TaskContext, payload: bytes) -> None:
    return None


async def submit_loop(scheduler: Scheduler, interval: float, until: float | None) -> int:
    loop = asyncio.get_running_loop()
    acks = 0
    while scheduler.running and (until is None or loop.time() < until):
        try:
            task_id = await scheduler.submit("load", b"payload")
        except Exception as exc:
            emit("ERR", type(exc).__name__, exc)
        else:
            acks += 1
            emit("ACK", task_id)
        await asyncio.sleep(interval)
    return acks


async def submit_blocking(scheduler: Scheduler, count: int) -> None:
    retry = RetryPolicy.exponential(5, initial=0.05, jitter=0.0)
    requests = [TaskRequest("block", pool="block", retry=retry) for _ in range(count)]
    try:
        ids = await scheduler.submit_many(requests)
    except Exception as exc:
        emit("ERR", type(exc).__name__, exc)
        return
    for task_id in ids:
        emit("ACK", task_id)


async def run_load(scheduler: Scheduler, args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    until = None if args.duration is None else loop.time() + args.duration
    if args.block:
        await submit_blocking(scheduler, args.block)
    acks = await asyncio.gather(
        *(submit_loop(scheduler, args.interval, until) for _ in range(args.submitters))
    )
    if args.duration is not None:
        emit("LOADDONE", sum(acks))


async def main(args: argparse.Namespace) -> int:
    handler = _EmitWarnings(logging.WARNING)
    logging.getLogger("cronoq").addHandler(handler)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        store = await SqliteStore.open(args.db, SqliteStoreConfig(**json.loads(args.config)))
    except Exception as exc:
        emit("ERR", type(exc).__name__, exc)
        return 1
    emit("OPEN", os.getpid())
    pools = [Pool("default", noop, concurrency=100), Pool("block", block, concurrency=100)]
    scheduler = Scheduler(pools, store=store, commit_timeout=args.commit_timeout)
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
    if starting.exception() is not None:
        emit("ERR", type(starting.exception()).__name__, starting.exception())
        await store.close()
        return 1
    emit("LEADING", store._epoch)
    load = asyncio.ensure_future(run_load(scheduler, args))
    lost = asyncio.ensure_future(scheduler.leadership_lost())
    await asyncio.wait({lost, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if not stop.is_set():
        emit("LOST", repr(scheduler.failure))
    load.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await load
    _release.set()
    if stop.is_set():
        await scheduler.close(timeout=5.0)
    await store.close()
    if stop.is_set():
        emit("CLOSED")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("db")
    parser.add_argument("--config", default="{}", help="SqliteStoreConfig fields, as JSON")
    parser.add_argument("--commit-timeout", type=float, default=5.0)
    parser.add_argument("--block", type=int, default=0, help="blocking tasks to submit at once")
    parser.add_argument("--submitters", type=int, default=0, help="concurrent submit loops")
    parser.add_argument("--interval", type=float, default=0.0, help="pause after each submit")
    parser.add_argument("--duration", type=float, default=None, help="seconds of submit load")
    return parser.parse_args(argv)


if __name__ == "__main__":
    try:
        code = asyncio.run(main(parse(sys.argv[1:])))
    finally:
        _release.set()
    sys.exit(code)
