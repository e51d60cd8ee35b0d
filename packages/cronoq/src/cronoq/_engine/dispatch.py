"""Dispatch: starting ready tasks into their pools' free slots (and remote workers' offered
slots), taking back attempts that were dispatched but never released, and the operator's pool
pauses (a paused pool starts nothing; what runs in it finishes)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence

from cronoq._engine.attempts import Attempts
from cronoq._engine.inputs import AttemptToken, OfferSlots, lease_hash
from cronoq._engine.outputs import Dispatch, PoolInfo
from cronoq._engine.state import Pool, Shared, Task
from cronoq._engine.tasks import Tasks
from cronoq._model import NS_PER_S, Status
from cronoq.errors import CronoqError, UnknownPool
from cronoq.store import AttemptLease, PoolPaused, TaskUpdated

__all__ = ["Dispatcher"]


class _SlotGroup:
    __slots__ = ("free", "pools")

    def __init__(self, pools: frozenset[str], free: int) -> None:
        self.pools = pools
        self.free = free


class Dispatcher:
    def __init__(self, shared: Shared, tasks: Tasks, attempts: Attempts) -> None:
        self.shared = shared
        self.tasks = tasks
        self.attempts = attempts
        self.dispatching = True
        # Remote workers' free slots, the most specific first (OfferSlots).
        self.slots: list[_SlotGroup] = []

    def offer(self, item: OfferSlots) -> None:
        # A worker serving one pool is used before one serving several, which could also take
        # another pool's task.
        groups = sorted(item.groups, key=lambda group: len(group[0]))
        self.slots = [_SlotGroup(pools, free) for pools, free in groups if free > 0]

    def withdraw(self, tokens: Sequence[AttemptToken], reason: str) -> None:
        for token in tokens:
            task = self.attempts.current(token)
            if task is not None:
                self.attempts.unstart(task, f"attempt {token.attempt} was not started: {reason}")

    # --- pool pauses ----------------------------------------------------------------------

    def pause(self, name: str, paused: bool) -> PoolInfo | CronoqError:
        """Pause or resume a pool; persisted only when it changes (pausing a paused pool
        writes nothing)."""
        pool = self.shared.pools.get(name)
        if pool is None:
            return UnknownPool(f"unknown pool {name!r}; configured: {self.shared.pool_names()}")
        if pool.paused != paused:
            pool.paused = paused
            self.shared.out.mutations.append(PoolPaused(name, paused))
        return _info(pool, _depths(self.shared, [name])[name])

    def restore_pauses(self, names: frozenset[str]) -> None:
        """Pauses a store recovered; those of pools no longer configured stay in the store
        (a pool configured again later is still paused) and do nothing here."""
        for name in names:
            pool = self.shared.pools.get(name)
            if pool is not None:
                pool.paused = True

    def pools(self) -> list[PoolInfo]:
        """Every configured pool, with its live tasks counted in one pass over them."""
        pools = self.shared.pools
        depths = _depths(self.shared, pools)
        return [_info(pool, depths[name]) for name, pool in pools.items()]

    # --- starting attempts ------------------------------------------------------------------

    def dispatch_ready(self) -> None:
        if not self.dispatching:
            return
        gates = self.shared.gates
        gates.refill()
        self._dispatch_pass()
        while gates.recheck():  # lanes brought back that parked elsewhere: bring more
            gates.refill()
            self._dispatch_pass()

    def _dispatch_pass(self) -> None:
        shared = self.shared
        tasks = shared.tasks
        gates = shared.gates
        now = shared.now
        stopping = self.attempts.stopping
        for pool in shared.pools.values():
            if pool.paused:
                continue  # its ready tasks wait in their queue, in order, until it resumes
            levels = pool.levels
            prios = pool.prios
            limit = pool.config.concurrency
            leased = pool.config.lease_ns is not None
            while prios and pool.running < limit:
                level = prios[0]
                lanes = levels[level]
                lane = next(iter(lanes))
                heap = lanes[lane]
                task_id = heap[0]
                task = tasks.get(task_id)
                if task is None or task.status is not Status.READY:
                    heapq.heappop(heap)  # cancelled or failed while queued
                    pool.entries -= 1
                    if not heap:
                        pool.drop_lane(level, lane)
                    continue
                if lane and (gate := gates.blocker(lane, now)) is not None:
                    pool.park(level, lane)  # back when the gate frees; the next lane's turn
                    gates.park(gate, (pool.config.name, level, lane), now)
                    continue
                slot = self._free_slot(pool.config.name) if leased else None
                if leased and slot is None:
                    break
                heapq.heappop(heap)
                pool.entries -= 1
                if not heap:
                    pool.drop_lane(level, lane)
                elif len(lanes) > 1:
                    del lanes[lane]  # its turn is over: to the back of the rotation
                    lanes[lane] = heap
                if stopping(task_id):
                    shared.deferred.add(task_id)  # re-queued when the old attempt reports
                    continue
                self._start(task, pool, slot)

    def _start(self, task: Task, pool: Pool, slot: _SlotGroup | None) -> None:
        shared = self.shared
        task.attempt += 1
        task.attempt_epoch = shared.epoch
        shared.lapsed.discard(task.id)
        message = f"attempt {task.attempt} started"
        shared.counters.start_delay.observe((shared.now - task.updated_ns) / NS_PER_S)
        self.tasks.transition(task, Status.RUNNING, message)
        pool.running += 1
        lane = task.spec.limits
        if lane:
            shared.gates.started(task.id, lane, shared.now)  # holds its gates, as take_slot
        if slot is not None:
            slot.free -= 1
        lease_id = lease = None
        if slot is not None:
            lease_id = shared.config.lease_ids()
            lease = AttemptLease(shared.epoch, lease_hash(lease_id))
            shared.lease_hashes[task.id] = lease.id_hash
        shared.out.mutations.append(
            TaskUpdated(task.id, Status.RUNNING, task.attempt, message, shared.now, lease=lease)
        )
        shared.set_wake(task, self.attempts.running_wake(task))
        shared.out.dispatches.append(
            Dispatch(
                task.token(),
                task.spec,
                shared.leases.get(task.id),
                None if slot is None else slot.pools,
                lease_id,
            )
        )

    def has_free_slot(self, pool: str) -> bool:
        """Whether a worker offers a free slot for this remote pool now."""
        return self._free_slot(pool) is not None

    def _free_slot(self, pool: str) -> _SlotGroup | None:
        for slot in self.slots:
            if slot.free and pool in slot.pools:
                return slot
        return None


def _depths(shared: Shared, names: Iterable[str]) -> dict[str, dict[Status, int]]:
    """Live tasks by status (every live status, zero included) of each named pool."""
    live = [status for status in Status if not status.is_terminal]
    depths = {name: dict.fromkeys(live, 0) for name in names}
    for task in shared.tasks.values():
        depth = depths.get(task.spec.pool)
        if depth is not None:
            depth[task.status] += 1
    return depths


def _info(pool: Pool, depth: dict[Status, int]) -> PoolInfo:
    config = pool.config
    remote = config.lease_ns is not None
    return PoolInfo(config.name, config.concurrency, pool.paused, pool.running, depth, remote)
