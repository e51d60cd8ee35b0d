"""The engine's operator calls (issue 21): pausing a pool, retrying a finished task, triggering
a schedule now. Driven through the pure state machine with explicit times; every step's
mutations are applied to a ``MemoryCluster``, as the driver commits them, so that a retry reads
the row the store holds and a recovery sees what was persisted."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from cronoq._engine import (
    AddSchedule,
    AttemptFailed,
    AttemptReport,
    AttemptSucceeded,
    AttemptToken,
    CancelTask,
    Dispatch,
    Engine,
    EngineConfig,
    GetTaskByKey,
    Input,
    ListPools,
    ListTasks,
    OfferSlots,
    PausePool,
    PauseSchedule,
    PoolConfig,
    PoolInfo,
    RetryTask,
    StepResult,
    SubmitTasks,
    TriggerSchedule,
)
from cronoq._memory import MemoryCluster
from cronoq._model import (
    NS_PER_S,
    OverlapPolicy,
    RetryPolicy,
    ScheduleSpec,
    Status,
    TaskSpec,
    TaskTemplate,
)
from cronoq.errors import NotRetryable, ScheduleNotFound, TaskNotFound, UnknownPool
from cronoq.store import PoolPaused, ScheduleSaved, TaskRecord, TaskRetried, TimeBase

S = NS_PER_S
T0 = 1_000_000 * S
TWO = RetryPolicy(max_attempts=2, initial_ns=S, multiplier=1.0, max_ns=S, jitter=0.0)


@dataclass
class Harness:
    """An engine whose every step is committed to a cluster, and the replies it gave."""

    engine: Engine
    cluster: MemoryCluster = field(default_factory=lambda: MemoryCluster(3600 * S))
    now: int = T0

    def step(self, *inputs: Input, at: int | None = None) -> StepResult:
        if at is not None:
            self.now = at
        leased = frozenset(p.name for p in self.engine.config.pools if p.lease_ns is not None)
        if leased:
            inputs = (OfferSlots([(leased, 100)]), *inputs)
        result = self.engine.step(self.now, inputs)
        self.cluster.apply(result.mutations, TimeBase())
        return result

    def ask(self, make: Callable[[object], Input]) -> object:
        """One input, made with its reply_to, and its reply."""
        reply_to = object()
        result = self.step(make(reply_to))
        (value,) = [v for r, v in result.replies if r is reply_to]
        return value

    def submit(self, *specs: TaskSpec) -> list[int]:
        results = self.ask(lambda r: SubmitTasks(list(specs), r))
        assert isinstance(results, list)
        return [r.task_id for r in results]

    def row(self, task_id: int) -> TaskRecord | None:
        return self.cluster.tasks.get(task_id)

    def retry(self, task_id: int) -> object:
        return self.ask(lambda r: RetryTask(task_id, self.row(task_id), "retried by request", r))

    def report(self, dispatch: Dispatch, *, ok: bool, retryable: bool = True) -> StepResult:
        outcome = AttemptSucceeded(b"done") if ok else AttemptFailed("boom", retryable)
        return self.step(AttemptReport(dispatch.token, outcome))

    def recover(self, epoch: int) -> tuple[Engine, StepResult]:
        state = self.cluster.recover(TimeBase(), self.now - 3600 * S)
        engine, result = Engine.recover(self.engine.config, epoch, self.now, state)
        self.cluster.apply(result.mutations, TimeBase())
        self.engine = engine
        return engine, result


def harness(*pools: PoolConfig, max_live_tasks: int | None = None) -> Harness:
    config = EngineConfig(pools or (PoolConfig("default", 1),), 3600 * S, max_live_tasks, 0)
    return Harness(Engine(config, 1))


def spec(kind: str = "job", **options: object) -> TaskSpec:
    return TaskSpec("default", kind, b"payload", retry=TWO, **options)  # type: ignore[arg-type]


def started(result: StepResult) -> list[int]:
    return [d.token.task_id for d in result.dispatches]


# --- pausing a pool -------------------------------------------------------------------------


def test_a_paused_pool_starts_nothing_and_its_running_attempt_finishes() -> None:
    h = harness(PoolConfig("default", 2))
    first = h.step(SubmitTasks([spec("a")], None)).dispatches[0]
    paused = h.ask(lambda r: PausePool("default", True, r))
    assert isinstance(paused, PoolInfo) and paused.paused
    assert h.cluster.paused_pools == {"default"}
    # Ready tasks wait in their queue; the running attempt reports as usual.
    queued = h.submit(spec("b"), spec("c"))
    assert started(h.step(at=T0 + S)) == []
    finished = h.report(first, ok=True)
    assert finished.dispatches == []
    assert h.row(first.token.task_id).status is Status.SUCCEEDED  # type: ignore[union-attr]
    info = h.ask(ListPools)
    assert info == [
        PoolInfo(
            "default",
            2,
            True,
            0,
            {Status.WAITING: 0, Status.SCHEDULED: 0, Status.READY: 2, Status.RUNNING: 0,
             Status.RETRYING: 0},
            False,
        )
    ]  # fmt: skip
    resumed = h.step(PausePool("default", False, None))
    assert started(resumed) == queued  # in queue order
    assert PoolPaused("default", False) in resumed.mutations
    assert h.cluster.paused_pools == set()


def test_pausing_a_paused_pool_writes_nothing_and_an_unknown_pool_is_refused() -> None:
    h = harness()
    h.ask(lambda r: PausePool("default", True, r))
    again = h.step(PausePool("default", True, None))
    assert again.mutations == []
    refused = h.ask(lambda r: PausePool("nope", True, r))
    assert isinstance(refused, UnknownPool)
    assert str(refused) == "unknown pool 'nope'; configured: default"


def test_a_paused_leased_pool_offers_no_attempt_to_workers() -> None:
    h = harness(PoolConfig("remote", 5, lease_ns=30 * S))
    h.ask(lambda r: PausePool("remote", True, r))
    h.submit(TaskSpec("remote", "job", b""))
    assert started(h.step(OfferSlots([(frozenset({"remote"}), 5)]))) == []
    assert len(h.step(PausePool("remote", False, None)).dispatches) == 1


def test_a_pause_survives_a_new_leader_and_one_of_an_unconfigured_pool_is_kept() -> None:
    h = harness(PoolConfig("default", 1), PoolConfig("other", 1))
    h.ask(lambda r: PausePool("default", True, r))
    h.cluster.paused_pools.add("gone")  # a pool an earlier deployment had
    (task_id,) = h.submit(spec())
    _, result = h.recover(epoch=2)
    assert result.dispatches == []
    pools = {p.name: p.paused for p in h.ask(ListPools)}  # type: ignore[attr-defined]
    assert pools == {"default": True, "other": False}
    assert started(h.step(PausePool("default", False, None))) == [task_id]
    assert h.cluster.paused_pools == {"gone"}


# --- retrying a finished task ----------------------------------------------------------------


def dead_letter(h: Harness, task: TaskSpec) -> int:
    """Submit and fail a task until it has no attempts left (TWO: two)."""
    first = h.step(SubmitTasks([task], None)).dispatches[0]
    h.report(first, ok=False)
    second = h.step(at=h.now + S).dispatches[0]
    h.report(second, ok=False)
    task_id = first.token.task_id
    row = h.row(task_id)
    assert row is not None and (row.status, row.attempt) == (Status.FAILED, 2)
    return task_id


def test_a_dead_lettered_task_is_retried_with_exactly_one_more_attempt() -> None:
    h = harness()
    task_id = dead_letter(h, spec())
    result = h.step(RetryTask(task_id, h.row(task_id), "retried by request", None))
    # Ready again, attempt count unchanged, the policy raised to allow attempt 3; then started.
    retried = next(m for m in result.mutations if isinstance(m, TaskRetried))
    assert (retried.status, retried.attempt, retried.spec.retry.max_attempts) == (
        Status.READY,
        2,
        3,
    )
    (dispatch,) = result.dispatches
    assert dispatch.token.attempt == 3
    h.report(dispatch, ok=False)
    row = h.row(task_id)
    assert row is not None
    assert (row.status, row.attempt) == (Status.FAILED, 3)
    assert row.message == "attempt 3 failed: boom; no attempts left"


def test_a_cancelled_task_keeps_the_attempts_it_had_left() -> None:
    h = harness()
    (task_id,) = h.submit(spec(start_at_ns=T0 + 60 * S))
    assert h.ask(lambda r: CancelTask(task_id, "not now", r)) is Status.CANCELLED
    record = h.retry(task_id)
    assert isinstance(record, TaskRecord)
    # Its fixed start is still ahead: it waits for it; its policy is unchanged.
    assert (record.status, record.attempt, record.message) == (
        Status.SCHEDULED,
        0,
        "retried by request",
    )
    assert record.spec.retry == TWO
    row = h.row(task_id)
    assert row is not None and (row.status, row.cancel_requested, row.finished_ns) == (
        Status.SCHEDULED,
        False,
        None,
    )
    assert started(h.step(at=T0 + 60 * S)) == [task_id]


def test_a_retry_refuses_what_it_cannot_run_and_changes_nothing() -> None:
    h = harness()
    (running,) = h.submit(spec("running"))
    refused = h.retry(running)
    assert isinstance(refused, NotRetryable)
    assert str(refused) == (
        f"task {running} is running: only a failed or cancelled task can be retried"
    )
    h.report(_dispatch_of(h, running), ok=True)
    succeeded = h.retry(running)
    assert isinstance(succeeded, NotRetryable)
    assert str(succeeded) == f"task {running} succeeded: rerun it to run it again as a new task"
    missing = h.ask(lambda r: RetryTask(1 << 50, None, "retried by request", r))
    assert isinstance(missing, TaskNotFound)
    before = dict(h.cluster.tasks)
    assert h.step(RetryTask(running, h.row(running), "x", None)).mutations == []
    assert h.cluster.tasks == before


def _dispatch_of(h: Harness, task_id: int) -> Dispatch:
    """The running attempt of a task, as a report names it."""
    row = h.row(task_id)
    assert row is not None and row.status is Status.RUNNING
    return Dispatch(AttemptToken(h.engine.epoch, task_id, row.attempt), row.spec)


def test_a_retry_is_refused_when_its_key_is_held_by_another_live_task() -> None:
    h = harness(PoolConfig("default", 1))
    (first,) = h.submit(spec(key="k"))
    assert h.ask(lambda r: CancelTask(first, "stop", r)) is Status.RUNNING
    h.report(_dispatch_of(h, first), ok=False)
    assert h.row(first).status is Status.CANCELLED  # type: ignore[union-attr]
    # The key is free once its holder finished past the retention; here, a new holder.
    h.now += 3601 * S
    (second,) = h.submit(spec(key="k"))
    refused = h.retry(first)
    assert isinstance(refused, NotRetryable)
    assert str(refused) == f"task {first}'s key 'k' is held by live task {second}"
    h.report(_dispatch_of(h, second), ok=True)
    record = h.retry(first)  # the holder finished: the retried task takes the key back
    assert isinstance(record, TaskRecord) and record.status is Status.READY
    assert h.ask(lambda r: GetTaskByKey("k", r)).task_id == first  # type: ignore[attr-defined]


def test_dependants_stay_failed_and_a_dependant_waits_for_its_retried_parent() -> None:
    h = harness(PoolConfig("default", 1))
    parent = dead_letter(h, spec("parent"))
    # Submitted after the parent failed: it fails at once, naming it.
    (child,) = h.submit(spec("child", after=(parent,)))
    assert h.row(child).message == f"dependency {parent} failed"  # type: ignore[union-attr]
    refused = h.retry(child)
    assert isinstance(refused, NotRetryable)
    assert str(refused) == (
        f"task {child} depends on task {parent}, which failed: retry task {parent} first"
    )
    h.retry(parent)
    # The parent is live again: the child, retried, waits for it and runs once it succeeds.
    record = h.retry(child)
    assert isinstance(record, TaskRecord) and record.status is Status.WAITING
    h.report(_dispatch_of(h, parent), ok=True)
    assert h.row(child).status is Status.RUNNING  # type: ignore[union-attr]


def test_a_retry_after_the_deadline_is_refused() -> None:
    h = harness()
    (task_id,) = h.submit(spec(start_at_ns=T0 + 5 * S, deadline_ns=T0 + 10 * S))
    assert h.ask(lambda r: CancelTask(task_id, "stop", r)) is Status.CANCELLED
    h.now = T0 + 10 * S
    refused = h.retry(task_id)
    assert isinstance(refused, NotRetryable)
    assert str(refused) == f"task {task_id}'s deadline has passed: rerun it as a new task instead"


def test_a_retried_task_survives_a_new_leader() -> None:
    h = harness()
    task_id = dead_letter(h, spec())
    h.engine.stop_dispatching()  # the retried task stays ready in the store
    h.retry(task_id)
    _, result = h.recover(epoch=2)
    (dispatch,) = result.dispatches
    assert (dispatch.token.task_id, dispatch.token.attempt) == (task_id, 3)
    assert dispatch.spec.retry.max_attempts == 3


# --- triggering a schedule --------------------------------------------------------------------


def add_schedule(h: Harness, overlap: str = "skip") -> ScheduleSpec:
    schedule = ScheduleSpec(
        "nightly",
        "0 3 * * *",
        "UTC",
        TaskTemplate("default", "report", b""),
        overlap=OverlapPolicy(overlap),
    )
    h.ask(lambda r: AddSchedule(schedule, False, r))
    return schedule


def test_a_trigger_runs_one_occurrence_now_and_leaves_the_timetable() -> None:
    h = harness()
    add_schedule(h)
    before = h.cluster.schedules["nightly"]
    result = h.step(TriggerSchedule("nightly", "r"))
    (task_id,) = started(result)
    assert ("r", task_id) in result.replies
    (saved,) = [m for m in result.mutations if isinstance(m, ScheduleSaved)]
    assert saved.schedule.last_task_id == task_id
    assert saved.schedule.next_ns == before.next_ns
    # The overlap policy (skip): while that task is live, a second trigger creates nothing.
    assert h.ask(lambda r: TriggerSchedule("nightly", r)) is None
    missing = h.ask(lambda r: TriggerSchedule("weekly", r))
    assert isinstance(missing, ScheduleNotFound)


def test_a_trigger_with_overlap_allowed_runs_beside_the_live_task() -> None:
    h = harness(PoolConfig("default", 2))
    add_schedule(h, overlap="allow")
    first = h.ask(lambda r: TriggerSchedule("nightly", r))
    second = h.ask(lambda r: TriggerSchedule("nightly", r))
    assert isinstance(first, int) and isinstance(second, int) and second > first


def test_a_trigger_of_a_paused_schedule_runs_and_it_stays_paused() -> None:
    h = harness()
    add_schedule(h)
    h.ask(lambda r: PauseSchedule("nightly", r))
    assert isinstance(h.ask(lambda r: TriggerSchedule("nightly", r)), int)
    assert h.cluster.schedules["nightly"].paused


def test_a_retried_task_that_had_left_memory_is_listed_again() -> None:
    # List pages through an index of the ids in memory: a task retried from its stored row
    # (it finished before the retention window, so memory forgot it) must be in it again.
    config = EngineConfig((PoolConfig("default", 1),), 10 * S, None, 0)
    h = Harness(Engine(config, 1))
    first = h.step(SubmitTasks([spec("a")], None)).dispatches[0]
    task_id = first.token.task_id
    h.step(AttemptReport(first.token, AttemptFailed("boom", retryable=False)))
    h.step(at=T0 + 60 * S)  # past the retention: pruned from memory, kept in the store
    assert h.ask(lambda r: ListTasks(r)) == []
    retried = h.retry(task_id)
    assert isinstance(retried, TaskRecord) and retried.status is Status.READY
    assert [t.task_id for t in h.ask(lambda r: ListTasks(r))] == [task_id]  # type: ignore[attr-defined]
