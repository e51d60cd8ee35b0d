"""Remote pools: attempts leased to workers in other processes (the server's workers).

A :class:`RemotePool` has no function. Workers attach with :meth:`Scheduler.attach`, which
returns a :class:`WorkerLink`: the attempts leased to that worker, and the cancellations of
attempts it runs, arrive on it in order. The worker heartbeats and reports through the
scheduler by :class:`AttemptToken`, on any link or none, so that a worker whose connection broke
reports on its next one while the lease lasts.

The engine starts an attempt of a remote pool only into a free worker slot that the
:class:`RemoteExecutor` offered before the step; if the worker left before the step committed,
the attempt is withdrawn, uncounted. An attempt counts as used once it left this process for
the worker, so an attempt lost in the network is retried after its lease, as a crash would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from cronoq import _validate as check
from cronoq._engine import AttemptToken, Dispatch
from cronoq._executors import Reporter
from cronoq._model import NS_PER_S
from cronoq.errors import SchedulerStopped, WorkerDetached

__all__ = [
    "CancelRequested",
    "LeaseRenewed",
    "LeasedAttempt",
    "RemoteExecutor",
    "RemotePool",
    "WorkerLink",
]


@dataclass(frozen=True, slots=True)
class RemotePool:
    """A pool whose attempts run on remote workers (:meth:`Scheduler.attach`)."""

    name: str
    concurrency: int = 1000
    """Most attempts of this pool leased at once, over every worker."""
    max_live: int | None = None
    """Bound on live tasks in this pool; submissions beyond it get AdmissionRejected."""
    lease: float = 30.0
    """Seconds an attempt stays leased without a heartbeat; then it is lost and retried."""

    def __post_init__(self) -> None:
        check.text(self.name, "pool name")
        check.integer(self.concurrency, f"pool {self.name!r} concurrency", 1, 1_000_000)
        if self.max_live is not None:
            check.integer(self.max_live, f"pool {self.name!r} max_live", 1, 1 << 40)
        check.duration_ns(self.lease, f"pool {self.name!r} lease", allow_zero=False)

    @property
    def lease_ns(self) -> int:
        return check.duration_ns(self.lease, "lease", allow_zero=False)


def _utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / NS_PER_S, UTC)


@dataclass(frozen=True, slots=True)
class LeasedAttempt:
    """An attempt leased to a worker: run it, heartbeat it, report it by its token."""

    token: AttemptToken
    pool: str
    kind: str
    key: str | None
    tags: tuple[str, ...]
    name: str | None
    deadline: datetime | None
    timeout: float | None
    """The per-attempt timeout in seconds: past it the scheduler cancels the attempt."""
    payload: bytes
    """As stored: the client's codec made it; ``b""`` means no payload."""
    lease_expires_at: datetime

    @classmethod
    def of(cls, dispatch: Dispatch) -> LeasedAttempt:
        spec = dispatch.spec
        assert dispatch.lease_expires_ns is not None, "a leased pool's dispatch has a lease"
        return cls(
            token=dispatch.token,
            pool=spec.pool,
            kind=spec.kind,
            key=spec.key,
            tags=spec.tags,
            name=spec.name,
            deadline=None if spec.deadline_ns is None else _utc(spec.deadline_ns),
            timeout=None if spec.timeout_ns is None else spec.timeout_ns / NS_PER_S,
            payload=spec.payload,
            lease_expires_at=_utc(dispatch.lease_expires_ns),
        )


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """Stop this attempt (a cancel, its timeout or deadline, the scheduler stopping); report
    it anyway, as a failure."""

    token: AttemptToken
    reason: str


@dataclass(frozen=True, slots=True)
class LeaseRenewed:
    """The answer to a heartbeat."""

    lease_expires_at: datetime
    cancel_reason: str | None
    """Set once the attempt is asked to stop."""


