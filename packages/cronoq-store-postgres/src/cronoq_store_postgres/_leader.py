"""Leadership through a session-level advisory lock held on a dedicated connection.

Traps this module avoids, each covered by a test:

- Advisory locks stack: polling stops once the lock is held, or one unlock would not free it.
- A lock session that dies (``pg_terminate_backend``, a server restart) means stepping down at
  once, through asyncpg's termination listener, not after the timeout.
- A leader frozen by SIGSTOP keeps its TCP session open: the session's ``idle_session_timeout``
  lets the server end it (and free the lock) after ``session_timeout``; the leader's keepalive
  query keeps it from ever being idle that long while alive.
- ``tcp_user_timeout`` and the keepalive settings bound how long the server keeps a vanished
  leader's session; a query timeout bounds every call on ours.
- A dead connection is abandoned with ``terminate()``: a graceful close would wait on it.
- A pooler between us and PostgreSQL would keep the lock on a pooled server session after we
  died, and drop the settings above: the session is checked (``verify_direct``) before it
  takes the lock, so a refused one strands no lock either; a pooler's rejection of the
  settings is no reason to try again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import asyncpg

from cronoq.errors import Fenced
from cronoq.store import LeadershipLoss
from cronoq_store_postgres._config import PgStoreConfig
from cronoq_store_postgres._direct import verify_direct
from cronoq_store_postgres._errors import CLASSIFIED, classify, rejects_startup_parameters

log = logging.getLogger("cronoq.postgres")

HOLDER_LOOK_S = 30.0
"""How often a standby looks up who holds the lock, for its log line."""


def session_settings(config: PgStoreConfig) -> dict[str, str]:
    """Server-side settings that bound how long PostgreSQL keeps a vanished client's session."""
    timeout_ms = round(config.session_timeout * 1000)
    interval = max(1, round(config.keepalive))
    return {
        "tcp_user_timeout": str(timeout_ms),
        "tcp_keepalives_idle": str(interval),
        "tcp_keepalives_interval": str(interval),
        "tcp_keepalives_count": str(max(1, round(config.session_timeout / interval))),
    }


def lock_session_settings(config: PgStoreConfig) -> dict[str, str]:
    """Those, and the server ending the session of a leader frozen for ``session_timeout``."""
    return {
        **session_settings(config),
        "idle_session_timeout": str(round(config.session_timeout * 1000)),
    }


