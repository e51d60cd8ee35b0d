"""Recurring schedules: add, replace, pause, resume and remove them, fire their occurrences
(overlap, catch-up after downtime, coalescing), and trigger one now."""

from __future__ import annotations

import heapq

from cronoq._cron import CronSchedule
from cronoq._engine.state import Shared, seconds
from cronoq._engine.tasks import Tasks
from cronoq._metrics import bump
from cronoq._model import CatchUpPolicy, OccurrenceOutcome, OverlapPolicy, ScheduleSpec, TaskSpec
from cronoq.errors import CronoqError, DuplicateSchedule, ScheduleNotFound, UnknownPool
from cronoq.store import OccurrenceRecorded, ScheduleRecord, ScheduleRemoved, ScheduleSaved

__all__ = ["Schedules"]


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


class Schedules:
    def __init__(self, shared: Shared, tasks: Tasks) -> None:
        self.shared = shared
        self.tasks = tasks
        self.schedules: dict[str, _Schedule] = {}
        self.timers: list[tuple[int, str]] = []

    def records(self) -> list[ScheduleRecord]:
        return [s.record() for s in self.schedules.values()]

    def add(self, spec: ScheduleSpec, replace: bool) -> ScheduleRecord | CronoqError:
        shared = self.shared
        if spec.template.pool not in shared.pools:
            return UnknownPool(
                f"schedule {spec.name!r} uses unknown pool {spec.template.pool!r}; "
                f"configured: {shared.pool_names()}"
            )
        existing = self.schedules.get(spec.name)
        if existing is not None and not replace:
            return DuplicateSchedule(f"a schedule named {spec.name!r} already exists")
        try:
            cron = CronSchedule.parse(spec.cron, spec.timezone)
            next_ns = cron.next_after(shared.now)
        except CronoqError as exc:  # InvalidCron, UnknownTimeZone: rejected like any bad input
            return exc
        record = ScheduleRecord(
            spec,
            next_ns,
            # A redeploy that re-registers its schedules must not undo an operator's pause.
            paused=existing.paused if existing else False,
            last_task_id=existing.last_task_id if existing else None,
        )
        self.schedules[spec.name] = schedule = _Schedule(record, cron)
        if existing is not None:
            self._record_unfired(existing, schedule, "replaced")
        self._save(schedule)
        return record

    def pause(self, name: str, paused: bool) -> ScheduleRecord | CronoqError:
        schedule = self.schedules.get(name)
        if schedule is None:
            return ScheduleNotFound(f"no schedule named {name!r}")
        if schedule.paused != paused:
            schedule.paused = paused
            if not paused:
                # Occurrences that passed while paused are not caught up, but recorded.
                now = self.shared.now
                due = schedule.next_ns
                schedule.next_ns = schedule.cron.next_after(now)
                if due <= now:
                    self._record(schedule, due, OccurrenceOutcome.PAUSED, None, "paused")
            self._save(schedule)
        return schedule.record()

    def trigger(self, name: str) -> int | CronoqError | None:
        """One occurrence now, through the overlap policy: the id of the task it created, or
        None if the schedule's last task is still live and its policy skips. The timetable
        stays as it is, and a paused schedule stays paused (a trigger is an operator's one-off
        run, as Temporal's ``schedule trigger``)."""
        schedule = self.schedules.get(name)
        if schedule is None:
            return ScheduleNotFound(f"no schedule named {name!r}")
        pool = schedule.spec.template.pool
        if pool not in self.shared.pools:
            return UnknownPool(
                f"schedule {name!r} uses pool {pool!r}, which is not configured; "
                f"configured: {self.shared.pool_names()}"
            )
        if not self.tasks.ids_left():
            return self.tasks.ids_exhausted()
        if self._overlapping(schedule):
            return None
        task_id = self._start(schedule)
        self.shared.out.mutations.append(ScheduleSaved(schedule.record()))
        return task_id

    def _overlapping(self, schedule: _Schedule) -> bool:
        return (
            schedule.spec.overlap is OverlapPolicy.SKIP
            and schedule.last_task_id in self.shared.tasks
        )

    def _start(self, schedule: _Schedule) -> int:
        """Create the task of one occurrence; it becomes the schedule's last task."""
        spec = schedule.spec
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
            limits=tuple(
                sorted((name, None) for name in self.shared.pools[template.pool].config.limits)
            ),
        )
        schedule.last_task_id = task_id = self.tasks.create(task_spec).id
        return task_id

    def remove(self, name: str) -> CronoqError | None:
        schedule = self.schedules.pop(name, None)
        if schedule is None:
            return ScheduleNotFound(f"no schedule named {name!r}")
        gone = _Schedule(schedule.record(), schedule.cron)
        gone.next_ns = schedule.cron.next_after(self.shared.now)  # the span ends at its next
        self._record_unfired(schedule, gone, "removed")
        self.shared.out.mutations.append(ScheduleRemoved(name))
        return None

    def _record_unfired(self, old: _Schedule, new: _Schedule, how: str) -> None:
        """A schedule replaced or removed whose next occurrence came due (while paused, or in
        this very step) and was not fired: the ledger says so, up to ``new``'s next."""
        if old.next_ns > self.shared.now:
            return
        if old.paused:
            outcome, message = OccurrenceOutcome.PAUSED, "paused"
        else:
            outcome, message = OccurrenceOutcome.MISSED, f"the schedule was {how} as it came due"
        self._record(new, old.next_ns, outcome, None, message)

    def restore(self, record: ScheduleRecord) -> None:
        """A recovered schedule; one whose cron or zone no longer parses (a tzdata update,
        say) must not block start-up: it stays in the store, inactive, until replaced or
        removed."""
        try:
            cron = CronSchedule.parse(record.spec.cron, record.spec.timezone)
        except CronoqError:
            return
        schedule = _Schedule(record, cron)
        self.schedules[schedule.spec.name] = schedule
        if not schedule.paused:
            heapq.heappush(self.timers, (schedule.next_ns, schedule.spec.name))

    def _save(self, schedule: _Schedule) -> None:
        self.shared.out.mutations.append(ScheduleSaved(schedule.record()))
        if not schedule.paused:
            heapq.heappush(self.timers, (schedule.next_ns, schedule.spec.name))

    def _due(self, due: int, name: str) -> bool:
        schedule = self.schedules.get(name)
        return schedule is not None and not schedule.paused and schedule.next_ns == due

    def fire(self) -> None:
        shared = self.shared
        timers = self.timers
        now = shared.now
        while timers and timers[0][0] <= now:
            due, name = heapq.heappop(timers)
            if not self._due(due, name):
                continue  # a stale timer: removed, paused or rescheduled since
            schedule = self.schedules[name]
            # Every occurrence up to now is covered by this firing (coalesced).
            until = schedule.cron.next_after(now)
            outcome, message = self._decide(schedule, due, now)
            task_id = schedule.last_task_id if outcome is OccurrenceOutcome.SKIPPED else None
            if outcome is OccurrenceOutcome.STARTED:
                task_id = self._start(schedule)
                if schedule.cron.next_after(due) < until:
                    outcome = OccurrenceOutcome.COALESCED
                    message = "the occurrences due until the next ran once, as one task"
            schedule.next_ns = until
            self._record(schedule, due, outcome, task_id, message)
            self._save(schedule)

    def _decide(self, schedule: _Schedule, due: int, now: int) -> tuple[OccurrenceOutcome, str]:
        """Whether an occurrence due at ``due`` starts a task now, or why not."""
        spec = schedule.spec
        pool = spec.template.pool
        # A recovered schedule may name a pool no longer configured: its occurrences are
        # skipped (the schedule stays listed) rather than breaking every step.
        if pool not in self.shared.pools:
            return OccurrenceOutcome.NO_POOL, f"its pool {pool!r} is not configured"
        late = now - due
        if late > spec.grace_ns and spec.catch_up is CatchUpPolicy.SKIP:
            return OccurrenceOutcome.MISSED, (
                f"fired {seconds(late)} late, past its grace of {seconds(spec.grace_ns)} "
                "(catch_up='skip'): no leader ran when it came due"
            )
        if self._overlapping(schedule):
            return OccurrenceOutcome.SKIPPED, (
                f"task {schedule.last_task_id} of an earlier occurrence was still live "
                "(overlap='skip')"
            )
        if not self.tasks.ids_left():  # see _ids.py
            return OccurrenceOutcome.REFUSED, str(self.tasks.ids_exhausted())
        return OccurrenceOutcome.STARTED, ""

    def _record(
        self,
        schedule: _Schedule,
        due: int,
        outcome: OccurrenceOutcome,
        task_id: int | None,
        message: str,
    ) -> None:
        """The ledger record of the occurrences due from ``due`` up to the schedule's next."""
        shared = self.shared
        name = schedule.spec.name
        shared.out.mutations.append(
            OccurrenceRecorded(name, due, schedule.next_ns, outcome, task_id, shared.now, message)
        )
        bump(shared.counters.occurrences, (name, outcome.value))

    def next_due(self) -> int | None:
        """The next occurrence of an active schedule (stale heads dropped on the way)."""
        timers = self.timers
        while timers and not self._due(*timers[0]):
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def compact(self) -> None:
        """Rebuild the timer heap once most of its entries are stale (see timers.py)."""
        if len(self.timers) > 2 * len(self.schedules) + 1024:
            self.timers = [(s.next_ns, name) for name, s in self.schedules.items() if not s.paused]
            heapq.heapify(self.timers)
