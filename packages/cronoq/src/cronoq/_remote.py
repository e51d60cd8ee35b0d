"""Remote pools: attempts leased to workers in other processes (the server's workers).

A ``RemotePool`` has no function. Workers attach with ``Scheduler.attach()``, which
returns a ``WorkerLink``: the attempts leased to that worker, and the cancellations of
attempts it runs, arrive on it in order. The worker heartbeats and reports through the
scheduler by ``AttemptToken``, on any link or none, so that a worker whose connection broke
reports on its next one while the lease lasts.

The engine starts an attempt of a remote pool only into a free worker slot that the
``RemoteExecutor`` offered before the step; if the worker left before the step committed,
the attempt is withdrawn, uncounted. An attempt counts as used once it left this process for
the worker, so an attempt lost in the network is retried after its lease, as a crash would be.

Each attempt comes with a lease id, a capability only its worker holds: heartbeats, reports and
re-attaching need it, so that no one who merely read a task's token can speak for its attempt.
A worker's slot stays taken until the worker reports the attempt (or its link closes), even
after the attempt was stopped or its lease lapsed: the function may still run, and the worker
is never given more attempts than its slots. A link whose attempt lapsed without a heartbeat
gets no new attempts until the worker speaks again (a wedged worker would lose them all).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cronoq import _validate as check
from cronoq._engine import AttemptToken, Dispatch
from cronoq._executors import Reporter
from cronoq._limits import pool_limits
from cronoq._model import NS_PER_S, TraceContext
from cronoq.errors import InvalidArgument, SchedulerStopped, WorkerDetached

__all__ = [
    "CancelRequested",
    "LeaseRenewed",
    "LeasedAttempt",
    "RemoteExecutor",
    "RemotePool",
    "WorkerInfo",
    "WorkerLink",
]


@dataclass(frozen=True, slots=True)
class RemotePool:
    """A pool whose attempts run on remote workers (``Scheduler.attach()``)."""

    name: str
    concurrency: int = 1000
    """Most attempts of this pool leased at once, over every worker."""
    max_live: int | None = None
    """Bound on live tasks in this pool; submissions beyond it get AdmissionRejected."""
    lease: float = 30.0
    """Seconds an attempt stays leased without a heartbeat; then it is lost and retried."""
    limits: Sequence[str] = ()
    """Names of the scheduler's limits every task of this pool takes (``Pool.limits``)."""

    def __post_init__(self) -> None:
        check.text(self.name, "pool name")
        check.integer(self.concurrency, f"pool {self.name!r} concurrency", 1, 1_000_000)
        if self.max_live is not None:
            check.integer(self.max_live, f"pool {self.name!r} max_live", 1, 1 << 40)
        check.duration_ns(self.lease, f"pool {self.name!r} lease", allow_zero=False)
        object.__setattr__(self, "limits", pool_limits(self.limits, self.name))

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
    lease_id: bytes = field(repr=False)
    """The attempt's capability: heartbeat, report and re-attach with it. Keep it secret (it
    is never logged, stored or shown by any read)."""
    trace_context: TraceContext | None = None
    """The trace of the task's submission, which the worker's span of the attempt joins."""
    after: tuple[int, ...] = ()
    """The task's parents: their outputs are the attempt's ``parent_outputs``
    (``Scheduler.parent_outputs`` reads them; the worker decodes them)."""

    @classmethod
    def of(cls, dispatch: Dispatch) -> LeasedAttempt:
        spec = dispatch.spec
        assert dispatch.lease_expires_ns is not None, "a leased pool's dispatch has a lease"
        assert dispatch.lease_id is not None, "a leased pool's dispatch has a lease id"
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
            lease_id=dispatch.lease_id,
            trace_context=spec.trace_context,
            after=spec.after,
        )


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """A worker attached to a server now, as ``AsyncClient.list_workers`` shows it."""

    worker_id: str
    """The name the worker gave itself (host and pid by default): not an identity."""
    address: str
    """Its connection's peer address, as gRPC names it (``ipv4:10.0.0.7:51234``)."""
    pools: tuple[str, ...]
    slots: int
    in_flight: int
    """Attempts holding one of its slots (leased to it, or still running from before)."""
    attached_at: datetime
    last_heartbeat_at: datetime | None
    """When it last heartbeat or reported one of its attempts; None if it has not yet."""
    identity: str | None = None
    """The identity its connection authenticated as (a token's or a client certificate's, as
    the server's configuration names it); None when the server runs without authentication."""


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
    stopped: bool = False
    """The scheduler ended the attempt (a timeout, a deadline, a cancellation) and its task
    waits for it: keep heartbeating while the function runs, then report (the report changes
    nothing, but frees the slot and lets the task go on)."""


