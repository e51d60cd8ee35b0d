"""Outbox rows for the server's tests: written by SQL as an application writes them, corrected
by SQL as an operator would, and the moment the leader quarantines them awaited from its log
line (``outbox row N quarantined: REASON``), not slept for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import typing
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from server_pg import pg_connect
from server_process import ServerProcess

__all__ = [
    "QuarantineLog",
    "correct_options",
    "drop_schema",
    "enqueue",
    "logged_quarantine",
    "reserve_schema",
    "schema_of_its_own",
    "unknown_pool",
    "wait_until",
]

UNKNOWN_POOL = '{"pool": "nope"}'


def unknown_pool(kind: str = "job", payload: bytes = b"x") -> tuple[str, bytes, str]:
    """A row whose pool the server lacks: quarantined with ``UnknownPool``."""
    return kind, payload, UNKNOWN_POOL


async def enqueue(schema: str, *rows: tuple[str, bytes, str]) -> list[int]:
    """Write each (kind, payload, options JSON) row in one transaction; return their ids."""
    conn = await pg_connect()
    try:
        async with conn.transaction():
            return [
                await conn.fetchval(
                    f'SELECT "{schema}".cronoq_enqueue($1, $2, $3::jsonb)', kind, payload, options
                )
                for kind, payload, options in rows
            ]
    finally:
        await conn.close()


async def correct_options(schema: str, row_id: int, options: str) -> None:
    """What an operator does before a requeue: the quarantined row's options, corrected."""
    conn = await pg_connect()
    try:
        updated = await conn.execute(
            f'UPDATE "{schema}".cronoq_outbox_quarantine SET options = $2 WHERE id = $1',
            row_id,
            options,
        )
    finally:
        await conn.close()
    assert updated == "UPDATE 1", (row_id, updated)


async def reserve_schema() -> str:
    """A schema name for a module's server (pg_schema is a test's); skips (or fails, with
    CRONOQ_REQUIRE_POSTGRES=1) when PostgreSQL is unreachable."""
    (await pg_connect()).terminate()
    return f"cronoq_test_{uuid.uuid4().hex[:12]}"


async def drop_schema(name: str) -> None:
    conn = await pg_connect()
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def schema_of_its_own() -> AsyncIterator[str]:
    """``reserve_schema``'s name, dropped afterwards."""
    name = await reserve_schema()
    try:
        yield name
    finally:
        await drop_schema(name)


async def logged_quarantine(server: ServerProcess, row_id: int, times: int = 1) -> str:
    """The reason of a row, once a server process logged its quarantine ``times`` times (a
    requeued row that still cannot become a task is quarantined again)."""
    prefix = f"outbox row {row_id} quarantined: "

    def ours(line: dict[str, str]) -> bool:
        return line.get("msg", "").startswith(prefix)

    line = await server.wait_line(
        lambda line: ours(line) and sum(map(ours, server.lines)) >= times,
        f"the quarantine of outbox row {row_id} ({times} time(s))",
        timeout=10.0,
    )
    return line["msg"].removeprefix(prefix)


class QuarantineLog(logging.Handler):
    """The rows an in-process leader quarantined, by their log lines."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, str] = {}
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        # Logged by the ingest, on the event loop's thread: the event is set from its loop.
        if record.msg == "outbox row %d quarantined: %s":
            row_id, reason = typing.cast(tuple[int, str], record.args)
            self.rows[row_id] = reason
            self._changed.set()

    async def quarantined(self, *row_ids: int, timeout: float = 10.0) -> dict[int, str]:
        """The reasons of these rows, once each was quarantined (again)."""
        async with asyncio.timeout(timeout):
            while not set(row_ids) <= self.rows.keys():
                self._changed.clear()
                await self._changed.wait()
        return {row_id: self.rows[row_id] for row_id in row_ids}

    def forget(self, *row_ids: int) -> None:
        """Before a requeue: the next quarantine of these rows is awaited afresh."""
        for row_id in row_ids:
            self.rows.pop(row_id, None)

    @classmethod
    @contextlib.contextmanager
    def watching(cls) -> Iterator[QuarantineLog]:
        handler = cls()
        logger = logging.getLogger("cronoq.outbox")
        logger.addHandler(handler)
        try:
            yield handler
        finally:
            logger.removeHandler(handler)


async def wait_until(
    condition: Callable[[], Awaitable[bool]] | Callable[[], bool],
    what: str,
    timeout: float = 10.0,
) -> None:
    """Poll a condition that has no event to await (the leader's outbox figures, read once a
    second; a requeued row's task), up to a bounded deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.02)