class WorkerLink:
    """One attached worker: its slots, and the events for it. Iterate it, or call ``next``.

    ``close()`` detaches it: attempts leased to it keep their leases (the worker may report
    them on a later link); attempts that arrived on it but were not yet taken go back to their
    queue uncounted.
    """

    def __init__(
        self, hub: RemoteExecutor, pools: frozenset[str], slots: int, stopped: asyncio.Event
    ) -> None:
        self.pools = pools
        self.slots = slots
        self.free = slots
        self._hub = hub
        self._events: asyncio.Queue[LeasedAttempt | CancelRequested] = asyncio.Queue()
        self._stopped = stopped
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def next(self) -> LeasedAttempt | CancelRequested:
        """The next attempt or cancellation. Raises WorkerDetached once closed, and
        SchedulerStopped when the scheduler stops (a new leader will lease again)."""
        while True:
            if not self._events.empty():
                return self._events.get_nowait()
            if self._closed:
                raise WorkerDetached("this worker link was closed")
            if self._stopped.is_set():
                raise SchedulerStopped("the scheduler stopped: attach to the new leader")
            getter = asyncio.ensure_future(self._events.get())
            stopped = asyncio.ensure_future(self._stopped.wait())
            try:
                await asyncio.wait((getter, stopped), return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()

    def __aiter__(self) -> WorkerLink:
        return self

    async def __anext__(self) -> LeasedAttempt | CancelRequested:
        try:
            return await self.next()
        except (WorkerDetached, SchedulerStopped):
            raise StopAsyncIteration from None

    def unsent(self, attempt: LeasedAttempt) -> None:
        """This attempt, taken from the link, never left for the worker (its stream failed
        before the send): back to its queue, uncounted."""
        self._hub.unsent(self, attempt.token)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        while not self._events.empty():
            event = self._events.get_nowait()
            if isinstance(event, LeasedAttempt):
                self._hub.unsent(self, event.token)
        self._hub.detach(self)

    async def __aenter__(self) -> WorkerLink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def _put(self, event: LeasedAttempt | CancelRequested) -> None:
        self._events.put_nowait(event)


class RemoteExecutor:
    """The executor of every remote pool of a scheduler: it offers its links' free slots and
    hands each released attempt to a link."""

    def __init__(self, pools: frozenset[str]) -> None:
        self.pools = pools
        self._links: list[WorkerLink] = []
        # Attempts that left for a worker and have not been reported, by the link they went to.
        self._leased: dict[AttemptToken, WorkerLink] = {}
        self._reporter: Reporter | None = None
        self._wake: Callable[[], None] | None = None
        self._stopped = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def bind(self, reporter: Reporter, wake: Callable[[], None], stopped: asyncio.Event) -> None:
        """Connect to the driver: withdrawals go to ``reporter``; ``wake`` asks for a step
        when slots free up; ``stopped`` ends a drain (an abort during a close)."""
        self._reporter = reporter
        self._wake = wake
        self._stopped = stopped

    @property
    def links(self) -> int:
        return sum(1 for link in self._links if not link.closed)

    def attach(
        self,
        pools: frozenset[str],
        slots: int,
        stopped: asyncio.Event,
        running: Sequence[AttemptToken],
    ) -> WorkerLink:
        link = WorkerLink(self, pools, slots, stopped)
        # A reconnecting worker names the attempts it still runs: they keep their slots on
        # the new link, whose reports free them.
        for token in running:
            if token in self._leased and link.free > 0:
                self._leased[token] = link
                link.free -= 1
        self._links.append(link)
        self._poke()
        return link

    def detach(self, link: WorkerLink) -> None:
        if link in self._links:
            self._links.remove(link)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake()

    # --- the Executor seam ----------------------------------------------------------------

    def slot_offer(self) -> list[tuple[frozenset[str], int]]:
        groups: dict[frozenset[str], int] = {}
        for link in self._links:
            if link.free > 0:
                groups[link.pools] = groups.get(link.pools, 0) + link.free
        return list(groups.items())

    def start(self, dispatch: Dispatch, reporter: Reporter) -> None:
        pool = dispatch.spec.pool
        candidates = [link for link in self._links if link.free > 0 and pool in link.pools]
        if not candidates:
            reporter.withdraw(dispatch.token, "its worker left before it was sent")
            return
        # As the engine counted slots: a worker of this pool alone before a shared one.
        link = min(candidates, key=lambda link: (len(link.pools), -link.free))
        link.free -= 1
        self._leased[dispatch.token] = link
        self._idle.clear()
        link._put(LeasedAttempt.of(dispatch))

    def cancel(self, token: AttemptToken, reason: str) -> None:
        link = self._leased.get(token)
        if link is None:
            return
        if link.closed:
            # Its worker is gone from this link; the attempt ended in the engine (its lease
            # expired, say), so nothing waits for its report any more.
            self._finished(token)
            return
        link._put(CancelRequested(token, reason))

    async def drain(self, timeout: float) -> set[AttemptToken]:
        if self._leased:
            idle = asyncio.ensure_future(self._idle.wait())
            stopped = asyncio.ensure_future(self._stopped.wait())
            try:
                await asyncio.wait(
                    (idle, stopped), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                idle.cancel()
                stopped.cancel()
        left = set(self._leased)
        self._leased.clear()
        self._idle.set()
        return left

    # --- what the scheduler tells it ------------------------------------------------------

    def leased(self, token: AttemptToken) -> bool:
        return token in self._leased

    def reported(self, token: AttemptToken) -> None:
        """The attempt's report was answered (applied or stale): its worker slot is free."""
        self._finished(token)

    def unsent(self, link: WorkerLink, token: AttemptToken) -> None:
        if self._leased.get(token) is link:
            self._finished(token)
            assert self._reporter is not None
            self._reporter.withdraw(token, "it could not be sent to its worker")

    def _finished(self, token: AttemptToken) -> None:
        link = self._leased.pop(token, None)
        if link is not None and not link.closed:
            link.free += 1
            self._poke()
        if not self._leased:
            self._idle.set()
