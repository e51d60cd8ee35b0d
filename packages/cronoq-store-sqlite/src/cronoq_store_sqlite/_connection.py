"""A sqlite3 connection on a thread of its own, which runs whole functions of it.

The store hands each transaction to the thread as one function (BEGIN ... COMMIT, or ROLLBACK
on any failure): one hop from the event loop per transaction, however many statements it
holds, and nothing can interleave with it or leave it open. A caller cancelled while it runs
only stops waiting; the function still runs to its end, and functions run in the order they
were given, so a later one always sees what an earlier one did.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any, TypeVar

__all__ = ["Connection"]

_T = TypeVar("_T")
_Job = tuple["asyncio.Future[Any] | None", Callable[[], Any]]


class Connection:
    """One sqlite3 connection, opened, used and closed on its thread only."""

    def __init__(self, jobs: SimpleQueue[_Job | None], db: sqlite3.Connection) -> None:
        self._jobs = jobs
        self._db = db
        self._closed = False

    @classmethod
    async def open(cls, path: str, *, cached_statements: int) -> Connection:
        """Connect on a new thread (implicit transactions off); sqlite3's errors pass."""
        jobs: SimpleQueue[_Job | None] = SimpleQueue()
        # A daemon: a store never closed must not keep the interpreter from exiting. Its
        # transaction, if one was open, is then lost as in a crash, which SQLite survives.
        threading.Thread(target=_serve, args=(jobs,), name="cronoq-sqlite", daemon=True).start()
        opened: list[sqlite3.Connection] = []

        def connect() -> sqlite3.Connection:
            db = sqlite3.connect(path, isolation_level=None, cached_statements=cached_statements)
            opened.append(db)
            return db

        future: asyncio.Future[sqlite3.Connection] = asyncio.get_running_loop().create_future()
        jobs.put((future, connect))
        try:
            db = await future
        except BaseException:  # a failed connect, or a caller cancelled while it ran
            jobs.put((None, lambda: _close_each(opened)))
            jobs.put(None)
            raise
        return cls(jobs, db)

    async def run(self, function: Callable[[sqlite3.Connection], _T]) -> _T:
        """``function(db)`` on the thread, after every function given before it."""
        if self._closed:
            raise sqlite3.ProgrammingError("the connection is closed")
        future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
        db = self._db
        self._jobs.put((future, lambda: function(db)))
        return await future

    def close(self) -> asyncio.Future[None]:
        """Close after the functions already given; the thread then ends. The close is queued
        before this returns, so it happens even if nobody awaits the future it returns."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._closed:
            future.set_result(None)
            return future
        self._closed = True
        self._jobs.put((future, self._db.close))
        self._jobs.put(None)
        return future


def _serve(jobs: SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        future, function = job
        try:
            result = function()
        except BaseException as exc:  # handed to the waiting caller, whatever it is
            if isinstance(exc, StopIteration):  # a future refuses it (it would never resolve)
                exc = RuntimeError(f"a connection's function raised {exc!r}")
            _hand_over(future, _set_exception, exc)
        else:
            _hand_over(future, _set_result, result)


def _hand_over(future: asyncio.Future[Any] | None, setter: Callable[..., None], value: Any) -> None:
    if future is None:
        return
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        future.get_loop().call_soon_threadsafe(setter, future, value)


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _close_each(connections: list[sqlite3.Connection]) -> None:
    for db in connections:
        db.close()