class LockSession:
    def __init__(self, dsn: str, config: PgStoreConfig, key: int) -> None:
        self._dsn = dsn
        self._config = config
        self._key = key
        self._conn: asyncpg.Connection | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self.lost = LeadershipLoss()

    async def acquire(self) -> float | None:
        """Block until this session holds the lock; then watch the session. Returns the
        seconds it waited behind another holder (None: the lock was free)."""
        # One INFO line per holder waited on, never one per poll.
        waiting_on: str | None = None
        since = time.monotonic()
        next_look = since
        while True:
            try:
                if await self._try_lock():
                    break
                if time.monotonic() < next_look:
                    holder = None
                else:
                    # pg_locks takes the lock manager's locks: once per HOLDER_LOOK_S, not
                    # once per poll of every standby.
                    next_look = time.monotonic() + HOLDER_LOOK_S
                    try:
                        holder = await self._holder()
                    except CLASSIFIED as exc:  # only a log line's detail: the lock decides
                        holder = f"another session (not shown: {exc!r})"
                if holder is not None and holder != waiting_on:
                    waiting_on = holder
                    log.info(
                        "standby: the leadership lock of schema %r is held by %s; waiting, "
                        "and taking over when that session unlocks or ends",
                        self._config.schema,
                        holder,
                    )
            except CLASSIFIED as exc:
                self._drop_connection()
                if rejects_startup_parameters(exc):
                    raise classify(exc, "opening the advisory lock session") from exc
                log.debug("advisory lock attempt failed, trying again: %s", exc)
            await asyncio.sleep(self._config.lock_poll)
        self.lost = LeadershipLoss()
        self._keepalive = asyncio.get_running_loop().create_task(self._watch())
        return None if waiting_on is None else time.monotonic() - since

    async def _holder(self) -> str | None:
        """The session holding the lock, for a standby's log line (None: nobody now). A role
        that may not see other sessions' details (pg_read_all_stats) gets their pid."""
        assert self._conn is not None
        # A bigint advisory lock is (classid, objid) = its high and low 32 bits, objsubid 1.
        row = await self._conn.fetchrow(
            "SELECT a.pid, a.usename, host(a.client_addr) AS client, a.backend_start "
            "FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND l.database = ("
            "SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND l.classid::bigint = $1 AND l.objid::bigint = $2 AND l.objsubid = 1",
            (self._key >> 32) & 0xFFFFFFFF,
            self._key & 0xFFFFFFFF,
        )
        if row is None:
            return None
        details = [
            f"user {row['usename']}" if row["usename"] else "",
            f"from {row['client']}" if row["client"] else "",
            f"since {row['backend_start']:%Y-%m-%d %H:%M:%S %Z}" if row["backend_start"] else "",
        ]
        shown = ", ".join(d for d in details if d)
        return f"PostgreSQL session pid {row['pid']}" + (f" ({shown})" if shown else "")

    async def _try_lock(self) -> bool:
        if self._conn is None or self._conn.is_closed():
            config = self._config
            settings = lock_session_settings(config)
            self._conn = await asyncpg.connect(
                self._dsn,
                command_timeout=config.session_timeout,
                timeout=config.session_timeout,
                server_settings={**settings, "application_name": "cronoq-leader-lock"},
            )
            try:
                await verify_direct(self._conn, settings, "the advisory lock session")
            except BaseException:
                self._drop_connection()
                raise
        conn = self._conn
        if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", self._key):
            return False
        conn.add_termination_listener(self._on_terminated)
        return True

    def _on_terminated(self, conn: object) -> None:
        log.warning("the advisory lock session was terminated: stepping down")
        self._step_down(Fenced("the advisory lock session was terminated"))

    async def _watch(self) -> None:
        """Keep the session busy and check it answers; step down when it stops answering."""
        config = self._config
        answered = time.monotonic()
        while self._conn is not None:
            await asyncio.sleep(config.keepalive)
            remaining = config.session_timeout - (time.monotonic() - answered)
            try:
                async with asyncio.timeout(max(remaining, 0.001)):
                    await self._conn.fetchval("SELECT 1")
            except CLASSIFIED as exc:  # TimeoutError is among them
                if isinstance(exc, TimeoutError) or time.monotonic() - answered >= (
                    config.session_timeout
                ):
                    log.warning("the advisory lock session stopped answering: %r", exc)
                    self._step_down(Fenced(f"the advisory lock session stopped answering: {exc!r}"))
                    return
                continue
            answered = time.monotonic()

    def _step_down(self, reason: Fenced | None = None) -> None:
        self.lost.lose(reason)
        current = asyncio.current_task()
        if self._keepalive is not None and self._keepalive is not current:
            self._keepalive.cancel()
        self._keepalive = None
        self._drop_connection()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.remove_termination_listener(self._on_terminated)
            conn.terminate()

    async def release(self) -> None:
        """Unlock and close, so a standby takes over at once."""
        # The keepalive must not run a query on the session while the unlock does.
        watch, self._keepalive = self._keepalive, None
        if watch is not None and watch is not asyncio.current_task():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        conn = self._conn
        if conn is not None and not conn.is_closed():
            conn.remove_termination_listener(self._on_terminated)
            with contextlib.suppress(*CLASSIFIED, TimeoutError):
                async with asyncio.timeout(self._config.keepalive):
                    await conn.execute("SELECT pg_advisory_unlock_all()")
        self._step_down()

    def abandon(self) -> None:
        """Drop the session without unlocking, as a killed process would."""
        self._step_down()
