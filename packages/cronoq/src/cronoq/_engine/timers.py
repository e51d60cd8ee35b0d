"""Timers: what a task's timer does when it fires (a fixed start, the end of a backoff, a
deadline, a timeout, a lost lease), when the engine must next be stepped, and keeping the
heaps in proportion to what is live."""

from __future__ import annotations

import heapq

from cronoq._engine.attempts import Attempts
from cronoq._engine.schedules import Schedules
from cronoq._engine.state import NO_TASK, Shared, Task, earliest, seconds
from cronoq._engine.tasks import Tasks
from cronoq._metrics import bump
from cronoq._model import Status

__all__ = ["Timers"]


class Timers:
    def __init__(
        self, shared: Shared, tasks: Tasks, attempts: Attempts, schedules: Schedules
    ) -> None:
        self.shared = shared
        self.tasks = tasks
        self.attempts = attempts
        self.schedules = schedules

    def fire(self) -> None:
        shared = self.shared
        now = shared.now
        live = shared.tasks
        while shared.timers and shared.timers[0][0] <= now:
            wake, task_id = heapq.heappop(shared.timers)
            task = live.get(task_id)
            if task is None or task.wake_ns != wake:
                continue  # stale: the task moved on since this timer was set
            task.wake_ns = None
            self._on_timer(task)

    def _on_timer(self, task: Task) -> None:
        shared = self.shared
        tasks = self.tasks
        attempts = self.attempts
        spec = task.spec
        now = shared.now
        deadline_passed = spec.deadline_ns is not None and now >= spec.deadline_ns
        status = task.status
        if status is Status.RUNNING:
            if deadline_passed:
                message = f"deadline passed during attempt {task.attempt}"
                attempts.stop(task, message)
                tasks.finish(task, Status.FAILED, message)
                return
            if task.cancel_requested:
                attempts.stop(task, task.message)
                tasks.finish(task, Status.CANCELLED, task.message)
                return
            timeout = spec.timeout_ns
            if timeout is not None and now >= task.updated_ns + timeout:
                reason = f"timed out after {seconds(timeout)}"
            else:
                reason = "lost: its worker stopped heartbeating"
                bump(shared.counters.attempts_lost, spec.pool)
                shared.lapsed.add(task.id)
            attempts.stop(task, reason)
            attempts.failed(task, reason, retryable=True, retry_after_ns=None)
        elif deadline_passed:
            tasks.finish(task, Status.FAILED, "deadline passed before the task could start")
        elif status is Status.SCHEDULED:
            tasks.transition(task, Status.READY, task.message)
            tasks.arm(task)  # a leader stalled past the grace missed the start too
            tasks.persist_status(task)
        elif status is Status.RETRYING:
            tasks.transition(task, Status.READY, task.message)
            tasks.arm(task)

    def next_wake(self) -> int | None:
        self._compact()
        zombie_end = self.attempts.next_zombie_end()
        # Drop stale heads so a cancelled task's timer does not cause a useless wake-up.
        timers = self.shared.timers
        live = self.shared.tasks
        while timers and live.get(timers[0][1], NO_TASK).wake_ns != timers[0][0]:
            heapq.heappop(timers)
        return earliest(
            earliest(timers[0][0] if timers else None, zombie_end),
            earliest(self.schedules.next_due(), self.shared.gates.next_wake()),
        )

    def _compact(self) -> None:
        """Rebuild a heap once most of its entries are stale (their task finished or moved
        on), so that memory follows the live tasks, not every timer ever set. Each rebuild
        is linear and follows as many stale pushes: amortised O(1) per entry."""
        shared = self.shared
        live = shared.tasks
        if len(shared.timers) > 2 * len(live) + 1024:
            shared.timers = [(t.wake_ns, t.id) for t in live.values() if t.wake_ns is not None]
            heapq.heapify(shared.timers)
        self.schedules.compact()
        shared.gates.sweep(shared.now)
        for pool in shared.pools.values():
            if pool.entries > 2 * pool.live + 1024:
                pool.compact(
                    lambda task_id: (
                        (t := live.get(task_id)) is not None and t.status is Status.READY
                    )
                )
