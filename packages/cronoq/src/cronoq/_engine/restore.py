"""Restore: an engine rebuilt from the rows a store recovered, at the start of an epoch (a
running attempt of a previous leader is lost, unless it is remote: its worker may still run it
inside its lease, so the new leader waits for that worker and adopts the attempt when it proves
itself with the lease id) or within this process's own epoch after a commit whose outcome is
uncertain (``InFlight`` says which attempts really left)."""

from __future__ import annotations

import dataclasses

from cronoq._engine.attempts import Attempts, Zombie
from cronoq._engine.inputs import AttemptToken, InFlight, lease_hash
from cronoq._engine.outputs import CancelAttempt
from cronoq._engine.schedules import Schedules
from cronoq._engine.state import Shared, Task, earliest
from cronoq._engine.tasks import Tasks
from cronoq._metrics import bump
from cronoq._model import Status
from cronoq.store import AttemptLease, RecoveredState, TaskRecord, TaskUpdated

__all__ = ["Restorer"]


class Restorer:
    def __init__(
        self,
        shared: Shared,
        tasks: Tasks,
        attempts: Attempts,
        schedules: Schedules,
        inflight: InFlight | None,
    ) -> None:
        self.shared = shared
        self.tasks = tasks
        self.attempts = attempts
        self.schedules = schedules
        self.inflight = inflight

    def run(self, state: RecoveredState) -> None:
        shared = self.shared
        tasks = self.tasks
        finished_rows = sorted(
            (r for r in state.tasks if r.status.is_terminal), key=lambda r: r.updated_ns
        )
        for row in finished_rows:
            tasks.add_finished(row)
            if row.lease is not None:
                self._stopped_row(row, self._earlier(row))
        for task_id, reason in state.quarantined:
            tasks.add_quarantined(task_id, reason)
        live_rows = [r for r in state.tasks if not r.status.is_terminal]
        gates = shared.gates
        for row in live_rows:
            tasks.add_live(row)
            if row.spec.limits:
                task = shared.tasks[row.task_id]
                task.spec = dataclasses.replace(row.spec, limits=gates.known(row.spec.limits))
        for row in state.tasks:
            if row.spec.limits and row.started_ns is not None:
                lane = gates.known(row.spec.limits)
                gates.recount_start(lane, row.started_ns, max(row.attempt, 1), shared.now)
        gates.sort_recounted()
        for schedule_row in state.schedules:
            self.schedules.restore(schedule_row)
        # Parents come before their dependents in id order, so one pass settles every cascade.
        for row in live_rows:
            restored = shared.tasks.get(row.task_id)
            if restored is not None:  # a failed parent's cascade may have finished it already
                self._task(restored, row)
        if self.inflight is not None:
            for token in self.inflight.executing:
                self._stopped_attempt(token, self.inflight)

    def _stopped_attempt(self, token: AttemptToken, inflight: InFlight) -> None:
        """An attempt of this process still executing: if the rows no longer show it as its
        task's current attempt (its timeout, deadline or cancellation landed in an uncertain
        commit), it is told to stop, and keeps its slot until it reports."""
        shared = self.shared
        task = shared.tasks.get(token.task_id)
        if (
            task is not None
            and task.status is Status.RUNNING
            and task.attempt == token.attempt
            and task.attempt_epoch == token.epoch
        ):
            return  # kept by _task
        done = self.tasks.finished.get(token.task_id) if task is None else None
        reason = f"attempt {token.attempt} is no longer current"
        if task is not None:
            reason = task.message
        elif done is not None:
            reason = f"the task is {done.status}"
        pool_name = inflight.executing[token]
        pool = shared.pools.get(pool_name)
        lane = shared.gates.known(inflight.lanes.get(token, ()))
        if pool is None:
            shared.out.expired.append(token)  # nothing here can stop it or wait for it
            return
        shared.out.cancels.append(CancelAttempt(token, pool_name, reason))
        lease = pool.config.lease_ns
        latest = task.attempt if task is not None else done.attempt if done is not None else None
        if lease is not None and latest != token.attempt:
            # A later attempt began, or the task is gone: this one had been let go (its lease
            # ended), and nothing waits for its report.
            shared.out.expired.append(token)
            return
        shared.take_slot(pool, lane)
        # A leased one: its lease as the engine before the rebuild knew it is gone: a whole
        # one from now holds the task (its worker may still run it), and no longer (it may be
        # gone). One whose lease had ended is not here (the driver forgets those: ``expired``),
        # unless the step that ended it is the uncertain one: it then holds one lease more, a
        # later retry but never two attempts at once.
        lease_id = inflight.lease_ids.get(token)
        held = None if lease_id is None else AttemptLease(token.epoch, lease_hash(lease_id))
        end = None if lease is None else shared.now + lease
        self.attempts.hold(Zombie(token, pool_name, reason, held, lane), end)

    def _task(self, task: Task, row: TaskRecord) -> None:
        shared = self.shared
        tasks = self.tasks
        attempts = self.attempts
        inflight = self.inflight
        spec = task.spec
        if spec.pool not in shared.pools:
            # Its pool is no longer configured: fail it visibly rather than keep it forever.
            tasks.finish(task, Status.FAILED, f"pool {spec.pool!r} is no longer configured")
            return
        pool = shared.pools[spec.pool]
        waits_for_worker = self._earlier(row) and pool.config.lease_ns is not None
        if task.status is Status.RUNNING:
            shared.take_slot(pool, spec.limits, task.id)
            token = task.token()
            if inflight is not None and (token in inflight.executing or token in inflight.reported):
                self._keep(task, row.lease)
                if task.cancel_requested and token in inflight.executing:
                    # The cancellation may have landed in the uncertain commit: deliver it.
                    shared.out.cancels.append(CancelAttempt(token, spec.pool, task.message))
                return
            left_to_worker = (
                inflight is not None
                and token in inflight.abandoned
                and row.lease is not None
                and pool.config.lease_ns is not None
            )
            if waits_for_worker or left_to_worker:
                # Its worker may run it still (a close that timed out left it to its worker):
                # the row keeps its lease, and whoever leads next waits for it.
                self._keep(task, row.lease)
                if task.cancel_requested:
                    shared.out.cancels.append(CancelAttempt(token, spec.pool, task.message))
                return
            if inflight is not None and not inflight.released(token):
                attempts.unstart(
                    task, f"attempt {task.attempt} was not started (its commit was uncertain)"
                )
                return
            shared.free_slot(spec.pool, task.id, spec.limits)
            if task.cancel_requested:
                tasks.finish(task, Status.CANCELLED, task.message)
            else:
                reason = "lost: the scheduler stopped while it ran"
                bump(shared.counters.attempts_lost, spec.pool)
                attempts.failed(task, reason, retryable=True, retry_after_ns=None)
            return
        if row.lease is not None:
            self._stopped_row(row, waits_for_worker)
        if task.status is Status.RETRYING:
            due = row.due_ns if row.due_ns is not None else shared.now
            shared.set_wake(task, earliest(due, spec.deadline_ns))
        else:
            blocker = tasks.link_parents(task) if spec.after else None
            if blocker is not None:
                task.status = Status.WAITING
                tasks.end_for_parent(task, *blocker)
            elif task.pending:
                task.status = Status.WAITING
                shared.set_wake(task, spec.deadline_ns)
            else:
                # A ready row became ready under a leader; only a start that was still ahead
                # (scheduled, waiting) can have passed while no leader ran.
                became_ready = task.status is Status.READY
                task.status = tasks.initial_status(task)
                tasks.arm(task, check_miss=not became_ready)

    def _earlier(self, row: TaskRecord) -> bool:
        """Whether the row holds the lease of an earlier leader's remote attempt, which may
        still run: its worker's lease holds."""
        lease = row.lease
        return lease is not None and (self.inflight is None or lease.epoch != self.shared.epoch)

    def _keep(self, task: Task, lease: AttemptLease | None) -> None:
        """A running attempt goes on: this process's own, or a remote one adopted from an
        earlier leader, whose lease runs a whole one from now (its worker may be alive)."""
        if lease is not None:
            self.shared.lease_hashes[task.id] = lease.id_hash
        self.shared.set_wake(task, self.attempts.running_wake(task))

    def _stopped_row(self, row: TaskRecord, waits_for_worker: bool) -> None:
        """A row, live or finished, that kept the lease of an attempt the engine had stopped.
        An earlier leader's: its worker may still run it, so it holds its slot and its task
        (a retry of a finished one included) for one lease from now, or until it reports.
        This leader's own: ``InFlight`` says whether it still runs (then ``_stopped_attempt``
        holds it), and the row is cleared if not (the write that cleared it was the uncertain
        one)."""
        shared = self.shared
        assert row.lease is not None
        token = AttemptToken(row.lease.epoch, row.task_id, row.attempt)
        # A finished row keeps its finish time; a live one is updated now.
        finished = row.status.is_terminal
        at_ns = row.updated_ns if finished else shared.now
        cleared = TaskUpdated(row.task_id, row.status, row.attempt, row.message, at_ns, row.due_ns)
        if finished:
            self.tasks.leased_finishes[row.task_id] = cleared
        pool = shared.pools.get(row.spec.pool)
        lease_ns = None if pool is None else pool.config.lease_ns
        if waits_for_worker and pool is not None and lease_ns is not None:
            lane = shared.gates.known(row.spec.limits)
            shared.take_slot(pool, lane)
            zombie = Zombie(token, pool.config.name, row.message, row.lease, lane)
            self.attempts.hold(zombie, shared.now + lease_ns)
        elif self.inflight is None or token not in self.inflight.executing:
            self.tasks.leased_finishes.pop(row.task_id, None)
            shared.out.mutations.append(cleared)
