"""PgStore: the ``Store`` protocol over PostgreSQL, through asyncpg.

Every batch is ONE statement (``_commit``), gated on the leader row's epoch and generation.
Every other write (pruning, quarantine) is gated on the same row in its own statement.

The generation fences this leader's own writes whose outcome it never learned. A statement
whose connection broke or timed out may still be running on the server, and commit later; the
first write after such a failure, and every ``recover()``, first raises the generation
(``_settle``). That update queues behind the orphan if it holds the leader row, so the orphan
is over before anything is read or written; if the orphan has not reached the row yet, its
gate no longer matches, and it writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg

from cronoq.errors import CronoqError, Fenced, InvalidArgument, StoreError, StoreFatal, Unavailable
from cronoq.store import (
    RECOVERY_COLUMNS,
    TASK_COLUMNS,
    AttemptEnded,
    Lease,
    Mutation,
    OccurrenceOutcome,
    OccurrenceRecorded,
    RecoveredState,
    ScheduleRecord,
    TaskRecord,
    TimeBase,
    collapse_batch,
    decode_looked_up_record,
    decode_schedule_spec,
    decode_task_record,
    prune_in_batches,
    quarantine_message,
    shielded,
    undecodable_reason,
)
from cronoq_store_postgres._commit import ID_CLASH, STATEMENT_CACHE_SIZE, CommitStatements
from cronoq_store_postgres._config import PgStoreConfig
from cronoq_store_postgres._direct import verify_direct
from cronoq_store_postgres._errors import CLASSIFIED, CLASSIFIED_OR_BAD_DSN, classify
from cronoq_store_postgres._leader import LockSession, session_settings
from cronoq_store_postgres._outbox import OutboxSql, PgOutbox, Statement
from cronoq_store_postgres._schema import (
    SCHEMA_VERSION,
    Connection,
    SchemaMigration,
    ensure_schema,
    lock_key,
    migrate,
    quote_ident,
)

__all__ = ["PgStore"]

log = logging.getLogger("cronoq.postgres")
NS = 1_000_000_000
_MIN_BIGINT, _MAX_BIGINT = -(2**63), 2**63 - 1
_T = TypeVar("_T")


class _Sql:
    """The statements of one schema, built once with the quoted schema name."""

    def __init__(self, schema: str) -> None:
        s = quote_ident(schema)
        self.bump_epoch = (
            f"UPDATE {s}.cronoq_leader SET epoch = epoch + 1 WHERE id = 1 "
            "RETURNING epoch, generation"
        )
        # GREATEST: a raise that was itself left in doubt, landing late, takes nothing back.
        self.settle = f"""
            UPDATE {s}.cronoq_leader SET generation = GREATEST(generation, $2)
            WHERE id = 1 AND epoch = $1 RETURNING generation"""
        self.leader = f"SELECT epoch, max_task_id FROM {s}.cronoq_leader WHERE id = 1"
        # A shared lock on the leader row, for the writes that do not update it: a takeover's
        # epoch bump waits until the statement is over, and a bump that came first (or a
        # raised generation) leaves the fence empty (FOR KEY SHARE would let the bump through).
        self.fence = fence = f"""fence AS (
                SELECT 1 FROM {s}.cronoq_leader
                WHERE id = 1 AND epoch = $1 AND generation = $2 FOR SHARE
            )"""
        self.commit = CommitStatements(s)
        self.recover = f"""
            SELECT {RECOVERY_COLUMNS} FROM {s}.cronoq_tasks
            WHERE finished_ns IS NULL OR finished_ns >= $1 OR lease_hash IS NOT NULL OR id IN (
                SELECT unnest(after_ids) FROM {s}.cronoq_tasks WHERE finished_ns IS NULL)
            ORDER BY id"""
        self.quarantine = f"""
            WITH {fence}, marked AS (
                UPDATE {s}.cronoq_tasks SET status = 'failed', message = u.reason,
                    updated_ns = $5, finished_ns = COALESCE(finished_ns, $5),
                    lease_epoch = NULL, lease_hash = NULL
                FROM unnest($3::bigint[], $4::text[]) AS u(id, reason)
                WHERE {s}.cronoq_tasks.id = u.id AND EXISTS (SELECT FROM fence)
            )
            SELECT count(*) FROM fence"""
        self.schedules = (
            f"SELECT name, spec, next_ns, paused, last_task_id FROM {s}.cronoq_schedules"
        )
        self.paused_pools = f"SELECT name FROM {s}.cronoq_pools WHERE paused"
        self.lookup = f"SELECT {TASK_COLUMNS} FROM {s}.cronoq_tasks WHERE "
        self.output = f"SELECT output FROM {s}.cronoq_tasks WHERE id = $1"
        self.attempts = f"""
            SELECT attempt, started_ns, ended_ns, message FROM {s}.cronoq_attempts
            WHERE task_id = $1 ORDER BY attempt"""
        # A record whose outcome this build does not know (a newer build's, or written by
        # hand) is skipped by the query, so that it neither fails the read nor shortens a page.
        # No bound ($2 NULL) reads all: each call is planned for its values.
        known = ", ".join(f"'{outcome.value}'" for outcome in OccurrenceOutcome)
        self.occurrences = f"""
            SELECT due_ns, until_ns, outcome, task_id, at_ns, message
            FROM {s}.cronoq_occurrences
            WHERE schedule = $1 AND ($2::bigint IS NULL OR due_ns < $2) AND outcome IN ({known})
            ORDER BY due_ns DESC LIMIT $3"""
        self.prune = f"""
            WITH {fence}, pruned AS (
                DELETE FROM {s}.cronoq_tasks WHERE id IN (
                    SELECT id FROM {s}.cronoq_tasks
                    WHERE finished_ns < $3 AND lease_hash IS NULL LIMIT $4)
                    AND EXISTS (SELECT FROM fence)
                RETURNING id
            ), pruned_attempts AS (
                DELETE FROM {s}.cronoq_attempts WHERE task_id IN (SELECT id FROM pruned)
            ), pruned_occurrences AS (
                DELETE FROM {s}.cronoq_occurrences WHERE (schedule, due_ns) IN (
                    SELECT schedule, due_ns FROM {s}.cronoq_occurrences WHERE until_ns < $3
                    LIMIT $4)
                    AND EXISTS (SELECT FROM fence)
                RETURNING 1
            )
            SELECT (SELECT count(*) FROM fence) AS leading,
                (SELECT count(*) FROM pruned) AS pruned,
                (SELECT count(*) FROM pruned_occurrences) AS records"""


class _Connection(asyncpg.Connection):
    def get_reset_query(self) -> str:
        # Pooled connections keep no session state that matters (no LISTEN, no advisory lock;
        # only the marker of verify_direct):
        # skip the reset query, a round trip per release, i.e. per commit. An open transaction
        # is still rolled back on release.
        return ""


class PgStore:
    """PostgreSQL store: replicas on one schema elect a leader by advisory lock."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        self._dsn = dsn
        self._pool = pool
        self._config = config
        self._sql = _Sql(config.schema)
        self._lock_session = LockSession(dsn, config, lock_key("leader", config.schema))
        self._serial = asyncio.Lock()
        self._epoch: int | None = None
        self._generation = 0
        """The generation this leader's writes are gated on (see the module's docstring)."""
        self._raised_to = 0
        """The highest generation this leader asked for: each new raise asks for more."""
        self._unsettled = False
        """A write of this leader may still land: settle before the next one."""
        self._time_base = TimeBase()
        self._pruning: asyncio.Task[None] | None = None
        self._closed = False
        self._outbox = (
            PgOutbox(
                OutboxSql(config.schema, fence=self._sql.fence),
                dsn,
                poll=config.outbox_poll,
                timeout=config.session_timeout,
                transactional=True,
                leading=self._outbox_write,
                plain=self._read,
                generation=lambda: self._generation,
                schema=config.schema,
            )
            if config.outbox
            else None
        )

    @property
    def outbox(self) -> PgOutbox | None:
        """The schema's outbox (``docs/outbox.md``), which a Scheduler on this store ingests;
        None if ``config.outbox`` is off."""
        return self._outbox

    @classmethod
    async def connect(cls, dsn: str, config: PgStoreConfig | None = None) -> PgStore:
        """Connect a pool, and check the schema is at this build's version: create or
        upgrade it if not (``config.migrate="auto"``), or refuse (``"never"``)."""
        config = _checked(dsn, config)
        settings = {
            **session_settings(config),
            "lock_timeout": str(round(config.lock_timeout * 1000)),
            # A generic plan for the commit's join on unnest() scans the whole task table once
            # it grows (measured: single-submit throughput fell from 19,836 to 8,705 tasks/s
            # at 100,000 tasks): plan each statement for its arrays.
            "plan_cache_mode": "force_custom_plan",
        }

        async def verify(conn: asyncpg.Connection) -> None:
            # The whole store must reach PostgreSQL directly, not only its lock session: a
            # pooler would drop the settings above as well (docs/stores/postgres.md).
            await verify_direct(conn, settings, "a connection of the store's pool")

        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=config.pool_size,
                connection_class=_Connection,
                statement_cache_size=STATEMENT_CACHE_SIZE,
                command_timeout=config.command_timeout,
                timeout=config.session_timeout,
                server_settings={**settings, "application_name": "cronoq"},
                init=verify,
            )
        except CLASSIFIED_OR_BAD_DSN as exc:
            raise classify(exc, "connecting") from exc
        try:
            async with pool.acquire() as conn:
                await ensure_schema(conn, config.schema, config.migrate)
        except StoreError:
            await pool.close()
            raise
        except CLASSIFIED as exc:
            await pool.close()
            raise classify(exc, f"checking the schema {config.schema!r}") from exc
        return cls(dsn, pool, config)

    @classmethod
    async def migrate(cls, dsn: str, config: PgStoreConfig | None = None) -> SchemaMigration:
        """Create or upgrade ``config.schema`` to this build's version, whatever
        ``config.migrate`` says, and say from which version: the deploy step
        (``cronoq-server migrate``), run as the role that owns the schema, so that replicas
        with ``migrate="never"`` need only read and write. Safe to run again, and beside
        running replicas of this build (they find the schema current)."""
        config = _checked(dsn, config)
        try:
            conn = await asyncpg.connect(
                dsn,
                timeout=config.session_timeout,
                command_timeout=config.command_timeout,
                server_settings={"application_name": "cronoq-migrate"},
            )
        except CLASSIFIED_OR_BAD_DSN as exc:
            raise classify(exc, "connecting") from exc
        try:
            before = await migrate(conn, config.schema)
        except CLASSIFIED as exc:
            raise classify(exc, f"migrating the schema {config.schema!r}") from exc
        finally:
            conn.terminate()
        return SchemaMigration(config.schema, before, SCHEMA_VERSION)

    @property
    def config(self) -> PgStoreConfig:
        return self._config

    # --- leadership -----------------------------------------------------------------------

    async def acquire_leadership(self) -> Lease:
        while True:
            self._check_open()
            waited = await self._lock_session.acquire()
            # The epoch is bumped, and committed, before this leader reads anything.
            try:
                epoch = await shielded(self._bump_epoch())
                break
            except Unavailable as exc:
                log.warning("could not bump the epoch, giving the lock back: %s", exc)
                await self._lock_session.release()
                await asyncio.sleep(self._config.lock_poll)
        self._epoch = epoch
        self._pruning = asyncio.get_running_loop().create_task(self._prune_regularly())
        if waited is None:
            log.info("leading schema %r (epoch %d)", self._config.schema, epoch)
        else:
            log.info(
                "leading schema %r (epoch %d): took the lock after %.1f s as a standby",
                self._config.schema,
                epoch,
                waited,
            )
        return Lease(epoch)

    async def _bump_epoch(self) -> int:
        async with self._serial:
            try:
                async with self._pool.acquire() as conn:
                    row = await conn.fetchrow(self._sql.bump_epoch)
            except CLASSIFIED as exc:
                raise classify(exc, "bumping the epoch") from exc
            assert row is not None
            # A write of an earlier epoch is fenced by the epoch: nothing to settle.
            self._generation = self._raised_to = int(row["generation"])
            self._unsettled = False
        return int(row["epoch"])

    async def leadership_lost(self) -> CronoqError | None:
        return await self._lock_session.lost.wait()

    async def release_leadership(self) -> None:
        self._stop_leading()
        await self._lock_session.release()

    def _stop_leading(self) -> None:
        self._epoch = None
        if self._outbox is not None:
            self._outbox.stop_listening()
        if self._pruning is not None:
            self._pruning.cancel()
            self._pruning = None

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("this PgStore is closed")

    def _check_leading(self, epoch: int | None) -> None:
        if self._lock_session.lost.is_set() or epoch is None or self._epoch != epoch:
            why = self._lock_session.lost.reason
            raise Fenced(
                f"epoch {epoch} no longer leads the schema {self._config.schema!r}"
                + ("" if why is None else f": {why}")
            )

    # --- writes ---------------------------------------------------------------------------

    async def _write(
        self, epoch: int, doing: str, statement: Callable[[Connection], Awaitable[_T]]
    ) -> _T:
        """Run one write of this leader, once no earlier write of it can still land.

        Call with ``_serial`` held. A write that fails in flight leaves the store unsettled:
        its statement may still be running on the server (the client timed out, or its
        connection broke), and commit after we move on.
        """
        self._check_open()
        try:
            async with self._pool.acquire() as conn:
                if self._unsettled:
                    await self._settle(conn, epoch)
                try:
                    return await statement(conn)
                except StoreError:
                    raise
                except BaseException:
                    self._unsettled = True
                    raise
        except CLASSIFIED as exc:
            raise classify(exc, doing) from exc

    async def _settle(self, conn: Connection, epoch: int) -> None:
        """Raise the generation: a write still in flight is over before this returns (it
        holds the leader row, which this waits for), or can no longer write anything."""
        self._unsettled = True
        self._raised_to = max(self._raised_to, self._generation) + 1
        generation = await conn.fetchval(self._sql.settle, epoch, self._raised_to)
        if generation is None:
            raise Fenced(f"epoch {epoch} was superseded by a newer leader")
        self._generation = int(generation)
        self._unsettled = False

    # --- commit ---------------------------------------------------------------------------

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        self._check_leading(epoch)
        await shielded(self._commit(epoch, batch))

    async def _commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        commit = self._sql.commit
        shape, arguments = commit.arguments(collapse_batch(batch), epoch, self._time_base.to_unix)
        async with self._serial:

            async def write(conn: Connection) -> int:
                arguments[2] = self._generation  # as of now: a settle may raise it
                try:
                    try:
                        return int(await conn.fetchval(commit.sql(shape), *arguments))
                    except asyncpg.UniqueViolationError:
                        # A new task's id is taken (the only unique key): the statement wrote
                        # nothing, and the one with ON CONFLICT tells a retry from a clash.
                        retried = commit.sql(shape, taken_ids=True)
                        return int(await conn.fetchval(retried, *arguments))
                except asyncpg.InvalidTextRepresentationError as exc:
                    if ID_CLASH not in str(exc):
                        raise
                    task_id = str(exc).split(ID_CLASH, 1)[1].strip(' "')
                    raise StoreFatal(
                        f"task id {task_id} already holds another task: the batch that reuses "
                        "it was not written. Ids are never reused, so the schema was changed "
                        "behind the store's back (a restored backup?) or this is a bug."
                    ) from exc

            written = await self._write(epoch, "committing a batch", write)
        if written == 0:
            raise Fenced(f"epoch {epoch} was superseded by a newer leader")

    # --- recovery -------------------------------------------------------------------------

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        self._check_leading(epoch)
        return await shielded(self._recover(epoch, time_base, retention_ns))

    async def _recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        self._time_base = time_base
        to_engine = time_base.to_engine
        sql = self._sql
        tasks: list[TaskRecord] = []
        quarantined: list[tuple[int, str]] = []
        schedules: list[ScheduleRecord] = []
        paused_pools: frozenset[str] = frozenset()
        async with self._serial:
            self._check_open()
            try:
                async with self._pool.acquire() as conn:
                    # Whatever this leader wrote, in doubt or not, is over before it reads.
                    await self._settle(conn, epoch)
                    # Only reads inside the transaction: it takes no row lock, so a leader
                    # frozen in it (SIGSTOP, a partition) holds up no successor.
                    async with conn.transaction():
                        row = await conn.fetchrow(sql.leader)
                        if row is None or row["epoch"] != epoch:
                            raise Fenced(f"epoch {epoch} is not the schema's current epoch")
                        max_task_id = int(row["max_task_id"])
                        task_rows = await conn.fetch(sql.recover, time.time_ns() - retention_ns)
                        schedule_rows = await conn.fetch(sql.schedules)
                        paused_pools = frozenset(r[0] for r in await conn.fetch(sql.paused_pools))
                    # Decoding a million rows takes seconds: off the loop, so the lock
                    # session's keepalive keeps answering meanwhile.
                    tasks, quarantined = await asyncio.to_thread(_decode_rows, task_rows, to_engine)
                    if quarantined:
                        # One autocommit statement, gated on the leader row: no lock outlives it.
                        try:
                            leading = await conn.fetchval(
                                sql.quarantine,
                                epoch,
                                self._generation,
                                [task_id for task_id, _ in quarantined],
                                [quarantine_message(reason) for _, reason in quarantined],
                                time.time_ns(),
                            )
                        except BaseException:
                            self._unsettled = True
                            raise
                        if leading == 0:
                            raise Fenced(f"epoch {epoch} was superseded while recovering")
                    for name, spec, next_ns, paused, last_task_id in schedule_rows:
                        try:
                            schedule = decode_schedule_spec(name, spec)
                        except ValueError:
                            log.exception("schedule %r cannot be decoded; it is skipped", name)
                            continue
                        schedules.append(
                            ScheduleRecord(schedule, to_engine(next_ns), paused, last_task_id)
                        )
            except CLASSIFIED as exc:
                raise classify(exc, "recovering") from exc
        for task_id, reason in quarantined:
            log.error("task %d %s", task_id, quarantine_message(reason))
        return RecoveredState(max_task_id, tasks, schedules, quarantined, paused_pools)

    # --- the outbox's statements -----------------------------------------------------------

    async def _outbox_write(
        self, epoch: int, doing: str, statement: Statement, *, reads: bool = False
    ) -> Any:
        """As a commit of ``epoch`` writes: once no write in doubt can still land, so that a
        read never finds a row a batch in flight may take. ``reads``: only that wait holds
        the commits back; the read itself runs beside them (they take no row it may return:
        only the ingest's own submissions do, and it reads once they are resolved)."""
        self._check_leading(epoch)
        if not reads:
            async with self._serial:
                return await self._write(epoch, doing, statement)
        async with self._serial:
            if self._unsettled:
                await self._write(epoch, doing, lambda conn: conn.fetchval("SELECT 1"))
        return await self._read(doing, statement)

    # --- lookups --------------------------------------------------------------------------

    async def _read(self, doing: str, statement: Statement) -> Any:
        self._check_open()
        try:
            async with self._pool.acquire() as conn:
                return await statement(conn)
        except CLASSIFIED as exc:
            raise classify(exc, doing) from exc

    async def _fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        return list(await self._read("reading", lambda conn: conn.fetch(sql, *args)))

    async def load_output(self, task_id: int) -> bytes | None:
        rows = await self._fetch(self._sql.output, task_id)
        return rows[0]["output"] if rows else None

    async def get_task(self, task_id: int) -> TaskRecord | None:
        return await self._lookup("id = $1", task_id)

    async def get_task_by_key(self, key: str) -> TaskRecord | None:
        return await self._lookup("key = $1 ORDER BY id DESC LIMIT 1", key)

    async def get_attempts(self, task_id: int) -> Sequence[AttemptEnded]:
        to_engine = self._time_base.to_engine
        return [
            AttemptEnded(
                task_id, r["attempt"], to_engine(r["started_ns"]), to_engine(r["ended_ns"]),
                r["message"],
            )
            for r in await self._fetch(self._sql.attempts, task_id)
        ]  # fmt: skip

    async def get_occurrences(
        self, schedule: str, before_ns: int | None, limit: int
    ) -> Sequence[OccurrenceRecorded]:
        to_engine = self._time_base.to_engine
        before = None if before_ns is None else self._time_base.to_unix(before_ns)
        if before is not None:
            # A bound past a bigint (another time base): every record is due before one
            # above it, and none before one below.
            before = None if before > _MAX_BIGINT else max(before, _MIN_BIGINT)
        return [
            OccurrenceRecorded(
                schedule, to_engine(r["due_ns"]), to_engine(r["until_ns"]),
                OccurrenceOutcome(r["outcome"]), r["task_id"], to_engine(r["at_ns"]),
                r["message"],
            )
            for r in await self._fetch(self._sql.occurrences, schedule, before, limit)
        ]  # fmt: skip

    async def _lookup(self, where: str, value: object) -> TaskRecord | None:
        rows = await self._fetch(self._sql.lookup + where, value)
        if not rows:
            return None
        return decode_looked_up_record(rows[0], self._time_base.to_engine)

    # --- pruning and shutdown -------------------------------------------------------------

    async def prune(self, horizon_unix_ns: int) -> int:
        """Delete tasks finished before the horizon and ledger records due before it (by
        their due time, whether or not their schedule still exists), a batch of each per
        statement; return how many tasks.

        Only the leader prunes: each batch is gated on its epoch, so a store that does not
        lead, or no longer does, raises ``Fenced`` and deletes nothing. The id high-water mark
        lives in ``cronoq_leader``, so ids stay unique after pruning.
        """
        tasks = 0

        async def batch() -> int:
            nonlocal tasks
            pruned, records = await shielded(self._prune_batch(horizon_unix_ns))
            tasks += pruned
            return max(pruned, records)  # another batch while either kind filled this one

        await prune_in_batches(batch, self._config.prune_batch)
        return tasks

    async def _prune_batch(self, horizon_unix_ns: int) -> tuple[int, int]:
        """One fenced statement: the tasks it deleted, and the ledger records."""
        async with self._serial:
            epoch = self._epoch
            self._check_leading(epoch)
            assert epoch is not None

            async def write(conn: Connection) -> asyncpg.Record | None:
                return await conn.fetchrow(
                    self._sql.prune, epoch, self._generation, horizon_unix_ns,
                    self._config.prune_batch,
                )  # fmt: skip

            row = await self._write(epoch, "pruning", write)
        assert row is not None
        if row["leading"] == 0:
            raise Fenced(f"epoch {epoch} was superseded: it prunes nothing")
        return int(row["pruned"]), int(row["records"])

    async def _prune_regularly(self) -> None:
        config = self._config
        while not self._lock_session.lost.is_set():
            try:
                await self.prune(time.time_ns() - round(config.keep_finished * NS))
            except Fenced as exc:
                log.warning("pruning stopped: %s", exc)
                return
            except StoreError as exc:
                log.warning("pruning failed, trying later: %s", exc)
            await asyncio.sleep(config.prune_interval)

    def abandon(self) -> None:
        """Drop every connection without unlocking, as a killed process would (for tests)."""
        self._stop_leading()
        self._lock_session.abandon()
        self._closed = True
        self._pool.terminate()

    async def close(self) -> None:
        if self._closed:
            return
        await self.release_leadership()
        self._closed = True
        with contextlib.suppress(*CLASSIFIED, TimeoutError):
            async with asyncio.timeout(self._config.keepalive):
                await self._pool.close()
        self._pool.terminate()


def _checked(dsn: str, config: PgStoreConfig | None) -> PgStoreConfig:
    config = config if config is not None else PgStoreConfig()
    if not isinstance(config, PgStoreConfig):
        raise InvalidArgument(f"config must be a PgStoreConfig, got {config!r}")
    if not isinstance(dsn, str) or not dsn or "\x00" in dsn:
        raise InvalidArgument("dsn must be a non-empty str without NUL")
    return config


def _decode_rows(
    rows: list[asyncpg.Record], to_engine: Callable[[int], int]
) -> tuple[list[TaskRecord], list[tuple[int, str]]]:
    tasks: list[TaskRecord] = []
    quarantined: list[tuple[int, str]] = []
    for row in rows:
        try:
            tasks.append(decode_task_record(row, to_engine, with_output=False))
        except (ValueError, TypeError) as exc:
            quarantined.append((row["id"], undecodable_reason(exc)))
    return tasks, quarantined
