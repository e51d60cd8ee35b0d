"""The engine: a pure, synchronous, deterministic state machine holding every task rule.

``Engine.step(now_ns, inputs)`` applies a batch of inputs and the timers due at ``now_ns`` and
returns a :class:`StepResult`: the mutations to persist (ONE store commit), the replies owed to
callers and the attempts to dispatch, which the driver releases only after that commit, and the
next time the engine needs to be stepped. It never reads a clock, awaits or touches a store, so
tests drive it with explicit times and simulations replay it exactly.

If a commit fails, the driver discards the engine and rebuilds one from the store with
:meth:`Engine.recover`: the engine itself never has to undo a step. A failed commit may still
have landed, so that rebuild is told which attempts this process really released
(:class:`InFlight`): an attempt the store shows running that no executor received is put back
in its queue without counting, one that ended meanwhile keeps its slot until it stops.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cronoq._cron import CronSchedule
from cronoq._frozen import quick_init
from cronoq._ids import first_id, last_id
from cronoq._metrics import Counters, bump
from cronoq._model import (
    LEGAL_TRANSITIONS,
    NS_PER_S,
    CatchUpPolicy,
    MissPolicy,
    OverlapPolicy,
    ScheduleSpec,
    Status,
    TaskSpec,
)
from cronoq.errors import (
    AdmissionRejected,
    CronoqError,
    DuplicateSchedule,
    ScheduleNotFound,
    SchedulerError,
    StaleAttempt,
    TaskNotFound,
    UnknownDependency,
    UnknownPool,
)
from cronoq.store import (
    CancelRequested,
    Mutation,
    RecoveredState,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    TaskRecord,
    TaskSubmitted,
    TaskUpdated,
)

__all__ = [
    "AddSchedule",
    "AttemptFailed",
    "AttemptReport",
    "AttemptSucceeded",
    "AttemptToken",
    "CancelAttempt",
    "CancelTask",
    "Dispatch",
    "Engine",
    "EngineConfig",
    "GetTask",
    "GetTaskByKey",
    "Heartbeat",
    "HeartbeatReply",
    "InFlight",
    "Input",
    "ListSchedules",
    "ListTasks",
    "OfferSlots",
    "PauseSchedule",
    "PoolConfig",
    "RemoveSchedule",
    "ResumeSchedule",
    "StaleAttempt",
    "StepResult",
    "SubmitResult",
    "SubmitTasks",
    "TaskSummary",
    "WaitTask",
    "WithdrawAttempts",
]


def _seconds(ns: int) -> str:
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


# --- configuration ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolConfig:
    name: str
    concurrency: int
    max_live: int | None = None
    """Bound on live (not finished) tasks in this pool; None means only the global bound."""
    lease_ns: int | None = None
    """Remote executors: an attempt not heartbeaten for this long is lost and retried. Such a
    pool also starts attempts only into the free slots its executor offers (OfferSlots)."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    pools: Sequence[PoolConfig]
    retention_ns: int = 3600 * NS_PER_S
    """How long finished tasks stay in memory for key deduplication and dependencies."""
    max_live_tasks: int | None = None
    seed: int | None = None
    """Seed of the backoff jitter; None draws one from the OS."""


# --- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptToken:
    """Names one attempt. Reports carrying any other token are rejected."""

    epoch: int
    task_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class AttemptSucceeded:
    output: bytes | None
    """None when the function returned None."""


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    message: str
    retryable: bool = True
    retry_after_ns: int | None = None


@dataclass(frozen=True, slots=True)
class SubmitTasks:
    specs: Sequence[TaskSpec]
    reply_to: object


@dataclass(frozen=True, slots=True)
class CancelTask:
    task_id: int
    message: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class AttemptReport:
    token: AttemptToken
    outcome: AttemptSucceeded | AttemptFailed
    reply_to: object = None
    remote: bool = False
    """From a remote worker: only an attempt of a leased pool may be reported so."""
    received_ns: int | None = None
    """When the driver received it: a lease is judged by that, not by a step a slow commit
    delayed."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    token: AttemptToken
    reply_to: object = None
    remote: bool = False
    received_ns: int | None = None


@dataclass(frozen=True, slots=True)
class OfferSlots:
    """The free slots of remote workers now, as (the pools they serve, how many), replacing
    the previous offer. The driver sends it before every step, so that the engine never
    dispatches an attempt to a leased pool that no worker can take."""

    groups: Sequence[tuple[frozenset[str], int]]
    reply_to: object = None


@dataclass(frozen=True, slots=True)
class AddSchedule:
    spec: ScheduleSpec
    replace: bool
    reply_to: object


@dataclass(frozen=True, slots=True)
class PauseSchedule:
    name: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class ResumeSchedule:
    name: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class RemoveSchedule:
    name: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class GetTask:
    task_id: int
    reply_to: object


@dataclass(frozen=True, slots=True)
class GetTaskByKey:
    key: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class WaitTask:
    task_id: int
    reply_to: object
    timeout_s: float | None = None
    """For the driver: how long the caller waits once the task is known to be live."""


@dataclass(frozen=True, slots=True)
class WithdrawAttempts:
    """Attempts dispatched by a committed step but never released to an executor (the
    scheduler began closing meanwhile): back to their queue, not counted as used."""

    tokens: Sequence[AttemptToken]
    reason: str
    reply_to: object = None


@dataclass(frozen=True, slots=True)
class ListTasks:
    reply_to: object
    statuses: frozenset[Status] | None = None
    pool: str | None = None
    kind: str | None = None
    tag: str | None = None
    limit: int | None = None
    after: int | None = None
    """Only tasks with a larger id (paging); results come in ascending id order."""


@dataclass(frozen=True, slots=True)
class ListSchedules:
    reply_to: object


Input = (
    SubmitTasks
    | CancelTask
    | AttemptReport
    | Heartbeat
    | AddSchedule
    | PauseSchedule
    | ResumeSchedule
    | RemoveSchedule
    | GetTask
    | GetTaskByKey
    | WaitTask
    | ListTasks
    | ListSchedules
    | WithdrawAttempts
    | OfferSlots
)


@dataclass(frozen=True, slots=True)
class InFlight:
    """What the process rebuilding an engine in its own epoch knows of the attempts it
    released to executors (after a commit whose outcome is uncertain)."""

    executing: Mapping[AttemptToken, str] = field(default_factory=dict)
    """Released and still running (no report yet), with the pool each runs in."""
    reported: frozenset[AttemptToken] = frozenset()
    """Ended; their reports are applied again after the rebuild."""
    abandoned: frozenset[AttemptToken] = frozenset()
    """Released, then left running without a report (a graceful close that timed out)."""

    def released(self, token: AttemptToken) -> bool:
        return token in self.executing or token in self.reported or token in self.abandoned


# --- outputs ------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True, slots=True)
class SubmitResult:
    task_id: int
    created: bool
    """False when the key was already held and ``task_id`` is the existing task."""


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """What the engine keeps of a finished task, and what ``list`` returns for every task."""

    task_id: int
    status: Status
    attempt: int
    pool: str
    kind: str
    key: str | None
    tags: tuple[str, ...]
    finished_ns: int | None


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Start this attempt. Released by the driver only after the step committed."""

    token: AttemptToken
    spec: TaskSpec
    lease_expires_ns: int | None = None
    """Leased pools: when the attempt is lost unless its worker heartbeats."""
    slot_pools: frozenset[str] | None = None
    """Leased pools: the offered slot group it took (the pools of the workers it may go to)."""


