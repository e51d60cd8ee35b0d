"""Stateful property tests of the pure engine, with a MemoryCluster as its durable log.

A hypothesis ``RuleBasedStateMachine`` plays the driver: every rule builds inputs, runs ONE
``Engine.step`` at a fake clock and "commits" the step's mutations to the cluster. A commit can
fail; then, exactly like ``Driver._recover_from_failed_step``, the engine is discarded and rebuilt
from the cluster (same epoch, adopting the attempts still in flight) and the rebuild's first step
is committed. Replies count as acknowledged, and dispatches as started, only after their step
committed. A crash discards the engine and every in-flight attempt of this process (pool a) and
recovers under a new epoch; remote attempts (pool b) run on in their workers, which report and
heartbeat them to the new leader with their lease ids.

The machine keeps a model of everything ever committed (it outlives pruning) and checks the
invariants of DESIGN.md on the committed mutation stream, at every dispatch, on every reply, and
after every rule (``@invariant``). The engine is read through a few private attributes where its
public surface says too little (which tasks are live): this is a white-box test of that module.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Set
from dataclasses import dataclass, replace

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from cronoq._engine import (
    AddSchedule,
    AttemptFailed,
    AttemptReport,
    AttemptSucceeded,
    AttemptToken,
    CancelTask,
    Engine,
    EngineConfig,
    Heartbeat,
    HeartbeatReply,
    InFlight,
    Input,
    ListTasks,
    OfferSlots,
    PauseSchedule,
    PoolConfig,
    RemoveSchedule,
    RerunTask,
    ResumeSchedule,
    StaleAttempt,
    StepResult,
    SubmitResult,
    SubmitTasks,
)
from cronoq._engine.state import Task
from cronoq._explain import Explanation, Hold
from cronoq._ids import epoch_of
from cronoq._limits import Limit
from cronoq._memory import MemoryCluster
from cronoq._model import (
    LEGAL_TRANSITIONS,
    NS_PER_S,
    CatchUpPolicy,
    MissPolicy,
    OccurrenceOutcome,
    OverlapPolicy,
    RetryPolicy,
    ScheduleSpec,
    Status,
    TaskSpec,
    TaskTemplate,
)
from cronoq.errors import (
    CronoqError,
    DuplicateSchedule,
    ScheduleNotFound,
    SchedulerError,
    TaskNotFound,
)
from cronoq.store import (
    AttemptEnded,
    CancelRequested,
    Mutation,
    OccurrenceRecorded,
    ScheduleRecord,
    ScheduleRemoved,
    ScheduleSaved,
    TaskSubmitted,
    TaskUpdated,
    TimeBase,
)

MS = 1_000_000
S = NS_PER_S
T0 = 1_700_000_000 * S
"""A fixed, realistic Unix start time: runs do not depend on the wall clock."""

RETENTION_NS = 30 * S
"""Short, so that time jumps regularly push finished tasks out of the engine's memory."""

LIMITS = (
    Limit("tenant", concurrency=1, per_key=True),
    Limit("pair", concurrency=2),
    Limit("window", rate=2, per=2.0),
    Limit("spaced", rate=3, per=3.0, burst=1, per_key=True),
    Limit("latest", concurrency=1, per_key=True, on_full="keep_latest"),
    Limit("newest", concurrency=1, on_full="cancel_running"),
)
"""Every kind of limit but ``reject`` (which refuses a submission: test_limits.py)."""
LIMIT_KEYS = ("x", "y", "z")

POOLS = (
    PoolConfig("a", concurrency=1),
    # A lease, so that attempts which are not heartbeaten are lost and retried. Its tasks all
    # take "pair", which binds below the pool's own concurrency.
    PoolConfig("b", concurrency=3, lease_ns=3 * S, limits=("pair",)),
)
CONFIG = EngineConfig(pools=POOLS, retention_ns=RETENTION_NS, seed=20240611, limits=LIMITS)
CONCURRENCY = {pool.name: pool.concurrency for pool in POOLS}
# Remote workers with slots to spare for the leased pool, offered before every step.
WORKERS = OfferSlots([(frozenset(p.name for p in POOLS if p.lease_ns is not None), 1000)])

NEVER_AUTO_PRUNE_NS = 200 * 366 * 24 * 3600 * S
"""``MemoryCluster.apply`` prunes every 1024 commits against the REAL clock; a keep_finished this
long makes that a no-op, so only the ``prune`` rule (on the fake clock) ever prunes."""

KEYS = ("k1", "k2", "k3")
SCHEDULES = ("s1", "s2")
EVERY_SECOND = "* * * * * *"

INITIAL = frozenset({Status.WAITING, Status.SCHEDULED, Status.READY})
"""The statuses a ``TaskSubmitted`` may carry."""


# --- which persisted status sequences are legal ----------------------------------------------
#
# The log does not see every transition. Reading the engine's rooms (cronoq/_engine/):
# - waiting, scheduled and ready are persisted only by ``TaskSubmitted`` (``Tasks.create``);
# - every ``TaskUpdated`` is running (``Dispatcher.dispatch_ready``), retrying
#   (``Attempts.failed``) or terminal (``Tasks.finish``);
# - waiting->ready/scheduled (``Tasks.finish`` settling a child), scheduled->ready and
#   retrying->ready (``Timers``) and the statuses ``Restorer`` assigns directly are never
#   persisted.
# So between two persisted statuses the task may pass through any number of waiting, scheduled
# and ready states unseen: the pair (a, b) is legal iff LEGAL_TRANSITIONS has a path a -> ... -> b
# whose intermediate states are all in UNPERSISTED. E.g. retrying -> running goes through ready,
# and waiting -> running through (scheduled ->) ready.
UNPERSISTED = frozenset({Status.WAITING, Status.SCHEDULED, Status.READY})


def _persisted_successors(start: Status) -> frozenset[Status]:
    seen: set[Status] = set()
    frontier = [start]
    reached: set[Status] = set()
    while frontier:
        status = frontier.pop()
        for nxt in LEGAL_TRANSITIONS[status]:
            reached.add(nxt)
            if nxt in UNPERSISTED and nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return frozenset(reached)


PERSISTED_SUCCESSORS = {status: _persisted_successors(status) for status in Status}


def _legal_persisted(before: Status, after: Status) -> bool:
    # The brief also admits re-persisting the same live status (no code path does so today).
    return after in PERSISTED_SUCCESSORS[before] or (after is before and not before.is_terminal)


