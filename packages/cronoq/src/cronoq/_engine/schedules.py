"""Recurring schedules: add, replace, pause, resume and remove them, fire their occurrences
(overlap, catch-up after downtime, coalescing), and trigger one now."""

from __future__ import annotations

import heapq

from cronoq._cron import CronSchedule
from cronoq._engine.state import Shared
from cronoq._engine.tasks import Tasks
from cronoq._model import CatchUpPolicy, OverlapPolicy, ScheduleSpec, TaskSpec
from cronoq.errors import CronoqError, DuplicateSchedule, ScheduleNotFound, UnknownPool
from cronoq.store import ScheduleRecord, ScheduleRemoved, ScheduleSaved

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
        self._save(schedule)
        return record

    def pause(self, name: str, paused: bool) -> ScheduleRecord | CronoqError:
        schedule = self.schedules.get(name)
        if schedule is None:
            return ScheduleNotFound(f"no schedule named {name!r}")
        if schedule.paused != paused:
            schedule.paused = paused
            if not paused:
                # Occurrences that passed while paused are not caught up.
                schedule.next_ns = schedule.cron.next_after(self.shared.now)
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
        if self.schedules.pop(name, None) is None:
            return ScheduleNotFound(f"no schedule named {name!r}")
        self.shared.out.mutations.append(ScheduleRemoved(name))
        return None

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
        tasks = self.tasks
        timers = self.timers
        now = shared.now
        while timers and timers[0][0] <= now:
            due, name = heapq.heappop(timers)
            if not self._due(due, name):
                continue  # a stale timer: removed, paused or rescheduled since
            schedule = self.schedules[name]
            spec = schedule.spec
            missed = now - due > spec.grace_ns
            # A recovered schedule may name a pool no longer configured: its occurrences are
            # skipped (the schedule stays listed) rather than breaking every step.
            # Without ids left (see _ids.py) an occurrence is skipped like one whose pool left.
            runnable = spec.template.pool in shared.pools and tasks.ids_left()
            if (
                runnable
                and not self._overlapping(schedule)
                and not (missed and spec.catch_up is CatchUpPolicy.SKIP)
            ):
                self._start(schedule)
            # Every occurrence up to now is covered by this firing (coalesced).
            schedule.next_ns = schedule.cron.next_after(now)
            self._save(schedule)

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