@dataclass(frozen=True, slots=True)
class CancelAttempt:
    """Ask the executor running this attempt to stop (cooperatively)."""

    token: AttemptToken
    pool: str
    reason: str


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """The answer to a heartbeat of a current attempt."""

    lease_expires_ns: int | None
    """None when the pool has no lease."""
    cancel_reason: str | None
    """Why the attempt should stop, once a cancellation was requested."""


@dataclass(slots=True)
class StepResult:
    mutations: list[Mutation] = field(default_factory=list)
    replies: list[tuple[object, object]] = field(default_factory=list)
    """(reply_to, value); a value that is an exception is raised to the caller."""
    dispatches: list[Dispatch] = field(default_factory=list)
    cancels: list[CancelAttempt] = field(default_factory=list)
    expired: list[AttemptToken] = field(default_factory=list)
    """Stopped leased attempts whose lease ended without a report, and attempts a rebuild does
    not hold again: no report of theirs is awaited any more (one that comes is stale)."""
    next_wake_ns: int | None = None


# --- internal state -----------------------------------------------------------------------


class _Task:
    """A live task. Slotted and flat: a million idle ones must fit in a few hundred MB."""

    __slots__ = (
        "attempt",
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
        self.message = "submitted"
        self.submitted_ns = submitted_ns
        self.updated_ns = submitted_ns
        self.wake_ns: int | None = None
        self.pending = 0
        self.cancel_requested = False

    def record(self, output: bytes | None = None) -> TaskRecord:
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
        )

    def summary(self) -> TaskSummary:
        spec = self.spec
        finished = self.updated_ns if self.status.is_terminal else None
        return TaskSummary(
            self.id, self.status, self.attempt, spec.pool, spec.kind, spec.key, spec.tags, finished
        )

    def token(self, epoch: int) -> AttemptToken:
        return AttemptToken(epoch, self.id, self.attempt)


_NO_TASK = _Task(0, TaskSpec("", "", b""), 0)
"""Stands in for a missing task in timer checks: its wake_ns is None, matching no timer."""


class _Pool:
    __slots__ = ("config", "live", "ready", "running")

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.running = 0
        self.live = 0
        # (-priority, id): highest priority first, then submission order.
        self.ready: list[tuple[int, int]] = []


class _SlotGroup:
    __slots__ = ("free", "pools")

    def __init__(self, pools: frozenset[str], free: int) -> None:
        self.pools = pools
        self.free = free


class _Schedule:
    __slots__ = ("cron", "last_task_id", "next_ns", "paused", "spec")

    def __init__(self, record: ScheduleRecord, cron: CronSchedule) -> None:
        self.spec = record.spec
        self.cron = cron
        self.next_ns = record.next_ns
        self.paused = record.paused
        self.last_task_id = record.last_task_id

    def record(self) -> ScheduleRecord:
        return ScheduleRecord(self.spec, self.next_ns, self.paused, self.last_task_id)


