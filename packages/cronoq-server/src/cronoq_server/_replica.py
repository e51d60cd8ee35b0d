"""One server process's place in its cluster: standby, leading, draining, stopped.

A replica waits for leadership with a ``Scheduler`` whose ``start()`` blocks until its store
says it leads. While it leads, calls go to that scheduler; when it loses leadership (fenced,
its store failed), it steps down, opens a new store connection and waits again as a standby.
A graceful shutdown drains: no new attempts are leased and no new calls taken, while the
workers' heartbeats and reports still are, until the scheduler closes.

A store that fails with ``StoreFatal`` (a wrong role, a permission denied, a damaged file) will
not recover by itself: the replica says so once, with the store's words and what to do, tries
again with a growing pause (someone may be fixing it), and after ``fatal_attempts`` such
failures in a row without leading in between, ``run`` raises ``StoreFailed`` so that the
process exits and its supervisor restarts it or alerts. A transient error (``Unavailable``) is
retried for as long as it lasts, as a standby waits for leadership.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from enum import StrEnum

from cronoq import BytesCodec, Limit, RemotePool, Scheduler
from cronoq.errors import CronoqError, SchedulerError, StoreFatal
from cronoq.store import Store
from cronoq_server._errors import CronoqServerError
from cronoq_server._logging import lifecycle

__all__ = ["NotServing", "Replica", "Role", "StoreFailed"]

log = logging.getLogger("cronoq.server")

_RESTART_PAUSE_S = 0.5
"""Before a replica that stepped down (or failed to start) waits for leadership again."""
_FATAL_PAUSE_MAX_S = 10.0
"""The pause after a permanent store error doubles from ``_RESTART_PAUSE_S`` up to this."""


class Role(StrEnum):
    STANDBY = "standby"
    LEADING = "leading"
    DRAINING = "draining"
    STOPPED = "stopped"


class NotServing(SchedulerError):
    """This replica does not take the call: nothing was applied; a client retries it on a new
    connection (which a balancer may send to the leader)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, applied=False)
        self.reason = reason


class StoreFailed(CronoqServerError):
    """The store failed permanently ``fatal_attempts`` times in a row: ``serve`` gives up."""


