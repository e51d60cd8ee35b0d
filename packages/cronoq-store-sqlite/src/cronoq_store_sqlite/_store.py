"""SqliteStore: the ``Store`` protocol over one SQLite file (WAL).

Two connections per instance, each on a thread of its own (``Connection``), which runs each
transaction as one function, so that no transaction interleaves with another on one
connection: the data connection commits, recovers, prunes and looks up; the lease connection
takes, renews and releases the lease. The lease has its own connection so that its
renewal goes on while a long recovery reads the data (a recovery of 500,000 tasks takes longer
than the default lease): recovery is a read transaction, which in WAL mode never blocks the
renewal's write. SQLite's own write lock serializes writers, of this instance and of others:
write transactions start with ``BEGIN IMMEDIATE`` (implicit transactions are off), because a
deferred transaction that reads and then writes fails with ``SQLITE_BUSY_SNAPSHOT`` without the
busy handler ever running. Every write of task data is fenced by the epoch and holder inside
its own write transaction (``_fence``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from cronoq.errors import (
    CronoqError,
    Fenced,
    InvalidArgument,
    StoreError,
    StoreFatal,
    Unavailable,
)
from cronoq.store import (
    ATTEMPTS_KEPT,
    RECOVERY_COLUMNS,
    TASK_COLUMNS,
    AttemptEnded,
    LeadershipLoss,
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
    encode_schedule_spec,
    new_task_columns,
    prune_in_batches,
    quarantine_message,
    shielded,
    undecodable_reason,
)
from cronoq_store_sqlite._config import SqliteStoreConfig
from cronoq_store_sqlite._connection import Connection
from cronoq_store_sqlite._errors import classify
from cronoq_store_sqlite._insert import STATEMENT_CACHE_SIZE, NewTaskInsert
from cronoq_store_sqlite._schema import check_features, configure, migrate, prepare_file

__all__ = ["SqliteStore"]

log = logging.getLogger("cronoq.sqlite")
_T = TypeVar("_T")
NS = 1_000_000_000
_MIN_INTEGER, _MAX_INTEGER = -(2**63), 2**63 - 1
"""What an SQLite INTEGER holds."""

# A row whose options are not valid JSON must not break the whole recovery query.
_RECOVER = f"""
    SELECT {RECOVERY_COLUMNS} FROM cronoq_tasks
    WHERE finished_ns IS NULL OR finished_ns >= :horizon OR lease_hash IS NOT NULL OR id IN (
        SELECT j.value FROM cronoq_tasks AS c,
            json_each(CASE WHEN json_valid(c.options) THEN c.options ELSE '{{}}' END, '$.after')
            AS j
        WHERE c.finished_ns IS NULL
    )
    ORDER BY id
"""
# A change with no status is a cancellation request alone: the status columns, and the
# lease, stay. Any other change replaces the lease with its own (NULL: none). A retry
# (options given) rewrites the options and replaces the cancellation flag instead of or-ing it.
# An attempt's start is written when one started in the batch, and kept otherwise.
_CHANGE_TASK = """
    UPDATE cronoq_tasks SET
        options = COALESCE(:options, options),
        status = COALESCE(:status, status),
        attempt = CASE WHEN :status IS NULL THEN attempt ELSE :attempt END,
        message = :message,
        updated_ns = CASE WHEN :status IS NULL THEN updated_ns ELSE :updated END,
        due_ns = CASE WHEN :status IS NULL THEN due_ns ELSE :due END,
        finished_ns = CASE WHEN :status IS NULL THEN finished_ns ELSE :finished END,
        output = CASE WHEN :status IS NULL THEN output ELSE :output END,
        cancel_requested = CASE WHEN :options IS NULL THEN cancel_requested OR :cancel
            ELSE :cancel END,
        lease_epoch = CASE WHEN :status IS NULL THEN lease_epoch ELSE :lease_epoch END,
        lease_hash = CASE WHEN :status IS NULL THEN lease_hash ELSE :lease_hash END,
        started_ns = COALESCE(:started, started_ns)
    WHERE id = :id
