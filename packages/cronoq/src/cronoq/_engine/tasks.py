"""The task table: ids, submission and admission, keys, dependencies, cancellation, the move
to a terminal status (with its cascade to dependants), and
retention of finished tasks. Reads of the table are in ``reads.py``, an operator's retry and
rerun in ``reruns.py``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cronoq._engine.limits import Lane, unknown_or_full
from cronoq._engine.outputs import CancelAttempt, SubmitResult, TaskSummary
from cronoq._engine.state import NO_TASK, Shared, Task, earliest, seconds
from cronoq._ids import first_id, last_id
from cronoq._metrics import bump
from cronoq._model import LEGAL_TRANSITIONS, MissPolicy, Status, TaskSpec
from cronoq._tracebacks import escape_header, split_traceback, with_traceback
from cronoq.errors import (
    AdmissionRejected,
    CronoqError,
    PermissionDenied,
    SchedulerError,
    TaskNotFound,
    UnknownDependency,
    UnknownPool,
)
from cronoq.store import (
    AttemptEnded,
    CancelRequested,
    TaskRecord,
    TaskSubmitted,
    TaskUpdated,
    quarantine_message,
)

__all__ = ["Tasks"]


class Tasks:
    """Live tasks are in ``shared.tasks``; this room keeps what outlives them: the finished
    ones inside the retention window (compact summaries), keys, dependants, waiters and the
    quarantined rows of the last recovery.

    ``dependents``: per live parent, the tasks that named it in ``after`` while it was live
    (submitted, retried or recovered waiting for it), in the order they did; a parent's
    finish settles them and moves its list to ``finished_dependents``, kept (for reads only)
    as long as its summary is.

    ``listed`` holds the id of every task in either (see ``index``) in ascending order, so that
    ``list`` starts at its ``after`` by bisection and stops when its page is full: a page costs
    the tasks it examines, not every task in memory. A pruned id stays in it (skipped) until
    half of it is pruned ids, then the list is compacted."""

    def __init__(self, shared: Shared, high_water_mark: int) -> None:
        self.shared = shared
        self.next_id = first_id(shared.epoch, high_water_mark)
        self.last_id = last_id(shared.epoch)  # ids past it would belong to the next epoch
        self.finished: dict[int, TaskSummary] = {}
        self.keys: dict[str, int] = {}
        self.dependents: dict[int, list[int]] = {}
        self.finished_dependents: dict[int, list[int]] = {}
        # Per task, the callers waiting for it to finish, by identity (removable in O(1)).
        self.waiters: dict[int, dict[int, object]] = {}
        self.quarantined: dict[int, TaskRecord] = {}
        # Finished tasks whose row keeps the lease of a stopped attempt: the update, without
        # the lease, that clears it once the attempt ends (see ``finish``).
        self.leased_finishes: dict[int, TaskUpdated] = {}
        self.listed: list[int] = []
        self.listed_sorted = True  # a recovery adds its rows out of id order: sorted on use
        self.pruned_listed = 0  # ids in ``listed`` no longer in memory

    @property
    def high_water_mark(self) -> int:
        return self.next_id - 1

    def ids_left(self) -> bool:
        return self.next_id <= self.last_id

    def take_waiters(self) -> list[tuple[int, object]]:
        """Remove and return every registered waiter as (task id, reply_to)."""
        taken = [(task_id, w) for task_id, ws in self.waiters.items() for w in ws.values()]
        self.waiters.clear()
        return taken

    def drop_waiter(self, task_id: int, reply_to: object) -> None:
        waiters = self.waiters.get(task_id)
        if waiters is not None and waiters.pop(id(reply_to), None) is not None and not waiters:
            del self.waiters[task_id]

    # --- submission -----------------------------------------------------------------------

    def submit(
        self,
        specs: Sequence[TaskSpec],
        key_pools: frozenset[str] | None = None,
        key_kinds: frozenset[str] | None = None,
    ) -> list[SubmitResult] | CronoqError:
        shared = self.shared
        scoped = key_pools is not None or key_kinds is not None
        # Validate the whole batch before applying any of it: nothing is half-applied.
        new_per_pool: dict[str, int] = {}
        new_lanes: list[Lane] = []
        limited: list[TaskSpec] = []  # the new tasks that take limits
        batch_keys: set[str] = set()
        for spec in specs:
            if spec.pool not in shared.pools:
                return UnknownPool(f"unknown pool {spec.pool!r}; configured: {shared.pool_names()}")
            for parent in spec.after:
                if parent > self.high_water_mark or parent <= 0:
                    return UnknownDependency(
                        f"task {spec.kind!r} depends on task {parent}, which was never submitted"
                    )
                if scoped and not self._within(parent, key_pools, key_kinds):
                    # Its output would reach this task: only a task the caller may see (of its
                    # pools and kinds, still known) may be a parent. Neither pool nor status.
                    return PermissionDenied(
                        f"task {spec.kind!r} depends on task {parent}, which is outside the "
                        "pools and kinds this submission may use, or no longer known",
                        "submit",
                    )
            if spec.key is not None:
                existing = self.keys.get(spec.key)
                if existing is not None:
                    if scoped and not self._within(existing, key_pools, key_kinds):
                        # Neither the task's id, pool nor status: only that the key is taken.
                        return PermissionDenied(
                            f"the key {spec.key[:255]!r} is held by a task outside the pools "
                            "and kinds this submission may use",
                            "submit",
                        )
                    continue
                if spec.key in batch_keys:
                    continue
                batch_keys.add(spec.key)
            new_per_pool[spec.pool] = new_per_pool.get(spec.pool, 0) + 1
            if spec.limits:
                new_lanes.append(spec.limits)
                limited.append(spec)
        if new_lanes and (refused := unknown_or_full(shared.gates, new_lanes, shared.now)):
            return refused
        if scoped and new_lanes and shared.gates.displacing:
            for spec in limited:
                if not self._ready_at_once(spec):
                    continue
                denied = self._displaces_outside(spec.limits, key_pools, key_kinds)
                if denied is not None:
                    return denied
        rejected = self.admit(new_per_pool)
        if rejected is not None:
            return rejected
        total_new = sum(new_per_pool.values())
        if self.next_id + total_new - 1 > self.last_id:
            return self.ids_exhausted()
        results: list[SubmitResult] = []
        for spec in specs:
            if spec.key is not None and (existing := self.keys.get(spec.key)) is not None:
                results.append(SubmitResult(existing, created=False))
                continue
            results.append(SubmitResult(self.create(spec).id, created=True))
        return results

    def _within(
        self, task_id: int, pools: frozenset[str] | None, kinds: frozenset[str] | None
    ) -> bool:
        """Whether a task (holding a key, or named as a parent) is of these pools and kinds
        (None: any), and still known."""
        task = self.shared.tasks.get(task_id)
        if task is not None:
            pool, kind = task.spec.pool, task.spec.kind
        elif (quarantined := self.quarantined.get(task_id)) is not None:
            pool, kind = quarantined.spec.pool, quarantined.spec.kind
        elif (done := self.finished.get(task_id)) is not None:
            pool, kind = done.pool, done.kind
        else:
            return False  # not known: not shown either
        return (pools is None or pool in pools) and (kinds is None or kind in kinds)

    def ids_exhausted(self) -> SchedulerError:
        # Refused before anything was created: the caller may retry as it is (elsewhere).
        return SchedulerError(
            f"epoch {self.shared.epoch} has issued every task id of its range (up to "
            f"{self.last_id}); restart the scheduler so that it leads under a new epoch",
            applied=False,
        )

    def create(self, spec: TaskSpec) -> Task:
        shared = self.shared
        # Callers check first (all or nothing); this guards the invariant ids rely on.
        assert self.ids_left(), self.ids_exhausted()
        if spec.limits and shared.gates.displacing and self._ready_at_once(spec):
            self._displace(spec.limits)
        task = Task(self.next_id, spec, shared.now)
        self.next_id += 1
        shared.tasks[task.id] = task
        self.listed.append(task.id)  # above every id issued before it: the order holds
        shared.pools[spec.pool].live += 1
        bump(shared.counters.submitted, spec.pool)
        if spec.key is not None:
            self.keys[spec.key] = task.id
        blocker = self.link_parents(task) if spec.after else None
        task.status = Status.WAITING if task.pending else self.initial_status(task)
        shared.out.mutations.append(TaskSubmitted(task.id, spec, task.status, shared.now))
        if blocker is not None:
            self.end_for_parent(task, *blocker)
        elif not task.pending:
            self.arm(task)
        else:
            shared.set_wake(task, spec.deadline_ns)  # a waiting task still fails at its deadline
        return task

    def _displaces_outside(
        self, lane: Lane, pools: frozenset[str] | None, kinds: frozenset[str] | None
    ) -> PermissionDenied | None:
        """A submission that may use only some pools and kinds must not cancel, through a
        limit's on_full, a task it could not cancel itself (as it may not take a key such a
        task holds)."""
        victims, _ = self._victims(lane)
        if all(self._within(task_id, pools, kinds) for task_id in victims):
            return None
        # Neither the task's id, pool nor kind: only that one would be cancelled.
        return PermissionDenied(
            "this task would cancel, by a limit's on_full, a task outside the pools and kinds "
            "this submission may use",
            "submit",
        )

    def _ready_at_once(self, spec: TaskSpec) -> bool:
        """Whether a new task is ready when submitted: only such a task displaces others by
        its limits' on_full (one that starts tomorrow, or after its parents, does not)."""
        start = spec.start_at_ns
        return not spec.after and (start is None or start <= self.shared.now)

    def _victims(self, lane: Lane) -> tuple[list[int], str]:
        """The tasks a new task of ``lane`` cancels, per its limits' ``on_full``: those
        waiting to start (keep_latest), and the oldest running attempt not already being
        cancelled (cancel_running); and why."""
        holders, waiting, why = self.shared.gates.displaced(lane)
        tasks = self.shared.tasks
        for task_id in holders:
            task = tasks.get(task_id)
            if task is not None and task.status is Status.RUNNING and not task.cancel_requested:
                return [*waiting, task_id], why
        return waiting, why

    def _displace(self, lane: Lane) -> None:
        """A new task of ``lane`` arrives: cancel what its limits' ``on_full`` says it
        replaces."""
        victims, why = self._victims(lane)
        for task_id in victims:
            self.cancel(task_id, why)

    def link_parents(self, task: Task) -> tuple[int, Status] | None:
        """Count unfinished parents; return a parent that failed or was cancelled, if any."""
        blocker: tuple[int, Status] | None = None
        for parent_id in task.spec.after:
            if parent_id in self.shared.tasks:
                task.pending += 1
                self.dependents.setdefault(parent_id, []).append(task.id)
                continue
            done = self.finished.get(parent_id)
            # Unknown ids below the high-water mark finished before the retention window.
            if done is not None and done.status is not Status.SUCCEEDED and blocker is None:
                blocker = (parent_id, done.status)
        return blocker

    def initial_status(self, task: Task) -> Status:
        start = task.spec.start_at_ns
        return Status.SCHEDULED if start is not None and start > self.shared.now else Status.READY

    def arm(self, task: Task, *, check_miss: bool = True) -> None:
        """Put a task whose dependencies are satisfied where it belongs: a timer or its queue.

        ``check_miss``: whether its fixed start may have been missed; not for a task that a
        leader already saw become ready on time (its row says ready), nor for an attempt that
        was put back unstarted.
        """
        shared = self.shared
        spec = task.spec
        if task.status is Status.SCHEDULED:
            assert spec.start_at_ns is not None
            shared.set_wake(task, earliest(spec.start_at_ns, spec.deadline_ns))
            return
        start = spec.start_at_ns
        now = shared.now
        if (
            check_miss
            and start is not None
            and task.attempt == 0  # the policy is about the first start, not a retry
            and spec.miss_policy is MissPolicy.SKIP
            and now > start + spec.grace_ns
        ):
            late = seconds(now - start)
            self.finish(task, Status.CANCELLED, f"skipped: fixed start missed by {late}")
            return
        if spec.deadline_ns is not None and now >= spec.deadline_ns:
            self.finish(task, Status.FAILED, "deadline passed before the task could start")
            return
        task.status = Status.READY
        shared.enqueue(task)
        shared.set_wake(task, spec.deadline_ns)

    # --- cancellation and the end of a task -----------------------------------------------

    def cancel(self, task_id: int, message: str) -> Status | CronoqError:
        message = escape_header(message)  # a caller's reason: never taken for a traceback
        shared = self.shared
        task = shared.tasks.get(task_id)
        if task is None:
            done = self.finished.get(task_id)
            if done is None:
                return TaskNotFound(f"no task {task_id}")
            return done.status
        if task.status is not Status.RUNNING:
            self.finish(task, Status.CANCELLED, message)
            return Status.CANCELLED
        if not task.cancel_requested:
            task.cancel_requested = True
            task.message = message
            shared.out.mutations.append(CancelRequested(task.id, shared.now, message))
            shared.out.cancels.append(CancelAttempt(task.token(), task.spec.pool, message))
        return Status.RUNNING

    def finish(
        self,
        task: Task,
        status: Status,
        message: str,
        output: bytes | None = None,
        traceback: str = "",
    ) -> None:
        """Make ``task`` terminal, persist it, answer its waiters and settle its dependents.
        A ``traceback`` goes into the row, the attempt's history and the waiters' answer after
        the message (see ``transition``).

        A task whose stopped remote attempt may still run (``shared.held_leases``), however it
        ends (cancelled, past its deadline, out of attempts, its parent failed), keeps that
        attempt's lease on its finished row until the attempt ends (``leased_finishes`` holds
        the update that clears it), so that a leader that takes over, and an operator's retry
        there, waits for the attempt too instead of starting another beside it."""
        shared = self.shared
        out = shared.out
        pending = [(task, status, message, output, traceback)]
        while pending:
            task, status, message, output, traceback = pending.pop()
            if task.status.is_terminal:
                continue  # a child reached twice: it names the same parent twice in ``after``
            started_ns = task.updated_ns if task.status is Status.RUNNING else None
            self.transition(task, status, message, traceback)
            task.wake_ns = None
            stored = with_traceback(message, traceback)
            update = TaskUpdated(task.id, status, task.attempt, stored, shared.now, output=output)
            lease = shared.held_leases.get(task.id)
            if lease is not None:
                self.leased_finishes[task.id] = update
                update = dataclasses.replace(update, lease=lease)
            out.mutations.append(update)
            del shared.tasks[task.id]
            if task.spec.limits:
                shared.gates.forget(task.id, task.spec.limits)
            shared.drop_lease(task)
            shared.lapsed.discard(task.id)
            bump(shared.counters.finished, (task.spec.pool, status.value))
            pool = shared.pools.get(task.spec.pool)
            if pool is not None:  # None only for a recovered task whose pool was removed
                pool.live -= 1
            self.finished[task.id] = task.summary()
            shared.deferred.discard(task.id)
            waiters = self.waiters.pop(task.id, None)
            if waiters:
                record = task.record(output, started_ns)
                if traceback:
                    record = dataclasses.replace(record, message=stored)
                for reply_to in waiters.values():
                    shared.reply(reply_to, record)
            children = self.dependents.pop(task.id, None)
            if children is None:
                continue
            # A retried parent that finishes again adds the dependants of its second life.
            self.finished_dependents.setdefault(task.id, []).extend(children)
            for child_id in children:
                child = shared.tasks.get(child_id)
                if child is None:
                    continue
                if status is Status.SUCCEEDED:
                    child.pending -= 1
                    if child.pending == 0:
                        self.transition(child, self.initial_status(child), child.message)
                        self.arm(child)
                        self.persist_status(child)
                else:
                    child_status, child_message = _parent_verdict(task.id, status)
                    pending.append((child, child_status, child_message, None, ""))

    def admit(self, new_per_pool: dict[str, int]) -> AdmissionRejected | None:
        """Why this many new live tasks (by pool) would not fit the bounds, if they would not."""
        shared = self.shared
        limit = shared.config.max_live_tasks
        total_new = sum(new_per_pool.values())
        if limit is not None and len(shared.tasks) + total_new > limit:
            return AdmissionRejected(
                f"{len(shared.tasks)} live tasks + {total_new} new would exceed "
                f"max_live_tasks={limit}"
            )
        for name, count in new_per_pool.items():
            pool = shared.pools[name]
            cap = pool.config.max_live
            if cap is not None and pool.live + count > cap:
                return AdmissionRejected(
                    f"pool {name!r} has {pool.live} live tasks; {count} more would exceed "
                    f"its max_live={cap}"
                )
        return None

    def end_for_parent(self, task: Task, parent_id: int, parent_status: Status) -> None:
        status, message = _parent_verdict(parent_id, parent_status)
        self.finish(task, status, message)

    def persist_status(self, task: Task) -> None:
        """Persist a move out of waiting or scheduled, so that a restart knows the task became
        ready on time and does not apply its miss policy to it."""
        if task.status.is_terminal:
            return  # arm finished it, and persisted that
        shared = self.shared
        lease = shared.held_leases.get(task.id)  # a retried task's stopped attempt still runs
        shared.out.mutations.append(
            TaskUpdated(task.id, task.status, task.attempt, task.message, shared.now, lease=lease)
        )

    def transition(self, task: Task, status: Status, message: str, traceback: str = "") -> None:
        """Every end of an attempt but a success goes through here, whoever ends it (a report,
        a timer, a recovery): it leaves a row of the attempt's history. A running task's
        ``updated_ns`` is its attempt's start (a cancellation request keeps it).

        A ``traceback`` is written after the message into the history (and by the caller into
        the row), never kept in memory: a million retrying tasks must not hold 8 KiB each."""
        if status not in LEGAL_TRANSITIONS[task.status]:
            raise AssertionError(f"illegal transition {task.status} -> {status} of task {task.id}")
        now = self.shared.now
        if task.status is Status.RUNNING and status is not Status.SUCCEEDED:
            stored = with_traceback(message, traceback)
            self.shared.out.mutations.append(
                AttemptEnded(task.id, task.attempt, task.updated_ns, now, stored)
            )
        task.status = status
        task.message = message
        task.updated_ns = now

    def prune_finished(self) -> None:
        horizon = self.shared.now - self.shared.config.retention_ns
        finished = self.finished
        while finished:
            task_id = next(iter(finished))
            summary = finished[task_id]
            if summary.finished_ns is not None and summary.finished_ns >= horizon:
                break
            del finished[task_id]
            self.pruned_listed += 1
            self.quarantined.pop(task_id, None)
            self.finished_dependents.pop(task_id, None)
            if summary.key is not None and self.keys.get(summary.key) == task_id:
                del self.keys[summary.key]
        if self.pruned_listed > len(self.listed) // 2:
            # Amortised: at least as many prunes as ids kept paid for this pass.
            tasks = self.shared.tasks
            self.listed = [i for i in self.listed if i in tasks or i in finished]
            self.pruned_listed = 0

    # --- rows of a recovery (see restore.py) -------------------------------------------------

    def index(self, task_id: int) -> None:
        """Add the id of a recovered row (or of a retried task that had left memory) to
        ``listed``; a duplicate is harmless."""
        listed = self.listed
        if listed and task_id <= listed[-1]:
            self.listed_sorted = False
        listed.append(task_id)

    def add_finished(self, row: TaskRecord) -> None:
        self.index(row.task_id)
        spec = row.spec
        self.finished[row.task_id] = TaskSummary.summarize(
            row.task_id, row.status, row.attempt, spec, row.updated_ns, row.message
        )
        if spec.key is not None:
            self.keys[spec.key] = row.task_id

    def add_quarantined(self, task_id: int, reason: str) -> None:
        now = self.shared.now
        self.index(task_id)
        message = quarantine_message(reason)
        self.finished[task_id] = TaskSummary.summarize(
            task_id, Status.FAILED, 0, NO_TASK.spec, now, message
        )
        # Lookups answer with what is known: failed, and why, not a decoding error.
        self.quarantined[task_id] = TaskRecord(
            task_id, NO_TASK.spec, Status.FAILED, 0, message, now, now
        )

    def add_live(self, row: TaskRecord) -> None:
        """A live row, as the store holds it; restore.py then settles it (``arm``, a lost
        attempt, a parent that failed meanwhile)."""
        shared = self.shared
        task = Task(row.task_id, row.spec, row.submitted_ns)
        task.status = row.status
        task.attempt = row.attempt
        task.message = split_traceback(row.message)[0]  # memory keeps no traceback
        task.updated_ns = row.updated_ns
        task.cancel_requested = row.cancel_requested
        # A remote attempt's lease names the leader that started it; any other attempt row is
        # either this leader's own (a rebuild in its epoch) or lost with its leader.
        task.attempt_epoch = shared.epoch if row.lease is None else row.lease.epoch
        shared.tasks[task.id] = task
        self.index(task.id)
        if row.spec.key is not None:
            self.keys[row.spec.key] = task.id
        if row.spec.pool in shared.pools:
            shared.pools[row.spec.pool].live += 1


def _parent_verdict(parent_id: int, parent_status: Status) -> tuple[Status, str]:
    if parent_status is Status.CANCELLED:
        return Status.CANCELLED, f"dependency {parent_id} was cancelled"
    return Status.FAILED, f"dependency {parent_id} failed"
