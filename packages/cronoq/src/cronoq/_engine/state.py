"""What every room of the engine shares: the step's clock and output, the live tasks, their
pools, and the task timers.

Each room (tasks, attempts, dispatch, schedules, timers, restore) keeps its own state; this
object holds only what several of them must read and write. It is passed to each room when the
engine is built, so that every dependency between rooms is visible in a constructor.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from cronoq._engine.inputs import AttemptToken, EngineConfig, PoolConfig
from cronoq._engine.limits import Gates, Lane
from cronoq._engine.outputs import StepResult, TaskSummary
from cronoq._metrics import Counters
from cronoq._model import NS_PER_S, Status, TaskSpec
from cronoq.store import AttemptLease, TaskRecord

__all__ = ["NO_TASK", "Pool", "Shared", "Task", "earliest", "seconds"]


class Task:
    """A live task. Slotted and flat: a million idle ones must fit in a few hundred MB."""

    __slots__ = (
        "attempt",
        "attempt_epoch",
        "cancel_requested",
        "id",
        "message",
        "pending",
        "spec",
        "status",
        "submitted_ns",
        "updated_ns",
        "wake_ns",
    )

    def __init__(self, task_id: int, spec: TaskSpec, submitted_ns: int) -> None:
        self.id = task_id
        self.spec = spec
        self.status = Status.READY
        self.attempt = 0
        # The epoch that started the current attempt: this leader's, or an earlier one's for
        # a remote attempt adopted after a failover (its worker keeps its token).
        self.attempt_epoch = 0
        self.message = "submitted"
        self.submitted_ns = submitted_ns
        self.updated_ns = submitted_ns
        self.wake_ns: int | None = None
        self.pending = 0
        self.cancel_requested = False

    def record(self, output: bytes | None = None, started_ns: int | None = None) -> TaskRecord:
        """``started_ns``: the start of its latest attempt if it is no longer running (memory
        keeps none: the caller that just ended it knows it)."""
        return TaskRecord(
            task_id=self.id,
            spec=self.spec,
            status=self.status,
            attempt=self.attempt,
            message=self.message,
            submitted_ns=self.submitted_ns,
            updated_ns=self.updated_ns,
            due_ns=self.wake_ns if self.status is Status.RETRYING else None,
            cancel_requested=self.cancel_requested,
            output=output,
            # A running task's last change is its attempt's start.
            started_ns=self.updated_ns if self.status is Status.RUNNING else started_ns,
        )

    def summary(self) -> TaskSummary:
        spec = self.spec
        finished = self.updated_ns if self.status.is_terminal else None
        return TaskSummary.summarize(
            self.id, self.status, self.attempt, spec, finished, self.message
        )

    def token(self) -> AttemptToken:
        return AttemptToken(self.attempt_epoch, self.id, self.attempt)


NO_TASK = Task(0, TaskSpec("", "", b""), 0)
"""Stands in for a missing task in timer checks: its wake_ns is None, matching no timer."""


class Pool:
    """A pool's slots and its ready tasks, queued in lanes (see ``_engine/limits.py``):
    ``levels`` maps each priority (negated: the highest first) to its lanes in their turn
    order, each a heap of task ids; ``prios`` heaps exactly the keys of ``levels``. A lane a
    gate holds back waits in ``parked``. ``entries`` counts the ids queued, stale ones
    included (a task cancelled while queued stays until dispatch or compaction drops it)."""

    __slots__ = ("config", "entries", "levels", "live", "parked", "paused", "prios", "running")

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.running = 0
        self.live = 0
        self.paused = False  # by an operator (dispatch.py): it starts no attempt
        self.levels: dict[int, dict[Lane, list[int]]] = {}
        self.prios: list[int] = []
        self.parked: dict[tuple[int, Lane], list[int]] = {}
        self.entries = 0

    def push(self, level: int, lane: Lane, task_id: int) -> None:
        self.entries += 1
        heap = self.parked.get((level, lane)) if self.parked else None
        if heap is None:
            lanes = self.levels.get(level)
            if lanes is None:
                lanes = self.levels[level] = {}
                heapq.heappush(self.prios, level)
            heap = lanes.get(lane)
            if heap is None:
                lanes[lane] = [task_id]
                return
        heapq.heappush(heap, task_id)

    def drop_lane(self, level: int, lane: Lane) -> list[int]:
        """Take a lane out of its level's turns (``level`` is the top one)."""
        lanes = self.levels[level]
        heap = lanes.pop(lane)
        if not lanes:
            del self.levels[level]
            heapq.heappop(self.prios)
        return heap

    def park(self, level: int, lane: Lane) -> None:
        self.parked[(level, lane)] = self.drop_lane(level, lane)

    def unpark(self, level: int, lane: Lane) -> None:
        heap = self.parked.pop((level, lane), None)
        if not heap:
            return
        lanes = self.levels.get(level)
        if lanes is None:
            lanes = self.levels[level] = {}
            heapq.heappush(self.prios, level)
        lanes[lane] = heap

    def compact(self, keep: Callable[[int], bool]) -> None:
        """Drop the queued ids ``keep`` refuses; linear in the entries."""
        entries = 0
        for level, lanes in list(self.levels.items()):
            for lane, heap in list(lanes.items()):
                kept = [task_id for task_id in heap if keep(task_id)]
                if kept:
                    heapq.heapify(kept)
                    lanes[lane] = kept
                    entries += len(kept)
                else:
                    del lanes[lane]
            if not lanes:
                del self.levels[level]
        for place, heap in list(self.parked.items()):
            kept = [task_id for task_id in heap if keep(task_id)]
            heapq.heapify(kept)
            self.parked[place] = kept  # an empty one stays until its gate brings it back
            entries += len(kept)
        self.prios = list(self.levels)
        heapq.heapify(self.prios)
        self.entries = entries


