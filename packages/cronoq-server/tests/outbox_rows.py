"""Outbox rows for the server's tests: written by SQL as an application writes them, corrected
by SQL as an operator would, and the moment the leader quarantines them awaited from its log
line (``outbox row N quarantined: REASON``), not slept for."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from server_pg import pg_connect

__all__ = ["QuarantineLog", "correct_options", "enqueue", "unknown_pool", "wait_until"]

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


class QuarantineLog(logging.Handler):
    """The rows an in-process leader quarantined, by their log lines."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[int, str] = {}
        self._changed = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        # Logged by the ingest, on the event loop's thread: the event is set from its loop.
        if record.msg == "outbox row %d quarantined: %s":
            row_id, reason = record.args  # type: ignore[misc]
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
