"""Uncertain commits for any store: a wrapper that makes a commit land and still fail.

A commit that times out or loses its reply may have landed (Temporal's "execute and timeout").
``FaultyStore`` wraps a store instance and, when armed, makes its next commit

- ``LANDS_THEN_UNAVAILABLE``: apply the batch, then raise ``Unavailable`` (a lost reply);
- ``LANDS_AFTER_TIMEOUT``: hang until the caller gives up (cancels), then apply the batch
  before the cancellation propagates (a slow commit that lands after the driver's timeout);
- ``UNAVAILABLE``: raise ``Unavailable`` without applying anything;
- ``HELD``: wait until ``FaultyStore.release_held()``, then apply the batch and succeed (a
  slow commit that the caller waits for: what else happens meanwhile is the test).

After one of the first three, every later commit raises ``Unavailable`` without landing until
the next ``recover()``: the driver, which retries a failed commit up to its ``commit_timeout``,
then gives up and rebuilds, and that rebuild finds the store healthy (``recovered`` is set).
Store authors need not write any of this: the kit wraps the instances their harness opens.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence

from cronoq.errors import CronoqError, Unavailable
from cronoq.store import (
    AttemptEnded,
    Lease,
    Mutation,
    OccurrenceRecorded,
    RecoveredState,
    Store,
    TaskRecord,
    TimeBase,
    shielded,
)

__all__ = ["CommitFault", "FaultyStore"]


class CommitFault(enum.Enum):
    LANDS_THEN_UNAVAILABLE = "the batch is applied, then the commit raises Unavailable"
    LANDS_AFTER_TIMEOUT = "the commit hangs until its caller gives up, then the batch is applied"
    UNAVAILABLE = "the commit raises Unavailable and applies nothing"
    HELD = "the commit waits until release_held(), then the batch is applied and it succeeds"


class DelegatingStore:
    """A store that forwards every call to ``inner``: the base of the kit's fault wrappers,
    which override what they break."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        await self.inner.commit(epoch, batch)

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        return await self.inner.recover(epoch, time_base, retention_ns)

    async def acquire_leadership(self) -> Lease:
        return await self.inner.acquire_leadership()

    async def leadership_lost(self) -> CronoqError | None:
        return await self.inner.leadership_lost()

    async def release_leadership(self) -> None:
        await self.inner.release_leadership()

    async def load_output(self, task_id: int) -> bytes | None:
        return await self.inner.load_output(task_id)

    async def get_task(self, task_id: int) -> TaskRecord | None:
        return await self.inner.get_task(task_id)

    async def get_task_by_key(self, key: str) -> TaskRecord | None:
        return await self.inner.get_task_by_key(key)

    async def get_attempts(self, task_id: int) -> Sequence[AttemptEnded]:
        return await self.inner.get_attempts(task_id)

    async def get_occurrences(
        self, schedule: str, before_ns: int | None, limit: int
    ) -> Sequence[OccurrenceRecorded]:
        return await self.inner.get_occurrences(schedule, before_ns, limit)

    async def close(self) -> None:
        await self.inner.close()


class FaultyStore(DelegatingStore):
    """A store that delegates to ``inner`` and injects one commit fault when armed."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self._armed: CommitFault | None = None
        self._failing = False
        self.injected = 0
        """Faults injected so far."""
        self.landed_uncertainly: list[list[Mutation]] = []
        """Batches that landed although their commit call failed."""
        self.faulted = asyncio.Event()
        """Set when an armed fault starts (for LANDS_AFTER_TIMEOUT: while the commit hangs)."""
        self.recovered = asyncio.Event()
        """Set by the first ``recover()`` that returns after ``arm``: the rebuild that follows
        a failed commit."""
        self._release = asyncio.Event()

    def arm(self, fault: CommitFault) -> None:
        """Inject ``fault`` into the next commit; later ones fail until the next ``recover``."""
        self._armed = fault
        self.faulted.clear()
        self.recovered.clear()
        self._release.clear()

    def disarm(self) -> None:
        """Take back a fault that no commit has met yet."""
        self._armed = None

    def release_held(self) -> None:
        """Let a ``HELD`` commit go on (it lands and succeeds)."""
        self._release.set()

    @property
    def armed(self) -> CommitFault | None:
        return self._armed

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        fault, self._armed = self._armed, None
        if fault is None:
            if self._failing:
                raise Unavailable("injected: the store is still failing after an uncertain commit")
            await self.inner.commit(epoch, batch)
            return
        self.injected += 1
        self.faulted.set()
        if fault is CommitFault.HELD:
            await self._release.wait()
            await self.inner.commit(epoch, batch)
            return
        self._failing = True
        if fault is CommitFault.UNAVAILABLE:
            raise Unavailable("injected: the commit did not reach the store")
        if fault is CommitFault.LANDS_THEN_UNAVAILABLE:
            await self.inner.commit(epoch, batch)
            self.landed_uncertainly.append(list(batch))
            raise Unavailable("injected: the commit landed but its reply was lost")
        try:
            await asyncio.Event().wait()  # until the caller's timeout cancels this call
        finally:
            # The server finishes the transaction although nobody waits for it any more.
            await shielded(self.inner.commit(epoch, batch))
            self.landed_uncertainly.append(list(batch))

    async def recover(self, epoch: int, time_base: TimeBase, retention_ns: int) -> RecoveredState:
        self._failing = False
        state = await self.inner.recover(epoch, time_base, retention_ns)
        self.recovered.set()
        return state