class Replica:
    def __init__(
        self,
        open_store: Callable[[], Awaitable[Store]],
        pools: list[RemotePool],
        *,
        commit_timeout: float,
        retention: float,
        drain_timeout: float,
        max_payload_bytes: int,
        fatal_attempts: int,
        tracing: bool = False,
        limits: Sequence[Limit] = (),
    ) -> None:
        self._open_store = open_store
        self._pools = pools
        self._commit_timeout = commit_timeout
        self._retention = retention
        self._drain_timeout = drain_timeout
        self._max_payload = max_payload_bytes
        self._fatal_attempts = fatal_attempts
        self._tracing = tracing
        self._limits = list(limits)
        self._fatal_count = 0
        self.store_problem: str | None = None
        """The last permanent store error, until the replica leads again."""
        self.leases = {p.name: p.lease for p in pools}
        self.role = Role.STANDBY
        self.reason = "waiting for leadership"
        self.scheduler: Scheduler | None = None
        self._changed: list[Callable[[Role], None]] = []
        self._shutdown = asyncio.Event()

    def on_change(self, callback: Callable[[Role], None]) -> None:
        self._changed.append(callback)

    def _become(self, role: Role, reason: str) -> None:
        self.role, self.reason = role, reason
        for callback in self._changed:
            callback(role)

    @property
    def ready(self) -> bool:
        return self.role is Role.LEADING

    def leader(self, *, leasing: bool = False, reporting: bool = False) -> Scheduler:
        """The scheduler that takes this call, or NotServing. While draining only the workers'
        heartbeats and reports are taken, so that running attempts can still end."""
        sched = self.scheduler
        if self.role is Role.LEADING and sched is not None and sched.running:
            return sched
        if self.role is Role.DRAINING and reporting and sched is not None:
            return sched
        if self.role is Role.STANDBY:
            raise NotServing(f"this replica is a standby ({self.reason})", "STANDBY")
        raise NotServing(f"this replica is {self.role.value} ({self.reason})", "STOPPING")

    async def run(self) -> None:
        """Lead whenever possible until ``shutdown()``; returns once the scheduler closed.
        Raises ``StoreFailed`` after ``fatal_attempts`` permanent store errors in a row."""
        try:
            await self._run()
        finally:
            self._become(Role.STOPPED, "shut down")

    async def _run(self) -> None:
        while not self._shutdown.is_set():
            try:
                store = await self._open_store()
            except StoreFatal as exc:
                await self._pause(self._fatal("opening the store", exc))
                continue
            except CronoqError as exc:
                log.warning("could not open the store: %s", exc)
                await self._pause()
                continue
            sched = Scheduler(
                self._pools,
                store=store,
                codec=BytesCodec(),
                commit_timeout=self._commit_timeout,
                retention=self._retention,
                max_payload_bytes=self._max_payload,
                tracing=self._tracing,
                limits=self._limits,
            )
            try:
                pause = await self._lead(sched)
            finally:
                self.scheduler = None
                with contextlib.suppress(CronoqError):
                    await store.close()
            if not self._shutdown.is_set():
                await self._pause(pause)

    async def _lead(self, sched: Scheduler) -> float:
        """Wait for leadership, then lead until it is lost or the replica shuts down; returns
        the pause before the next try."""
        self._become(Role.STANDBY, "waiting for leadership")
        lifecycle("standby")
        starting = asyncio.ensure_future(sched.start())
        shutdown = asyncio.ensure_future(self._shutdown.wait())
        try:
            await asyncio.wait((starting, shutdown), return_when=asyncio.FIRST_COMPLETED)
        finally:
            shutdown.cancel()
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, CronoqError):
                await starting
            return _RESTART_PAUSE_S
        if (error := starting.exception()) is not None:
            if isinstance(error, StoreFatal):
                return self._fatal("starting to lead", error)
            log.warning("could not start leading: %s", error)
            return _RESTART_PAUSE_S
        self._fatal_count, self.store_problem = 0, None
        self.scheduler = sched
        self._become(Role.LEADING, f"epoch {sched.epoch}")
        lifecycle("leading", epoch=sched.epoch)
        lost = asyncio.ensure_future(sched.leadership_lost())
        shutdown = asyncio.ensure_future(self._shutdown.wait())
        try:
            await asyncio.wait((lost, shutdown), return_when=asyncio.FIRST_COMPLETED)
        finally:
            shutdown.cancel()
            lost.cancel()
        if self._shutdown.is_set() and sched.running:
            self._become(Role.DRAINING, "shutting down")
            lifecycle("draining", epoch=sched.epoch, timeout_s=self._drain_timeout)
            await sched.close(timeout=self._drain_timeout)
            lifecycle("stepped_down", epoch=sched.epoch, reason="shutdown")
            return 0.0
        why = str(sched.failure or "leadership was lost")
        self._become(Role.STANDBY, f"stepped down: {why}")
        lifecycle("stepping_down", epoch=sched.epoch, reason=why)
        await sched.close(timeout=0)
        if isinstance(sched.failure, StoreFatal):
            return self._fatal("leading", sched.failure)
        return _RESTART_PAUSE_S

    def _fatal(self, doing: str, error: StoreFatal) -> float:
        """Count a permanent store error: said once (again only if it changes), raised as
        StoreFailed at the last attempt; else the pause before the next one."""
        self._fatal_count += 1
        problem = " ".join(str(error).split())  # one line, whatever the store's message
        if problem != self.store_problem:
            log.error(
                "the store failed while %s, and this will not pass by itself: %s. Fix the "
                "store or its settings (the message says what failed); cronoq-server tries "
                "%d time(s) in all (runtime.store_fatal_attempts), then exits with code 1",
                doing,
                problem,
                self._fatal_attempts,
            )
        self.store_problem = problem
        self.reason = f"the store failed: {problem}"
        if self._fatal_count >= self._fatal_attempts:
            raise StoreFailed(f"the store failed {self._fatal_count} time(s) in a row: {problem}")
        pause: float = _RESTART_PAUSE_S * 2.0 ** (self._fatal_count - 1)
        return min(pause, _FATAL_PAUSE_MAX_S)

    async def _pause(self, seconds: float = _RESTART_PAUSE_S) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._shutdown.wait()

    def shutdown(self) -> None:
        """Begin a graceful shutdown (drain, then close); ``run`` returns when it is done."""
        self._shutdown.set()

    def abort(self) -> None:
        """Stop at once (a second signal): the scheduler is aborted, attempts abandoned."""
        self._shutdown.set()
        if self.scheduler is not None:
            self.scheduler.abort()