class WorkerLink:
    """One attached worker: its slots, and the events for it. Iterate it, or call ``next``.

    ``close()`` detaches it: attempts leased to it keep their leases (the worker may report
    them on a later link); attempts that arrived on it but were not yet taken go back to their
    queue uncounted.
    """

    def __init__(
        self,
        hub: RemoteExecutor,
        pools: frozenset[str],
        slots: int,
        stopped: asyncio.Event,
        name: str = "",
    ) -> None:
        self.pools = pools
        self.name = name  # as the worker named itself: for people, not an identity
        self.slots = slots
        self.free = slots
        # Attempts the worker named on attaching that this process did not lease to it (an
        # earlier leader's, or ones it let go): each holds a slot until the worker reports it
        # or proves it with a heartbeat. By token, with the lease id the worker gave.
        self.claims: dict[AttemptToken, bytes] = {}
        # An attempt of this link lapsed without a heartbeat: no new ones until it speaks.
        self.wedged = False
        self._hub = hub
        # A deque and an event, not an asyncio.Queue: a next() cancelled just as an event
        # arrived must leave the event in place (a Queue getter may have taken it already).
        self._events: deque[LeasedAttempt | CancelRequested] = deque()
        self._arrived = asyncio.Event()
        self._stopped = stopped
        self._closed = False
        self.attached_at = datetime.now(UTC)
        # When one of its attempts was last heartbeaten or reported (None: not yet).
        self.last_heard_at: datetime | None = None

    @property
    def in_flight(self) -> int:
        """Attempts holding one of its slots: leased to it, or named when it attached."""
        return self.slots - self.free

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def queued(self) -> int:
        """Events that arrived and were not taken yet."""
        return len(self._events)

    async def next(self) -> LeasedAttempt | CancelRequested:
        """The next attempt or cancellation. Raises WorkerDetached once closed, and
        SchedulerStopped when the scheduler stops (a new leader will lease again)."""
        while True:
            if self._events:
                return self._events.popleft()
            if self._closed:
                raise WorkerDetached("this worker link was closed")
            if self._stopped.is_set():
                raise SchedulerStopped("the scheduler stopped: attach to the new leader")
            self._arrived.clear()
            arrived = asyncio.ensure_future(self._arrived.wait())
            stopped = asyncio.ensure_future(self._stopped.wait())
            try:
                await asyncio.wait((arrived, stopped), return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrived.cancel()
                stopped.cancel()

    def __aiter__(self) -> WorkerLink:
        return self

    async def __anext__(self) -> LeasedAttempt | CancelRequested:
        try:
            return await self.next()
        except (WorkerDetached, SchedulerStopped):
            raise StopAsyncIteration from None

    def unsent(self, event: LeasedAttempt | CancelRequested) -> None:
        """This event, taken from the link, never left for the worker (its stream failed
        before the send): an attempt goes back to its queue, uncounted; a cancellation waits
        for the worker to re-attach naming its attempt."""
        if isinstance(event, LeasedAttempt):
            self._hub.unsent(self, event.token)
        elif isinstance(event, CancelRequested):
            self._hub.undelivered(event)
        else:
            raise InvalidArgument(
                f"unsent takes a LeasedAttempt or CancelRequested, got {type(event).__name__}"
            )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._arrived.set()
        while self._events:
            self.unsent(self._events.popleft())
        self._hub.detach(self)

    async def __aenter__(self) -> WorkerLink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def _put(self, event: LeasedAttempt | CancelRequested) -> None:
        self._events.append(event)
        self._arrived.set()


class RemoteExecutor:
    """The executor of every remote pool of a scheduler: it offers its links' free slots and
    hands each released attempt to a link."""

    def __init__(self, pools: frozenset[str]) -> None:
        self.pools = pools
        self._links: list[WorkerLink] = []
        # Attempts that left for a worker and have not been reported, by the link they went to,
        # and when each one's lease ends (Unix ns; renewed by heartbeats).
        self._leased: dict[AttemptToken, WorkerLink] = {}
        self._lease_ends: dict[AttemptToken, int] = {}
        self._lease_ids: dict[AttemptToken, bytes] = {}
        self._pools: dict[AttemptToken, str] = {}  # of the attempts this process leased
        # Cancellations of attempts not on an open link (yet): sent when a link names them.
        self._cancels: dict[AttemptToken, str] = {}
        self._reporter: Reporter | None = None
        self._wake: Callable[[], None] | None = None
        self._stopped = asyncio.Event()
        # Set whenever an attempt is reported or a link detaches: a drain looks again.
        self._changed = asyncio.Event()

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
        running: Sequence[tuple[AttemptToken, bytes]],
        name: str = "",
    ) -> WorkerLink:
        link = WorkerLink(self, pools, slots, stopped, name)
        # A reconnecting worker names the attempts it still runs, with their lease ids: each
        # takes a slot on the new link, whose reports free them (all of them, even beyond its
        # slots: the worker runs them whatever it asks for now). One leased here moves to the
        # new link only with its lease id; any other is held as a claim. A token named twice
        # takes one slot.
        for token, lease_id in dict(running).items():
            link.free -= 1
            if self._owns(token, lease_id):
                previous = self._leased.get(token)
                if previous is not None and not previous.closed:
                    previous.free += 1  # the worker moved it off a link it still holds
                self._leased[token] = link
                self._resend_cancel(token, link)
            else:
                # Unproven: a pending cancellation waits for its first accepted heartbeat
                # (whose reply carries it anyway), so that a guess learns nothing.
                link.claims[token] = lease_id
        self._links.append(link)
        self._poke()
        return link

    def worker_of(self, task_id: int, attempt: int) -> str | None:
        """The name of the worker this attempt was leased to, if it is on an open link."""
        for token, link in self._leased.items():
            if token.task_id == task_id and token.attempt == attempt and not link.closed:
                return link.name or None
        return None

    def _owns(self, token: AttemptToken, lease_id: bytes | None) -> bool:
        """Whether ``lease_id`` is the id this process leased ``token`` with."""
        known = self._lease_ids.get(token)
        return known is not None and lease_id is not None and hmac.compare_digest(known, lease_id)

    def detach(self, link: WorkerLink) -> None:
        if link in self._links:
            self._links.remove(link)
        self._changed.set()

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake()

    # --- the Executor seam ----------------------------------------------------------------

    def slot_offer(self) -> list[tuple[frozenset[str], int]]:
        groups: dict[frozenset[str], int] = {}
        for link in self._links:
            if link.free > 0 and not link.wedged:
                groups[link.pools] = groups.get(link.pools, 0) + link.free
        return list(groups.items())

    def start(self, dispatch: Dispatch, reporter: Reporter) -> None:
        pool = dispatch.spec.pool
        candidates = [
            link for link in self._links if link.free > 0 and not link.wedged and pool in link.pools
        ]
        if not candidates:
            reporter.withdraw(dispatch.token, "its worker left before it was sent")
            return
        # A link of the slot group the engine counted it against, so that the slots it left
        # for other pools stay where it expects them; the most free first.
        link = min(candidates, key=lambda link: (link.pools != dispatch.slot_pools, -link.free))
        link.free -= 1
        self._leased[dispatch.token] = link
        assert dispatch.lease_expires_ns is not None and dispatch.lease_id is not None
        self._lease_ends[dispatch.token] = dispatch.lease_expires_ns
        self._lease_ids[dispatch.token] = dispatch.lease_id
        self._pools[dispatch.token] = pool
        link._put(LeasedAttempt.of(dispatch))

    def cancel(self, token: AttemptToken, reason: str) -> None:
        link = self._leased.get(token)
        if link is not None and not link.closed:
            link._put(CancelRequested(token, reason))
        else:
            # Its worker may still run it and re-attach naming it (its link broke, or it ran
            # under an earlier leader): it hears the cancellation then.
            self._cancels[token] = reason

    def expired(self, token: AttemptToken) -> None:
        self._cancels.pop(token, None)
        link = self._leased.get(token)
        if link is None:
            return
        if link.closed:
            # Its worker left: only a reattach naming it could bring it back, and its report
            # would be stale now.
            self._finished(token)
        else:
            # Its worker is attached but let the lease lapse: it keeps the slot until it
            # reports, and its link gets no new attempt until it heartbeats or reports.
            link.wedged = True

    async def drain(self, timeout: float) -> set[AttemptToken]:
        """Wait for every leased attempt to be reported, until ``timeout``; one whose worker
        left and whose lease ended is not waited for (the engine counted it lost)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._leased and not self._stopped.is_set():
            now = time.time_ns()
            gone = {t: end for t, end in self._lease_ends.items() if self._leased[t].closed}
            for token in [t for t, end in gone.items() if end <= now]:
                self._finished(token)
                del gone[token]
            wait = deadline - loop.time()
            if not self._leased or wait <= 0:
                break
            if gone:
                wait = min(wait, (min(gone.values()) - now) / 1e9)
            self._changed.clear()
            changed = asyncio.ensure_future(self._changed.wait())
            stopped = asyncio.ensure_future(self._stopped.wait())
            try:
                await asyncio.wait(
                    (changed, stopped), timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                changed.cancel()
                stopped.cancel()
        left = set(self._leased)
        self._leased.clear()
        self._lease_ends.clear()
        return left

    # --- what the scheduler tells it ------------------------------------------------------

    def leased(self, token: AttemptToken) -> bool:
        return token in self._leased

    def pool_of(self, token: AttemptToken, lease_id: bytes) -> str | None:
        """The pool of an attempt this process leased with ``lease_id`` and that is not
        reported yet."""
        return self._pools.get(token) if self._owns(token, lease_id) else None

    def reported(self, token: AttemptToken, lease_id: bytes) -> None:
        """The attempt's report was answered (applied or stale): its worker's slot is free.
        Only for the worker that holds its lease id: a guessed report frees nothing."""
        if self._owns(token, lease_id):
            self._spoke(self._leased.get(token))
            self._finished(token)
            return
        for link in reversed(self._links):  # the newest: its worker's live connection
            claimed = link.claims.get(token)
            if claimed is not None and hmac.compare_digest(claimed, lease_id):
                del link.claims[token]
                self._cancels.pop(token, None)
                self._spoke(link)
                link.free += 1
                self._drop_claims(token)
                self._poke()
                return

    def renewed(self, token: AttemptToken, lease_id: bytes, lease_ends_ns: int) -> None:
        """A heartbeat the engine accepted (so ``lease_id`` is the attempt's): a claimed
        attempt becomes its link's, whose cancellations and slot it then follows."""
        if token not in self._leased:
            # The newest link that names it: a worker that re-attached before its old
            # connection closed runs it on the new one (as ``attach`` moves an owned one).
            for link in reversed(self._links):
                claimed = link.claims.get(token)
                if claimed is not None and hmac.compare_digest(claimed, lease_id):
                    del link.claims[token]
                    self._leased[token] = link
                    self._lease_ids[token] = lease_id
                    self._resend_cancel(token, link)
                    self._drop_claims(token)
                    break
            else:
                return
        self._spoke(self._leased[token])
        self._lease_ends[token] = lease_ends_ns

    def _drop_claims(self, token: AttemptToken) -> None:
        """The attempt's claim was proven on one link (or it ended): another link that named
        it too (its worker re-attached before the old link closed) gets that slot back."""
        for link in self._links:
            if link.claims.pop(token, None) is not None:
                link.free += 1
                self._poke()

    def undelivered(self, cancel: CancelRequested) -> None:
        """A cancellation that never left a closed link: its worker may still run the attempt
        and re-attach naming it, and hears it then (as one issued while it was away), or at
        once if it re-attached already."""
        link = self._leased.get(cancel.token)
        if link is None:
            return
        if link.closed:
            self._cancels[cancel.token] = cancel.reason
        else:
            link._put(cancel)

    def _resend_cancel(self, token: AttemptToken, link: WorkerLink) -> None:
        """A cancellation its worker's old link never delivered goes on its new one."""
        reason = self._cancels.get(token)
        if reason is not None and not link.closed:
            link._put(CancelRequested(token, reason))

    def heard(self, token: AttemptToken, lease_id: bytes) -> None:
        """The worker of ``token`` spoke (a heartbeat answered stale, say): it is not wedged."""
        if self._owns(token, lease_id):
            self._spoke(self._leased.get(token))

    def _spoke(self, link: WorkerLink | None) -> None:
        if link is not None:
            link.last_heard_at = datetime.now(UTC)
        if link is not None and link.wedged:
            link.wedged = False
            self._poke()

    def unsent(self, link: WorkerLink, token: AttemptToken) -> None:
        if self._leased.get(token) is link:
            self._finished(token)
            assert self._reporter is not None
            self._reporter.withdraw(token, "it could not be sent to its worker")

    def _finished(self, token: AttemptToken) -> None:
        self._lease_ends.pop(token, None)
        self._lease_ids.pop(token, None)
        self._pools.pop(token, None)
        self._cancels.pop(token, None)
        link = self._leased.pop(token, None)
        if link is not None and not link.closed:
            link.free += 1
            self._poke()
        self._changed.set()
