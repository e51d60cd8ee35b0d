"""The MemoryStore's outbox: rows "written in a transaction" by ``put`` and ``put_many``, taken
by the commit of the batch that makes their tasks (``OutboxTaken``), as PostgreSQL's are."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cronoq import _validate as check
from cronoq._outbox import (
    MAX_OUTBOX_OPTIONS_BYTES,
    QUARANTINE_PAYLOAD_HEAD,
    OutboxRow,
    OutboxStats,
    QuarantinedRow,
    encode_outbox_options,
)
from cronoq.errors import InvalidArgument

if TYPE_CHECKING:
    from cronoq._memory import MemoryStore

__all__ = ["MemoryOutbox", "OutboxTables"]

_POLL_S = 1.0


class OutboxTables:
    """The outbox of a ``MemoryCluster``, shared by its instances like its other tables."""

    def __init__(self) -> None:
        self.rows: dict[int, OutboxRow] = {}
        self.quarantine: dict[int, QuarantinedRow] = {}
        self.last_id = 0
        # Plain futures, as the cluster's: nothing loop-bound outlives a test's loop.
        self.waiting: list[asyncio.Future[None]] = []

    def add(self, row: OutboxRow) -> None:
        self.rows[row.row_id] = row
        waiting, self.waiting = self.waiting, []
        for future in waiting:
            if not future.done():
                future.set_result(None)


class MemoryOutbox:
    """``MemoryStore(outbox=True).outbox``: a transactional ``OutboxSource``."""

    transactional = True

    def __init__(self, store: MemoryStore, tables: OutboxTables) -> None:
        self._store = store
        self._tables = tables

    def put(self, kind: str, payload: bytes = b"", **options: Any) -> int:
        """Add one row, as an application's transaction would; return its id. The options
        are those of ``submit`` (checked as the PostgreSQL helpers check them)."""
        return self.put_many([(kind, payload, options)])[0]

    def put_many(self, rows: Sequence[tuple[str, bytes, dict[str, Any]]]) -> list[int]:
        """Add several rows at once (all or none)."""
        now = time.time_ns()
        checked = [
            (check.text(kind, "kind"), _payload(payload), encode_outbox_options(options, now))
            for kind, payload, options in rows
        ]
        ids = []
        for kind, payload, options in checked:
            self._tables.last_id += 1
            ids.append(self._tables.last_id)
            self._tables.add(OutboxRow(self._tables.last_id, kind, payload, options, now))
        return ids

    def put_raw(self, kind: str, payload: bytes, options: str) -> int:
        """Add a row as SQL could write it, unchecked (for tests of the quarantine)."""
        self._tables.last_id += 1
        row = OutboxRow(self._tables.last_id, kind, payload, options, time.time_ns())
        self._tables.add(row)
        return row.row_id

    async def read(self, epoch: int, limit: int) -> Sequence[OutboxRow]:
        self._store.check_leading(epoch)
        rows = self._tables.rows
        return [rows[row_id] for row_id in sorted(rows)[:limit]]

    async def take(self, epoch: int, row_ids: Sequence[int]) -> None:
        self._store.check_leading(epoch)
        for row_id in row_ids:
            self._tables.rows.pop(row_id, None)

    async def quarantine(self, epoch: int, rows: Sequence[tuple[int, str]]) -> None:
        self._store.check_leading(epoch)
        now = time.time_ns()
        for row_id, reason in rows:
            row = self._tables.rows.pop(row_id, None)
            if row is not None:
                self._tables.quarantine[row_id] = QuarantinedRow(
                    row.row_id, row.kind, row.payload, row.options, row.enqueued_unix_ns,
                    reason, now, len(row.payload),
                )  # fmt: skip

    async def wait(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self._tables.waiting.append(future)
        try:
            async with asyncio.timeout(_POLL_S):
                await future
        except TimeoutError:
            pass
        finally:
            if future in self._tables.waiting:
                self._tables.waiting.remove(future)

    async def stats(self) -> OutboxStats:
        self._store.check_available()
        rows = self._tables.rows
        oldest = min((r.enqueued_unix_ns for r in rows.values()), default=None)
        return OutboxStats(len(rows), oldest, len(self._tables.quarantine))

    async def quarantined(self, after: int, limit: int) -> Sequence[QuarantinedRow]:
        self._store.check_available()
        kept = self._tables.quarantine
        return [
            dataclasses.replace(
                kept[row_id],
                payload=kept[row_id].payload[:QUARANTINE_PAYLOAD_HEAD],
                options=kept[row_id].options[:MAX_OUTBOX_OPTIONS_BYTES],
            )
            for row_id in sorted(kept)
            if row_id > after
        ][:limit]

    async def requeue(self, row_ids: Sequence[int]) -> int:
        self._store.check_available()
        moved = 0
        for row_id in row_ids:
            row = self._tables.quarantine.pop(row_id, None)
            if row is not None:
                self._tables.add(
                    OutboxRow(row.row_id, row.kind, row.payload, row.options, row.enqueued_unix_ns)
                )
                moved += 1
        return moved

    async def discard(self, row_ids: Sequence[int]) -> int:
        self._store.check_available()
        return sum(self._tables.quarantine.pop(row_id, None) is not None for row_id in row_ids)

    async def close(self) -> None:
        return None


def _payload(value: object) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise InvalidArgument(f"payload must be bytes, got {type(value).__name__}")
    if len(value) > check.DEFAULT_MAX_PAYLOAD_BYTES:  # as the PostgreSQL helpers bound it
        raise InvalidArgument(
            f"payload is {len(value)} bytes, over {check.DEFAULT_MAX_PAYLOAD_BYTES}"
        )
    return bytes(value)
