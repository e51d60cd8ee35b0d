"""``cronoq_schedule_occurrences_total{schedule,outcome}``: the scheduler's per-schedule
outcome counter (``SchedulerMetrics.occurrences``, a ledger record each) as Prometheus reads it,
against real schedulers on a MemoryStore whose schedules fire every second."""

from __future__ import annotations

from outbox_rows import wait_until
from prometheus_client import generate_latest
from test_server_metrics import by, new_collector, pools, scrape

from cronoq import MemoryStore, OccurrenceOutcome, Scheduler

OUTCOMES = {outcome.value for outcome in OccurrenceOutcome}
HOSTILE = 'nightly"} cronoq_leader 1\n# TYPE x counter\\'
"""A schedule's name is any text: one that would end its label value and forge a sample if
the exposition did not escape it."""


async def fired(scheduler: Scheduler, name: str, records: int) -> None:
    """Until the schedule's ledger holds ``records`` records (it fires every second)."""

    async def enough() -> bool:
        return len(await scheduler.occurrences(name)) >= records

    await wait_until(enough, f"{records} ledger records of {name!r}", timeout=15)


async def test_occurrences_count_by_schedule_and_outcome_with_every_outcome_at_zero() -> None:
    collector, registry = new_collector([0], ("fast",))
    # Declared from the first scrape, without a series until a schedule comes due.
    assert "# TYPE cronoq_schedule_occurrences_total counter" in generate_latest(registry).decode()
    assert "cronoq_schedule_occurrences_total" not in scrape(registry)
    async with Scheduler(pools()) as scheduler:
        collector.watch(scheduler)
        await scheduler.add_schedule("every-second", "* * * * * *", kind="k", pool="fast")
        await scheduler.add_schedule(HOSTILE, "* * * * * *", kind="k", pool="fast")
        await scheduler.pause_schedule(HOSTILE)
        await fired(scheduler, "every-second", 2)
        await scheduler.pause_schedule("every-second")
        counted = by(scrape(registry)["cronoq_schedule_occurrences_total"], "schedule", "outcome")
        ledger = await scheduler.occurrences("every-second")
    expected = {("every-second", outcome): 0 for outcome in OUTCOMES}
    for record in ledger:
        expected["every-second", record.outcome.value] += 1
    # A schedule that never came due (paused from the start) has no series yet.
    assert counted == expected
    assert sum(counted.values()) == len(ledger) >= 2


async def test_the_counts_survive_a_new_scheduler_and_a_hostile_name_is_escaped() -> None:
    collector, registry = new_collector([0], ("fast",))
    store = MemoryStore()
    first = Scheduler(pools(), store=store)
    await first.start()
    collector.watch(first)
    await first.add_schedule(HOSTILE, "* * * * * *", kind="k", pool="fast")
    await fired(first, HOSTILE, 1)
    await first.pause_schedule(HOSTILE)
    counted = by(scrape(registry)["cronoq_schedule_occurrences_total"], "schedule", "outcome")
    before = int(sum(counted.values()))
    await first.close()
    async with Scheduler(pools(), store=store.connect_another()) as again:
        collector.watch(again)
        await again.resume_schedule(HOSTILE)
        await fired(again, HOSTILE, before + 1)
        await again.pause_schedule(HOSTILE)
        text = generate_latest(registry).decode()
        counted = by(scrape(registry)["cronoq_schedule_occurrences_total"], "schedule", "outcome")
        ledger = await again.occurrences(HOSTILE)
    # Counted over both schedulers, each record once: the process's counter never goes down.
    assert set(counted) == {(HOSTILE, outcome) for outcome in OUTCOMES}
    assert sum(counted.values()) == len(ledger) > before
    # Escaped as Prometheus escapes a label value: no line of the name stands on its own.
    assert 'schedule="nightly\\"} cronoq_leader 1\\n# TYPE x counter\\\\"' in text
    assert "\n# TYPE x counter" not in text
