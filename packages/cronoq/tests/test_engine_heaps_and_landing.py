"""Review of the issue 9 engine rework: checks the regression tests leave open.

``test_the_timer_heap_follows_the_live_tasks`` in test_engine.py passes on the code before the
change too (once no task is live, popping stale heads empties the heap); the version here keeps
a live timer at the head, which is what makes stale entries stay without compaction.
"""

from __future__ import annotations

from cronoq._engine import (
    AttemptReport,
    AttemptSucceeded,
    Engine,
    EngineConfig,
    Input,
    PoolConfig,
    SubmitTasks,
)
from cronoq._model import NS_PER_S, ScheduleSpec, Status, TaskSpec, TaskTemplate
from cronoq._reconcile import batch_landed
from cronoq.store import Mutation, RecoveredState, ScheduleRecord, ScheduleSaved, TaskSubmitted

T0 = 1_000_000 * NS_PER_S
DAY = 86_400 * NS_PER_S


def test_the_timer_heap_follows_the_live_tasks_behind_a_live_head() -> None:
    engine = Engine(EngineConfig([PoolConfig("default", 100)], seed=0), epoch=1)
    week = 7 * DAY
    # One live task whose timer (its start, a day away) stays at the head of the heap.
    later = TaskSpec("default", "later", b"", start_at_ns=T0 + DAY)
    specs = [later] + [TaskSpec("default", "job", b"", deadline_ns=T0 + week)] * 5000
    engine.step(T0, [SubmitTasks(specs, None)])
    now = T0 + 1
    running = engine.running_tokens()
    while running:
        inputs: list[Input] = [AttemptReport(t, AttemptSucceeded(None)) for t in running]
        engine.step(now, inputs)
        now += 1
        running = engine.running_tokens()
    assert engine.live_count == 1
    # 5,000 finished tasks' deadlines sit behind a live head: only compaction removes them.
    assert len(engine._shared.timers) <= 2 * engine.live_count + 1024


SCHEDULE = ScheduleSpec("yearly", "0 0 1 1 *", "UTC", TaskTemplate("default", "job", b""))


def test_a_submission_decides_before_a_schedule_saved_unchanged() -> None:
    saved = ScheduleRecord(SCHEDULE, 1000)
    submitted = TaskSubmitted(7, TaskSpec("default", "job", b""), Status.READY, 100)
    batch: list[Mutation] = [submitted, ScheduleSaved(saved)]
    # The store still holds the schedule as it was, and never saw task 7: not landed.
    assert batch_landed(batch, RecoveredState(6, (), (saved,))) is False