"""
# A finished row that keeps a lease (an attempt that may still run) stays until it is cleared.
_PRUNABLE = "SELECT id FROM cronoq_tasks WHERE finished_ns < ? AND lease_hash IS NULL LIMIT ?"
# Its attempts go first, chosen by the same query in the same transaction: the same rows.
_PRUNE_ATTEMPTS = f"DELETE FROM cronoq_attempts WHERE task_id IN ({_PRUNABLE})"
_PRUNE = f"DELETE FROM cronoq_tasks WHERE id IN ({_PRUNABLE})"
# An attempt is written once: a commit retried after it landed changes nothing. Only the
# latest ATTEMPTS_KEPT of a task are kept.
_SAVE_ATTEMPT = """
    INSERT INTO cronoq_attempts (task_id, attempt, started_ns, ended_ns, message)
    VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id, attempt) DO NOTHING
"""
_TRIM_ATTEMPTS = "DELETE FROM cronoq_attempts WHERE task_id = ? AND attempt <= ?"
_ATTEMPTS = """
    SELECT attempt, started_ns, ended_ns, message FROM cronoq_attempts
    WHERE task_id = ? ORDER BY attempt
"""
# A ledger record is written once: a commit retried after it landed changes nothing.
_SAVE_OCCURRENCE = """
    INSERT INTO cronoq_occurrences (schedule, due_ns, until_ns, outcome, task_id, at_ns, message)
    VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (schedule, due_ns) DO NOTHING
"""
# A record whose outcome this build does not know (written by a newer one, or by hand) is
# skipped by the query, so that it neither fails the read nor shortens a page.
_OCCURRENCES = f"""
    SELECT due_ns, until_ns, outcome, task_id, at_ns, message FROM cronoq_occurrences
    WHERE schedule = ? AND due_ns < ?
        AND outcome IN ({", ".join(f"'{o.value}'" for o in OccurrenceOutcome)})
    ORDER BY due_ns DESC LIMIT ?
"""
_OCCURRENCES_ALL = _OCCURRENCES.replace("AND due_ns < ?", "")
# Ledger records go once their span ended (a pause of a week is one record, written when it
# ends), whether or not their schedule still exists.
_PRUNE_OCCURRENCES = """
    DELETE FROM cronoq_occurrences WHERE (schedule, due_ns) IN (
        SELECT schedule, due_ns FROM cronoq_occurrences WHERE until_ns < ? LIMIT ?)
"""
_SAVE_SCHEDULE = """
    INSERT INTO cronoq_schedules (name, spec, next_ns, paused, last_task_id)
    VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (name) DO UPDATE SET spec = excluded.spec, next_ns = excluded.next_ns,
        paused = excluded.paused, last_task_id = excluded.last_task_id
