"""Limits: the gates a task passes besides its pool's slots. A gate is one limit and one key
(the only one of a limit that is not per key). It counts the attempts holding it (as a pool
counts its slots: a stopped attempt until it really ended), the starts inside its rate window,
and the ready tasks that name it.

A pool queues its ready tasks in lanes (``state.Pool``): a lane is the tasks of one priority
that take the same gates, in id order. Dispatch takes one task from each lane in turn, so a
key with 100,000 waiting tasks delays a key with one by a single start. A lane whose first task
a gate holds back is parked on that gate, out of the rotation, and comes back when the gate
frees: a release, or the time its rate window lets the next start (``wakes``). A parked lane
never blocks another, and dispatch never looks at it while it waits.

After a takeover the counts are rebuilt from the rows (``Restorer``): attempts that may still
run hold their gates again, and each task whose latest attempt started inside a rate window
counts its attempts there (every one of them at that start: conservative, see
docs/limits.md)."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from cronoq._limits import MAX_RATE, Limit, LimitInfo, LimitKeyInfo, LimitKeys, OnFull
from cronoq.errors import CronoqError, LimitFull, UnknownLimit

if TYPE_CHECKING:
    from cronoq._engine.state import Pool

__all__ = ["Gate", "Gates", "Lane", "ParkedLane"]

Lane = LimitKeys
IDLE_GATES_KEPT = 16_384
"""Gates nothing uses that may stay between sweeps (a few hundred bytes each)."""
ParkedLane = tuple[str, int, Lane]
"""(pool, level, lane): a lane parked on a gate."""


class Gate:
    __slots__ = (
        "blocked",
        "holders",
        "key",
        "limit",
        "queued",
        "running",
        "starts",
        "tat",
        "waiting",
        "wake",
    )

    def __init__(self, limit: Limit, key: str | None) -> None:
        # Only what its limit needs is made: a per-key limit may have a gate for each of
        # thousands of keys, and each container is one more object for the collector to walk.
        self.limit = limit
        self.key = key
        self.running = 0
        # Inside the window, oldest first (a rate limit's).
        self.starts: deque[int] | None = None if limit.rate is None else deque()
        self.tat = 0  # the theoretical arrival time of the burst's spacing (GCRA)
        self.waiting = 0  # ready tasks naming it, not started
        # Which they are, oldest first (a limit that cancels them: on_full="keep_latest").
        self.queued: dict[int, None] | None = {} if limit.on_full is OnFull.KEEP_LATEST else None
        # Live tasks whose running attempt holds it, oldest first (a limit that cancels the
        # oldest: on_full="cancel_running").
        self.holders: dict[int, None] | None = (
            {} if limit.on_full is OnFull.CANCEL_RUNNING else None
        )
        # The lanes it holds back, in order (not a set: the engine is deterministic, and a
        # set of str tuples is ordered by the process's hash seed).
        self.blocked: dict[ParkedLane, None] | None = None
        self.wake: int | None = None  # when its rate lets the next start, while lanes wait

    def idle(self) -> bool:
        return not (self.running or self.starts or self.waiting or self.holders or self.blocked)

    def named(self) -> str:
        key = "" if self.key is None else f" key {self.key[:255]!r}"
        return f"limit {self.limit.name!r}{key}"


class Gates:
    """Every gate in use. A gate nothing uses any more stays until the next ``sweep`` (keys
    are unbounded, memory is not): dropped at once, a key whose tasks come one at a time
    would build its gate again for each (lanes take turns, so its next task comes later)."""

    def __init__(self, limits: Sequence[Limit], pools: dict[str, Pool]) -> None:
        self.limits = {limit.name: limit for limit in limits}
        self.pools = pools
        self.gates: dict[tuple[str, str | None], Gate] = {}
        self.kept = 0  # gates left by the last sweep
        self.now = 0  # the step's time (``fire``)
        # Gates that gained room while lanes were parked on them, for ``refill``; those it
        # refilled, for ``recheck``. Ordered: the engine is deterministic.
        self.freed: dict[tuple[str, str | None], None] = {}
        self.refilled: dict[tuple[str, str | None], None] = {}
        # The tasks its gates count waiting: ready, queued, not started. (A task can become
        # ready and finish before it is queued: a missed start, a deadline.)
        self.waiting: set[int] = set()
        self.wakes: list[tuple[int, tuple[str, str | None]]] = []
        # The limits whose on_full does more than queue: a submission looks at no other.
        self.rejecting = frozenset(
            n for n, limit in self.limits.items() if limit.on_full is OnFull.REJECT
        )
        self.displacing = frozenset(
            n
            for n, limit in self.limits.items()
            if limit.on_full in (OnFull.KEEP_LATEST, OnFull.CANCEL_RUNNING)
        )
        # Per rate limit: its window and the spacing of starts past its burst, in ns.
        self._window = {n: limit.per_ns or 0 for n, limit in self.limits.items()}
        self._spacing = {
            n: (limit.per_ns or 0) // limit.rate if limit.rate else 0
            for n, limit in self.limits.items()
        }

    def _gate(self, pair: tuple[str, str | None]) -> Gate:
        gate = self.gates.get(pair)
        if gate is None:
            gate = self.gates[pair] = Gate(self.limits[pair[0]], pair[1])
        return gate

    def sweep(self, now: int) -> None:
        """Drop the gates nothing uses (no attempt, start in its window, task or lane), once
        they are most of them and more than ``IDLE_GATES_KEPT``: amortised O(1) per gate
        made, and a key that comes back soon finds its gate."""
        if len(self.gates) <= 2 * self.kept + IDLE_GATES_KEPT:
            return
        for gate in self.gates.values():
            if gate.starts:
                self._prune(gate, now)
        self.gates = {pair: gate for pair, gate in self.gates.items() if not gate.idle()}
        self.kept = len(self.gates)

    def known(self, lane: Lane) -> Lane:
        """The lane without the limits no longer configured (a recovered task's)."""
        if all(name in self.limits for name, _ in lane):
            return lane
        return tuple(pair for pair in lane if pair[0] in self.limits)

    def unknown(self, lane: Lane) -> UnknownLimit | None:
        for name, _ in lane:
            if name not in self.limits:
                shown = ", ".join(sorted(self.limits)[:20]) or "none"
                return UnknownLimit(f"unknown limit {name!r}; configured: {shown}")
        return None

    # --- the state of a gate ----------------------------------------------------------------

    def _prune(self, gate: Gate, now: int) -> None:
        starts = gate.starts
        if starts is None:
            return
        horizon = now - self._window[gate.limit.name]
        while starts and starts[0] <= horizon:
            starts.popleft()

    def _rate_free_at(self, gate: Gate, now: int) -> int | None:
        """When the rate lets the next start: ``now`` or later; None without a rate."""
        limit = gate.limit
        if limit.rate is None:
            return None
        self._prune(gate, now)
        free = now
        starts = gate.starts
        if starts is not None and len(starts) >= limit.rate:
            free = starts[len(starts) - limit.rate] + self._window[limit.name]
        if limit.burst is not None:
            free = max(free, gate.tat - (limit.burst - 1) * self._spacing[limit.name])
        return free

    def _full(self, gate: Gate, now: int) -> bool:
        limit = gate.limit
        if limit.concurrency is not None and gate.running >= limit.concurrency:
            return True
        free = self._rate_free_at(gate, now)
        return free is not None and free > now

    def free_at(self, gate: Gate, now: int) -> int | None:
        """When the gate's rate lets the next start, if its rate holds it now (None: only a
        release frees it)."""
        limit = gate.limit
        if limit.concurrency is not None and gate.running >= limit.concurrency:
            return None
        free = self._rate_free_at(gate, now)
        return free if free is not None and free > now else None

    def blocker(self, lane: Lane, now: int) -> Gate | None:
        """The first gate of the lane with no room now, if any."""
        gates = self.gates
        for pair in lane:
            gate = gates.get(pair)
            if gate is not None and self._full(gate, now):
                return gate
        return None

    # --- a task's life ----------------------------------------------------------------------

    def queued(self, task_id: int, lane: Lane) -> None:
        """A task of the lane became ready."""
        self.waiting.add(task_id)
        for pair in lane:
            gate = self._gate(pair)
            gate.waiting += 1
            if gate.queued is not None:
                gate.queued[task_id] = None

    def started(self, task_id: int, lane: Lane, now: int) -> None:
        """An attempt starts: its gates count it running (as ``take``) and count its start."""
        self.waiting.discard(task_id)
        for pair in lane:
            gate = self._gate(pair)
            gate.running += 1
            gate.waiting -= 1
            if gate.holders is not None:
                gate.holders[task_id] = None
            if gate.queued is not None:
                gate.queued.pop(task_id, None)
            if gate.starts is not None:
                self._count_start(gate, now, 1)

    def _count_start(self, gate: Gate, at: int, count: int) -> None:
        if gate.starts is None:
            return
        gate.starts.extend([at] * count)
        if gate.limit.burst is not None:
            spacing = self._spacing[gate.limit.name]
            gate.tat = max(gate.tat, at) + spacing * count

    def unstart(self, lane: Lane, at: int) -> None:
        """An attempt started at ``at`` reached no executor: its start does not count."""
        for pair in lane:
            gate = self.gates.get(pair)
            if gate is not None and gate.starts is not None and at in gate.starts:
                gate.starts.remove(at)

    def take(self, lane: Lane, holder: int | None = None) -> None:
        """An attempt holds the lane's gates (one a rebuild found); ``holder``: its task, if
        the task is running it (``cancel_running`` may cancel it)."""
        for pair in lane:
            gate = self._gate(pair)
            gate.running += 1
            if holder is not None and gate.holders is not None:
                gate.holders[holder] = None

    def release(self, task_id: int, lane: Lane) -> None:
        """An attempt holding the lane's gates ended (or let go of its slot)."""
        for pair in lane:
            gate = self.gates.get(pair)
            if gate is None:
                continue
            gate.running -= 1
            if gate.holders is not None:
                gate.holders.pop(task_id, None)
            limit = gate.limit
            if gate.blocked and limit.concurrency is not None and gate.running < limit.concurrency:
                self.freed[pair] = None

    def forget(self, task_id: int, lane: Lane) -> None:
        """A task finished: it waits for no gate and holds none as a live task (its stopped
        attempt, if any, still holds its slot until ``release``)."""
        ready = task_id in self.waiting
        self.waiting.discard(task_id)
        for pair in lane:
            gate = self.gates.get(pair)
            if gate is not None:
                if ready:
                    gate.waiting -= 1
                    if gate.queued is not None:
                        gate.queued.pop(task_id, None)
                if gate.holders is not None:
                    gate.holders.pop(task_id, None)

    def recount_start(self, lane: Lane, at: int, attempts: int, now: int) -> None:
        """A recovered task's latest attempt started at ``at``: inside a rate window, all its
        attempts count there (earlier ones may have started inside it too)."""
        for pair in lane:
            limit = self.limits[pair[0]]
            if limit.rate is not None and at > now - self._window[limit.name]:
                self._count_start(self._gate(pair), at, min(attempts, limit.rate))

    def sort_recounted(self) -> None:
        """Recounted starts came in row order: the window needs them in time order."""
        for gate in self.gates.values():
            if gate.starts:
                gate.starts = deque(sorted(gate.starts))

    # --- parked lanes -------------------------------------------------------------------------

    def park(self, gate: Gate, parked: ParkedLane, now: int) -> None:
        if gate.blocked is None:
            gate.blocked = {}
        gate.blocked[parked] = None
        self._arm_wake(gate, now)

    def _arm_wake(self, gate: Gate, now: int) -> None:
        """A gate holding lanes back and without room: a timer for when its rate window has
        room again (a release adds room to a concurrency itself: ``freed``)."""
        limit = gate.limit
        if limit.concurrency is not None and gate.running >= limit.concurrency:
            return
        free = self._rate_free_at(gate, now)
        if free is not None and free > now and gate.wake != free:
            gate.wake = free
            heapq.heappush(self.wakes, (free, (limit.name, gate.key)))

    def _room(self, gate: Gate, now: int) -> int:
        """How many more attempts the gate would let start now."""
        limit = gate.limit
        room = MAX_RATE
        if limit.concurrency is not None:
            room = limit.concurrency - gate.running
        if limit.rate is not None:
            free = self._rate_free_at(gate, now)
            if free is not None and free > now:
                return 0
            room = min(room, limit.rate - len(gate.starts or ()))
            if limit.burst is not None:
                room = min(room, 1)  # the spacing is checked again after each start
        return room

    def refill(self) -> None:
        """Bring back, for each gate that gained room, as many of its parked lanes as it has
        room for, the longest parked first: not every lane, of which all but a few would
        park again (a freed slot of a limit over 5,000 lanes would cost 5,000 checks)."""
        now = self.now
        for pair in self.freed:
            gate = self.gates.get(pair)
            if gate is None or not gate.blocked:
                continue
            gate.wake = None
            room = self._room(gate, now)
            for parked in list(gate.blocked)[: max(room, 0)]:
                del gate.blocked[parked]
                pool_name, level, lane = parked
                pool = self.pools.get(pool_name)
                if pool is not None:
                    pool.unpark(level, lane)
            self.refilled[pair] = None
        self.freed.clear()

    def recheck(self) -> bool:
        """After a dispatch pass: whether a gate that was refilled still has room and lanes
        parked (those brought back parked on another gate, or their tasks were gone), which
        a next pass brings back; one with no room gets its timer."""
        now = self.now
        for pair in self.refilled:
            gate = self.gates.get(pair)
            if gate is None or not gate.blocked:
                continue
            if self._room(gate, now) > 0:
                self.freed[pair] = None
            else:
                self._arm_wake(gate, now)
        self.refilled.clear()
        return bool(self.freed)

    def fire(self, now: int) -> None:
        """Gates whose rate window has room again: ``refill`` brings their lanes back."""
        self.now = now
        wakes = self.wakes
        while wakes and wakes[0][0] <= now:
            at, pair = heapq.heappop(wakes)
            gate = self.gates.get(pair)
            if gate is not None and gate.wake == at:
                gate.wake = None
                self.freed[pair] = None

    def next_wake(self) -> int | None:
        wakes = self.wakes
        while wakes:
            at, pair = wakes[0]
            gate = self.gates.get(pair)
            if gate is not None and gate.wake == at:
                return at
            heapq.heappop(wakes)  # stale: its gate woke, or is gone
        return None

    # --- submissions --------------------------------------------------------------------------

    def refuse(self, lanes: Iterable[Lane], now: int) -> LimitFull | None:
        """A batch's tasks, checked against the limits that reject when full: each gate's
        room counts its waiting tasks and the batch's earlier ones."""
        added: dict[tuple[str, str | None], int] = {}
        rejecting = self.rejecting
        for lane in lanes:
            for pair in lane:
                if pair[0] not in rejecting:
                    continue
                limit = self.limits[pair[0]]
                before = added.get(pair, 0)
                added[pair] = before + 1
                gate = self.gates.get(pair) or Gate(limit, pair[1])
                waiting = gate.waiting + before
                if limit.concurrency is not None and gate.running + waiting >= limit.concurrency:
                    return LimitFull(
                        f"{gate.named()} is full: {gate.running} running, {waiting} waiting, "
                        f"of {limit.concurrency}; retry later"
                    )
                if limit.rate is not None:
                    self._prune(gate, now)
                    if len(gate.starts or ()) + waiting >= limit.rate:
                        return LimitFull(
                            f"{gate.named()} is full: {len(gate.starts or ())} starts in the last "
                            f"{limit.per:g}s and {waiting} waiting, of {limit.rate}; retry later"
                        )
        return None

    def displaced(self, lane: Lane) -> tuple[list[int], list[int], str]:
        """What a new task of ``lane`` displaces: (running tasks to cancel, waiting tasks to
        cancel, why), per the ``on_full`` of its limits."""
        running: list[int] = []
        waiting: list[int] = []
        why = ""
        for pair in lane:
            if pair[0] not in self.displacing:
                continue
            limit = self.limits[pair[0]]
            gate = self.gates.get(pair)
            if gate is None:
                continue
            if limit.on_full is OnFull.KEEP_LATEST and gate.queued:
                waiting.extend(gate.queued)
                why = f"replaced by a newer task of {gate.named()} (on_full=keep_latest)"
            elif (
                limit.on_full is OnFull.CANCEL_RUNNING
                and limit.concurrency is not None
                and gate.running + gate.waiting >= limit.concurrency
                and gate.holders
            ):
                running.append(next(iter(gate.holders)))
                why = f"cancelled for a newer task of {gate.named()} (on_full=cancel_running)"
        return running, waiting, why

    # --- reads ----------------------------------------------------------------------------------

    def describe_wait(self, lane: Lane, now: int) -> str | None:
        """Why a ready task of ``lane`` cannot start now, if a gate holds it."""
        gate = self.blocker(lane, now)
        if gate is None:
            return None
        limit = gate.limit
        if limit.concurrency is not None and gate.running >= limit.concurrency:
            return f"{gate.named()}: {gate.running} of {limit.concurrency} running"
        starts = len(gate.starts or ())
        if limit.rate is not None and starts < limit.rate:  # the burst's spacing holds it
            return f"{gate.named()}: past its burst of {limit.burst}, one start per " + (
                f"{limit.per / limit.rate:g}s" if limit.per else "window"
            )
        return f"{gate.named()}: {starts} of {limit.rate} starts per {limit.per:g}s"

    def infos(self, top: int, now: int) -> list[LimitInfo]:
        """Each limit's totals, and its ``top`` busiest keys: one pass over the gates, and a
        partial selection (not a sort of every key) only when keys are asked for, since a
        metrics scrape asks for none and keys are unbounded."""
        totals = {name: [0, 0, 0, 0] for name in self.limits}  # keys in use, running, ...
        per_limit: dict[str, list[Gate]] = {name: [] for name in self.limits}
        for (name, _), gate in self.gates.items():
            if gate.starts:
                self._prune(gate, now)
            starts = len(gate.starts or ())
            total = totals[name]
            if not (gate.running or gate.waiting or starts):
                continue  # kept for reuse, in use by nothing: not shown
            total[0] += 1
            total[1] += gate.running
            total[2] += starts
            total[3] += gate.waiting
            if top:
                per_limit[name].append(gate)
        infos = []
        for name, limit in self.limits.items():
            busiest = heapq.nsmallest(
                top,
                per_limit[name],
                key=lambda g: (-(g.running + g.waiting), -len(g.starts or ()), g.key or ""),
            )
            keys = tuple(
                LimitKeyInfo(g.key, g.running, len(g.starts or ()), g.waiting) for g in busiest
            )
            in_use, running, starts, waiting = totals[name]
            infos.append(LimitInfo(limit, in_use, running, starts, waiting, keys))
        return infos


def unknown_or_full(gates: Gates, lanes: list[Lane], now: int) -> CronoqError | None:
    for lane in lanes:
        if (unknown := gates.unknown(lane)) is not None:
            return unknown
    return gates.refuse(lanes, now) if gates.rejecting else None