ENDED_LEASES_KEPT = 65_536
"""How many ended leases the engine remembers (about 100 bytes each): a worker whose attempt
ended longer ago than that many others is told its attempt is unknown rather than why."""


class Shared:
    """The state several rooms touch. ``tasks`` holds the live tasks only; a finished one
    leaves it (see the tasks room). ``leases``: when each leased attempt's lease ends, by task
    id (a report after it is stale); ``lease_hashes``: the SHA-256 of its lease id, which its
    worker must present; ``ended_leases``: the token and lease id hash of the last attempt of
    each task whose lease ended lately (at most ``ENDED_LEASES_KEPT``), by which its worker
    still proves itself, to learn why its word is stale; ``held_leases``: the lease of each
    task's stopped remote attempt that may still run, which the task's row keeps whatever
    becomes of the task. ``lapsed``: tasks whose latest
    attempt was counted lost because its lease ran out (a later word of that attempt is
    answered "lease", not "not current"). ``deferred``: ready tasks held back from dispatch
    while their previous attempt still runs."""

    __slots__ = (
        "config",
        "counters",
        "deferred",
        "ended_leases",
        "epoch",
        "gates",
        "held_leases",
        "lapsed",
        "lease_hashes",
        "leases",
        "now",
        "out",
        "pools",
        "tasks",
        "timers",
    )

    def __init__(self, config: EngineConfig, epoch: int, counters: Counters) -> None:
        self.config = config
        self.counters = counters
        self.epoch = epoch
        self.now = 0
        self.out = StepResult()
        self.tasks: dict[int, Task] = {}
        self.pools = {p.name: Pool(p) for p in config.pools}
        self.gates = Gates(config.limits, self.pools)
        self.timers: list[tuple[int, int]] = []
        self.leases: dict[int, int] = {}
        self.lease_hashes: dict[int, bytes] = {}
        self.ended_leases: dict[int, tuple[AttemptToken, bytes]] = {}
        self.held_leases: dict[int, AttemptLease] = {}
        self.lapsed: set[int] = set()
        self.deferred: set[int] = set()

    def drop_lease(self, task: Task) -> tuple[int | None, AttemptLease | None]:
        """The running attempt of ``task`` ends: when its lease would have ended, and the
        lease itself (None for an attempt of this process)."""
        end = self.leases.pop(task.id, None)
        id_hash = self.lease_hashes.pop(task.id, None)
        if id_hash is None:
            return end, None
        self.remember_ended(task.token(), id_hash)
        return end, AttemptLease(task.attempt_epoch, id_hash)

    def remember_ended(self, token: AttemptToken, id_hash: bytes) -> None:
        """An attempt's lease ended: its worker may still prove itself with the id."""
        ended = self.ended_leases
        ended.pop(token.task_id, None)  # re-inserted last: the oldest entries go first
        ended[token.task_id] = (token, id_hash)
        if len(ended) > ENDED_LEASES_KEPT:
            del ended[next(iter(ended))]

    def reply(self, reply_to: object, value: object) -> None:
        if reply_to is not None:
            self.out.replies.append((reply_to, value))

    def set_wake(self, task: Task, wake_ns: int | None) -> None:
        if wake_ns == task.wake_ns:
            return  # its timer is already in the heap: a heartbeat without a lease, say
        task.wake_ns = wake_ns
        if wake_ns is not None:
            heapq.heappush(self.timers, (wake_ns, task.id))

    def enqueue(self, task: Task) -> None:
        """Put a ready task in its pool's queue: highest priority first, then its lane's turn
        (``Pool``), then submission order."""
        spec = task.spec
        lane = spec.limits
        self.pools[spec.pool].push(-spec.priority, lane, task.id)
        if lane and task.id not in self.gates.waiting:  # not if held back, ready all along
            self.gates.queued(task.id, lane)

    def take_slot(self, pool: Pool, lane: Lane, holder: int | None = None) -> None:
        """An attempt holds a slot of its pool and its limits until ``free_slot``;
        ``holder``: the task whose running attempt it is, if any."""
        pool.running += 1
        if lane:
            self.gates.take(lane, holder)

    def free_slot(self, pool_name: str, task_id: int, lane: Lane) -> None:
        pool = self.pools.get(pool_name)
        if pool is not None:  # None only for a recovered attempt whose pool was removed
            pool.running -= 1
        if lane:
            self.gates.release(task_id, lane)

    def pool_names(self) -> str:
        return ", ".join(sorted(self.pools))


def earliest(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def seconds(ns: int) -> str:
    """A duration for people: two significant digits below ten seconds (``0.62s``, ``1.5s``),
    then whole seconds (``42s``), minutes and seconds (``1m30s``), hours and minutes (``2h5m``),
    days and hours (``3d4h``)."""
    s = ns / NS_PER_S
    if ns <= 0:
        return "0s"
    if s < 10:
        digits = 1 - math.floor(math.log10(s))
        rounded = round(s, digits)
        if rounded < 10:  # 9.96 rounds to 10: written as whole seconds below
            return f"{rounded:.{max(digits, 0)}f}".rstrip("0").rstrip(".") + "s"
    # Each unit is chosen on the rounded value, so 59.6s reads 1m and 3599.7s reads 1h.
    seconds = round(s)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        m, sec = divmod(seconds, 60)
        return f"{m}m{sec}s" if sec else f"{m}m"
    minutes = round(s / 60)
    if minutes < 24 * 60:
        h, m = divmod(minutes, 60)
        return f"{h}h{m}m" if m else f"{h}h"
    d, h = divmod(round(s / 3600), 24)
    return f"{d}d{h}h" if h else f"{d}d"