"""

_RECOVER_PAUSED_POOLS = "SELECT name FROM cronoq_pools WHERE paused"
_SAVE_POOL = """
    INSERT INTO cronoq_pools (name, paused) VALUES (?, ?)
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused
"""


class SqliteStore:
    """A durable store in one local SQLite file; processes sharing it elect one leader."""

    def __init__(
        self, conn: Connection, lease_conn: Connection, path: str, config: SqliteStoreConfig
    ) -> None:
        self._conn = conn
        self._lease_conn = lease_conn
        self._path = path
        self._config = config
        self._insert = NewTaskInsert()
        # Unique, and telling a standby's log who leads: "host/pid/random".
        self._holder = f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex}"
        self._held_by: str | None = None
        """The other holder the last look at the lease found (None: free, or not looked)."""
        self._epoch: int | None = None
        self._lost = LeadershipLoss()
        self._time_base = TimeBase()
        self._renewal: asyncio.Task[None] | None = None
        self._pruning: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(
        cls, path: str | os.PathLike[str], config: SqliteStoreConfig | None = None
    ) -> SqliteStore:
        """Open (creating if needed, owner-only) the database file and migrate its schema."""
        config = config if config is not None else SqliteStoreConfig()
        if not isinstance(config, SqliteStoreConfig):
            raise InvalidArgument(f"config must be a SqliteStoreConfig, got {config!r}")
        path = os.fspath(path)
        if not isinstance(path, str) or not path or "\x00" in path:
            raise InvalidArgument(f"path must be a non-empty str without NUL, got {path!r}")
        if path == ":memory:" or path.startswith("file:"):
            raise InvalidArgument("SqliteStore needs a file path; use MemoryStore for memory")
        # Asked of the library before any file is made: a refused one leaves nothing behind.
        with contextlib.closing(sqlite3.connect(":memory:")) as library:
            check_features(library)
        # Off the loop: looking at an existing file may wait a moment for SQLite's locks.
        await asyncio.to_thread(prepare_file, path)

        def configured(db: sqlite3.Connection) -> None:
            configure(
                db,
                full_sync=config.full_sync,
                busy_timeout_ms=round(config.busy_timeout * 1000),
                journal_size_limit=config.journal_size_limit,
            )

        opened: list[Connection] = []
        try:
            for _ in range(2):  # the data connection, then the lease connection
                try:
                    conn = await Connection.open(path, cached_statements=STATEMENT_CACHE_SIZE)
                except sqlite3.Error as exc:
                    raise classify(exc, "opening", path) from exc
                opened.append(conn)
                await conn.run(configured)
            await _migrate_patiently(opened[0], config, path)
        except sqlite3.Error as exc:
            await _close_all(opened)
            raise classify(exc, "configuring", path) from exc
        except BaseException:
            await _close_all(opened)
            raise
        return cls(opened[0], opened[1], path, config)

    @property
    def path(self) -> str:
        return self._path

    # --- transactions ---------------------------------------------------------------------

    async def _transaction(
        self,
        doing: str,
        body: Callable[[sqlite3.Connection], _T],
        *,
        epoch: int | None = None,
        lease: bool = False,
        write: bool = True,
    ) -> _T:
        """``body`` in a transaction on the data connection (or the lease one), in one hop to
        its thread: ``BEGIN IMMEDIATE`` (a write) or ``BEGIN`` (a read: one snapshot, no write
        lock) ... COMMIT, rolled back on any failure.

        ``epoch``: the one a fenced write (``_fence``) was for; if it still leads, this
        instance steps down. Callers run it ``shielded``, so that this happens even if the
        caller is cancelled meanwhile.
        """
        conn = self._lease_conn if lease else self._conn
        self._check_open()
        path = self._path

        def transaction(db: sqlite3.Connection) -> _T:
            try:
                db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = body(db)
                    db.execute("COMMIT")
                except BaseException:
                    _roll_back(db)
                    raise
            except sqlite3.Error as exc:
                raise classify(exc, doing, path) from exc
            return result

        try:
            return await conn.run(transaction)
        except Fenced as exc:
            if epoch is not None and epoch == self._epoch:
                self._step_down(exc)
            raise

    def _fence(self, db: sqlite3.Connection, epoch: int, max_task_id: int = 0) -> None:
        """On the connection's thread, inside a write transaction: go on only if ``epoch``
        and this holder still hold the lease (raising the id high-water mark on the way).
        SQLite's write lock, held from ``BEGIN IMMEDIATE`` on, keeps another instance from
        taking over before COMMIT, so a fenced instance writes nothing, even one that does not
        know yet (paused past its lease and resumed)."""
        # This instance stepped down (or never led): nothing of it may land, even while the
        # lease row, not yet taken over, still names it.
        if epoch != self._epoch or (
            db.execute(
                "UPDATE cronoq_leader SET max_task_id = MAX(max_task_id, ?) "
                "WHERE id = 1 AND epoch = ? AND holder = ?",
                (max_task_id, epoch, self._holder),
            ).rowcount
            != 1
        ):
            raise self._fenced(epoch)

    def _fenced(self, epoch: int) -> Fenced:
        """What a fenced write raises (``_transaction`` steps down, on the event loop)."""
        return Fenced(f"epoch {epoch} no longer holds the lease of {self._path!r}")

    def _leading_epoch(self, doing: str) -> int:
        if self._epoch is None:
            raise Fenced(f"cannot {doing}: this instance does not lead {self._path!r}")
        return self._epoch

    async def _read(
        self, sql: str, params: Sequence[Any] | dict[str, Any] = (), *, lease: bool = False
    ) -> list[Any]:
        return await shielded(self._read_now(sql, params, lease))

    async def _read_now(
        self, sql: str, params: Sequence[Any] | dict[str, Any], lease: bool = False
    ) -> list[Any]:
        conn = self._lease_conn if lease else self._conn
        self._check_open()
        path = self._path

        def read(db: sqlite3.Connection) -> list[Any]:
            try:
                return db.execute(sql, params).fetchall()
            except sqlite3.Error as exc:
                raise classify(exc, "reading", path) from exc

        return await conn.run(read)

    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable(f"the SqliteStore on {self._path!r} is closed")

    # --- leadership -----------------------------------------------------------------------

    async def acquire_leadership(self) -> Lease:
        # One INFO line per change: waiting behind a holder (again if another takes over
        # meanwhile), then leading. A standby polls every lock_poll: never a line per poll.
        waiting_on: str | None = None
        waited_since = time.monotonic()
        while True:
            try:
                epoch = await shielded(self._try_take_lease())
            except Unavailable as exc:
                log.debug("lease check failed, trying again: %s", exc)
                epoch = None
            if epoch is not None:
                self._epoch = epoch
                self._lost = LeadershipLoss()
                self._renewal = asyncio.get_running_loop().create_task(self._renew_lease())
                self._pruning = asyncio.get_running_loop().create_task(self._prune_regularly())
                if waiting_on is None:
                    log.info("leading %s (epoch %d)", self._path, epoch)
                else:
                    log.info(
                        "leading %s (epoch %d): took over the lease after %.1f s as a standby",
                        self._path,
                        epoch,
                        time.monotonic() - waited_since,
                    )
                return Lease(epoch)
            holder = self._held_by
            if holder is not None and holder != waiting_on:
                waiting_on = holder
                log.info(
                    "standby: the lease of %s is held by %s; waiting, and taking over when it "
                    "is released or not renewed for lease_ttl (%g s)",
                    self._path,
                    describe_holder(holder),
                    self._config.lease_ttl,
                )
            await asyncio.sleep(self._config.lock_poll)

    async def _try_take_lease(self) -> int | None:
        def take(db: sqlite3.Connection) -> int | None:
            epoch, holder, expires_ns = db.execute(
                "SELECT epoch, holder, expires_ns FROM cronoq_leader WHERE id = 1"
            ).fetchone()
            now = time.time_ns()
            if holder is not None and expires_ns > now:
                self._held_by = holder
                return None  # another standby was quicker
            db.execute(
                "UPDATE cronoq_leader SET epoch = ?, holder = ?, expires_ns = ? WHERE id = 1",
                (epoch + 1, self._holder, now + round(self._config.lease_ttl * NS)),
            )
            return int(epoch) + 1

        # Look first without the write lock: a standby must not contend with the leader's
        # commits every poll, nor hold a read transaction open between polls.
        [(holder, expires_ns)] = await self._read(
            "SELECT holder, expires_ns FROM cronoq_leader WHERE id = 1", lease=True
        )
        if holder is not None and expires_ns > time.time_ns():
            self._held_by = holder
            return None
        self._held_by = None
        return await self._transaction("taking the lease", take, lease=True)

    async def _renew_lease(self) -> None:
        """Extend the lease every ``lease_renew``; notice a takeover, or an expiry we missed."""
        config = self._config
        valid_until = time.monotonic() + config.lease_ttl
        while True:
            await asyncio.sleep(config.lease_renew)
            try:
                renewed = await shielded(self._extend_lease())
            except Unavailable as exc:
                if time.monotonic() < valid_until:
                    log.warning("lease renewal failed, trying again: %s", exc)
                    continue
                lost = Fenced(f"the lease ran out while its renewal failed: {exc}")
                log.warning("leadership lost: %s", lost)
                self._step_down(lost)
                return
            except StoreFatal as exc:
                self._stop_on_fatal(exc)
                return
            if not renewed:
                lost = Fenced(f"the lease of {self._path!r} was taken over")
                log.warning("leadership lost: %s", lost)
                self._step_down(lost)
                return
            valid_until = time.monotonic() + config.lease_ttl

    async def _extend_lease(self) -> bool:
        def extend(db: sqlite3.Connection) -> bool:
            cursor = db.execute(
                "UPDATE cronoq_leader SET expires_ns = ? WHERE id = 1 AND epoch = ? AND holder = ?",
                (time.time_ns() + round(self._config.lease_ttl * NS), self._epoch, self._holder),
            )
            return cursor.rowcount == 1

        return await self._transaction("renewing the lease", extend, lease=True)

    def _stop_on_fatal(self, exc: StoreFatal) -> None:
        """A background write (renewal, pruning) failed for good: a read-only, corrupt or
        unreachable file is not retried. Stop leading, so the scheduler stops, and leave the
        lease to run out as a crash would: writing its release would likely fail the same way."""
        log.error("leadership given up: %s", exc)
        self._step_down(exc)

    def _step_down(self, reason: CronoqError | None = None) -> None:
        """Stop leading; ``reason``: why, for ``leadership_lost`` (None: released)."""
        self._epoch = None
        self._lost.lose(reason)
        current = asyncio.current_task()
        for task in (self._renewal, self._pruning):
            if task is not None and task is not current:
                task.cancel()
        self._renewal = self._pruning = None

    async def leadership_lost(self) -> CronoqError | None:
        return await self._lost.wait()

    async def release_leadership(self) -> None:
        if self._epoch is None or self._closed:
            return
        epoch = self._epoch
        self._step_down()
        with contextlib.suppress(Unavailable):
            await shielded(self._release_lease(epoch))

    async def _release_lease(self, epoch: int) -> None:
        def release(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE cronoq_leader SET holder = NULL, expires_ns = 0 "
                "WHERE id = 1 AND epoch = ? AND holder = ?",
                (epoch, self._holder),
            )

        await self._transaction("releasing the lease", release, lease=True)

    # --- commit ---------------------------------------------------------------------------

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        await shielded(self._commit(epoch, batch))

    async def _commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        rows = collapse_batch(batch)
        to_unix = self._time_base.to_unix

        def unix(ns: int | None) -> int | None:
            return None if ns is None else to_unix(ns)

        # The rows' values are read on the event loop, where the batch was made; the
        # transaction's thread only runs the statements.
        new_tasks = new_task_columns(rows.new_tasks, to_unix) if rows.new_tasks else None
        changes = [
            {
                "id": c.task_id,
                "status": None if c.status is None else c.status.value,
                "attempt": c.attempt,
                "message": c.message,
                "updated": to_unix(c.updated_ns),
                "due": unix(c.due_ns),
                "finished": unix(c.finished_ns),
                "output": c.output,
                "cancel": c.cancel_requested,
                "options": c.options,
                "lease_epoch": None if c.lease is None else c.lease.epoch,
                "lease_hash": None if c.lease is None else c.lease.id_hash,
                "started": unix(c.started_ns),
            }
            for c in rows.changes
        ]
        schedules = [
            (
                r.spec.name,
                encode_schedule_spec(r.spec),
                to_unix(r.next_ns),
                r.paused,
                r.last_task_id,
            )
            for r in rows.saved_schedules
        ]
        removed = [(name,) for name in rows.removed_schedules]
        pools = list(rows.paused_pools.items())
        attempts = [
            (a.task_id, a.attempt, to_unix(a.started_ns), to_unix(a.ended_ns), a.message)
            for a in rows.ended_attempts
        ]
        trims = [(a.task_id, a.attempt - ATTEMPTS_KEPT) for a in rows.ended_attempts]
        occurrences = [
            (
                o.schedule,
                to_unix(o.due_ns),
                to_unix(o.until_ns),
                o.outcome.value,
                o.task_id,
                to_unix(o.at_ns),
                o.message,
            )
            for o in rows.occurrences
        ]

        def write(db: sqlite3.Connection) -> None:
            self._fence(db, epoch, rows.max_task_id)
            if new_tasks is not None:
                self._insert.run(db, new_tasks)
            if changes:
                db.executemany(_CHANGE_TASK, changes)
            if schedules:
                db.executemany(_SAVE_SCHEDULE, schedules)
            if removed:
                db.executemany("DELETE FROM cronoq_schedules WHERE name = ?", removed)
            if pools:
                db.executemany(_SAVE_POOL, pools)
            if attempts:
                db.executemany(_SAVE_ATTEMPT, attempts)
                db.executemany(_TRIM_ATTEMPTS, trims)
            if occurrences:
                db.executemany(_SAVE_OCCURRENCE, occurrences)

        await self._transaction("committing a batch", write, epoch=epoch)

    # --- recovery -------------------------------------------------------------------------

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        return await shielded(self._recover(epoch, time_base, retention_ns))

    async def _recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        self._time_base = time_base
        to_engine = time_base.to_engine
        tasks: list[TaskRecord] = []
        quarantined: list[tuple[int, str]] = []
        schedules: list[ScheduleRecord] = []
        paused_pools: set[str] = set()

        # A read transaction: one snapshot of the file, and no write lock, so that the lease
        # renewal (on its own connection) keeps the lease however long this takes. Nothing
        # else writes tasks meanwhile: this instance leads, and its own commits run after
        # this on the connection's thread. Rows are decoded there, as they are read.
        def read(db: sqlite3.Connection) -> int:
            row = db.execute(
                "SELECT epoch, holder, max_task_id FROM cronoq_leader WHERE id = 1"
            ).fetchone()
            if (row[0], row[1]) != (epoch, self._holder) or epoch != self._epoch:
                raise self._fenced(epoch)
            for task_row in db.execute(_RECOVER, {"horizon": time.time_ns() - retention_ns}):
                try:
                    tasks.append(decode_task_record(task_row, to_engine, with_output=False))
                except (ValueError, TypeError) as exc:
                    quarantined.append((task_row[0], undecodable_reason(exc)))
            for name, spec, next_ns, paused, last_task_id in db.execute(
                "SELECT name, spec, next_ns, paused, last_task_id FROM cronoq_schedules"
            ):
                try:
                    schedules.append(
                        ScheduleRecord(
                            decode_schedule_spec(name, spec),
                            to_engine(next_ns),
                            bool(paused),
                            last_task_id,
                        )
                    )
                except ValueError:
                    log.exception("schedule %r cannot be decoded; it is skipped", name)
            paused_pools.update(name for (name,) in db.execute(_RECOVER_PAUSED_POOLS))
            return int(row[2])

        max_task_id = await self._transaction("recovering", read, epoch=epoch, write=False)
        if quarantined:
            now = time.time_ns()

            def quarantine(db: sqlite3.Connection) -> None:
                self._fence(db, epoch)
                db.executemany(
                    "UPDATE cronoq_tasks SET status = 'failed', message = ?, updated_ns = ?, "
                    "finished_ns = COALESCE(finished_ns, ?), lease_epoch = NULL, "
                    "lease_hash = NULL WHERE id = ?",
                    [
                        (quarantine_message(reason), now, now, task_id)
                        for task_id, reason in quarantined
                    ],
                )

            await self._transaction("quarantining undecodable rows", quarantine, epoch=epoch)
        for task_id, reason in quarantined:
            log.error("task %d %s", task_id, quarantine_message(reason))
        return RecoveredState(max_task_id, tasks, schedules, quarantined, frozenset(paused_pools))

    # --- lookups --------------------------------------------------------------------------

    async def load_output(self, task_id: int) -> bytes | None:
        rows = await self._read("SELECT output FROM cronoq_tasks WHERE id = ?", (task_id,))
        return bytes(rows[0][0]) if rows and rows[0][0] is not None else None

    async def get_task(self, task_id: int) -> TaskRecord | None:
        return await self._lookup("id = ?", task_id)

    async def get_task_by_key(self, key: str) -> TaskRecord | None:
        return await self._lookup("key = ? ORDER BY id DESC LIMIT 1", key)

    async def get_attempts(self, task_id: int) -> Sequence[AttemptEnded]:
        to_engine = self._time_base.to_engine
        return [
            AttemptEnded(task_id, attempt, to_engine(started), to_engine(ended), message)
            for attempt, started, ended, message in await self._read(_ATTEMPTS, (task_id,))
        ]

    async def get_occurrences(
        self, schedule: str, before_ns: int | None, limit: int
    ) -> Sequence[OccurrenceRecorded]:
        to_engine = self._time_base.to_engine
        before = None if before_ns is None else self._time_base.to_unix(before_ns)
        # A bound past what an INTEGER holds (another time base) cannot be bound: every
        # record is due before one above it, and none before one below.
        if before is None or before > _MAX_INTEGER:
            rows = await self._read(_OCCURRENCES_ALL, (schedule, limit))
        else:
            rows = await self._read(_OCCURRENCES, (schedule, max(before, _MIN_INTEGER), limit))
        return [
            OccurrenceRecorded(
                schedule, to_engine(due), to_engine(until), OccurrenceOutcome(outcome), task_id,
                to_engine(at), message,
            )
            for due, until, outcome, task_id, at, message in rows
        ]  # fmt: skip

    async def _lookup(self, where: str, value: object) -> TaskRecord | None:
        rows = await self._read(f"SELECT {TASK_COLUMNS} FROM cronoq_tasks WHERE {where}", (value,))
        if not rows:
            return None
        return decode_looked_up_record(rows[0], self._time_base.to_engine)

    # --- pruning and shutdown -------------------------------------------------------------

    async def prune(self, horizon_unix_ns: int) -> int:
        """Delete tasks finished before the horizon and ledger records due before it, a batch
        of each per transaction; return how many tasks.

        Only the leader prunes: each batch is fenced like a commit, so an instance that lost
        its lease (whether it knows or not) deletes nothing and gets ``Fenced``. The id
        high-water mark lives in ``cronoq_leader``, so ids stay unique after pruning.
        """
        epoch = self._leading_epoch("prune")
        tasks = 0

        async def batch() -> int:
            nonlocal tasks
            pruned, records = await shielded(self._prune_batch(epoch, horizon_unix_ns))
            tasks += pruned
            return max(pruned, records)  # another batch while either kind filled this one

        await prune_in_batches(batch, self._config.prune_batch)
        return tasks

    async def _prune_batch(self, epoch: int, horizon_unix_ns: int) -> tuple[int, int]:
        """One fenced transaction: the tasks it deleted, and the ledger records."""

        def prune(db: sqlite3.Connection) -> tuple[int, int]:
            self._fence(db, epoch)
            arguments = (horizon_unix_ns, self._config.prune_batch)
            db.execute(_PRUNE_ATTEMPTS, arguments)
            pruned = db.execute(_PRUNE, arguments).rowcount
            return pruned, db.execute(_PRUNE_OCCURRENCES, arguments).rowcount

        return await self._transaction("pruning", prune, epoch=epoch)

    async def _prune_regularly(self) -> None:
        config = self._config
        while not self._lost.is_set():
            try:
                await self.prune(time.time_ns() - round(config.keep_finished * NS))
            except Fenced:
                return  # stepped down: the new leader prunes
            except StoreFatal as exc:
                self._stop_on_fatal(exc)
                return
            except StoreError as exc:
                log.warning("pruning failed, trying later: %s", exc)
            await asyncio.sleep(config.prune_interval)

    async def abandon(self) -> None:
        """Stop as a killed process would: no release, the lease simply runs out (for tests)."""
        self._step_down()
        await self._close_connection()

    async def close(self) -> None:
        await self.release_leadership()
        await self._close_connection()

    async def _close_connection(self) -> None:
        if self._closed:
            return
        # Each connection closes after the transactions already given to it; shielded, so that
        # a cancelled close still closes both.
        self._closed = True
        await shielded(_close_all([self._conn, self._lease_conn]))


def _roll_back(db: sqlite3.Connection) -> None:
    # SQLite rolls some failures (a full disk, an I/O error) back by itself.
    with contextlib.suppress(sqlite3.Error):
        if db.in_transaction:
            db.execute("ROLLBACK")


async def _close_all(connections: Sequence[Connection]) -> None:
    # One after the other: the last connection to close checkpoints the WAL into the database
    # and deletes it, which two closing at once on their threads would each leave to the other.
    for conn in connections:
        with contextlib.suppress(sqlite3.Error):
            await conn.close()


async def _migrate_patiently(conn: Connection, config: SqliteStoreConfig, path: str) -> None:
    """Instances opened together contend for the write lock: opening waits its turn (a short
    ``busy_timeout`` is for commits, which the scheduler retries, not for opening)."""
    give_up = time.monotonic() + max(5.0, 10 * config.busy_timeout)
    while True:
        try:
            await conn.run(lambda db: migrate(db, path))
            return
        except Unavailable:
            if time.monotonic() >= give_up:
                raise
            await asyncio.sleep(config.lock_poll)


def describe_holder(holder: str) -> str:
    """Who holds the lease, for a log line: ``host pid N`` from a holder of this release
    ("host/pid/random"), else the holder as written (an older release's random hex)."""
    host, _, rest = holder.partition("/")
    pid, _, unique = rest.partition("/")
    if host and pid.isdigit() and unique:
        return f"{host} pid {pid}"
    return f"holder {holder}"
