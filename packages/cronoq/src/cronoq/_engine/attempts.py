"""Attempts once started: which report or heartbeat is current (and why another is stale),
leases and their ids, the end of an attempt and the retry it leads to (backoff, attempts left,
deadline), attempts the engine stopped that still hold their slot ("zombies"), and attempts put
back because no executor received them."""

from __future__ import annotations

import random
from typing import NamedTuple

from cronoq._engine.inputs import (
    AttemptReport,
    AttemptSucceeded,
    AttemptToken,
    Heartbeat,
    lease_matches,
)
from cronoq._engine.limits import Lane
from cronoq._engine.outputs import CancelAttempt, HeartbeatReply
from cronoq._engine.state import Shared, Task, earliest, seconds
from cronoq._engine.tasks import Tasks
from cronoq._metrics import bump
from cronoq._model import Status
from cronoq._tracebacks import escape_header, with_traceback
from cronoq.errors import SchedulerError, StaleAttempt
from cronoq.store import AttemptLease, TaskUpdated

__all__ = ["Attempts", "Zombie"]


class Zombie(NamedTuple):
    """An attempt the engine stopped that has not reported: it keeps its slot, and its task
    starts no other attempt, until it does (or, if leased, until its lease ends)."""

    token: AttemptToken
    pool: str
    reason: str
    lease: AttemptLease | None
    """A remote attempt's lease: its worker proves itself with the id, and the task's row
    keeps it so that a new leader waits for that worker too."""
    lane: Lane = ()
    """The limits its slot holds besides its pool's (``TaskSpec.limits``)."""


