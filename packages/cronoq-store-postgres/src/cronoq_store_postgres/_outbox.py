"""PgOutbox: the outbox tables as a ``cronoq.store.OutboxSource``.

The store's own (``PgStore.outbox``) is transactional: the commit that makes a batch's tasks
durable deletes its rows (``OutboxTaken``), reads wait for any write of the leader whose
outcome it did not learn, and the quarantine is fenced like a commit. One in another database
(``PgOutbox.connect``) is not: the ingest keys rows by themselves and deletes them after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import asyncpg

from cronoq._outbox import MAX_OUTBOX_OPTIONS_BYTES, QUARANTINE_PAYLOAD_HEAD
from cronoq.errors import Fenced, InvalidArgument, StoreFatal
from cronoq.store import OutboxRow, OutboxStats, QuarantinedRow
from cronoq_store_postgres._errors import CLASSIFIED, CLASSIFIED_OR_BAD_DSN, classify
from cronoq_store_postgres._schema import Connection, ensure_schema, outbox_channel, quote_ident

__all__ = ["OutboxSql", "PgOutbox"]

log = logging.getLogger("cronoq.postgres")
_LISTEN_ERRORS: tuple[type[BaseException], ...] = (*CLASSIFIED_OR_BAD_DSN, TimeoutError, OSError)

Statement = Callable[[Connection], Awaitable[Any]]
Plain = Callable[[str, Statement], Awaitable[Any]]
"""(what it does, for errors; the statement) -> its result."""


class Leading(Protocol):
    """Runs a statement as ``epoch``'s leader writes, after any write of it in doubt (with
    ``reads``: only waits for those, then reads beside the commits)."""

    def __call__(
        self, epoch: int, doing: str, statement: Statement, *, reads: bool = False
    ) -> Awaitable[Any]: ...


READ_BYTES = 64 * 1024 * 1024
"""About how many bytes of payload one read of the outbox returns (at least one row)."""


class OutboxSql:
    """The outbox's statements over one schema. ``fence``: the CTE that gates a quarantine on
    the leader row ($1 epoch, $2 generation), or one that passes them through."""

    def __init__(self, schema: str, fence: str | None = None) -> None:
        s = quote_ident(schema)
        self.channel = outbox_channel(s)
        fence = fence or "fence AS (SELECT $1::bigint, $2::bigint)"
        enqueued_ns = "(extract(epoch FROM enqueued_at) * 1000000)::bigint * 1000"
        # Up to $1 rows and about $2 bytes of payload (always one row at least): a backlog of
        # large payloads is read, checked and committed a few megabytes at a time. The sizes
        # come from the rows' headers (octet_length does not detoast).
        self.read = f"""
            SELECT id, kind, payload, options::text, {enqueued_ns} FROM (
                SELECT id, kind, payload, options, enqueued_at,
                    sum(octet_length(payload)) OVER (ORDER BY id) - octet_length(payload)
                        AS before
                FROM (SELECT * FROM {s}.cronoq_outbox ORDER BY id LIMIT $1) AS head
            ) AS sized
            WHERE before < $2 ORDER BY id"""
        # What the leader's role needs to ingest: without it, the ingest stops before a
        # commit that deletes rows is refused (which would stop the whole scheduler).
        # has_table_privilege is true if ANY privilege of a list is held: one call each.
        self.privileges = """
            SELECT bool_and(has_table_privilege(t, p)) FROM (VALUES
                ($1, 'SELECT'), ($1, 'INSERT'), ($1, 'DELETE'),
                ($2, 'SELECT'), ($2, 'INSERT'), ($2, 'UPDATE'), ($2, 'DELETE')
            ) AS needed(t, p)"""
        self.tables = (f"{s}.cronoq_outbox", f"{s}.cronoq_outbox_quarantine")
        self.take = f"DELETE FROM {s}.cronoq_outbox WHERE id = ANY($1::bigint[])"
        self.quarantine = f"""
            WITH {fence}, moved AS (
                DELETE FROM {s}.cronoq_outbox AS o
                USING unnest($3::bigint[], $4::text[]) AS u(id, reason)
                WHERE o.id = u.id AND EXISTS (SELECT FROM fence)
                RETURNING o.id, o.kind, o.payload, o.options, o.enqueued_at, u.reason
            ), kept AS (
                INSERT INTO {s}.cronoq_outbox_quarantine
                    (id, kind, payload, options, enqueued_at, reason)
                SELECT id, kind, payload, options::text, enqueued_at, reason FROM moved
                -- An id quarantined before (a row an application wrote with an id of its
                -- choosing): the newer row replaces it rather than vanishing.
                ON CONFLICT (id) DO UPDATE SET kind = excluded.kind, payload = excluded.payload,
                    options = excluded.options, enqueued_at = excluded.enqueued_at,
                    reason = excluded.reason, quarantined_at = now()
            )
            SELECT count(*) FROM fence"""
        self.stats = f"""
            SELECT (SELECT count(*) FROM {s}.cronoq_outbox),
                (SELECT {enqueued_ns.replace("enqueued_at", "min(enqueued_at)")}
                    FROM {s}.cronoq_outbox),
                (SELECT count(*) FROM {s}.cronoq_outbox_quarantine)"""
        self.quarantined = f"""
            SELECT id, kind, substring(payload FROM 1 FOR {QUARANTINE_PAYLOAD_HEAD:d}),
                left(options, {MAX_OUTBOX_OPTIONS_BYTES:d}), {enqueued_ns}, reason,
                {enqueued_ns.replace("enqueued_at", "quarantined_at")}, octet_length(payload)
            FROM {s}.cronoq_outbox_quarantine WHERE id > $1 ORDER BY id LIMIT $2"""
        # Back with their ids: a row keeps its identity (and derived key) through a requeue.
        self.requeue = f"""
            WITH moved AS (
                DELETE FROM {s}.cronoq_outbox_quarantine WHERE id = ANY($1::bigint[])
                RETURNING id, kind, payload, options, enqueued_at
            ), back AS (
                INSERT INTO {s}.cronoq_outbox (id, kind, payload, options, enqueued_at)
                OVERRIDING SYSTEM VALUE
                SELECT id, kind, payload, options::jsonb, enqueued_at FROM moved
            )
            SELECT count(*) FROM moved"""
        self.discard = f"""
            WITH gone AS (
                DELETE FROM {s}.cronoq_outbox_quarantine WHERE id = ANY($1::bigint[])
                RETURNING 1
            )
            SELECT count(*) FROM gone"""


class _Listener:
    """A dedicated connection LISTENing on the outbox's channel, opened at the first wait and
    reopened after a failure; without it the poll alone ingests."""

    def __init__(self, dsn: str, channel: str, timeout: float) -> None:
        self._dsn = dsn
        self._channel = channel
        self._timeout = timeout
        self._conn: asyncpg.Connection | None = None
        self._event = asyncio.Event()
        self._failing = False

    def arm(self) -> None:
        """Called before a read: a notification from now on wakes the next wait."""
        self._event.clear()

    async def wait(self, poll: float) -> None:
        await self._listen()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(poll):
                await self._event.wait()

    async def _listen(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            return
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(
                self._dsn,
                timeout=self._timeout,
                server_settings={"application_name": "cronoq-outbox"},
            )
            await conn.add_listener(self._channel, lambda *_: self._event.set())
        except _LISTEN_ERRORS as exc:
            if conn is not None:
                conn.terminate()
            if not self._failing:  # once, not at every poll while it lasts
                log.warning("outbox: cannot LISTEN (%s); polling only until it can", exc)
            self._failing = True
            return
        except BaseException:
            if conn is not None:
                conn.terminate()
            raise
        self._failing = False
        self._conn = conn
        self._event.set()  # rows may have come while nobody listened: read once more

    def close(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
            self._conn = None


class PgOutbox:
    """An ``OutboxSource`` over a schema's ``cronoq_outbox`` (see the module docstring)."""

    def __init__(
        self,
        sql: OutboxSql,
        dsn: str,
        *,
        poll: float,
        timeout: float,
        transactional: bool,
        leading: Leading,
        plain: Plain,
        generation: Callable[[], int] = lambda: 0,
        pool: asyncpg.Pool | None = None,
        schema: str = "public",
        max_read_bytes: int = READ_BYTES,
    ) -> None:
        """``leading(epoch, doing, statement, reads=)`` runs a statement as that epoch's leader
        writes (see ``Leading``); ``plain(doing, statement)`` runs one on any connection."""
        self._sql = sql
        self._poll = poll
        self._transactional = transactional
        self._leading = leading
        self._plain = plain
        self._generation = generation
        self._pool = pool
        self._schema = schema
        self._max_read_bytes = max_read_bytes
        self._checked: int | None = None
        """The epoch whose grants were checked (a new leadership checks again)."""
        self._listener = _Listener(dsn, sql.channel, timeout)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        schema: str = "public",
        poll: float = 1.0,
        timeout: float = 10.0,
        migrate: str = "auto",
    ) -> PgOutbox:
        """An outbox in a database other than the scheduler's store (``Scheduler(outbox=)``):
        ingested at least once, deduplicated by a key derived from each row (docs/outbox.md).
        ``migrate="auto"`` creates the schema's tables if missing."""
        if not isinstance(dsn, str) or not dsn or "\x00" in dsn:
            raise InvalidArgument("dsn must be a non-empty str without NUL")
        for name, value in (("poll", poll), ("timeout", timeout)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidArgument(f"{name} must be a positive number of seconds: {value!r}")
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=1, max_size=2, timeout=timeout, command_timeout=timeout,
                server_settings={"application_name": "cronoq-outbox"},
            )  # fmt: skip
        except CLASSIFIED_OR_BAD_DSN as exc:
            raise classify(exc, "connecting to the outbox") from exc
        try:
            async with pool.acquire() as conn:
                await ensure_schema(conn, schema, migrate)
        except BaseException:
            await pool.close()
            raise

        async def run(doing: str, statement: Statement) -> Any:
            try:
                async with pool.acquire() as conn:
                    return await statement(conn)
            except CLASSIFIED as exc:
                raise classify(exc, doing) from exc

        return cls(
            OutboxSql(schema), dsn, poll=poll, timeout=timeout, transactional=False,
            leading=lambda _epoch, doing, statement, reads=False: run(doing, statement),
            plain=run, pool=pool, schema=schema,
        )  # fmt: skip

    @property
    def transactional(self) -> bool:
        return self._transactional

    async def read(self, epoch: int, limit: int) -> Sequence[OutboxRow]:
        self._listener.arm()
        if self._checked != epoch:
            allowed = await self._leading(
                epoch,
                "checking the outbox's grants",
                lambda c: c.fetchval(self._sql.privileges, *self._sql.tables),
            )
            if not allowed:
                raise StoreFatal(
                    f"the role may not ingest the outbox of schema {self._schema!r}: grant it "
                    "SELECT, INSERT, DELETE on cronoq_outbox and SELECT, INSERT, UPDATE, DELETE on "
                    "cronoq_outbox_quarantine (docs/stores/postgres.md), or turn the outbox off "
                    "(outbox = false), and restart the leader"
                )
            self._checked = epoch
        sql, cap = self._sql.read, self._max_read_bytes
        rows = await self._leading(
            epoch, "reading the outbox", lambda c: c.fetch(sql, limit, cap), reads=True
        )
        return [OutboxRow(*row) for row in rows]

    async def take(self, epoch: int, row_ids: Sequence[int]) -> None:
        sql, ids = self._sql.take, list(row_ids)
        await self._leading(epoch, "deleting outbox rows", lambda c: c.execute(sql, ids))

    async def quarantine(self, epoch: int, rows: Sequence[tuple[int, str]]) -> None:
        sql = self._sql.quarantine
        ids = [row_id for row_id, _ in rows]
        reasons = [reason for _, reason in rows]
        leading = await self._leading(
            epoch,
            "quarantining outbox rows",
            lambda c: c.fetchval(sql, epoch, self._generation(), ids, reasons),
        )
        if leading == 0:
            raise Fenced(f"epoch {epoch} was superseded: it quarantines nothing")

    async def wait(self) -> None:
        await self._listener.wait(self._poll)

    async def stats(self) -> OutboxStats:
        sql = self._sql.stats
        row = await self._plain("reading the outbox", lambda c: c.fetchrow(sql))
        return OutboxStats(int(row[0]), row[1], int(row[2]))

    async def quarantined(self, after: int, limit: int) -> Sequence[QuarantinedRow]:
        sql = self._sql.quarantined
        rows = await self._plain("reading the quarantine", lambda c: c.fetch(sql, after, limit))
        return [QuarantinedRow(*row) for row in rows]

    async def requeue(self, row_ids: Sequence[int]) -> int:
        sql = self._sql.requeue
        ids = list(row_ids)
        return int(await self._plain("requeueing outbox rows", lambda c: c.fetchval(sql, ids)))

    async def discard(self, row_ids: Sequence[int]) -> int:
        sql = self._sql.discard
        ids = list(row_ids)
        return int(await self._plain("discarding outbox rows", lambda c: c.fetchval(sql, ids)))

    def stop_listening(self) -> None:
        self._listener.close()

    async def close(self) -> None:
        self._listener.close()
        if self._pool is not None:
            await self._pool.close()
