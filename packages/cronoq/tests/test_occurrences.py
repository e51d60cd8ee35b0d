"""The occurrence ledger: one record per firing, whose spans cover every occurrence that came
due exactly once, across a leader killed before its commit, downtime under each catch-up
policy, pauses, and a failover of real schedulers."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime

import pytest

from cronoq import (
    CatchUpPolicy,
    MemoryStore,
    OccurrenceInfo,
    OccurrenceOutcome,
    OverlapPolicy,
    Pool,
    Scheduler,
    TaskContext,
)
from cronoq._cron import CronSchedule
from cronoq._engine import (
    AddSchedule,
    AttemptReport,
    AttemptSucceeded,
    Engine,
    EngineConfig,
    PauseSchedule,
    PoolConfig,
    ResumeSchedule,
    StepResult,
)
from cronoq._memory import MemoryCluster
from cronoq._model import NS_PER_S, ScheduleSpec, TaskTemplate
from cronoq.errors import InvalidArgument, ScheduleNotFound
from cronoq.store import OccurrenceRecorded, TimeBase

S = NS_PER_S
MINUTE = 60 * S
T0 = 1_700_000_040 * S  # on a whole minute
EVERY_MINUTE = "* * * * *"


class Cluster:
    """Engines that commit every step to a MemoryCluster and complete each attempt at
    once; a crash loses the step in progress, and a new leader recovers from the log."""

    def __init__(self, spec: ScheduleSpec) -> None:
        self.config = EngineConfig([PoolConfig("p", 10)], retention_ns=3600 * S)
        self.cluster = MemoryCluster(keep_finished_ns=24 * 3600 * S)
        self.epoch = 1
        self.engine = Engine(self.config, self.epoch)
        self.step(T0 - 30 * S, AddSchedule(spec, False, None))

    def step(self, now: int, *inputs: object, commit: bool = True) -> StepResult:
        result = self.engine.step(now, list(inputs))  # type: ignore[arg-type]
        if commit:
            self._commit(now, result)
        return result

    def _commit(self, now: int, result: StepResult) -> None:
        self.cluster.apply(result.mutations, TimeBase())
        reports = [AttemptReport(d.token, AttemptSucceeded(None)) for d in result.dispatches]
        if reports:  # each attempt succeeds at once
            self._commit(now, self.engine.step(now, reports))

    def crash_and_recover(self, now: int) -> None:
        self.epoch += 1
        state = self.cluster.recover(TimeBase(), now - self.config.retention_ns)
        self.engine, first = Engine.recover(self.config, self.epoch, now, state)
        self._commit(now, first)

    def records(self, name: str = "tick") -> list[OccurrenceRecorded]:
        return sorted(self.cluster.occurrences.get(name, {}).values(), key=lambda r: r.due_ns)


def _spec(catch_up: CatchUpPolicy) -> ScheduleSpec:
    template = TaskTemplate("p", "tick", b"")
    return ScheduleSpec(
        "tick", EVERY_MINUTE, "UTC", template, OverlapPolicy.SKIP, catch_up, grace_ns=MINUTE
    )


def _covering(records: list[OccurrenceRecorded], due: int) -> list[OccurrenceRecorded]:
    return [r for r in records if r.due_ns <= due < r.until_ns]


@pytest.mark.parametrize("catch_up", list(CatchUpPolicy))
def test_every_occurrence_due_in_a_window_has_exactly_one_record(catch_up: CatchUpPolicy) -> None:
    log = Cluster(_spec(catch_up))
    for minute in range(10):
        log.step(T0 + minute * MINUTE + S)
    # The leader is killed before the commit of its next firing: that firing never happened.
    log.step(T0 + 10 * MINUTE + S, commit=False)
    # Downtime: the next leader takes over nine and a half minutes later.
    log.crash_and_recover(T0 + 19 * MINUTE + 30 * S)
    for minute in range(20, 30):
        log.step(T0 + minute * MINUTE + S)
    records = log.records()
    due_times = CronSchedule.parse(EVERY_MINUTE).preview(T0 - S, 30)
    assert due_times[0] == T0 and due_times[-1] == T0 + 29 * MINUTE
    for due in due_times:
        assert len(_covering(records, due)) == 1, (due - T0) // MINUTE
    [downtime] = _covering(records, T0 + 10 * MINUTE)
    assert (downtime.due_ns, downtime.until_ns) == (T0 + 10 * MINUTE, T0 + 20 * MINUTE)
    assert downtime.at_ns == T0 + 19 * MINUTE + 30 * S
    if catch_up is CatchUpPolicy.COALESCE:
        assert downtime.outcome is OccurrenceOutcome.COALESCED
        assert downtime.task_id is not None and downtime.task_id >> 40 == 2
    else:
        assert downtime.outcome is OccurrenceOutcome.MISSED and downtime.task_id is None
        assert "past its grace of 1m (catch_up='skip')" in downtime.message
    others = [r for r in records if r is not downtime]
    assert {r.outcome for r in others} == {OccurrenceOutcome.STARTED}
    assert all(r.until_ns - r.due_ns == MINUTE for r in others)


def test_a_pause_is_one_record_of_the_occurrences_it_held_back() -> None:
    log = Cluster(_spec(CatchUpPolicy.COALESCE))
    log.step(T0 + S)
    log.step(T0 + 2 * S, PauseSchedule("tick", None))
    for minute in range(1, 5):
        log.step(T0 + minute * MINUTE + S)
    log.step(T0 + 4 * MINUTE + 2 * S, ResumeSchedule("tick", None))
    log.step(T0 + 5 * MINUTE + S)
    outcomes = [(r.due_ns - T0, r.until_ns - T0, r.outcome) for r in log.records()]
    assert outcomes == [
        (0, MINUTE, OccurrenceOutcome.STARTED),
        (MINUTE, 5 * MINUTE, OccurrenceOutcome.PAUSED),
        (5 * MINUTE, 6 * MINUTE, OccurrenceOutcome.STARTED),
    ]


class Ticks:
    def __init__(self) -> None:
        self.seen = 0
        self.arrived = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: object) -> None:
        self.seen += 1
        self.arrived.set()

    async def wait(self, count: int) -> None:
        async with asyncio.timeout(10):
            while self.seen < count:
                self.arrived.clear()
                await self.arrived.wait()


def _check_contiguous(records: list[OccurrenceInfo]) -> None:
    """Newest first, each span ending where the next (newer) one begins."""
    for newer, older in itertools.pairwise(records):
        assert older.until == newer.due_at, (older, newer)


async def test_the_ledger_across_a_killed_leader_of_real_schedulers() -> None:
    ticks = Ticks()
    store = MemoryStore()
    pools = [Pool("default", ticks)]
    first = Scheduler(pools, store=store)
    await first.start()
    await first.add_schedule("tick", "* * * * * *", kind="tick")
    await ticks.wait(2)
    first.abort()
    store.simulate_crash()
    async with Scheduler(pools, store=store.connect_another()) as second:
        await ticks.wait(ticks.seen + 2)
        # Removed, the ledger stands still while it is read; a removed schedule keeps it.
        await second.remove_schedule("tick")
        records = await second.occurrences("tick")
        # Both leaders recorded firings (a task id names the epoch that created it).
        assert {r.task_id >> 40 for r in records if r.task_id is not None} == {1, 2}, records
        _check_contiguous(records)
        dues = [r.due_at for r in records]
        assert len(set(dues)) == len(dues)
        assert all(r.decided_at >= r.due_at for r in records)
        # Pages: before= the last due of a page gives the rest, in the same order.
        page = await second.occurrences("tick", limit=2)
        rest = await second.occurrences("tick", before=page[-1].due_at, limit=1000)
        assert [r.due_at for r in page + rest][: len(records)] == dues
        # An unknown schedule has none.
        with pytest.raises(ScheduleNotFound):
            await second.occurrences("nothing")
        assert await second.occurrences("nothing", before=datetime.now(UTC)) == []
        with pytest.raises(InvalidArgument):
            await second.occurrences("tick", limit=0)
        metrics = second.metrics()
        assert metrics.occurrences.get(("tick", "started"), 0) >= 1


def test_replacing_a_paused_schedule_records_what_its_pause_held_back() -> None:
    """Found by the property machine: a redeploy re-registering a paused schedule recomputed
    its next occurrence, and the occurrences due while paused had no record."""
    spec = _spec(CatchUpPolicy.COALESCE)
    log = Cluster(spec)
    log.step(T0 + S)
    log.step(T0 + 2 * S, PauseSchedule("tick", None))
    log.step(T0 + 3 * MINUTE + S, AddSchedule(spec, True, None))
    log.step(T0 + 3 * MINUTE + 2 * S, ResumeSchedule("tick", None))
    log.step(T0 + 4 * MINUTE + S)
    outcomes = [(r.due_ns - T0, r.until_ns - T0, r.outcome) for r in log.records()]
    assert outcomes == [
        (0, MINUTE, OccurrenceOutcome.STARTED),
        (MINUTE, 4 * MINUTE, OccurrenceOutcome.PAUSED),
        (4 * MINUTE, 5 * MINUTE, OccurrenceOutcome.STARTED),
    ]