class Engine:
    """All task semantics. See the module docstring for the contract."""

    def __init__(
        self,
        config: EngineConfig,
        epoch: int,
        high_water_mark: int = 0,
        counters: Counters | None = None,
    ) -> None:
        if not config.pools:
            raise ValueError("at least one pool is required")
        self.config = config
        self.counters = counters if counters is not None else Counters()
        self.epoch = epoch
        self._next_id = first_id(epoch, high_water_mark)
        self._last_id = last_id(epoch)  # ids past it would belong to the next epoch
        self._pools = {p.name: _Pool(p) for p in config.pools}
        self._tasks: dict[int, _Task] = {}
        self._finished: dict[int, TaskSummary] = {}
        self._keys: dict[str, int] = {}
        self._dependents: dict[int, list[int]] = {}
        # Per task, the callers waiting for it to finish, by identity (removable in O(1)).
        self._waiters: dict[int, dict[int, object]] = {}
        # Attempts told to stop (a timeout, a deadline) that have not reported yet: each keeps
        # its pool slot, and its task starts no other attempt, until it does.
        self._zombies: dict[int, tuple[AttemptToken, str]] = {}
        # A leased zombie also ends when its lease does (its worker may be gone for good).
        self._zombie_leases: dict[int, int] = {}
        self._deferred: set[int] = set()
        """Ready tasks held back from dispatch while their previous attempt still runs."""
        self._quarantined: dict[int, TaskRecord] = {}
        # Leased attempts: when each lease ends (task id -> ns). A report after it is stale.
        self._leases: dict[int, int] = {}
        # Remote workers' free slots, the most specific first (OfferSlots).
        self._slots: list[_SlotGroup] = []
        self._schedules: dict[str, _Schedule] = {}
        self._timers: list[tuple[int, int]] = []
        self._schedule_timers: list[tuple[int, str]] = []
        self._rng = random.Random(config.seed)
        self._dispatching = True
        self._now = 0
        self._out = StepResult()

    # --- public surface -------------------------------------------------------------------

    @property
    def high_water_mark(self) -> int:
        """The last id this engine issued (or recovered)."""
        return self._next_id - 1

    @property
    def live_count(self) -> int:
        return len(self._tasks)

    def stop_dispatching(self) -> None:
        """Start no more attempts (a graceful shutdown); everything else goes on."""
        self._dispatching = False

    def running_tokens(self) -> set[AttemptToken]:
        return {t.token(self.epoch) for t in self._tasks.values() if t.status is Status.RUNNING}

    def take_waiters(self) -> list[tuple[int, object]]:
        """Remove and return every registered waiter as (task id, reply_to)."""
        taken = [(task_id, w) for task_id, ws in self._waiters.items() for w in ws.values()]
        self._waiters.clear()
        return taken

    def drop_waiter(self, task_id: int, reply_to: object) -> None:
        """Forget a waiter whose caller gave up."""
        waiters = self._waiters.get(task_id)
        if waiters is not None and waiters.pop(id(reply_to), None) is not None and not waiters:
            del self._waiters[task_id]

    def step(self, now_ns: int, inputs: Iterable[Input] = ()) -> StepResult:
        self._now = now_ns
        out = self._out  # may already hold the bookkeeping of a recovery (_restore)
        # Prune first: a key or parent that left the retention window is gone for these inputs.
        self._prune_finished()
        for item in inputs:
            self._apply(item)
        self._fire_task_timers()
        self._expire_zombies()
        self._fire_schedules()
        self._dispatch_ready()
        out.next_wake_ns = self._next_wake()
        self._out = StepResult()
        return out

    @classmethod
    def recover(
        cls,
        config: EngineConfig,
        epoch: int,
        now_ns: int,
        state: RecoveredState,
        inflight: InFlight | None = None,
        counters: Counters | None = None,
    ) -> tuple[Engine, StepResult]:
        """Rebuild from recovered rows and run a first step.

        ``inflight`` is None when this epoch starts: every attempt the rows show running was
        the previous leader's and is lost: it counts as used and is retried after backoff or
        dead-lettered. It is given when the process rebuilds within its own epoch, after a
        commit whose outcome is uncertain; then every running row is this epoch's, and:

        - a row of an attempt still executing or reported keeps running (reports re-applied);
        - a row of an attempt no executor received (its step landed although its commit
          failed) goes back to its queue without counting;
        - an executing attempt the rows no longer show as current (its timeout or deadline
          landed) keeps its slot and is cancelled, and its task starts nothing until it stops.

        The returned step carries the mutations of that bookkeeping; commit it before serving.
        """
        engine = cls(config, epoch, state.max_task_id, counters)
        engine._restore(now_ns, state, inflight)
        return engine, engine.step(now_ns)

    # --- input handling -------------------------------------------------------------------

    def _apply(self, item: Input) -> None:
        match item:
            case AttemptReport():
                self._report(item)
            case SubmitTasks():
                self._reply(item.reply_to, self._submit(item.specs))
            case CancelTask():
                self._reply(item.reply_to, self._cancel(item.task_id, item.message))
            case Heartbeat():
                self._heartbeat(item)
            case GetTask():
                self._reply(item.reply_to, self._get(item.task_id))
            case GetTaskByKey():
                task_id = self._keys.get(item.key)
                self._reply(item.reply_to, None if task_id is None else self._get(task_id))
            case WaitTask():
                self._wait(item)
            case ListTasks():
                self._reply(item.reply_to, self._list(item))
            case AddSchedule():
                self._reply(item.reply_to, self._add_schedule(item.spec, item.replace))
            case PauseSchedule():
                self._reply(item.reply_to, self._pause_schedule(item.name, paused=True))
            case ResumeSchedule():
                self._reply(item.reply_to, self._pause_schedule(item.name, paused=False))
            case RemoveSchedule():
                self._reply(item.reply_to, self._remove_schedule(item.name))
            case ListSchedules():
                self._reply(item.reply_to, [s.record() for s in self._schedules.values()])
            case OfferSlots():
                # A worker serving one pool is used before one serving several, which could
                # also take another pool's task.
                groups = sorted(item.groups, key=lambda group: len(group[0]))
                self._slots = [_SlotGroup(pools, free) for pools, free in groups if free > 0]
            case WithdrawAttempts():
                for token in item.tokens:
                    task = self._current_attempt(token)
                    if task is not None:
                        self._unstart(
                            task, f"attempt {token.attempt} was not started: {item.reason}"
                        )

    def _reply(self, reply_to: object, value: object) -> None:
        if reply_to is not None:
            self._out.replies.append((reply_to, value))

    def _submit(self, specs: Sequence[TaskSpec]) -> list[SubmitResult] | CronoqError:
        # Validate the whole batch before applying any of it: nothing is half-applied.
        new_per_pool: dict[str, int] = {}
        batch_keys: set[str] = set()
        for spec in specs:
            if spec.pool not in self._pools:
                return UnknownPool(f"unknown pool {spec.pool!r}; configured: {self._pool_names()}")
            for parent in spec.after:
                if parent > self.high_water_mark or parent <= 0:
                    return UnknownDependency(
                        f"task {spec.kind!r} depends on task {parent}, which was never submitted"
                    )
            if spec.key is not None:
                if spec.key in self._keys or spec.key in batch_keys:
                    continue
                batch_keys.add(spec.key)
            new_per_pool[spec.pool] = new_per_pool.get(spec.pool, 0) + 1
        limit = self.config.max_live_tasks
        total_new = sum(new_per_pool.values())
        if limit is not None and len(self._tasks) + total_new > limit:
            return AdmissionRejected(
                f"{len(self._tasks)} live tasks + {total_new} new would exceed "
                f"max_live_tasks={limit}"
            )
        for name, count in new_per_pool.items():
            pool = self._pools[name]
            cap = pool.config.max_live
            if cap is not None and pool.live + count > cap:
                return AdmissionRejected(
                    f"pool {name!r} has {pool.live} live tasks; {count} more would exceed "
                    f"its max_live={cap}"
                )
        if self._next_id + total_new - 1 > self._last_id:
            return self._ids_exhausted()
        results: list[SubmitResult] = []
        for spec in specs:
            if spec.key is not None and (existing := self._keys.get(spec.key)) is not None:
                results.append(SubmitResult(existing, created=False))
                continue
            results.append(SubmitResult(self._create(spec).id, created=True))
        return results

    def _ids_exhausted(self) -> SchedulerError:
        return SchedulerError(
            f"epoch {self.epoch} has issued every task id of its range (up to {self._last_id}); "
            "restart the scheduler so that it leads under a new epoch"
        )

    def _create(self, spec: TaskSpec) -> _Task:
        # Callers check first (all or nothing); this guards the invariant ids rely on.
        assert self._next_id <= self._last_id, self._ids_exhausted()
        task = _Task(self._next_id, spec, self._now)
        self._next_id += 1
        self._tasks[task.id] = task
        self._pools[spec.pool].live += 1
        bump(self.counters.submitted, spec.pool)
        if spec.key is not None:
            self._keys[spec.key] = task.id
        blocker = self._link_parents(task) if spec.after else None
        task.status = Status.WAITING if task.pending else self._initial_status(task)
        self._out.mutations.append(TaskSubmitted(task.id, spec, task.status, self._now))
        if blocker is not None:
            self._end_for_parent(task, *blocker)
        elif not task.pending:
            self._arm(task)
        else:
            self._set_wake(task, spec.deadline_ns)  # a waiting task still fails at its deadline
        return task

    def _link_parents(self, task: _Task) -> tuple[int, Status] | None:
        """Count unfinished parents; return a parent that failed or was cancelled, if any."""
        blocker: tuple[int, Status] | None = None
        for parent_id in task.spec.after:
            if parent_id in self._tasks:
                task.pending += 1
                self._dependents.setdefault(parent_id, []).append(task.id)
                continue
            done = self._finished.get(parent_id)
            # Unknown ids below the high-water mark finished before the retention window.
            if done is not None and done.status is not Status.SUCCEEDED and blocker is None:
                blocker = (parent_id, done.status)
        return blocker

    def _initial_status(self, task: _Task) -> Status:
        start = task.spec.start_at_ns
        return Status.SCHEDULED if start is not None and start > self._now else Status.READY

    def _arm(self, task: _Task, *, check_miss: bool = True) -> None:
        """Put a task whose dependencies are satisfied where it belongs: a timer or its queue.

        ``check_miss``: whether its fixed start may have been missed; not for a task that a
        leader already saw become ready on time (its row says ready), nor for an attempt that
        was put back unstarted.
        """
        spec = task.spec
        if task.status is Status.SCHEDULED:
            assert spec.start_at_ns is not None
            self._set_wake(task, self._earliest(spec.start_at_ns, spec.deadline_ns))
            return
        start = spec.start_at_ns
        if (
            check_miss
            and start is not None
            and task.attempt == 0  # the policy is about the first start, not a retry
            and spec.miss_policy is MissPolicy.SKIP
            and self._now > start + spec.grace_ns
        ):
            late = _seconds(self._now - start)
            self._finish(task, Status.CANCELLED, f"skipped: fixed start missed by {late}")
            return
        if spec.deadline_ns is not None and self._now >= spec.deadline_ns:
            self._finish(task, Status.FAILED, "deadline passed before the task could start")
            return
        task.status = Status.READY
        heapq.heappush(self._pools[spec.pool].ready, (-spec.priority, task.id))
        self._set_wake(task, spec.deadline_ns)

    def _cancel(self, task_id: int, message: str) -> Status | CronoqError:
        task = self._tasks.get(task_id)
        if task is None:
            done = self._finished.get(task_id)
            if done is None:
                return TaskNotFound(f"no task {task_id}")
            return done.status
        if task.status is not Status.RUNNING:
            self._finish(task, Status.CANCELLED, message)
            return Status.CANCELLED
        if not task.cancel_requested:
            task.cancel_requested = True
            task.message = message
            self._out.mutations.append(CancelRequested(task.id, self._now, message))
            self._out.cancels.append(CancelAttempt(task.token(self.epoch), task.spec.pool, message))
        return Status.RUNNING

    def _current_attempt(self, token: AttemptToken) -> _Task | None:
        task = self._tasks.get(token.task_id)
        if (
            task is None
            or token.epoch != self.epoch
            or task.status is not Status.RUNNING
            or task.attempt != token.attempt
        ):
            return None
        return task

    def _stale(
        self, token: AttemptToken, remote: bool, received_ns: int | None = None
    ) -> StaleAttempt | None:
        """Why a heartbeat or report of ``token`` must change nothing, if it must."""
        name = f"attempt {token.attempt} of task {token.task_id} (epoch {token.epoch})"
        task = self._tasks.get(token.task_id)
        if remote and task is not None and self._pools[task.spec.pool].config.lease_ns is None:
            # A worker may not end an attempt that runs in this process.
            return StaleAttempt(f"{name} was not leased to a worker", "unknown")
        if token.epoch != self.epoch:
            message = f"{name} belongs to an earlier leader (epoch now {self.epoch})"
            return StaleAttempt(message, "epoch")
        if task is None:
            done = self._finished.get(token.task_id)
            if done is None:
                return StaleAttempt(f"{name}: no such task", "unknown")
            return StaleAttempt(f"{name}: the task is {done.status}", "finished")
        if task.status is not Status.RUNNING or task.attempt != token.attempt:
            return StaleAttempt(
                f"{name} is not current (the task is {task.status}, attempt {task.attempt})",
                "attempt",
            )
        lease_end = self._leases.get(task.id)
        if lease_end is not None and lease_end <= (received_ns or self._now):
            return StaleAttempt(f"{name}: its lease expired", "lease")
        return None

    def _report(self, item: AttemptReport) -> None:
        stale = self._stale(item.token, item.remote, item.received_ns)
        if stale is not None:
            zombie = self._zombies.get(item.token.task_id)
            # A worker's report ends only a leased zombie: never an attempt of this process.
            if zombie is not None and (
                not item.remote or self._pools[zombie[1]].config.lease_ns is not None
            ):
                self._end_zombie(item.token)
            self._reply(item.reply_to, stale)
            return
        task = self._tasks[item.token.task_id]
        self._leases.pop(task.id, None)
        self._pools[task.spec.pool].running -= 1
        outcome = item.outcome
        if isinstance(outcome, AttemptSucceeded):
            message = f"attempt {task.attempt} succeeded"
            self._finish(task, Status.SUCCEEDED, message, output=outcome.output)
        elif task.cancel_requested:
            self._finish(task, Status.CANCELLED, task.message)
        else:
            self._attempt_failed(task, outcome.message, outcome.retryable, outcome.retry_after_ns)
        self._reply(item.reply_to, None)

    def _end_zombie(self, token: AttemptToken) -> None:
        """A stopped attempt finally reported: free its slot and let its task go on."""
        zombie = self._zombies.get(token.task_id)
        if zombie is None or zombie[0] != token:
            return
        del self._zombies[token.task_id]
        self._zombie_leases.pop(token.task_id, None)
        pool = self._pools.get(zombie[1])
        if pool is not None:
            pool.running -= 1
        if token.task_id in self._deferred:
            self._deferred.discard(token.task_id)
            task = self._tasks[token.task_id]
            heapq.heappush(self._pools[task.spec.pool].ready, (-task.spec.priority, task.id))

    def _stop_attempt(self, task: _Task, reason: str) -> None:
        """Cancel the running attempt of ``task``, which the engine is ending on its own.

        The attempt keeps its slot until it reports (Python cannot kill a thread, an async
        function may ignore its cancellation, a worker may finish first): the pool's limit and
        "one attempt of a task at a time" hold for attempts that outlive their timeout. A leased
        (remote) attempt also lets go when its lease ends, since its worker may be gone.
        """
        token = task.token(self.epoch)
        self._out.cancels.append(CancelAttempt(token, task.spec.pool, reason))
        self._zombies[task.id] = (token, task.spec.pool)
        lease_end = self._leases.pop(task.id, None)
        if lease_end is not None:
            self._zombie_leases[task.id] = lease_end

    def _unstart(self, task: _Task, message: str) -> None:
        """Put back a dispatched attempt that no executor received: it does not count."""
        self._pools[task.spec.pool].running -= 1
        self._leases.pop(task.id, None)
        task.attempt -= 1
        # RUNNING -> READY is not a transition of the task's life: the attempt never began.
        task.status = Status.READY
        task.message = message
        task.updated_ns = self._now
        task.wake_ns = None
        self._out.mutations.append(
            TaskUpdated(task.id, Status.READY, task.attempt, message, self._now)
        )
        self._arm(task, check_miss=False)

    def _heartbeat(self, item: Heartbeat) -> None:
        stale = self._stale(item.token, item.remote, item.received_ns)
        if stale is not None:
            self._reply(item.reply_to, stale)
            return
        task = self._tasks[item.token.task_id]
        self._set_wake(task, self._running_wake(task))
        reason = task.message if task.cancel_requested else None
        self._reply(item.reply_to, HeartbeatReply(self._leases.get(task.id), reason))

    def _attempt_failed(
        self, task: _Task, reason: str, retryable: bool, retry_after_ns: int | None
    ) -> None:
        """The running attempt of ``task`` ended without success (its slot is already freed)."""
        spec = task.spec
        attempt = task.attempt
        if not retryable:
            bump(self.counters.dead_lettered, spec.pool)
            self._finish(task, Status.FAILED, f"attempt {attempt} failed (not retryable): {reason}")
            return
        if attempt >= spec.retry.max_attempts:
            message = f"attempt {attempt} failed: {reason}; no attempts left"
            bump(self.counters.dead_lettered, spec.pool)
            self._finish(task, Status.FAILED, message)
            return
        delay = retry_after_ns
        if delay is None:
            delay = spec.retry.delay_ns(attempt, self._rng.random())
        due = self._now + delay
        if spec.deadline_ns is not None and due >= spec.deadline_ns:
            message = f"attempt {attempt} failed: {reason}; the next would start after the deadline"
            bump(self.counters.dead_lettered, spec.pool)
            self._finish(task, Status.FAILED, message)
            return
        bump(self.counters.retries, spec.pool)
        message = f"attempt {attempt} failed: {reason}; retrying in {_seconds(delay)}"
        self._transition(task, Status.RETRYING, message)
        self._out.mutations.append(
            TaskUpdated(task.id, Status.RETRYING, attempt, message, self._now, due_ns=due)
        )
        task.wake_ns = None
        self._set_wake(task, self._earliest(due, spec.deadline_ns))

    def _finish(
        self, task: _Task, status: Status, message: str, output: bytes | None = None
    ) -> None:
        """Make ``task`` terminal, persist it, answer its waiters and settle its dependents."""
        pending = [(task, status, message, output)]
        while pending:
            task, status, message, output = pending.pop()
            if task.status.is_terminal:
                continue  # a child reached twice: it names the same parent twice in ``after``
            self._transition(task, status, message)
            task.wake_ns = None
            self._out.mutations.append(
                TaskUpdated(task.id, status, task.attempt, message, self._now, output=output)
            )
            del self._tasks[task.id]
            self._leases.pop(task.id, None)
            bump(self.counters.finished, (task.spec.pool, status.value))
            pool = self._pools.get(task.spec.pool)
            if pool is not None:  # None only for a recovered task whose pool was removed
                pool.live -= 1
            self._finished[task.id] = task.summary()
            self._deferred.discard(task.id)
            waiters = self._waiters.pop(task.id, None)
            if waiters:
                record = task.record(output)
                for reply_to in waiters.values():
                    self._reply(reply_to, record)
            for child_id in self._dependents.pop(task.id, ()):
                child = self._tasks.get(child_id)
                if child is None:
                    continue
                if status is Status.SUCCEEDED:
                    child.pending -= 1
                    if child.pending == 0:
                        self._transition(child, self._initial_status(child), child.message)
                        self._arm(child)
                        self._persist_status(child)
                else:
                    child_status, child_message = self._parent_verdict(task.id, status)
                    pending.append((child, child_status, child_message, None))

    @staticmethod
    def _parent_verdict(parent_id: int, parent_status: Status) -> tuple[Status, str]:
        if parent_status is Status.CANCELLED:
            return Status.CANCELLED, f"dependency {parent_id} was cancelled"
        return Status.FAILED, f"dependency {parent_id} failed"

    def _end_for_parent(self, task: _Task, parent_id: int, parent_status: Status) -> None:
        status, message = self._parent_verdict(parent_id, parent_status)
        self._finish(task, status, message)

    def _persist_status(self, task: _Task) -> None:
        """Persist a move out of waiting or scheduled, so that a restart knows the task became
        ready on time and does not apply its miss policy to it."""
        if task.status.is_terminal:
            return  # _arm finished it, and persisted that
        self._out.mutations.append(
            TaskUpdated(task.id, task.status, task.attempt, task.message, self._now)
        )

    def _transition(self, task: _Task, status: Status, message: str) -> None:
        if status not in LEGAL_TRANSITIONS[task.status]:
            raise AssertionError(f"illegal transition {task.status} -> {status} of task {task.id}")
        task.status = status
        task.message = message
        task.updated_ns = self._now

    # --- reads ----------------------------------------------------------------------------

    def _get(self, task_id: int) -> TaskRecord | TaskSummary | CronoqError:
        task = self._tasks.get(task_id)
        if task is not None:
            return task.record()
        quarantined = self._quarantined.get(task_id)
        if quarantined is not None:
            return quarantined
        done = self._finished.get(task_id)
        if done is not None:
            return done
        return TaskNotFound(f"no task {task_id}")

    def _wait(self, item: WaitTask) -> None:
        if item.task_id in self._tasks:
            self._waiters.setdefault(item.task_id, {})[id(item.reply_to)] = item.reply_to
        else:
            self._reply(item.reply_to, self._get(item.task_id))

    def _list(self, query: ListTasks) -> list[TaskSummary]:
        after = query.after if query.after is not None else 0
        found: list[TaskSummary] = []
        sources: tuple[Iterable[_Task | TaskSummary], ...] = (
            self._tasks.values(),
            self._finished.values(),
        )
        for source in sources:
            for item in source:
                summary = item.summary() if isinstance(item, _Task) else item
                if (
                    summary.task_id > after
                    and (query.statuses is None or summary.status in query.statuses)
                    and (query.pool is None or summary.pool == query.pool)
                    and (query.kind is None or summary.kind == query.kind)
                    and (query.tag is None or query.tag in summary.tags)
                ):
                    found.append(summary)
        # Ascending ids (submission order), so that ``after`` pages through a stable order.
        if query.limit is not None and query.limit < len(found):
            return heapq.nsmallest(query.limit, found, key=lambda summary: summary.task_id)
        found.sort(key=lambda summary: summary.task_id)
        return found

    def gauges(self) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """Live tasks by (pool, status), and attempts holding a slot by pool."""
        depth: dict[tuple[str, str], int] = {}
        for task in self._tasks.values():
            bump(depth, (task.spec.pool, task.status.value))
        return depth, {name: pool.running for name, pool in self._pools.items()}

    # --- schedules ------------------------------------------------------------------------

    def _add_schedule(self, spec: ScheduleSpec, replace: bool) -> ScheduleRecord | CronoqError:
        if spec.template.pool not in self._pools:
            return UnknownPool(
                f"schedule {spec.name!r} uses unknown pool {spec.template.pool!r}; "
                f"configured: {self._pool_names()}"
            )
        existing = self._schedules.get(spec.name)
        if existing is not None and not replace:
            return DuplicateSchedule(f"a schedule named {spec.name!r} already exists")
        try:
            cron = CronSchedule.parse(spec.cron, spec.timezone)
            next_ns = cron.next_after(self._now)
        except CronoqError as exc:  # InvalidCron, UnknownTimeZone: rejected like any bad input
            return exc
        record = ScheduleRecord(
            spec,
            next_ns,
            # A redeploy that re-registers its schedules must not undo an operator's pause.
            paused=existing.paused if existing else False,
            last_task_id=existing.last_task_id if existing else None,
        )
        self._schedules[spec.name] = schedule = _Schedule(record, cron)
        self._save_schedule(schedule)
        return record

    def _pause_schedule(self, name: str, paused: bool) -> ScheduleRecord | CronoqError:
        schedule = self._schedules.get(name)
        if schedule is None:
            return ScheduleNotFound(f"no schedule named {name!r}")
        if schedule.paused != paused:
            schedule.paused = paused
            if not paused:
                # Occurrences that passed while paused are not caught up.
                schedule.next_ns = schedule.cron.next_after(self._now)
            self._save_schedule(schedule)
        return schedule.record()

    def _remove_schedule(self, name: str) -> CronoqError | None:
        if self._schedules.pop(name, None) is None:
            return ScheduleNotFound(f"no schedule named {name!r}")
        self._out.mutations.append(ScheduleRemoved(name))
        return None

    def _save_schedule(self, schedule: _Schedule) -> None:
        self._out.mutations.append(ScheduleSaved(schedule.record()))
        if not schedule.paused:
            heapq.heappush(self._schedule_timers, (schedule.next_ns, schedule.spec.name))

    def _fire_schedules(self) -> None:
        timers = self._schedule_timers
        now = self._now
        while timers and timers[0][0] <= now:
            due, name = heapq.heappop(timers)
            if not self._schedule_due(due, name):
                continue  # a stale timer: removed, paused or rescheduled since
            schedule = self._schedules[name]
            spec = schedule.spec
            missed = now - due > spec.grace_ns
            overlapping = (
                spec.overlap is OverlapPolicy.SKIP and schedule.last_task_id in self._tasks
            )
            # A recovered schedule may name a pool no longer configured: its occurrences are
            # skipped (the schedule stays listed) rather than breaking every step.
            # Without ids left (see _ids.py) an occurrence is skipped like one whose pool left.
            runnable = spec.template.pool in self._pools and self._next_id <= self._last_id
            if (
                runnable
                and not overlapping
                and not (missed and spec.catch_up is CatchUpPolicy.SKIP)
            ):
                template = spec.template
                task_spec = TaskSpec(
                    pool=template.pool,
                    kind=template.kind,
                    payload=template.payload,
                    tags=template.tags,
                    name=spec.name,
                    priority=template.priority,
                    retry=template.retry,
                    timeout_ns=template.timeout_ns,
                    schedule=spec.name,
                )
                schedule.last_task_id = self._create(task_spec).id
            # Every occurrence up to now is covered by this firing (coalesced).
            schedule.next_ns = schedule.cron.next_after(now)
            self._save_schedule(schedule)

    # --- timers and dispatch --------------------------------------------------------------

    @staticmethod
    def _earliest(a: int | None, b: int | None) -> int | None:
        if a is None:
            return b
        if b is None:
            return a
        return min(a, b)

    def _set_wake(self, task: _Task, wake_ns: int | None) -> None:
        if wake_ns == task.wake_ns:
            return  # its timer is already in the heap: a heartbeat without a lease, say
        task.wake_ns = wake_ns
        if wake_ns is not None:
            heapq.heappush(self._timers, (wake_ns, task.id))

    def _running_wake(self, task: _Task) -> int | None:
        spec = task.spec
        wake = spec.deadline_ns
        if spec.timeout_ns is not None:
            wake = self._earliest(wake, task.updated_ns + spec.timeout_ns)
        lease = self._pools[spec.pool].config.lease_ns
        if lease is not None:
            self._leases[task.id] = self._now + lease
            wake = self._earliest(wake, self._now + lease)
        return wake

    def _fire_task_timers(self) -> None:
        timers = self._timers
        now = self._now
        while timers and timers[0][0] <= now:
            wake, task_id = heapq.heappop(timers)
            task = self._tasks.get(task_id)
            if task is None or task.wake_ns != wake:
                continue  # stale: the task moved on since this timer was set
            task.wake_ns = None
            self._on_timer(task)

    def _on_timer(self, task: _Task) -> None:
        spec = task.spec
        deadline_passed = spec.deadline_ns is not None and self._now >= spec.deadline_ns
        status = task.status
        if status is Status.RUNNING:
            if deadline_passed:
                message = f"deadline passed during attempt {task.attempt}"
                self._stop_attempt(task, message)
                self._finish(task, Status.FAILED, message)
                return
            if task.cancel_requested:
                self._stop_attempt(task, task.message)
                self._finish(task, Status.CANCELLED, task.message)
                return
            timeout = spec.timeout_ns
            if timeout is not None and self._now >= task.updated_ns + timeout:
                reason = f"timed out after {_seconds(timeout)}"
            else:
                reason = "lost: its worker stopped heartbeating"
                bump(self.counters.attempts_lost, spec.pool)
            self._stop_attempt(task, reason)
            self._attempt_failed(task, reason, retryable=True, retry_after_ns=None)
        elif deadline_passed:
            self._finish(task, Status.FAILED, "deadline passed before the task could start")
        elif status is Status.SCHEDULED:
            self._transition(task, Status.READY, task.message)
            self._arm(task)  # a leader stalled past the grace missed the start too
            self._persist_status(task)
        elif status is Status.RETRYING:
            self._transition(task, Status.READY, task.message)
            self._arm(task)

    def _dispatch_ready(self) -> None:
        if not self._dispatching:
            return
        for pool in self._pools.values():
            ready = pool.ready
            limit = pool.config.concurrency
            leased = pool.config.lease_ns is not None
            while ready and pool.running < limit:
                slot = self._free_slot(pool.config.name) if leased else None
                if leased and slot is None:
                    break
                _, task_id = heapq.heappop(ready)
                task = self._tasks.get(task_id)
                if task is None or task.status is not Status.READY:
                    continue  # cancelled or failed while queued
                if task_id in self._zombies:
                    self._deferred.add(task_id)  # re-queued when the old attempt reports
                    continue
                task.attempt += 1
                message = f"attempt {task.attempt} started"
                self.counters.start_delay.observe((self._now - task.updated_ns) / NS_PER_S)
                self._transition(task, Status.RUNNING, message)
                pool.running += 1
                if slot is not None:
                    slot.free -= 1
                self._out.mutations.append(
                    TaskUpdated(task.id, Status.RUNNING, task.attempt, message, self._now)
                )
                self._set_wake(task, self._running_wake(task))
                self._out.dispatches.append(
                    Dispatch(
                        task.token(self.epoch),
                        task.spec,
                        self._leases.get(task.id),
                        None if slot is None else slot.pools,
                    )
                )

    def _free_slot(self, pool: str) -> _SlotGroup | None:
        for slot in self._slots:
            if slot.free and pool in slot.pools:
                return slot
        return None

    def _expire_zombies(self) -> None:
        for task_id, lease_end in list(self._zombie_leases.items()):
            if lease_end <= self._now:
                token = self._zombies[task_id][0]
                self._out.expired.append(token)
                self._end_zombie(token)

    def _next_wake(self) -> int | None:
        self._compact_heaps()
        zombie_end = min(self._zombie_leases.values(), default=None)
        # Drop stale heads so a cancelled task's timer does not cause a useless wake-up.
        tasks, schedules = self._timers, self._schedule_timers
        while tasks and self._tasks.get(tasks[0][1], _NO_TASK).wake_ns != tasks[0][0]:
            heapq.heappop(tasks)
        while schedules and not self._schedule_due(*schedules[0]):
            heapq.heappop(schedules)
        return self._earliest(
            self._earliest(tasks[0][0] if tasks else None, zombie_end),
            schedules[0][0] if schedules else None,
        )

    def _compact_heaps(self) -> None:
        """Rebuild a heap once most of its entries are stale (their task finished or moved
        on), so that memory follows the live tasks, not every timer ever set. Each rebuild
        is linear and follows as many stale pushes: amortised O(1) per entry."""
        live = len(self._tasks)
        if len(self._timers) > 2 * live + 1024:
            self._timers = [
                (t.wake_ns, t.id) for t in self._tasks.values() if t.wake_ns is not None
            ]
            heapq.heapify(self._timers)
        if len(self._schedule_timers) > 2 * len(self._schedules) + 1024:
            self._schedule_timers = [
                (s.next_ns, name) for name, s in self._schedules.items() if not s.paused
            ]
            heapq.heapify(self._schedule_timers)
        for pool in self._pools.values():
            if len(pool.ready) > 2 * pool.live + 1024:
                pool.ready = [
                    entry
                    for entry in pool.ready
                    if (t := self._tasks.get(entry[1])) is not None and t.status is Status.READY
                ]
                heapq.heapify(pool.ready)

    def _schedule_due(self, due: int, name: str) -> bool:
        schedule = self._schedules.get(name)
        return schedule is not None and not schedule.paused and schedule.next_ns == due

    def _prune_finished(self) -> None:
        horizon = self._now - self.config.retention_ns
        finished = self._finished
        while finished:
            task_id = next(iter(finished))
            summary = finished[task_id]
            if summary.finished_ns is not None and summary.finished_ns >= horizon:
                break
            del finished[task_id]
            self._quarantined.pop(task_id, None)
            if summary.key is not None and self._keys.get(summary.key) == task_id:
                del self._keys[summary.key]

    def _pool_names(self) -> str:
        return ", ".join(sorted(self._pools))

    # --- recovery -------------------------------------------------------------------------

    def _restore(self, now: int, state: RecoveredState, inflight: InFlight | None) -> None:
        self._now = now
        finished_rows = sorted(
            (r for r in state.tasks if r.status.is_terminal), key=lambda r: r.updated_ns
        )
        for row in finished_rows:
            spec = row.spec
            self._finished[row.task_id] = TaskSummary(
                row.task_id,
                row.status,
                row.attempt,
                spec.pool,
                spec.kind,
                spec.key,
                spec.tags,
                row.updated_ns,
            )
            if spec.key is not None:
                self._keys[spec.key] = row.task_id
        for task_id, reason in state.quarantined:
            self._finished[task_id] = TaskSummary(task_id, Status.FAILED, 0, "", "", None, (), now)
            # Lookups answer with what is known: failed, and why, not a decoding error.
            self._quarantined[task_id] = TaskRecord(
                task_id, _NO_TASK.spec, Status.FAILED, 0, f"quarantined: {reason}", now, now
            )
        live_rows = [r for r in state.tasks if not r.status.is_terminal]
        for row in live_rows:
            task = _Task(row.task_id, row.spec, row.submitted_ns)
            task.status = row.status
            task.attempt = row.attempt
            task.message = row.message
            task.updated_ns = row.updated_ns
            task.cancel_requested = row.cancel_requested
            self._tasks[task.id] = task
            if row.spec.key is not None:
                self._keys[row.spec.key] = task.id
            if row.spec.pool in self._pools:
                self._pools[row.spec.pool].live += 1
        for schedule_row in state.schedules:
            try:
                cron = CronSchedule.parse(schedule_row.spec.cron, schedule_row.spec.timezone)
            except CronoqError:
                # Its cron or zone no longer parses (a tzdata update, say): it must not block
                # start-up. It stays in the store, inactive, until replaced or removed.
                continue
            schedule = _Schedule(schedule_row, cron)
            self._schedules[schedule.spec.name] = schedule
            if not schedule.paused:
                heapq.heappush(self._schedule_timers, (schedule.next_ns, schedule.spec.name))
        # Parents come before their dependents in id order, so one pass settles every cascade.
        for row in live_rows:
            restored = self._tasks.get(row.task_id)
            if restored is not None:  # a failed parent's cascade may have finished it already
                self._restore_task(restored, row.due_ns, inflight)
        if inflight is not None:
            for token in inflight.executing:
                self._restore_stopped_attempt(token, inflight)

    def _restore_stopped_attempt(self, token: AttemptToken, inflight: InFlight) -> None:
        """An attempt of this process still executing: if the rows no longer show it as its
        task's current attempt (its timeout, deadline or cancellation landed in an uncertain
        commit), it is told to stop, and keeps its slot until it reports."""
        task = self._tasks.get(token.task_id)
        if task is not None and task.status is Status.RUNNING and task.attempt == token.attempt:
            return  # adopted by _restore_task
        done = self._finished.get(token.task_id) if task is None else None
        reason = f"attempt {token.attempt} is no longer current"
        if task is not None:
            reason = task.message
        elif done is not None:
            reason = f"the task is {done.status}"
        pool_name = inflight.executing[token]
        pool = self._pools.get(pool_name)
        if pool is None:
            self._out.expired.append(token)  # nothing here can stop it or wait for it
            return
        self._out.cancels.append(CancelAttempt(token, pool_name, reason))
        lease = pool.config.lease_ns
        latest = task.attempt if task is not None else done.attempt if done is not None else None
        if lease is not None and latest != token.attempt:
            # A later attempt began, or the task is gone: this one had been let go (its lease
            # ended), and nothing waits for its report.
            self._out.expired.append(token)
            return
        pool.running += 1
        self._zombies[token.task_id] = (token, pool_name)
        if lease is not None:
            # Its lease as the engine before the rebuild knew it is gone: a whole one from now
            # holds the task (its worker may still run it), and no longer (it may be gone).
            # One whose lease had ended is not here (the driver forgets those: ``expired``),
            # unless the step that ended it is the uncertain one: it then holds one lease
            # more, a later retry but never two attempts at once.
            self._zombie_leases[token.task_id] = self._now + lease

    def _restore_task(self, task: _Task, due_ns: int | None, inflight: InFlight | None) -> None:
        spec = task.spec
        if spec.pool not in self._pools:
            # Its pool is no longer configured: fail it visibly rather than keep it forever.
            self._finish(task, Status.FAILED, f"pool {spec.pool!r} is no longer configured")
            return
        if task.status is Status.RUNNING:
            pool = self._pools[spec.pool]
            pool.running += 1
            token = task.token(self.epoch)
            if inflight is not None and (token in inflight.executing or token in inflight.reported):
                self._set_wake(task, self._running_wake(task))
                if task.cancel_requested and token in inflight.executing:
                    # The cancellation may have landed in the uncertain commit: deliver it.
                    self._out.cancels.append(CancelAttempt(token, spec.pool, task.message))
                return
            if inflight is not None and not inflight.released(token):
                self._unstart(
                    task, f"attempt {task.attempt} was not started (its commit was uncertain)"
                )
                return
            pool.running -= 1
            if task.cancel_requested:
                self._finish(task, Status.CANCELLED, task.message)
            else:
                reason = "lost: the scheduler stopped while it ran"
                bump(self.counters.attempts_lost, spec.pool)
                self._attempt_failed(task, reason, retryable=True, retry_after_ns=None)
        elif task.status is Status.RETRYING:
            due = due_ns if due_ns is not None else self._now
            self._set_wake(task, self._earliest(due, spec.deadline_ns))
        else:
            blocker = self._link_parents(task) if spec.after else None
            if blocker is not None:
                task.status = Status.WAITING
                self._end_for_parent(task, *blocker)
            elif task.pending:
                task.status = Status.WAITING
                self._set_wake(task, spec.deadline_ns)
            else:
                # A ready row became ready under a leader; only a start that was still ahead
                # (scheduled, waiting) can have passed while no leader ran.
                became_ready = task.status is Status.READY
                task.status = self._initial_status(task)
                self._arm(task, check_miss=not became_ready)
