"""One server process's place in its cluster: standby, leading, draining, stopped.

A replica waits for leadership with a ``Scheduler`` whose ``start()`` blocks until its store
says it leads. While it leads, calls go to that scheduler; when it loses leadership (fenced,
its store failed), it steps down, opens a new store connection and waits again as a standby.
A graceful shutdown drains: no new attempts are leased and no new calls taken, while the
workers' heartbeats and reports still are, until the scheduler closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from enum import StrEnum

from cronoq import BytesCodec, RemotePool, Scheduler
from cronoq.errors import CronoqError, SchedulerError
from cronoq.store import Store
from cronoq_server._logging import lifecycle

__all__ = ["NotServing", "Replica", "Role"]

log = logging.getLogger("cronoq.server")

_RESTART_PAUSE_S = 0.5
"""Before a replica that stepped down (or failed to start) waits for leadership again."""


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
    ) -> None:
        self._open_store = open_store
        self._pools = pools
        self._commit_timeout = commit_timeout
        self._retention = retention
        self._drain_timeout = drain_timeout
        self._max_payload = max_payload_bytes
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
        """Lead whenever possible until ``shutdown()``; returns once the scheduler closed."""
        while not self._shutdown.is_set():
            try:
                store = await self._open_store()
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
            )
            try:
                await self._lead(sched)
            finally:
                self.scheduler = None
                with contextlib.suppress(CronoqError):
                    await store.close()
            if not self._shutdown.is_set():
                await self._pause()
        self._become(Role.STOPPED, "shut down")

    async def _lead(self, sched: Scheduler) -> None:
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
            return
        if (error := starting.exception()) is not None:
            log.warning("could not start leading: %s", error)
            return
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
            return
        why = str(sched.failure or "leadership was lost")
        self._become(Role.STANDBY, f"stepped down: {why}")
        lifecycle("stepping_down", epoch=sched.epoch, reason=why)
        await sched.close(timeout=0)

    async def _pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_RESTART_PAUSE_S):
                await self._shutdown.wait()

    def shutdown(self) -> None:
        """Begin a graceful shutdown (drain, then close); ``run`` returns when it is done."""
        self._shutdown.set()

    def abort(self) -> None:
        """Stop at once (a second signal): the scheduler is aborted, attempts abandoned."""
        self._shutdown.set()
        if self.scheduler is not None:
            self.scheduler.abort()