# --- the model -------------------------------------------------------------------------------


@dataclass
class TaskModel:
    """What the committed log says about one task. Kept after the row is pruned."""

    spec: TaskSpec
    submitted_ns: int
    statuses: list[Status]
    attempt: int = 0
    due_ns: int | None = None
    """Due time of the last persisted retrying status."""
    started_ns: int | None = None
    """Start of the last persisted attempt."""
    finished_ns: int | None = None
    leased_finish: bool = False
    """Finished with the lease of an attempt that may still run: one update clears it."""
    cancel_requested: bool = False
    ended_attempt: int | None = None
    """The attempt an ``AttemptEnded`` ended, until the update that ends it too."""
    ended_message: str = ""

    @property
    def status(self) -> Status:
        return self.statuses[-1]

    @property
    def live(self) -> bool:
        return not self.status.is_terminal


def _token_order(token: AttemptToken) -> tuple[int, int, int]:
    return token.epoch, token.task_id, token.attempt


def _reply(result: StepResult, tag: str) -> object:
    values = [value for reply_to, value in result.replies if reply_to == tag]
    assert len(values) == 1, f"expected one reply to {tag!r}, got {result.replies!r}"
    return values[0]


# --- strategies ------------------------------------------------------------------------------

FAIL = st.integers(0, 11).map(lambda n: n == 11)
"""A commit fails about one time in twelve; shrinks towards success."""

DELTAS = st.one_of(
    st.sampled_from([MS, 100 * MS, 500 * MS, S, 2 * S, 5 * S, 15 * S, 45 * S]),
    st.integers(1, 3 * S),
)

OUTCOMES: st.SearchStrategy[AttemptSucceeded | AttemptFailed] = st.one_of(
    # Half the attempts succeed, so that dependents get to run.
    st.sampled_from([AttemptSucceeded(b"ok"), AttemptSucceeded(None)]),
    st.sampled_from(
        [
            AttemptFailed("boom"),
            AttemptFailed("boom", retry_after_ns=0),
            AttemptFailed("boom", retry_after_ns=3 * S),
            AttemptFailed("fatal", retryable=False),
        ]
    ),
)


def _specs(now: int, live_ids: list[int], recent_ids: list[int]) -> st.SearchStrategy[TaskSpec]:
    """Valid task specs: small retries and backoffs, start/deadline in the near future."""
    # Parents are mostly live tasks, so that dependents wait and then run; recent finished ones
    # test the retention rules. A parent may be named twice, which the engine settles once.
    after: st.SearchStrategy[tuple[int, ...]] = st.just(())
    if live_ids or recent_ids:
        parent = st.sampled_from(sorted(set(live_ids) | set(recent_ids)))
        if live_ids:
            parent = st.sampled_from(live_ids) | parent
        after = st.lists(parent, max_size=2).map(tuple)
    soon = st.sampled_from([0, 500 * MS, 2 * S, 10 * S]).map(lambda delta: now + delta)
    retry = st.builds(
        RetryPolicy,
        max_attempts=st.integers(1, 3),
        initial_ns=st.sampled_from([0, 100 * MS, S]),
        multiplier=st.just(2.0),
        max_ns=st.just(2 * S),
        jitter=st.sampled_from([0.0, 0.5]),
    )
    return st.builds(
        TaskSpec,
        pool=st.sampled_from([pool.name for pool in POOLS]),
        limits=st.lists(
            st.sampled_from([limit.name for limit in LIMITS if limit.name != "pair"]),
            max_size=2,
            unique=True,
        ).flatmap(_keyed),
        kind=st.just("job"),
        payload=st.just(b""),
        key=st.none() | st.sampled_from(KEYS),
        priority=st.integers(0, 2),
        retry=retry,
        start_at_ns=st.none() | soon,
        miss_policy=st.sampled_from(MissPolicy),
        grace_ns=st.sampled_from([0, S]),
        # Mostly without deadline or timeout, or few attempts would ever succeed.
        deadline_ns=st.sampled_from([None, None, S, 5 * S, 30 * S]).map(
            lambda delta: None if delta is None else now + delta
        ),
        timeout_ns=st.sampled_from([None, None, None, 500 * MS, 2 * S]),
        after=after,
    )


def _keyed(names: list[str]) -> st.SearchStrategy[tuple[tuple[str, str | None], ...]]:
    """The given limits, each with a key drawn for the per-key ones."""
    per_key = {limit.name for limit in LIMITS if limit.per_key}
    return st.tuples(
        *(st.sampled_from(LIMIT_KEYS) if name in per_key else st.none() for name in names)
    ).map(lambda keys: tuple(sorted(zip(names, keys, strict=True))))


def _with_pool_limits(spec: TaskSpec) -> TaskSpec:
    """A submission adds its pool's limits (Scheduler.task_spec); the machine does it here."""
    pool = {p.name: p for p in POOLS}[spec.pool]
    extra = [(name, None) for name in pool.limits if name not in dict(spec.limits)]
    return replace(spec, limits=tuple(sorted([*spec.limits, *extra])))


def _schedule_specs(name: str) -> st.SearchStrategy[ScheduleSpec]:
    """Every second, overlap=skip; the task it creates retries a little."""
    template = st.builds(
        TaskTemplate,
        pool=st.sampled_from([pool.name for pool in POOLS]),
        kind=st.just("tick"),
        payload=st.just(b""),
        retry=st.builds(
            RetryPolicy,
            max_attempts=st.integers(1, 2),
            initial_ns=st.just(100 * MS),
            max_ns=st.just(S),
            jitter=st.just(0.0),
        ),
        timeout_ns=st.none() | st.just(500 * MS),
    )
    return st.builds(
        ScheduleSpec,
        name=st.just(name),
        cron=st.just(EVERY_SECOND),
        timezone=st.just("UTC"),
        template=template,
        overlap=st.just(OverlapPolicy.SKIP),
        catch_up=st.sampled_from(CatchUpPolicy),
        grace_ns=st.sampled_from([500 * MS, 60 * S]),
    )


# --- the machine -----------------------------------------------------------------------------


