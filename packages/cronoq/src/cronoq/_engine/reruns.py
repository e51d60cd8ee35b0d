"""An operator's second chance for a finished task: ``retry`` continues the same task (its
attempts keep counting), ``rerun`` submits a new task with its spec, linked to it."""

from __future__ import annotations

import dataclasses

from cronoq._engine.limits import unknown_or_full
from cronoq._engine.state import Shared, Task
from cronoq._engine.tasks import Tasks
from cronoq._model import MAX_ATTEMPTS, Status
from cronoq.errors import CronoqError, NotRetryable, SchedulerError, TaskNotFound, UnknownPool
from cronoq.store import TaskRecord, TaskRetried, quarantine_message

__all__ = ["Reruns"]


class Reruns:
    def __init__(self, shared: Shared, tasks: Tasks) -> None:
        self.shared = shared
        self.tasks = tasks

    def retry(self, task_id: int, row: TaskRecord | None, message: str) -> TaskRecord | CronoqError:
        """Make a failed or cancelled task live again, with one more attempt allowed.

        Its attempts keep counting (the next is its last + 1), and if it had used all its
        policy allows, the policy's ``max_attempts`` becomes that next attempt: it keeps the
        attempts it had left, or gets exactly one more. It takes its key back. Dependants that
        its failure already ended stay ended (each may be retried in turn, and then waits for
        it). Refused, changing nothing, when running it could not work: see ``_unretryable``.
        """
        shared = self.shared
        found = self._unretryable(task_id, row)
        if found is not None:
            return found
        assert row is not None  # _unretryable refuses a task whose row the store lacks
        done = self.tasks.finished.pop(task_id, None)
        if done is None:
            self.tasks.index(task_id)  # finished before the retention window: out of ``listed``
        attempt = row.attempt if done is None else done.attempt
        spec = row.spec
        if attempt >= spec.retry.max_attempts:
            retry = dataclasses.replace(spec.retry, max_attempts=attempt + 1)
            spec = dataclasses.replace(spec, retry=retry)
        known = shared.gates.known(spec.limits)
        if known != spec.limits:  # a limit no longer configured holds nothing (docs/limits.md)
            spec = dataclasses.replace(spec, limits=known)
        task = Task(task_id, spec, row.submitted_ns)
        task.attempt = attempt
        task.message = message
        task.updated_ns = shared.now
        shared.tasks[task_id] = task
        shared.pools[spec.pool].live += 1
        if spec.key is not None:
            self.tasks.keys[spec.key] = task_id
        self.tasks.link_parents(task)  # no parent failed (checked): it counts those still live
        task.status = Status.WAITING if task.pending else self.tasks.initial_status(task)
        shared.out.mutations.append(
            TaskRetried(task_id, spec, task.status, attempt, message, shared.now)
        )
        if task.pending:
            shared.set_wake(task, spec.deadline_ns)
        else:
            # An operator asked for it now: a fixed start missed long ago does not skip it.
            self.tasks.arm(task, check_miss=False)
        return task.record()

    def _unretryable(self, task_id: int, row: TaskRecord | None) -> CronoqError | None:
        """Why the task cannot be retried now, if it cannot."""
        shared = self.shared
        name = f"task {task_id}"
        found = self._unrunnable(task_id, row, "only a failed or cancelled task can be retried")
        if found is not None:
            return found
        assert row is not None  # _unrunnable refuses a task whose row the store lacks
        done = self.tasks.finished.get(task_id)
        if (row.status if done is None else done.status) is Status.SUCCEEDED:
            return NotRetryable(f"{name} succeeded: rerun it to run it again as a new task")
        spec = row.spec
        attempt = row.attempt if done is None else done.attempt
        if attempt >= MAX_ATTEMPTS:
            return NotRetryable(f"{name} has used {attempt} attempts, the most a task may have")
        if spec.deadline_ns is not None and shared.now >= spec.deadline_ns:
            return NotRetryable(f"{name}'s deadline has passed: rerun it as a new task instead")
        holder = None if spec.key is None else self.tasks.keys.get(spec.key)
        if holder is not None and holder != task_id and holder in shared.tasks:
            return NotRetryable(f"{name}'s key {spec.key!r} is held by live task {holder}")
        return self.tasks.admit({spec.pool: 1})

    def rerun(self, task_id: int, row: TaskRecord | None) -> int | CronoqError:
        """Submit a new task with the spec of a finished one (any end, success included),
        ``rerun_of`` naming it: the id of the new task. It starts now (no fixed start, no
        deadline: both were the original's) and is no schedule's occurrence; it keeps its
        parents (and gets their outputs again), its limits still configured and its pool's
        current ones (a limit with ``on_full="reject"`` may refuse it, as a submission), and
        takes over the key unless another live task holds it. Refused, changing nothing, as
        ``retry`` is when running it could not work."""
        shared = self.shared
        tasks = self.tasks
        name = f"task {task_id}"
        found = self._unrunnable(
            task_id, row, "only a finished task can be run again (cancel it first, or wait for it)"
        )
        if found is not None:
            return found
        assert row is not None  # _unrunnable refuses a task whose row the store lacks
        spec = row.spec
        holder = None if spec.key is None else tasks.keys.get(spec.key)
        if holder is not None and holder in shared.tasks:
            return NotRetryable(f"{name}'s key {spec.key!r} is held by live task {holder}")
        # Its limits still configured, and those its pool has now (as a new submission's).
        limits = dict(shared.gates.known(spec.limits))
        for limit in shared.pools[spec.pool].config.limits:
            limits.setdefault(limit, None)
        lane = tuple(sorted(limits.items()))
        if lane and (refused := unknown_or_full(shared.gates, [lane], shared.now)):
            return refused
        if (refused := tasks.admit({spec.pool: 1})) is not None:
            return refused
        if not tasks.ids_left():
            return tasks.ids_exhausted()
        spec = dataclasses.replace(
            spec,
            start_at_ns=None,
            deadline_ns=None,
            schedule=None,
            trace_context=None,
            limits=lane,
            rerun_of=task_id,
        )
        return tasks.create(spec).id

    def _unrunnable(self, task_id: int, row: TaskRecord | None, only: str) -> CronoqError | None:
        """Why a finished task's spec cannot make a task now, if it cannot: shared by retry
        and rerun. ``only``: what a live task is told it should be instead."""
        shared = self.shared
        tasks = self.tasks
        name = f"task {task_id}"
        live = shared.tasks.get(task_id)
        if live is not None:
            return NotRetryable(f"{name} is {live.status}: {only}")
        quarantined = row is not None and row.message.startswith(quarantine_message(""))
        if task_id in tasks.quarantined or quarantined:
            return NotRetryable(f"{name} was quarantined (its row could not be decoded)")
        if row is None:
            if task_id not in tasks.finished:
                return TaskNotFound(f"no task {task_id}")
            # Finished in a step whose commit had not landed when the row was read.
            return SchedulerError(f"{name} finished a moment ago; try again", applied=False)
        if not row.status.is_terminal and task_id not in tasks.finished:
            return SchedulerError(f"{name} is changing; try again", applied=False)
        spec = row.spec
        if spec.pool not in shared.pools:
            return UnknownPool(
                f"{name} is in pool {spec.pool!r}, which is not configured; "
                f"configured: {shared.pool_names()}"
            )
        for parent_id in spec.after:
            parent = tasks.finished.get(parent_id)
            if parent is not None and parent.status is not Status.SUCCEEDED:
                return NotRetryable(
                    f"{name} depends on task {parent_id}, which {parent.status}: "
                    f"retry task {parent_id} first"
                )
        return None