class Attempts:
    def __init__(self, shared: Shared, tasks: Tasks) -> None:
        self.shared = shared
        self.tasks = tasks
        self.rng = random.Random(shared.config.seed)
        self.zombies: dict[int, Zombie] = {}
        # A leased zombie also ends when its lease does (its worker may be gone for good); its
        # worker's heartbeats renew it while the function runs.
        self.zombie_leases: dict[int, int] = {}

    def running_tokens(self) -> set[AttemptToken]:
        return {t.token() for t in self.shared.tasks.values() if t.status is Status.RUNNING}

    def current(self, token: AttemptToken) -> Task | None:
        task = self.shared.tasks.get(token.task_id)
        if (
            task is None
            or task.status is not Status.RUNNING
            or task.attempt != token.attempt
            or task.attempt_epoch != token.epoch
        ):
            return None
        return task

    def stale(
        self,
        token: AttemptToken,
        remote: bool,
        received_ns: int | None = None,
        lease_id: bytes | None = None,
    ) -> StaleAttempt | SchedulerError | None:
        """Why a heartbeat or report of ``token`` must change nothing, if it must. A remote
        one must carry a lease id this attempt was leased with; without it the attempt is
        "unknown" to the caller, whatever it is, so that a guessed token learns nothing and
        changes nothing. A token of a later epoch than this leader's is not stale: this leader
        was deposed (it may not know yet), and the worker must ask the current one, so the
        answer is "not applied" (the client retries elsewhere), never a verdict."""
        shared = self.shared
        name = f"attempt {token.attempt} of task {token.task_id} (epoch {token.epoch})"
        if token.epoch > shared.epoch:
            return SchedulerError(
                f"{name} is of a later leader than this one (epoch {shared.epoch}): ask the "
                "current leader",
                applied=False,
            )
        if remote and not self._proves(token, lease_id):
            return StaleAttempt(f"{name} is unknown with this lease id", "unknown")
        task = shared.tasks.get(token.task_id)
        if task is None:
            done = self.tasks.finished.get(token.task_id)
            if done is None:
                return StaleAttempt(f"{name}: no such task", "unknown")
            return StaleAttempt(f"{name}: the task is {done.status}", "finished")
        if task.status is Status.RUNNING and task.attempt == token.attempt:
            if token.epoch != task.attempt_epoch:
                message = (
                    f"{name} belongs to an earlier leader and was not adopted "
                    f"(epoch now {shared.epoch})"
                )
                return StaleAttempt(message, "epoch")
            lease_end = shared.leases.get(task.id)
            if lease_end is not None and lease_end <= (received_ns or shared.now):
                return StaleAttempt(f"{name}: its lease expired", "lease")
            return None
        now = f"the task is {task.status}, attempt {task.attempt}"
        if token.attempt > task.attempt:
            return StaleAttempt(f"{name} was never started ({now})", "unknown")
        if token.attempt < task.attempt:
            return StaleAttempt(f"{name} is not current: a newer attempt exists ({now})", "attempt")
        if task.id in shared.lapsed:
            message = f"{name}: its lease expired and it was counted lost ({now})"
            return StaleAttempt(message, "lease")
        if token.epoch != task.attempt_epoch:
            message = f"{name} belongs to an earlier leader (epoch now {shared.epoch}; {now})"
            return StaleAttempt(message, "epoch")
        return StaleAttempt(f"{name} has already ended ({now})", "attempt")

    def pool_of(self, token: AttemptToken, lease_id: bytes) -> str | None:
        """The pool of the remote attempt ``token`` names if ``lease_id`` proves it (its
        running lease, or the lease its stopped attempt holds); None otherwise, whatever the
        attempt is, so that a guess learns nothing."""
        task = self.shared.tasks.get(token.task_id)
        if task is not None and task.token() == token and task.status is Status.RUNNING:
            running = self.shared.lease_hashes.get(token.task_id)
            if running is not None and lease_matches(lease_id, running):
                return task.spec.pool
        zombie = self.zombies.get(token.task_id)
        if zombie is not None and zombie.token == token and zombie.lease is not None:
            return zombie.pool if lease_matches(lease_id, zombie.lease.id_hash) else None
        return None

    def _proves(self, token: AttemptToken, lease_id: bytes | None) -> bool:
        """Whether ``lease_id`` is the one ``token``'s attempt was leased with: its running
        lease, the lease a stopped attempt holds, or one that ended lately (so that its worker
        still learns precisely why it is stale)."""
        shared = self.shared
        task = shared.tasks.get(token.task_id)
        if task is not None and task.token() == token and task.status is Status.RUNNING:
            running = shared.lease_hashes.get(token.task_id)
            if running is not None:
                return lease_matches(lease_id, running)
        zombie = self.zombies.get(token.task_id)
        if zombie is not None and zombie.token == token and zombie.lease is not None:
            return lease_matches(lease_id, zombie.lease.id_hash)
        ended = shared.ended_leases.get(token.task_id)
        return ended is not None and ended[0] == token and lease_matches(lease_id, ended[1])

    def held(self, token: AttemptToken, remote: bool, lease_id: bytes | None) -> Zombie | None:
        """The stopped attempt ``token`` names, if it still holds its slot and the caller may
        speak for it: a worker with its lease id, or this process for one of its own."""
        zombie = self.zombies.get(token.task_id)
        if zombie is None or zombie.token != token:
            return None
        if remote:
            if zombie.lease is None or not lease_matches(lease_id, zombie.lease.id_hash):
                return None
        elif zombie.lease is not None:
            return None
        return zombie

    def report(self, item: AttemptReport) -> None:
        shared = self.shared
        stale = self.stale(item.token, item.remote, item.received_ns, item.lease_id)
        if stale is not None:
            if self.held(item.token, item.remote, item.lease_id) is not None:
                self.end_zombie(item.token)
            shared.reply(item.reply_to, stale)
            return
        task = shared.tasks[item.token.task_id]
        shared.drop_lease(task)
        shared.free_slot(task.spec.pool, task.id, task.spec.limits)
        outcome = item.outcome
        if isinstance(outcome, AttemptSucceeded):
            message = f"attempt {task.attempt} succeeded"
            self.tasks.finish(task, Status.SUCCEEDED, message, output=outcome.output)
        elif task.cancel_requested:
            self.tasks.finish(task, Status.CANCELLED, task.message)
        else:
            self.failed(
                task,
                outcome.message,
                outcome.retryable,
                outcome.retry_after_ns,
                traceback=outcome.traceback,
            )
        shared.reply(item.reply_to, None)

    def heartbeat(self, item: Heartbeat) -> None:
        shared = self.shared
        stale = self.stale(item.token, item.remote, item.received_ns, item.lease_id)
        if stale is not None:
            zombie = self.held(item.token, item.remote, item.lease_id)
            lease = None if zombie is None else shared.pools[zombie.pool].config.lease_ns
            if zombie is None or lease is None:
                shared.reply(item.reply_to, stale)
                return
            # Still running after it was stopped: it keeps its slot, and its task waits, for
            # as long as its worker says so.
            end = shared.now + lease
            self.zombie_leases[item.token.task_id] = end
            shared.reply(item.reply_to, HeartbeatReply(end, zombie.reason, stopped=True))
            return
        task = shared.tasks[item.token.task_id]
        shared.set_wake(task, self.running_wake(task))
        reason = task.message if task.cancel_requested else None
        shared.reply(item.reply_to, HeartbeatReply(shared.leases.get(task.id), reason))

    def running_wake(self, task: Task) -> int | None:
        """When a running attempt must next be looked at (its deadline, timeout or lease); a
        leased one's lease is renewed from now."""
        shared = self.shared
        spec = task.spec
        wake = spec.deadline_ns
        if spec.timeout_ns is not None:
            wake = earliest(wake, task.updated_ns + spec.timeout_ns)
        lease = shared.pools[spec.pool].config.lease_ns
        if lease is not None:
            shared.leases[task.id] = shared.now + lease
            wake = earliest(wake, shared.now + lease)
        return wake

    def failed(
        self,
        task: Task,
        reason: str,
        retryable: bool,
        retry_after_ns: int | None,
        *,
        traceback: str = "",
    ) -> None:
        """The running attempt of ``task`` ended without success (its slot is already freed):
        retry after the backoff, or dead-letter it. An attempt the engine stopped may still
        run: the task's row keeps its lease (``shared.held_leases``), retrying or finished, so
        that a new leader waits for it too. A traceback follows the message in its row and
        history, not in memory."""
        reason = escape_header(reason)  # a function's or worker's text, as cancel's reason
        shared = self.shared
        counters = shared.counters
        spec = task.spec
        attempt = task.attempt
        if not retryable:
            bump(counters.dead_lettered, spec.pool)
            message = f"attempt {attempt} failed (not retryable): {reason}"
            self.tasks.finish(task, Status.FAILED, message, traceback=traceback)
            return
        if attempt >= spec.retry.max_attempts:
            message = f"attempt {attempt} failed: {reason}; no attempts left"
            bump(counters.dead_lettered, spec.pool)
            self.tasks.finish(task, Status.FAILED, message, traceback=traceback)
            return
        delay = retry_after_ns
        if delay is None:
            delay = spec.retry.delay_ns(attempt, self.rng.random())
        due = shared.now + delay
        if spec.deadline_ns is not None and due >= spec.deadline_ns:
            message = f"attempt {attempt} failed: {reason}; the next would start after the deadline"
            bump(counters.dead_lettered, spec.pool)
            self.tasks.finish(task, Status.FAILED, message, traceback=traceback)
            return
        bump(counters.retries, spec.pool)
        message = f"attempt {attempt} failed: {reason}; retrying in {seconds(delay)}"
        self.tasks.transition(task, Status.RETRYING, message, traceback)
        shared.out.mutations.append(
            TaskUpdated(
                task.id,
                Status.RETRYING,
                attempt,
                with_traceback(message, traceback),
                shared.now,
                due_ns=due,
                lease=shared.held_leases.get(task.id),
            )
        )
        task.wake_ns = None
        shared.set_wake(task, earliest(due, spec.deadline_ns))

    # --- attempts the engine stopped, and attempts that never began ------------------------

    def stop(self, task: Task, reason: str) -> None:
        """Cancel the running attempt of ``task``, which the engine is ending on its own.

        The attempt keeps its slot until it reports (Python cannot kill a thread, an async
        function may ignore its cancellation, a worker may finish first): the pool's limit and
        "one attempt of a task at a time" hold for attempts that outlive their timeout. A leased
        (remote) attempt lets go when its lease ends, since its worker may be gone; its worker
        renews that lease by heartbeating while the function runs; the task's row keeps that
        lease while it holds (``shared.held_leases``).
        """
        shared = self.shared
        token = task.token()
        shared.out.cancels.append(CancelAttempt(token, task.spec.pool, reason))
        end, lease = shared.drop_lease(task)
        if end is not None and end <= shared.now:
            lease = None  # it lapsed: nothing waits for it any more (a crash would not either)
        self.hold(Zombie(token, task.spec.pool, reason, lease, task.spec.limits), end)

    def stopping(self, task_id: int) -> bool:
        """Whether a stopped attempt of this task still holds its slot."""
        return task_id in self.zombies

    def stopped_until(self, task_id: int) -> int | None:
        """When the stopped attempt of this task stops holding its slot at the latest (its
        lease's end), if a lease bounds it."""
        return self.zombie_leases.get(task_id)

    def hold(self, zombie: Zombie, lease_end: int | None) -> None:
        """A stopped attempt keeps its slot (already counted in its pool) until it reports,
        or until ``lease_end`` if its worker may be gone."""
        self.zombies[zombie.token.task_id] = zombie
        if zombie.lease is not None:
            self.shared.held_leases[zombie.token.task_id] = zombie.lease
        if lease_end is not None:
            self.zombie_leases[zombie.token.task_id] = lease_end

    def end_zombie(self, token: AttemptToken) -> None:
        """A stopped attempt reported, or its lease ended: free its slot and let its task go
        on. A row that kept its lease for it is cleared, so that no later leader waits for an
        attempt that is over (and counts its slot twice)."""
        shared = self.shared
        zombie = self.zombies.get(token.task_id)
        if zombie is None or zombie.token != token:
            return
        del self.zombies[token.task_id]
        self.zombie_leases.pop(token.task_id, None)
        shared.held_leases.pop(token.task_id, None)
        if zombie.lease is not None:  # one a restore held had no running lease to drop
            shared.remember_ended(token, zombie.lease.id_hash)
        shared.free_slot(zombie.pool, token.task_id, zombie.lane)
        cleared = self.tasks.leased_finishes.pop(token.task_id, None)
        task = shared.tasks.get(token.task_id)
        if task is None:
            if cleared is not None and zombie.lease is not None:
                shared.out.mutations.append(cleared)
            return
        if zombie.lease is not None and task.status is not Status.RUNNING:
            # Its task waited for it (retrying, or retried by hand): the row lets go too.
            due = task.wake_ns if task.status is Status.RETRYING else None
            shared.out.mutations.append(
                TaskUpdated(task.id, task.status, task.attempt, task.message, shared.now, due)
            )
        if token.task_id in shared.deferred:
            shared.deferred.discard(token.task_id)
            shared.enqueue(task)

    def retried(self, task_id: int) -> None:
        """An operator's retry made a finished task live again, which cleared its row's lease:
        if the attempt the engine had stopped still runs, the row takes its lease back, so that
        a leader that takes over waits for it too (here, dispatch waits: ``stopping``)."""
        shared = self.shared
        self.tasks.leased_finishes.pop(task_id, None)
        zombie = self.zombies.get(task_id)
        task = shared.tasks.get(task_id)
        if zombie is None or zombie.lease is None or task is None:
            return
        shared.out.mutations.append(
            TaskUpdated(
                task.id, task.status, task.attempt, task.message, shared.now, lease=zombie.lease
            )
        )

    def expire_zombies(self) -> None:
        """Let go of stopped leased attempts whose lease ended without a report."""
        shared = self.shared
        for task_id, lease_end in list(self.zombie_leases.items()):
            if lease_end <= shared.now:
                token = self.zombies[task_id].token
                shared.out.expired.append(token)
                self.end_zombie(token)

    def next_zombie_end(self) -> int | None:
        return min(self.zombie_leases.values(), default=None)

    def unstart(self, task: Task, message: str) -> None:
        """Put back a dispatched attempt that no executor received: it does not count."""
        shared = self.shared
        shared.free_slot(task.spec.pool, task.id, task.spec.limits)
        if task.spec.limits:
            shared.gates.unstart(task.spec.limits, task.updated_ns)
        shared.drop_lease(task)
        task.attempt -= 1
        # RUNNING -> READY is not a transition of the task's life: the attempt never began.
        task.status = Status.READY
        task.message = message
        task.updated_ns = shared.now
        task.wake_ns = None
        shared.out.mutations.append(
            TaskUpdated(task.id, Status.READY, task.attempt, message, shared.now)
        )
        self.tasks.arm(task, check_miss=False)