@settings(
    max_examples=250,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.cluster = MemoryCluster(NEVER_AUTO_PRUNE_NS)
        self.epoch = 1
        self.now = T0
        self.next_wake: int | None = None
        self.inflight: dict[AttemptToken, str] = {}
        """Dispatched (after commit) and not yet reported, mapped to their pool."""
        self.lease_ids: dict[AttemptToken, bytes] = {}
        """The lease id each remote attempt was dispatched with (its worker's capability)."""
        self.retired: set[AttemptToken] = set()
        """Attempts that can never be current again: reported, or lost in a crash."""
        self.tasks: dict[int, TaskModel] = {}
        self.ids: list[int] = []
        """Every committed task id, in commit order."""
        self.max_id = 0
        self.acked: set[int] = set()
        self.pruned: set[int] = set()
        self.ended_attempts: set[tuple[int, int]] = set()
        self.schedule_generation: Counter[str] = Counter()
        self.schedule_tasks: dict[tuple[str, int], list[int]] = {}
        self.steps_since_crash = 0
        self.occurrence_spans: dict[tuple[str, int], list[tuple[int, int]]] = {}
        """Per schedule (and generation), the spans its ledger records cover, in order."""
        self.limit_starts: dict[tuple[str, str | None], list[int]] = {}
        """Every released start of an attempt that takes a rate limit, by limit and key."""
        self.engine = self._rebuild(None, failures=0)

    # --- the driver's part: step, commit, rebuild ---------------------------------------------

    def _run(self, inputs: list[Input], fail: bool) -> StepResult | None:
        """One driver turn. Returns the step if it committed, None if it was lost."""
        result = self.engine.step(self.now, [WORKERS, *inputs])
        if fail and result.mutations:
            # The step never became durable: forget it, rebuild memory from the log. Reports in
            # it stay in flight (the driver re-applies them), so their tokens are adopted too.
            self.engine = self._rebuild(self._inflight(), failures=0)
            return None
        reported = {item.token for item in inputs if isinstance(item, AttemptReport)}
        self._persist(result, reported=reported)
        return result

    def _inflight(self) -> InFlight:
        """What the driver knows after an uncertain commit: the attempts it released in this
        epoch (remote ones adopted from an earlier leader were never released by it)."""
        mine = {t: pool for t, pool in self.inflight.items() if t.epoch == self.epoch}
        lease_ids = {t: self.lease_ids[t] for t in mine if t in self.lease_ids}
        lanes = {t: self.tasks[t.task_id].spec.limits for t in mine}
        return InFlight(executing=mine, lease_ids=lease_ids, lanes=lanes)

    def _report(
        self, token: AttemptToken, outcome: AttemptSucceeded | AttemptFailed, tag: str
    ) -> AttemptReport:
        """As an executor reports: a remote worker with its lease id, a local one without."""
        lease_id = self.lease_ids.get(token)
        return AttemptReport(token, outcome, tag, remote=lease_id is not None, lease_id=lease_id)

    def _rebuild(self, inflight: InFlight | None, failures: int) -> Engine:
        """``Driver._rebuild``: recover, commit the first step; retry if that commit fails."""
        while True:
            state = self.cluster.recover(TimeBase(), self.now - RETENTION_NS)
            engine, first = Engine.recover(CONFIG, self.epoch, self.now, state, inflight)
            if first.mutations and failures > 0:
                failures -= 1
                continue
            self._persist(first, engine)
            # The driver steps again at once: a fresh engine knows no worker slots until then.
            self._persist(engine.step(self.now, [WORKERS]), engine)
            return engine

    def _persist(
        self,
        result: StepResult,
        engine: Engine | None = None,
        reported: Set[AttemptToken] = frozenset(),
    ) -> None:
        """Commit a step, then release it: check its dispatches and put them in flight.
        ``reported``: attempts whose reports this step took (they no longer run)."""
        self._observe(result.mutations)
        self.cluster.apply(result.mutations, TimeBase())
        for token in result.expired:
            # As the driver does: a stopped leased attempt whose lease ended is let go (its
            # worker may be gone); a report of it is stale from now on.
            assert token in self.inflight, f"{token} expired but was not in flight"
            self._retire(token)
        for dispatch in result.dispatches:
            self._check_dispatch(dispatch.token, engine or self.engine, reported)
            self._check_rates(dispatch.spec.limits)
            self.inflight[dispatch.token] = dispatch.spec.pool
            if dispatch.lease_id is not None:
                self.lease_ids[dispatch.token] = dispatch.lease_id
        # The driver sleeps until next_wake_ns: in the past it would spin.
        assert result.next_wake_ns is None or result.next_wake_ns > self.now, result.next_wake_ns
        self.next_wake = result.next_wake_ns
        self.steps_since_crash += 1

    def _retire(self, token: AttemptToken) -> None:
        del self.inflight[token]
        self.lease_ids.pop(token, None)
        self.retired.add(token)

    # --- checks on the committed mutation stream ------------------------------------------

    def _observe(self, batch: list[Mutation]) -> None:
        for mutation in batch:
            match mutation:
                case TaskSubmitted(task_id, spec, status, submitted_ns):
                    self._observe_submitted(task_id, spec, status, submitted_ns)
                case TaskUpdated():
                    self._observe_updated(mutation)
                case CancelRequested(task_id):
                    model = self.tasks[task_id]
                    assert model.status is Status.RUNNING, (task_id, model.statuses)
                    assert not model.cancel_requested, f"cancel of {task_id} requested twice"
                    model.cancel_requested = True
                case ScheduleRemoved(name):
                    # A schedule added again under this name is a new schedule.
                    self.schedule_generation[name] += 1
                case ScheduleSaved():
                    pass
                case AttemptEnded():
                    self._observe_attempt_ended(mutation)
                case OccurrenceRecorded():
                    self._observe_occurrence(mutation)

    def _observe_occurrence(self, record: OccurrenceRecorded) -> None:
        """The ledger: each occurrence decided once, whatever crashes and failed commits
        happened (a firing whose commit did not land is decided again, recorded once), never
        before it came due, and the spans of one schedule follow each other with neither
        overlap nor gap (every schedule here runs every second, so that replacing one keeps
        its timetable): each occurrence that came due is in exactly one record."""
        owner = (record.schedule, self.schedule_generation[record.schedule])
        spans = self.occurrence_spans.setdefault(owner, [])
        where = f"{record} after {spans[-3:]}"
        assert record.due_ns <= record.at_ns == self.now < record.until_ns, where
        assert not spans or spans[-1][1] == record.due_ns, where
        spans.append((record.due_ns, record.until_ns))
        created = record.outcome in (OccurrenceOutcome.STARTED, OccurrenceOutcome.COALESCED)
        assert (record.task_id is not None) is (
            created or record.outcome is OccurrenceOutcome.SKIPPED
        ), where

    def _observe_attempt_ended(self, ended: AttemptEnded) -> None:
        """An attempt's history row: written once, for the running attempt, with its start
        and now as its end, just before the update that ends it (``_observe_updated``)."""
        model = self.tasks[ended.task_id]
        where = f"task {ended.task_id}: {[str(s) for s in model.statuses]}, {ended}"
        assert model.status is Status.RUNNING and model.ended_attempt is None, where
        assert ended.attempt == model.attempt, where
        assert (ended.started_ns, ended.ended_ns) == (model.started_ns, self.now), where
        assert (ended.task_id, ended.attempt) not in self.ended_attempts, where
        self.ended_attempts.add((ended.task_id, ended.attempt))
        model.ended_attempt = ended.attempt
        model.ended_message = ended.message

    def _observe_submitted(
        self, task_id: int, spec: TaskSpec, status: Status, submitted_ns: int
    ) -> None:
        # Ids are unique, increase in submission order and are never reused, even after a
        # crash; the ids of an epoch carry it, so a later epoch's are larger than all before.
        assert task_id not in self.tasks, f"id {task_id} reused"
        assert task_id > self.max_id, f"id {task_id} issued after {self.max_id}"
        assert epoch_of(task_id) == self.epoch, (task_id, self.epoch)
        assert status in INITIAL, status
        assert submitted_ns == self.now
        self.tasks[task_id] = TaskModel(spec, submitted_ns, [status])
        self.ids.append(task_id)
        self.max_id = task_id
        if spec.schedule is not None:
            owner = (spec.schedule, self.schedule_generation[spec.schedule])
            self.schedule_tasks.setdefault(owner, []).append(task_id)

    def _observe_updated(self, update: TaskUpdated) -> None:
        model = self.tasks[update.task_id]
        before, after = model.status, update.status
        where = f"task {update.task_id}: {[str(s) for s in model.statuses]} then {after}"
        if before.is_terminal and model.leased_finish:
            # The one update a finished row gets: the lease of its stopped attempt, cleared
            # once that attempt ended, the rest of the row as it was.
            assert (after, update.attempt, update.at_ns, update.lease) == (
                before,
                model.attempt,
                model.finished_ns,
                None,
            ), f"a finished row's lease clearing changed it: {where}"
            model.leased_finish = False
            return
        assert not before.is_terminal, f"terminal task changed: {where}"
        assert _legal_persisted(before, after), f"illegal transition: {where}"
        # An attempt that ended otherwise than in success (ready: it never began) left a row
        # of the history, in this batch, just before; a success writes none.
        if before is Status.RUNNING and after is not Status.RUNNING:
            ended = after not in (Status.SUCCEEDED, Status.READY)
            assert (model.ended_attempt is not None) == ended, f"history row missing: {where}"
            assert update.message == model.ended_message or not ended, where
        model.ended_attempt = None
        assert update.at_ns == self.now, where
        # Attempts never decrease: a start counts one more, every other update keeps the count.
        if after is Status.RUNNING:
            assert update.attempt == model.attempt + 1, f"{where}: attempt {update.attempt}"
            assert update.attempt <= model.spec.retry.max_attempts, where
            if before is Status.RETRYING:
                assert model.due_ns is not None and self.now >= model.due_ns, (
                    f"{where}: started before its backoff ended at {model.due_ns}"
                )
        else:
            assert update.attempt == model.attempt, f"{where}: attempt {update.attempt}"
        # A durable cancellation request is never followed by another attempt.
        if model.cancel_requested:
            assert after.is_terminal, f"{where} after its cancellation was requested"
        if after is Status.RETRYING:
            assert update.due_ns is not None and update.due_ns >= self.now, where
            deadline = model.spec.deadline_ns
            assert deadline is None or update.due_ns < deadline, where
        # A miss policy skips a start that was missed, never a task that already ran.
        if after is Status.CANCELLED and update.message.startswith("skipped"):
            assert model.attempt == 0, f"{where}: {update.message!r} after {model.attempt} attempts"
        model.statuses.append(after)
        model.attempt = update.attempt
        model.due_ns = update.due_ns
        if after is Status.RUNNING:
            model.started_ns = update.at_ns
        if after.is_terminal:
            model.finished_ns = update.at_ns
            model.leased_finish = update.lease is not None

    def _check_rates(self, lane: tuple[tuple[str, str | None], ...]) -> None:
        """A start leaves at most ``rate`` starts in any window of ``per`` seconds ending now,
        and with a ``burst``, at most ``burst + elapsed / spacing`` since any earlier start:
        whatever crashes and failovers came between (the log is the only memory)."""
        for pair in lane:
            limit = LIMITS_BY_NAME[pair[0]]
            window = limit.per_ns
            if limit.rate is None or window is None:
                continue
            starts = self.limit_starts.setdefault(pair, [])
            starts.append(self.now)
            recent = [at for at in starts if at > self.now - window]
            assert len(recent) <= limit.rate, f"{pair}: {len(recent)} starts in {limit.per}s"
            if limit.burst is not None:
                spacing = window // limit.rate
                for index, since in enumerate(recent):
                    allowed = limit.burst + (self.now - since) // spacing
                    assert len(recent) - index <= allowed, f"{pair}: burst exceeded since {since}"

    def _check_dispatch(
        self, token: AttemptToken, engine: Engine, reported: Set[AttemptToken]
    ) -> None:
        assert token.epoch == self.epoch == engine.epoch, token
        assert token not in self.inflight and token not in self.retired, f"{token} dispatched twice"
        beside = [t for t in self.inflight if t.task_id == token.task_id and t not in reported]
        assert not beside, f"{token} started while {beside} may still run"
        model = self.tasks[token.task_id]
        assert model.status is Status.RUNNING and model.attempt == token.attempt, (
            token,
            model.statuses,
        )
        spec = model.spec
        assert spec.deadline_ns is None or self.now < spec.deadline_ns, "started past deadline"
        assert spec.start_at_ns is None or self.now >= spec.start_at_ns, "started before start_at"
        for parent_id in spec.after:
            self._check_parent_satisfied(parent_id, token.task_id)

    def _check_parent_satisfied(self, parent_id: int, child_id: int) -> None:
        """A dependent starts only after each parent succeeded, judged by the log.

        DESIGN.md: "a parent that finished before the retention window counts as satisfied"; the
        engine has forgotten such a parent when the child is submitted (and recovery does not
        load it). So a parent that failed or was cancelled is acceptable only if it finished
        before ``child.submitted - retention``; a pruned parent only if it is a real id below the
        high-water mark, pruned after finishing (the prune horizon is older than the retention).
        """
        child = self.tasks[child_id]
        parent = self.tasks[parent_id]
        record = self.cluster.tasks.get(parent_id)
        if record is None:
            assert parent_id in self.pruned and parent_id <= self.cluster.max_task_id, parent_id
        else:
            assert record.status is parent.status
        where = f"task {child_id} started while its parent {parent_id} is {parent.status}"
        if parent.status is Status.SUCCEEDED:
            return
        assert parent.finished_ns is not None, where
        assert parent.finished_ns < child.submitted_ns - RETENTION_NS, (
            f"{where} (finished at {parent.finished_ns - T0}, child submitted at "
            f"{child.submitted_ns - T0}, relative ns)"
        )

    def _specs(self) -> st.SearchStrategy[TaskSpec]:
        live = [task_id for task_id, model in self.tasks.items() if model.live]
        return _specs(self.now, live, self.ids[-5:]).map(_with_pool_limits)

    # --- rules: callers -------------------------------------------------------------------

    @rule(data=st.data(), fail=FAIL)
    def submit(self, data: st.DataObject, fail: bool) -> None:
        specs = data.draw(st.lists(self._specs(), min_size=1, max_size=5), "specs")
        # Who held each key the engine must know of: live, or finished within the retention.
        horizon = self.now - RETENTION_NS
        holders = {
            task_id
            for task_id, model in self.tasks.items()
            if model.spec.key is not None
            and (model.live or (model.finished_ns is not None and model.finished_ns >= horizon))
        }
        held_keys = {self.tasks[task_id].spec.key for task_id in holders}
        first_new = len(self.ids)
        result = self._run([SubmitTasks(specs, "submit")], fail)
        if result is None:
            return
        reply = _reply(result, "submit")
        assert isinstance(reply, list), reply  # every spec drawn here is valid
        created = [r.task_id for r in reply if isinstance(r, SubmitResult) and r.created]
        # The submitted tasks are the step's first rows, in the order of the batch.
        assert created == self.ids[first_new : first_new + len(created)], (created, self.ids)
        for spec, outcome in zip(specs, reply, strict=True):
            assert isinstance(outcome, SubmitResult)
            self.acked.add(outcome.task_id)
            model = self.tasks[outcome.task_id]
            if outcome.created:
                assert model.spec == spec
                assert spec.key is None or spec.key not in held_keys, (
                    f"key {spec.key!r} held by a task the engine should know, yet a new task "
                    "was created"
                )
            else:
                # Idempotent submission: the id of the task holding the key.
                assert spec.key is not None and model.spec.key == spec.key
                assert outcome.task_id in holders or outcome.task_id in created, outcome

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), fail=FAIL)
    def cancel(self, data: st.DataObject, fail: bool) -> None:
        task_id = data.draw(st.sampled_from(self.ids), label="task_id")
        model = self.tasks[task_id]
        result = self._run([CancelTask(task_id, "cancelled by the test", "cancel")], fail)
        if result is None:
            return
        reply = _reply(result, "cancel")
        if isinstance(reply, TaskNotFound):
            # Only a task finished before the retention window is forgotten.
            assert model.finished_ns is not None, (task_id, model.statuses)
            assert model.finished_ns < self.now - RETENTION_NS, (task_id, model.finished_ns)
        elif reply is Status.RUNNING:
            # A running attempt is asked to stop; a timer in the same step may end it already.
            assert model.cancel_requested, (task_id, model.statuses)
            assert model.status is Status.RUNNING or model.status.is_terminal
        else:
            # Cancelled now, or the terminal status the task already had.
            assert isinstance(reply, Status) and reply.is_terminal, reply
            assert model.status is reply, (task_id, reply, model.statuses)

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), fail=FAIL)
    def rerun(self, data: st.DataObject, fail: bool) -> None:
        """An operator runs a task again, as the Scheduler asks: with its row as stored."""
        task_id = data.draw(st.sampled_from(self.ids), label="task_id")
        model = self.tasks[task_id]
        first_new = len(self.ids)
        row = self.cluster.tasks.get(task_id)
        result = self._run([RerunTask(task_id, row, "rerun")], fail)
        if result is None:
            return
        reply = _reply(result, "rerun")
        if not isinstance(reply, int):
            assert isinstance(reply, CronoqError), reply
            assert len(self.ids) == first_new, "a refused rerun created a task"
            assert not isinstance(reply, TaskNotFound) or row is None, (task_id, reply)
            return
        assert model.status.is_terminal, (task_id, model.statuses)
        assert self.ids[first_new] == reply, (reply, self.ids)
        spec = self.tasks[reply].spec
        assert spec.rerun_of == task_id and spec.start_at_ns is None and spec.schedule is None
        assert replace(spec, rerun_of=None, limits=model.spec.limits) == replace(
            model.spec,
            start_at_ns=None,
            deadline_ns=None,
            schedule=None,
            trace_context=None,
            rerun_of=None,
        )

    @precondition(lambda self: bool(self.ids))
    @rule(data=st.data(), fail=FAIL)
    def burst(self, data: st.DataObject, fail: bool) -> None:
        """Submissions, cancellations and reports that queued up during a commit: ONE step."""
        kinds = data.draw(
            st.lists(st.sampled_from(["submit", "cancel", "report"]), min_size=2, max_size=5),
            label="burst",
        )
        running = self.engine.running_tokens()
        unreported = sorted(self.inflight, key=_token_order)
        inputs: list[Input] = []
        for i, kind in enumerate(kinds):
            tag = f"{kind} {i}"
            if kind == "submit":
                specs = data.draw(st.lists(self._specs(), min_size=1, max_size=2), label=tag)
                inputs.append(SubmitTasks(specs, tag))
            elif kind == "cancel":
                task_id = data.draw(st.sampled_from(self.ids), label=tag)
                inputs.append(CancelTask(task_id, "cancelled in a burst", tag))
            elif unreported:
                token = unreported.pop(data.draw(st.integers(0, len(unreported) - 1), label=tag))
                inputs.append(self._report(token, data.draw(OUTCOMES, label=tag), tag))
        result = self._run(inputs, fail)
        if result is None:
            return
        for item in inputs:
            reply = _reply(result, str(item.reply_to))
            if isinstance(item, SubmitTasks):
                assert isinstance(reply, list) and len(reply) == len(item.specs), reply
                self.acked.update(outcome.task_id for outcome in reply)
            elif isinstance(item, CancelTask):
                assert isinstance(reply, Status | TaskNotFound), reply
            else:
                # A cancellation earlier in the same step only flags a running attempt.
                assert isinstance(item, AttemptReport)
                if item.token in running:
                    assert reply is None, reply
                else:
                    assert isinstance(reply, StaleAttempt), reply
                self._retire(item.token)

    # --- rules: executors -----------------------------------------------------------------

    @precondition(lambda self: bool(self.inflight))
    @rule(data=st.data(), outcome=OUTCOMES, fail=FAIL)
    def complete(
        self, data: st.DataObject, outcome: AttemptSucceeded | AttemptFailed, fail: bool
    ) -> None:
        token = data.draw(st.sampled_from(sorted(self.inflight, key=_token_order)), label="token")
        current = token in self.engine.running_tokens()
        result = self._run([self._report(token, outcome, "report")], fail)
        if result is None:
            return  # not durable: the attempt is still in flight and will report again
        reply = _reply(result, "report")
        if current:
            assert reply is None, reply
        else:
            # Timed out, deadline passed or lease lost since: the engine moved on without it.
            assert isinstance(reply, StaleAttempt), reply
        self._retire(token)

    @precondition(lambda self: bool(self.inflight))
    @rule(outcome=OUTCOMES, fail=FAIL)
    def complete_all(self, outcome: AttemptSucceeded | AttemptFailed, fail: bool) -> None:
        """Every attempt in flight reports at once: one step with many inputs (group commit)."""
        tokens = sorted(self.inflight, key=_token_order)
        running = self.engine.running_tokens()
        reports: list[Input] = [
            self._report(token, outcome, f"report {i}") for i, token in enumerate(tokens)
        ]
        result = self._run(reports, fail)
        if result is None:
            return
        for i, token in enumerate(tokens):
            reply = _reply(result, f"report {i}")
            assert (reply is None) if token in running else isinstance(reply, StaleAttempt), reply
            self._retire(token)

    @precondition(lambda self: bool(self.ids) or bool(self.retired))
    @rule(data=st.data(), outcome=OUTCOMES)
    def report_stale(self, data: st.DataObject, outcome: AttemptSucceeded | AttemptFailed) -> None:
        candidates = set(self.retired)
        for task_id in self.ids[-5:]:
            candidates.add(AttemptToken(self.epoch, task_id, 0))  # attempt 0 never runs
            candidates.add(AttemptToken(self.epoch + 1, task_id, 1))  # an epoch not yet begun
        for token in self.engine.running_tokens():
            candidates.add(AttemptToken(token.epoch, token.task_id, token.attempt - 1))
            candidates.add(AttemptToken(token.epoch - 1, token.task_id, token.attempt))
        token = data.draw(st.sampled_from(sorted(candidates, key=_token_order)), label="token")
        assert token not in self.engine.running_tokens()
        # Every rule leaves the engine stepped at self.now, so a step at the same time with only
        # a rejected report in it must change nothing at all.
        result = self.engine.step(self.now, [WORKERS, AttemptReport(token, outcome, "stale")])
        # A later epoch's token is not judged: a leader that sees one was replaced.
        refusal = SchedulerError if token.epoch > self.epoch else StaleAttempt
        assert isinstance(_reply(result, "stale"), refusal)
        assert result.mutations == [], result.mutations
        assert result.dispatches == [] and result.cancels == [], result
        self._persist(result)

    @precondition(lambda self: bool(self.inflight))
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        token = data.draw(st.sampled_from(sorted(self.inflight, key=_token_order)), label="token")
        current = token in self.engine.running_tokens()
        zombie = self.engine._attempts.zombies.get(token.task_id)  # white box: stopped ones
        lease_id = self.lease_ids.get(token)
        heartbeat = Heartbeat(token, "heartbeat", remote=lease_id is not None, lease_id=lease_id)
        result = self.engine.step(self.now, [WORKERS, heartbeat])
        reply = _reply(result, "heartbeat")
        if current:
            assert isinstance(reply, HeartbeatReply) and not reply.stopped, reply
            assert (reply.cancel_reason is not None) is self.tasks[token.task_id].cancel_requested
        elif lease_id is not None and zombie is not None and zombie.token == token:
            # Stopped, still running on its worker: it holds its slot while it heartbeats.
            assert isinstance(reply, HeartbeatReply) and reply.stopped, reply
        else:
            assert isinstance(reply, StaleAttempt), reply
        assert result.mutations == [], "a heartbeat persists nothing"
        self._persist(result)

    @rule(
        statuses=st.none() | st.frozensets(st.sampled_from(Status), min_size=1),
        pool=st.sampled_from([None, "a", "b"]),
        kind=st.sampled_from([None, "job", "other"]),
        tag=st.sampled_from([None, "t"]),
        limit=st.none() | st.integers(1, 4),
        data=st.data(),
    )
    def list_tasks(
        self,
        statuses: frozenset[Status] | None,
        pool: str | None,
        kind: str | None,
        tag: str | None,
        limit: int | None,
        data: st.DataObject,
    ) -> None:
        """A page is what filtering and sorting every task in memory would give: the index
        ``list`` starts from (built on submission and recovery, pruned and compacted) neither
        loses a task nor keeps one the engine no longer holds."""
        after = data.draw(st.none() | st.sampled_from([0, *self.ids]), label="after")
        query = ListTasks("list", statuses, pool, kind, tag, limit, after)
        result = self.engine.step(self.now, [WORKERS, query])
        every = [task.summary() for task in self._engine_live().values()]
        every += self.engine._tasks.finished.values()  # white box: those in the retention
        expected = sorted(
            (
                summary
                for summary in every
                if summary.task_id > (after or 0)
                and (statuses is None or summary.status in statuses)
                and (pool is None or summary.pool == pool)
                and (kind is None or summary.kind == kind)
                and (tag is None or tag in summary.tags)
            ),
            key=lambda summary: summary.task_id,
        )[:limit]
        listed = _reply(result, "list")
        assert isinstance(listed, list)
        assert [replace(summary, waiting_for=None) for summary in listed] == expected
        # A ready task a limit holds back says which, and no other task says anything.
        gates, live = self.engine._shared.gates, self._engine_live()
        for summary in listed:
            task = live.get(summary.task_id)
            held = None
            if task is not None and task.status is Status.READY:
                held = gates.blocker(task.spec.limits, self.now)
            if held is None:
                assert summary.waiting_for is None, summary
            else:
                assert summary.waiting_for is not None
                assert summary.waiting_for.startswith(f"limit {held.limit.name!r}"), summary
        self._persist(result)

    # --- rules: time ----------------------------------------------------------------------

    @rule(delta=DELTAS, fail=FAIL)
    def advance(self, delta: int, fail: bool) -> None:
        self.now += delta
        self._run([], fail)

    @precondition(lambda self: self.next_wake is not None)
    @rule(fail=FAIL)
    def wake(self, fail: bool) -> None:
        """Step exactly when the engine asked to be woken, as the driver's timer does."""
        assert self.next_wake is not None
        self.now = max(self.now, self.next_wake)
        self._run([], fail)

    # --- rules: schedules -----------------------------------------------------------------

    @rule(
        name=st.sampled_from(SCHEDULES),
        action=st.sampled_from(["add", "replace", "pause", "resume", "remove"]),
        data=st.data(),
        fail=FAIL,
    )
    def schedule(self, name: str, action: str, data: st.DataObject, fail: bool) -> None:
        """One rule for every schedule call, so that schedules do not crowd tasks out."""
        item: Input
        if action in ("add", "replace"):
            spec = data.draw(_schedule_specs(name), label="schedule")
            item = AddSchedule(spec, replace=action == "replace", reply_to="schedule")
        elif action == "pause":
            item = PauseSchedule(name, "schedule")
        elif action == "resume":
            item = ResumeSchedule(name, "schedule")
        else:
            item = RemoveSchedule(name, "schedule")
        existed = name in self.cluster.schedules
        result = self._run([item], fail)
        if result is None:
            return
        reply = _reply(result, "schedule")
        if isinstance(item, AddSchedule):
            if existed and action == "add":
                assert isinstance(reply, DuplicateSchedule), reply
            else:
                assert isinstance(reply, ScheduleRecord) and reply.spec == item.spec, reply
                assert self.cluster.schedules[name].spec == item.spec
            return
        assert isinstance(reply, ScheduleNotFound) is not existed, (action, name, reply)
        if action == "remove":
            assert name not in self.cluster.schedules
        elif existed:
            assert self.cluster.schedules[name].paused is (action == "pause")

    # --- rules: faults and housekeeping ---------------------------------------------------

    # Crashes lose every local running attempt; spaced out, attempts get a chance to succeed.
    @precondition(lambda self: self.steps_since_crash >= 6)
    @rule(
        downtime=st.sampled_from([0, S, 5 * S, 40 * S]),
        failures=st.integers(0, 5).map(lambda n: 1 if n == 5 else 0),
    )
    def crash(self, downtime: int, failures: int) -> None:
        """The process dies: its engine and its own running attempts are gone; remote ones
        run on in their workers; a new leader recovers."""
        for token in [t for t in self.inflight if t not in self.lease_ids]:
            self._retire(token)
        self.steps_since_crash = 0
        self.epoch += 1
        self.now += downtime
        self.engine = self._rebuild(None, failures)

    @rule(extra=st.sampled_from([0, 10 * S]))
    def prune(self, extra: int) -> None:
        """The store forgets old finished rows; keep_finished is never below the retention."""
        horizon = self.now - RETENTION_NS - extra
        before = set(self.cluster.tasks)
        self.cluster.prune(horizon)
        for task_id in before - set(self.cluster.tasks):
            finished = self.tasks[task_id].finished_ns
            assert finished is not None and finished < horizon, (task_id, finished)
            self.pruned.add(task_id)

    # --- invariants -----------------------------------------------------------------------

    def _engine_live(self) -> dict[int, Task]:
        return self.engine._shared.tasks  # white box: which tasks the engine holds live

    @invariant()
    def no_committed_task_is_lost(self) -> None:
        """Every acknowledged (indeed every committed) task is in the log, unless pruned after
        it finished, and is live in the engine exactly when it is live in the log."""
        assert self.acked <= set(self.tasks)
        for task_id, model in self.tasks.items():
            record = self.cluster.tasks.get(task_id)
            if record is None:
                assert task_id in self.pruned and not model.live, task_id
                continue
            assert record.status is model.status and record.attempt == model.attempt, task_id
        live_in_log = {task_id for task_id, model in self.tasks.items() if model.live}
        assert set(self._engine_live()) == live_in_log

    @invariant()
    def engine_agrees_with_log(self) -> None:
        """Memory never runs ahead of the log: attempts and running-ness match it."""
        assert self.engine.epoch == self.epoch
        assert self.engine.high_water_mark >= self.cluster.max_task_id
        for task_id, task in self._engine_live().items():
            model = self.tasks[task_id]
            assert task.attempt == model.attempt, (task_id, task.attempt, model.attempt)
            assert (task.status is Status.RUNNING) is (model.status is Status.RUNNING), (
                task_id,
                task.status,
                model.statuses,
            )
            if task.status is Status.RUNNING:
                assert task.cancel_requested is model.cancel_requested, task_id

    @invariant()
    def timers_are_never_late(self) -> None:
        """Every rule leaves the engine stepped at ``now``: nothing it should have done by then
        is still pending. Past its deadline a task is not live at all (DESIGN.md: it is not
        started, and a running attempt is cancelled and the task fails)."""
        for task_id, model in self.tasks.items():
            deadline = model.spec.deadline_ns
            assert not (model.live and deadline is not None and deadline <= self.now), (
                f"task {task_id} is {model.status} {self.now - deadline}ns past its deadline"
            )
            # An attempt's timeout counts from its start, whatever happened since (a
            # cancellation request, a rebuild that adopted it).
            timeout = model.spec.timeout_ns
            if model.status is Status.RUNNING and timeout is not None:
                assert model.started_ns is not None
                assert self.now < model.started_ns + timeout, f"task {task_id} overran its timeout"
        for task_id, task in self._engine_live().items():
            assert task.wake_ns is None or task.wake_ns > self.now, (task_id, task.status)

    @invariant()
    def ready_tasks_do_not_idle(self) -> None:
        """A pool with a free slot has no ready task waiting for one."""
        idle = {
            name
            for name, pool in self.engine._shared.pools.items()
            if pool.running < CONCURRENCY[name]
        }
        gates = self.engine._shared.gates
        for task_id, task in self._engine_live().items():
            # A task whose stopped attempt has not reported yet waits for it, not for a slot;
            # one a limit holds back waits for that limit, and holds back no other task.
            held_back = (
                task_id in self.engine._attempts.zombies
                or gates.blocker(task.spec.limits, self.now) is not None
            )
            assert held_back or not (task.status is Status.READY and task.spec.pool in idle), (
                task_id
            )

    @invariant()
    def every_live_task_is_explained_by_a_true_hold(self) -> None:
        """``explain`` names what really holds each live task: a ready one is never said to
        be about to start (every rule leaves the engine stepped), and the hold it names is
        the case (the pool full, the limit without room, the stopped attempt, no slot)."""
        shared = self.engine._shared
        reads = self.engine._reads  # white box: the read the Scheduler's explain makes
        for task_id, task in self._engine_live().items():
            found = reads.explain(task_id)
            assert isinstance(found, Explanation), found
            assert found.status is task.status and found.pool == task.spec.pool, found
            where = (task_id, found)
            match task.status:
                case Status.WAITING:
                    assert found.hold is Hold.DEPENDENCIES and found.parents, where
                    assert all(p in shared.tasks for p in found.parents), where
                case Status.SCHEDULED:
                    assert found.hold is Hold.START_TIME, where
                case Status.RETRYING:
                    assert found.hold is Hold.RETRY_BACKOFF and found.until is not None, where
                case Status.RUNNING:
                    hold = Hold.CANCELLING if task.cancel_requested else Hold.RUNNING
                    assert found.hold is hold and found.attempt == task.attempt, where
                case _:
                    self._check_ready_hold(task, found)

    def _check_ready_hold(self, task: Task, found: Explanation) -> None:
        shared = self.engine._shared
        pool = shared.pools[task.spec.pool]
        where = (task.id, found)
        match found.hold:
            case Hold.STOPPED_ATTEMPT:
                assert task.id in self.engine._attempts.zombies, where
            case Hold.POOL_PAUSED:
                assert pool.paused, where
            case Hold.POOL_FULL:
                assert pool.running >= CONCURRENCY[task.spec.pool] == found.concurrency, where
            case Hold.LIMIT:
                gate = shared.gates.blocker(task.spec.limits, self.now)
                assert gate is not None, where
                assert (found.limit, found.limit_key) == (gate.limit.name, gate.key), where
            case Hold.NO_WORKER_SLOTS:
                assert pool.config.lease_ns is not None, where
                assert not self.engine._dispatcher.has_free_slot(task.spec.pool), where
            case _:
                raise AssertionError(f"ready task {task.id} explained as {found}")

    @invariant()
    def a_key_has_one_live_task(self) -> None:
        live_keys = [m.spec.key for m in self.tasks.values() if m.live and m.spec.key is not None]
        assert len(live_keys) == len(set(live_keys)), Counter(live_keys)

    @invariant()
    def a_schedule_has_one_live_task(self) -> None:
        # Every schedule here uses overlap=skip.
        for owner, task_ids in self.schedule_tasks.items():
            live = [task_id for task_id in task_ids if self.tasks[task_id].live]
            assert len(live) <= 1, f"schedule {owner} has live tasks {live}"

    @invariant()
    def pools_respect_concurrency(self) -> None:
        running = self.engine.running_tokens()
        # The engine believes running only attempts that were dispatched and not yet reported.
        assert running <= set(self.inflight), running - set(self.inflight)
        per_pool = Counter(self.inflight[token] for token in running)
        # An attempt keeps its slot until it reports, even once the engine stopped it (a
        # timeout, a deadline): every unreported attempt counts. A leased one also lets go
        # when its lease ends (white box: the stopped ones still inside their lease).
        unreported = Counter(self.inflight.values())
        leased_zombies = Counter(zombie.pool for zombie in self.engine._attempts.zombies.values())
        for config in POOLS:
            if config.lease_ns is None:
                count = unreported[config.name]
            else:
                count = per_pool[config.name] + leased_zombies[config.name]
            assert count <= config.concurrency, f"pool {config.name}: {count} running"
            slots = self.engine._shared.pools[config.name].running  # white box: the slot counter
            assert slots == count, (config.name, slots, count)

    @invariant()
    def limits_respect_concurrency(self) -> None:
        """Per limit and key, the attempts that may still run (as ``pools_respect_concurrency``
        counts them) never exceed its concurrency, and are what its gate counts."""
        running = self.engine.running_tokens()
        leased = {p.name for p in POOLS if p.lease_ns is not None}
        holding: Counter[tuple[str, str | None]] = Counter()
        for token, pool in self.inflight.items():
            if pool not in leased or token in running:
                holding.update(self.tasks[token.task_id].spec.limits)
        for zombie in self.engine._attempts.zombies.values():
            if zombie.pool in leased:
                holding.update(zombie.lane)
        gates = self.engine._shared.gates.gates
        waiting = Counter(
            pair
            for task in self._engine_live().values()
            if task.status is Status.READY
            for pair in task.spec.limits
        )
        running_tasks: dict[tuple[str, str | None], set[int]] = {}
        for task in self._engine_live().values():
            if task.status is Status.RUNNING:
                for pair in task.spec.limits:
                    running_tasks.setdefault(pair, set()).add(task.id)
        for limit in LIMITS:
            for pair in [(limit.name, None), *((limit.name, key) for key in LIMIT_KEYS)]:
                count = holding[pair]
                if limit.concurrency is not None:
                    assert count <= limit.concurrency, f"{pair}: {count} running"
                gate = gates.get(pair)
                assert (0 if gate is None else gate.running) == count, (pair, count)
                # What list_limits and on_full="reject" count as waiting.
                assert (0 if gate is None else gate.waiting) == waiting[pair], pair
                # What on_full="cancel_running" may cancel: every task running an attempt
                # that holds the gate, whichever leader started it (a stopped attempt stays
                # among them until it ends; its task is not running, and is not cancelled).
                if gate is not None and gate.holders is not None:
                    assert running_tasks.get(pair, set()) <= set(gate.holders), pair


LIMITS_BY_NAME = {limit.name: limit for limit in LIMITS}

TestEngineProperties = EngineMachine.TestCase
