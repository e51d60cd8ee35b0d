"""The engine: a pure, synchronous, deterministic state machine holding every task rule.

``Engine.step(now_ns, inputs)`` applies a batch of inputs and the timers due at ``now_ns`` and
returns a ``StepResult``: the mutations to persist (ONE store commit), the replies owed to
callers and the attempts to dispatch, which the driver releases only after that commit, and the
next time the engine needs to be stepped. It never reads a clock, awaits or touches a store, so
tests drive it with explicit times and simulations replay it exactly.

If a commit fails, the driver discards the engine and rebuilds one from the store with
``Engine.recover()``: the engine itself never has to undo a step. A failed commit may still
have landed, so that rebuild is told which attempts this process really released
(``InFlight``): an attempt the store shows running that no executor received is put back
in its queue without counting, one that ended meanwhile keeps its slot until it stops.

This class is a facade: it routes each input to the room that owns its rule (see
docs/architecture.md for the map) and runs a step's phases in order.
"""

from __future__ import annotations

from collections.abc import Iterable

from cronoq._engine.attempts import Attempts
from cronoq._engine.dispatch import Dispatcher
from cronoq._engine.inputs import (
    AddSchedule,
    AttemptReport,
    AttemptToken,
    CancelTask,
    EngineConfig,
    ExplainTask,
    GetDependants,
    GetTask,
    GetTaskByKey,
    Heartbeat,
    InFlight,
    Input,
    ListLimits,
    ListPools,
    ListSchedules,
    ListTasks,
    OfferSlots,
    PausePool,
    PauseSchedule,
    RemoveSchedule,
    RerunTask,
    ResumeSchedule,
    RetryTask,
    SubmitTasks,
    TriggerSchedule,
    WaitTask,
    WithdrawAttempts,
)
from cronoq._engine.outputs import StepResult
from cronoq._engine.reads import Reads
from cronoq._engine.reruns import Reruns
from cronoq._engine.restore import Restorer
from cronoq._engine.schedules import Schedules
from cronoq._engine.state import Shared
from cronoq._engine.tasks import Tasks
from cronoq._engine.timers import Timers
from cronoq._metrics import Counters, bump
from cronoq.store import OutboxTaken, RecoveredState, TaskRecord

__all__ = ["Engine"]


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
        self._shared = shared = Shared(config, epoch, self.counters)
        self._tasks = tasks = Tasks(shared, high_water_mark)
        self._attempts = attempts = Attempts(shared, tasks)
        self._dispatcher = dispatcher = Dispatcher(shared, tasks, attempts)
        self._reads = Reads(shared, tasks, attempts, dispatcher)
        self._reruns = Reruns(shared, tasks)
        self._schedules = schedules = Schedules(shared, tasks)
        self._timers = Timers(shared, tasks, attempts, schedules)

    # --- public surface -------------------------------------------------------------------

    @property
    def high_water_mark(self) -> int:
        """The last id this engine issued (or recovered)."""
        return self._tasks.high_water_mark

    @property
    def live_count(self) -> int:
        return len(self._shared.tasks)

    def stop_dispatching(self) -> None:
        """Start no more attempts (a graceful shutdown); everything else goes on."""
        self._dispatcher.dispatching = False

    def running_tokens(self) -> set[AttemptToken]:
        return self._attempts.running_tokens()

    def attempt_pool(self, token: AttemptToken, lease_id: bytes) -> str | None:
        """The pool of a remote attempt whose lease ``lease_id`` proves, this leader's or one
        it adopted from an earlier one; None for anything else (see ``Attempts.pool_of``)."""
        return self._attempts.pool_of(token, lease_id)

    def take_waiters(self) -> list[tuple[int, object]]:
        """Remove and return every registered waiter as (task id, reply_to)."""
        return self._tasks.take_waiters()

    def drop_waiter(self, task_id: int, reply_to: object) -> None:
        """Forget a waiter whose caller gave up."""
        self._tasks.drop_waiter(task_id, reply_to)

    def gauges(self) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """Live tasks by (pool, status), and attempts holding a slot by pool."""
        depth: dict[tuple[str, str], int] = {}
        for task in self._shared.tasks.values():
            bump(depth, (task.spec.pool, task.status.value))
        return depth, {name: pool.running for name, pool in self._shared.pools.items()}

    def step(self, now_ns: int, inputs: Iterable[Input] = ()) -> StepResult:
        shared = self._shared
        shared.now = now_ns
        out = shared.out  # may already hold the bookkeeping of a recovery (Restorer)
        # Prune first: a key or parent that left the retention window is gone for these inputs.
        self._tasks.prune_finished()
        for item in inputs:
            self._apply(item)
        self._timers.fire()
        self._attempts.expire_zombies()
        self._schedules.fire()
        shared.gates.fire(now_ns)
        self._dispatcher.dispatch_ready()
        out.next_wake_ns = self._timers.next_wake()
        shared.out = StepResult()
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
        engine._shared.now = now_ns
        Restorer(engine._shared, engine._tasks, engine._attempts, engine._schedules, inflight).run(
            state
        )
        engine._dispatcher.restore_pauses(state.paused_pools)
        return engine, engine.step(now_ns)

    # --- input handling -------------------------------------------------------------------

    def _apply(self, item: Input) -> None:
        reply = self._shared.reply
        tasks = self._tasks
        reads = self._reads
        schedules = self._schedules
        match item:
            case AttemptReport():
                self._attempts.report(item)
            case SubmitTasks():
                submitted = tasks.submit(item.specs, item.key_pools, item.key_kinds)
                if item.outbox and isinstance(submitted, list):
                    self._shared.out.mutations.append(OutboxTaken(item.outbox))
                reply(item.reply_to, submitted)
            case CancelTask():
                reply(item.reply_to, tasks.cancel(item.task_id, item.message))
            case Heartbeat():
                self._attempts.heartbeat(item)
            case GetTask():
                reply(item.reply_to, reads.get(item.task_id))
            case GetDependants():
                reply(item.reply_to, reads.dependants(item.task_id))
            case GetTaskByKey():
                reply(item.reply_to, reads.get_by_key(item.key))
            case WaitTask():
                reads.wait(item.task_id, item.reply_to)
            case ListTasks():
                reply(item.reply_to, reads.list(item))
            case ExplainTask():
                reply(item.reply_to, reads.explain(item.task_id))
            case AddSchedule():
                reply(item.reply_to, schedules.add(item.spec, item.replace))
            case PauseSchedule():
                reply(item.reply_to, schedules.pause(item.name, paused=True))
            case ResumeSchedule():
                reply(item.reply_to, schedules.pause(item.name, paused=False))
            case RemoveSchedule():
                reply(item.reply_to, schedules.remove(item.name))
            case ListSchedules():
                reply(item.reply_to, schedules.records())
            case TriggerSchedule():
                reply(item.reply_to, schedules.trigger(item.name))
            case PausePool():
                reply(item.reply_to, self._dispatcher.pause(item.name, item.paused))
            case ListPools():
                reply(item.reply_to, self._dispatcher.pools())
            case ListLimits():
                reply(item.reply_to, self._shared.gates.infos(item.keys, self._shared.now))
            case RetryTask():
                retried = self._reruns.retry(item.task_id, item.record, item.message)
                if isinstance(retried, TaskRecord):
                    self._attempts.retried(item.task_id)
                reply(item.reply_to, retried)
            case RerunTask():
                reply(item.reply_to, self._reruns.rerun(item.task_id, item.record))
            case OfferSlots():
                self._dispatcher.offer(item)
            case WithdrawAttempts():
                self._dispatcher.withdraw(item.tokens, item.reason)
