"""Random histories: a Scheduler over the store, crashed at commit boundaries, given commits
that land and still fail, closed in the middle of things, and checked against a model.

Crashes happen before a step's commit reaches the store, after the store committed it but
before any caller was answered, or between steps. Uncertain commits come from
``FaultyStore`` around the harness's instance: applied and then
reported ``Unavailable``, hung past the driver's ``commit_timeout`` and then applied, or not
applied; attempts finish, are cancelled and time out while such a commit fails. Graceful closes
come during a dispatching commit, with attempts that ignore cancellation, and while the store
is down.

What every history must keep (``_Checks`` gathers the violations; each names its rule):

- acknowledged tasks are durable and unchanged; a call that failed with ``SchedulerError`` left
  its batch all there or absent, and all there if its commit landed;
- an attempt counts as used only if it was released to an executor: a task's attempt number
  is the number of times the executor function was entered for it, plus at most one per real
  crash (``abort``) that found it live, since a crash may fall between the commit of a dispatch
  and its release (after a crash memory is gone: that attempt is indistinguishable from one that
  ran); a graceful close and an uncertain commit are not crashes and get no such allowance;
- never two attempts of one task run at once in one scheduler (attempts of a scheduler that
  crashed or closed may outlive it in this process; a real process would have ended them);
- a success reported to a running scheduler is applied: the task ends succeeded with that
  attempt, and no later attempt runs; exempt: an attempt with a per-attempt timeout that ran
  near it (the timeout may have come first), one that saw a cancellation, reports a crash may
  have dropped, and those after a graceful close's drain time;
- a cancellation the caller was told about reaches the running attempt;
- every ``wait()`` resolves or fails with a ``CronoqError``: within a bound after its scheduler
  stops (close, abort), and once its task is finished;
- ``close(timeout=t)`` returns within ``t`` plus a margin, even for attempts that ignore
  cancellation and while the store is down; after it returns no cooperative attempt still runs.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from cronoq import (
    Pool,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    Status,
    TaskContext,
    TaskInfo,
    TaskRequest,
)
from cronoq.errors import CronoqError, TaskError
from cronoq.store import (
    Mutation,
    Store,
    TaskSubmitted,
)
from cronoq_conformance._faults import CommitFault, DelegatingStore, FaultyStore
from cronoq_conformance._harness import Capability, StoreHarness

__all__ = ["SimulationSuite"]

_T = TypeVar("_T")

FAULT_COMMIT_TIMEOUT = 0.25
"""The driver's commit_timeout during an uncertain commit; 30 s the rest of the time, so that
a slow commit on a loaded machine is not turned into a fault the history did not choose."""
CLOSE_MARGIN = 1.5
"""What close(timeout=t) may take beyond t: the last commits and the release (the driver gives
itself a second for them)."""
STUBBORN_S = 3.0
"""How long a stubborn attempt ignores its cancellation: beyond t + CLOSE_MARGIN."""
SETTLE_S = 8.0
WAITER_S = 2.0
CANCEL_S = 2.0
ATTEMPT_TIMEOUT_S = 0.15
UNCERTAIN = (CommitFault.LANDS_THEN_UNAVAILABLE, CommitFault.LANDS_AFTER_TIMEOUT)


class CrashPoint(enum.Enum):
    BEFORE_COMMIT = "before the commit reaches the store"
    AFTER_COMMIT = "after the store committed, before any caller is answered"


class Behaviour(enum.Enum):
    OK = "ok"  # returns at once
    FAIL = "fail"  # raises a retryable TaskError at once
    GATE = "gate"  # waits for the history's gate to open
    STUBBORN = "stubborn"  # waits for the gate, and ignores cancellation for STUBBORN_S


class CrashingStore(DelegatingStore):
    """Wraps a store; when armed, the next commit kills the scheduler at the chosen point."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.armed: CrashPoint | None = None
        self.on_crash: Any = None

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        point, self.armed = self.armed, None
        if point is CrashPoint.AFTER_COMMIT:
            await self.inner.commit(epoch, batch)
        if point is not None:
            self.on_crash()
            await asyncio.sleep(0)  # the driver task was cancelled: this raises CancelledError
            raise AssertionError("the crash did not stop the driver")
        await self.inner.commit(epoch, batch)


@dataclass
class Model:
    """What callers were told."""

    acknowledged: dict[int, bytes] = field(default_factory=dict)
    """Task id -> payload, for every submission that returned."""
    keys: dict[str, int] = field(default_factory=dict)
    uncertain_batches: list[list[str]] = field(default_factory=list)
    """Keys of submit_many calls that failed without an answer: all durable or none."""
    cancelled: set[int] = field(default_factory=set)
    """Tasks whose cancel() returned 'cancelled'."""
    issued: list[int] = field(default_factory=list)
    """Every id ever returned, in order."""


@dataclass(frozen=True, slots=True)
class Meta:
    """How a submitted task behaves (whether or not its submission was acknowledged)."""

    behaviour: Behaviour
    max_attempts: int
    timed: bool


@dataclass(slots=True)
class Entry:
    """One entry of the executor function: one released attempt."""

    generation: int
    attempt: int
    task_id: int
    started: float
    ended: float | None = None
    outcome: str | None = None  # "succeeded", "failed", "cancelled"
    saw_cancel: bool = False
    exempt: bool = False
    """Its report may be lost legitimately (a crash came before it was committed)."""


@dataclass(slots=True)
class Generation:
    """One Scheduler of the history, over its own store instance."""

    number: int
    sched: Scheduler
    faulty: FaultyStore
    crashing: CrashingStore
    instance: Store
    crashed: bool = False


@dataclass(slots=True)
class Waiter:
    future: asyncio.Future[TaskInfo]
    generation: int
    task_id: int


_F = TypeVar("_F", bound=Callable[..., None])


def _step(rule_function: _F) -> _F:
    """Write each step into the history that a failure report shows: a failure that depends
    on timing may not replay, and then hypothesis cannot print the steps itself."""

    @functools.wraps(rule_function)
    def step(self: SchedulerMachine, **arguments: Any) -> None:
        shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        self.note(f"{rule_function.__name__}({shown})")
        rule_function(self, **arguments)

    return step  # type: ignore[return-value]


class SchedulerMachine(RuleBasedStateMachine):
    harness: StoreHarness
    faults: bool = True
    """Whether histories include uncertain commits (FaultyStore)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.model = Model()
        self.names = itertools.count()
        self.run_id = uuid.uuid4().hex[:12]
        self.known: dict[str, Meta] = {}
        self.entries: dict[str, list[Entry]] = {}
        self.allowance: dict[str, int] = {}
        self.seen_terminal: set[str] = set()
        self.drain_deadlines: dict[int, float] = {}
        """Generation -> when the drain time of its graceful close ended."""
        self.faulty_stores: list[FaultyStore] = []
        self.waiters: list[Waiter] = []
        self.violations: list[str] = []
        self.history: list[str] = []
        self.last_check = time.monotonic()
        self.gate = asyncio.Event()
        self.generations = itertools.count(1)
        self.gen: Generation | None = None
        self.began = time.monotonic()
        self.run(self._start())

    def note(self, line: str) -> None:
        number = 0 if self.gen is None else self.gen.number
        self.history.append(f"[{time.monotonic() - self.began:7.3f}s gen {number}] {line}")

    def run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run_until_complete(coro)

    def bounded(self, coro: Coroutine[Any, Any, _T], seconds: float, what: str) -> _T:
        try:
            return self.run(asyncio.wait_for(coro, seconds))
        except TimeoutError:
            raise AssertionError(f"{what} did not return within {seconds:g}s") from None

    @property
    def sched(self) -> Scheduler:
        assert self.gen is not None
        return self.gen.sched

    @property
    def faulty(self) -> FaultyStore:
        assert self.gen is not None
        return self.gen.faulty

    async def _start(self) -> None:
        number = next(self.generations)
        instance = await self.harness.open()
        faulty = FaultyStore(instance)
        crashing = CrashingStore(faulty)
        sched = Scheduler(
            [Pool("default", self._executor(number), concurrency=8)],
            store=crashing,
            commit_timeout=30.0,
            seed=5,
        )
        crashing.on_crash = lambda: self._crash_now(sched)
        self.gen = Generation(number, sched, faulty, crashing, instance)
        self.faulty_stores.append(faulty)
        await asyncio.wait_for(sched.start(), self.harness.leadership_timeout + 5)

    def teardown(self) -> None:
        try:
            if self.gen is not None and self.sched.running:
                self._settle()
                self.bounded(self.sched.close(timeout=1.0), 1.0 + CLOSE_MARGIN + 5, "close")
            self.gate.set()
            self.run(self.harness.close_all())
            self._report_violations()
        finally:
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.wait(pending, timeout=STUBBORN_S + 1))
            self.loop.close()

    def _next_key(self) -> str:
        # Unique across examples: hypothesis runs them all on the one cluster of the test.
        return f"{self.run_id}-{next(self.names)}"

    # --- the executor ---------------------------------------------------------------------

    def _executor(self, generation: int) -> Any:
        async def execute(ctx: TaskContext, payload: bytes) -> bytes:
            meta = self.known.get(ctx.key or "")
            if meta is None:
                return payload  # a task of an earlier example of this test: not ours
            assert ctx.key is not None
            entries = self.entries.setdefault(ctx.key, [])
            running = [e.attempt for e in entries if e.generation == generation and not e.ended]
            if running:
                self.violations.append(
                    f"two attempts at once: attempt {ctx.attempt} of task {ctx.task_id} started "
                    f"while attempt(s) {running} still ran"
                )
            entry = Entry(generation, ctx.attempt, ctx.task_id, time.monotonic())
            entries.append(entry)
            name = f"attempt {ctx.attempt} of task {ctx.task_id} ({meta.behaviour.value})"
            self.note(f"  {name} entered")
            try:
                await self._behave(meta.behaviour, entry)
            except asyncio.CancelledError:
                entry.outcome = "cancelled"
                raise
            except BaseException:
                entry.outcome = "failed"
                raise
            finally:
                entry.ended = time.monotonic()
                self.note(f"  {name} ended: {entry.outcome or 'succeeded'}")
            entry.outcome = "succeeded"
            entry.saw_cancel = entry.saw_cancel or ctx.cancelled
            return payload

        return execute

    async def _behave(self, behaviour: Behaviour, entry: Entry) -> None:
        if behaviour is Behaviour.FAIL:
            raise TaskError("planned failure")
        if behaviour is Behaviour.OK:
            return
        gate = self.gate
        if behaviour is Behaviour.GATE:
            await gate.wait()
            return
        # Stubborn: cancellation is noted and ignored for STUBBORN_S, or until the gate opens.
        loop = asyncio.get_running_loop()
        give_up: float | None = None
        while not gate.is_set():
            remaining = None if give_up is None else give_up - loop.time()
            if remaining is not None and remaining <= 0:
                return
            try:
                await asyncio.wait_for(gate.wait(), remaining)
            except asyncio.CancelledError:
                entry.saw_cancel = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                if give_up is None:
                    give_up = loop.time() + STUBBORN_S
            except TimeoutError:
                return

    def _running_entries(self, *behaviours: Behaviour) -> list[tuple[str, Entry]]:
        assert self.gen is not None
        return [
            (key, e)
            for key, entries in self.entries.items()
            for e in entries
            if e.generation == self.gen.number
            and e.ended is None
            and self.known[key].behaviour in behaviours
        ]

    # --- generations: crash, close, restart ----------------------------------------------

    def _crash_now(self, sched: Scheduler) -> None:
        """A real crash: abort. Memory is gone, so what it knew is given the benefit of the
        doubt: a live task's attempt may count once without having run, and a report not yet
        seen applied may be lost."""
        assert self.gen is not None and self.gen.sched is sched
        sched.abort()
        self._forgive(self.gen)

    def _forgive(self, gen: Generation) -> None:
        gen.crashed = True
        for key in self.known:
            if key not in self.seen_terminal:
                self.allowance[key] = self.allowance.get(key, 0) + 1
            for e in self.entries.get(key, []):
                if e.generation == gen.number and (e.ended is None or e.ended > self.last_check):
                    e.exempt = True

    def _recover(self) -> None:
        """After a crash: the harness crashes the store instance, a new scheduler takes over."""
        assert self.gen is not None
        self._check_waiters_of_stopped(self.gen.number, "an abort")
        self.run(self.harness.crash(self.gen.instance))
        self.run(self._start())

    def _restart_after_close(self) -> None:
        assert self.gen is not None
        self._check_waiters_of_stopped(self.gen.number, "a graceful close")
        self.run(self._start())

    def _close(self, timeout: float, what: str) -> None:
        """close(timeout) must return within the timeout plus CLOSE_MARGIN."""
        gen = self.gen
        assert gen is not None
        started = time.monotonic()
        self.drain_deadlines[gen.number] = started + timeout
        closing = asyncio.ensure_future(gen.sched.close(timeout=timeout), loop=self.loop)
        self.run(asyncio.wait([closing], timeout=timeout + CLOSE_MARGIN))
        elapsed = time.monotonic() - started
        if not closing.done():
            self.violations.append(
                f"close(timeout={timeout:g}) {what} had not returned after {elapsed:.2f}s"
            )
            return
        closing.result()
        self._check_closed(gen)

    def _check_closed(self, gen: Generation) -> None:
        cooperative = (Behaviour.GATE, Behaviour.OK, Behaviour.FAIL)
        # A cancelled coroutine ends at its next turn of the loop: close() need not wait for
        # that, so give the cancelled ones a few turns before calling them still running.
        for _ in range(20):
            if not self._running_entries(*cooperative):
                break
            self.run(asyncio.sleep(0))
        for key, e in self._running_entries(*cooperative):
            self.violations.append(
                f"attempt {e.attempt} of task {e.task_id} ({key}) still ran after close() "
                "returned: it was neither drained nor stopped"
            )

    def _check_answered(self, call: asyncio.Future[Any], what: str) -> None:
        """A call in flight when its scheduler stopped is answered (a result or an error)."""
        self.run(asyncio.wait([call], timeout=WAITER_S))
        if not call.done():
            self.violations.append(f"{what} was never answered ({WAITER_S:g}s after close())")
            call.cancel()
            self.run(asyncio.wait([call], timeout=1))
        elif not call.cancelled() and call.exception() is not None:
            raise call.exception()  # type: ignore[misc]

    def _check_waiters_of_stopped(self, generation: int, what: str) -> None:
        futures = [w.future for w in self.waiters if w.generation == generation]
        if futures:
            self.run(asyncio.wait(futures, timeout=WAITER_S))
        for w in self.waiters:
            if w.generation != generation:
                continue
            if not w.future.done():
                self.violations.append(
                    f"wait({w.task_id}) still hung {WAITER_S:g}s after {what} of its scheduler"
                )
            elif not w.future.cancelled() and not _resolved_or_cronoq(w.future):
                self.violations.append(
                    f"wait({w.task_id}) failed with {w.future.exception()!r}, not a CronoqError"
                )
        self.waiters = [w for w in self.waiters if w.generation != generation]

    # --- uncertain commits ---------------------------------------------------------------

    def _set_commit_timeout(self, seconds: float) -> None:
        # The Scheduler takes commit_timeout once; a history needs a short one only while it
        # injects an uncertain commit, so the kit reaches into the driver for those steps.
        driver = self.sched._driver
        driver._commit_timeout = seconds

    def _arm(self, fault: CommitFault) -> None:
        if fault is not CommitFault.HELD:
            self._set_commit_timeout(FAULT_COMMIT_TIMEOUT)
        self.faulty.arm(fault)

    def _wait_for_rebuild(self, what: str) -> None:
        """The uncertain commit was given up and memory rebuilt from the store."""
        bound = FAULT_COMMIT_TIMEOUT + self.harness.leadership_timeout + 3
        if not self.faulty.faulted.is_set():
            # Nothing was committed (a cancel of a finished task, say): no fault, no rebuild.
            self.faulty.disarm()
            self._set_commit_timeout(30.0)
            return
        try:
            self.bounded(self.faulty.recovered.wait(), bound, f"the rebuild after {what}")
        finally:
            self.faulty.disarm()
            self._set_commit_timeout(30.0)

    # --- operations -----------------------------------------------------------------------

    def _requests(
        self, size: int, behaviour: Behaviour, attempts: int, timed: bool
    ) -> list[TaskRequest]:
        timed = timed and behaviour is Behaviour.GATE
        requests = []
        for _ in range(size):
            key = self._next_key()
            self.known[key] = Meta(behaviour, attempts, timed)
            requests.append(
                TaskRequest(
                    "job",
                    f"{behaviour.value}-{key}".encode(),
                    key=key,
                    retry=RetryPolicy.exponential(
                        attempts, initial=0.001, maximum=0.002, jitter=0.0
                    ),
                    timeout=ATTEMPT_TIMEOUT_S if timed else None,
                )
            )
        return requests

    async def _submit(self, requests: list[TaskRequest]) -> list[int] | None:
        try:
            ids = await self.sched.submit_many(requests)
        except SchedulerError as exc:
            self.note(f"  submit of {[r.key for r in requests]} failed: {exc}")
            self.model.uncertain_batches.append([r.key for r in requests if r.key])
            return None
        self.note(f"  submitted {[r.key for r in requests]} as {ids}")
        for task_id, request in zip(ids, requests, strict=True):
            assert request.key is not None
            self.model.acknowledged[task_id] = request.payload
            self.model.keys[request.key] = task_id
            self.model.issued.append(task_id)
        return ids

    @rule(
        size=st.integers(1, 3),
        behaviour=st.sampled_from(Behaviour),
        attempts=st.sampled_from([1, 3]),
        timed=st.booleans(),
        crash=st.sampled_from([None, None, *CrashPoint]),
    )
    @_step
    def submit_many(
        self, size: int, behaviour: Behaviour, attempts: int, timed: bool, crash: CrashPoint | None
    ) -> None:
        assert self.gen is not None
        requests = self._requests(size, behaviour, attempts, timed)
        self.gen.crashing.armed = crash
        ids = self.bounded(self._submit(requests), 60, "submit_many")
        if ids is None:
            if crash is not None:
                self._recover()
            return
        assert crash is None or self.gen.crashing.armed is None

    @precondition(lambda self: self.faults)
    @rule(
        size=st.integers(1, 3),
        behaviour=st.sampled_from([Behaviour.OK, Behaviour.FAIL, Behaviour.GATE]),
        attempts=st.sampled_from([1, 3]),
        fault=st.sampled_from([*UNCERTAIN, CommitFault.UNAVAILABLE]),
    )
    @_step
    def submit_during_an_uncertain_commit(
        self, size: int, behaviour: Behaviour, attempts: int, fault: CommitFault
    ) -> None:
        # The submission's step dispatches what it made ready: item 2 of issue 9.
        requests = self._requests(size, behaviour, attempts, timed=False)
        self._arm(fault)
        self.bounded(self._submit(requests), 30, "a submit during an uncertain commit")
        self._wait_for_rebuild(f"{fault.name} on a submit")

    @precondition(lambda self: self.faults)
    @rule(fault=st.sampled_from([*UNCERTAIN, CommitFault.UNAVAILABLE]))
    @_step
    def finish_attempts_during_an_uncertain_commit(self, fault: CommitFault) -> None:
        # Preconditions and draws must not depend on timing (hypothesis replays histories).
        if not self._running_entries(Behaviour.GATE):
            return
        # Attempts report while a commit fails: their reports queue behind it (item 1).
        self._arm(fault)
        trigger = asyncio.ensure_future(
            self._submit(self._requests(1, Behaviour.OK, 1, timed=False)), loop=self.loop
        )
        self.bounded(self.faulty.faulted.wait(), 5, "the uncertain commit")
        self._open_gate()
        self.bounded(asyncio.wait_for(trigger, 30), 31, "a submit during an uncertain commit")
        self._wait_for_rebuild(f"{fault.name} while attempts finished")

    @precondition(lambda self: self.faults)
    @rule(fault=st.sampled_from([*UNCERTAIN, CommitFault.UNAVAILABLE]))
    @_step
    def time_out_during_an_uncertain_commit(self, fault: CommitFault) -> None:
        if not self._gate_slots():
            return
        # The step that times an attempt out and cancels it is the uncertain one (item 3).
        [request] = self._requests(1, Behaviour.GATE, 2, timed=True)
        assert request.key is not None
        ids = self.bounded(self._submit([request]), 30, "submit")
        if ids is None or not self._entered(request.key, 2.0):
            return
        self._arm(fault)
        try:
            self.bounded(self.faulty.faulted.wait(), 3, "the commit of the timeout")
        finally:
            self._wait_for_rebuild(f"{fault.name} on a timeout")

    @rule(
        pick=st.integers(0, 1 << 16),
        fault=st.sampled_from([None, None, *UNCERTAIN, CommitFault.UNAVAILABLE]),
    )
    @_step
    def cancel(self, pick: int, fault: CommitFault | None) -> None:
        if not self.model.acknowledged:
            return
        if fault is not None and not self.faults:
            fault = None
        running = {e.task_id for _, e in self._running_entries(Behaviour.GATE)}
        choices = sorted(running & set(self.model.acknowledged)) or sorted(self.model.acknowledged)
        task_id = choices[pick % len(choices)]
        key = next(k for k, t in self.model.keys.items() if t == task_id)
        if self.known[key].behaviour is Behaviour.STUBBORN:
            return  # its success after a cancellation is a choice of the driver, not checked
        if fault is not None:
            self._arm(fault)
        try:
            status = self.bounded(self.sched.cancel(task_id), 30, "cancel")
        except SchedulerError:
            status = None
        if fault is not None:
            self._wait_for_rebuild(f"{fault.name} on a cancel")
        if status is None:  # not told: the caller retries, as the error says it may
            try:
                status = self.bounded(self.sched.cancel(task_id), 30, "a retried cancel")
            except SchedulerError:
                return
        if status is Status.CANCELLED:
            self.model.cancelled.add(task_id)
        if status in (Status.CANCELLED, Status.RUNNING):
            self._check_cancel_reached(key, task_id)

    def _check_cancel_reached(self, key: str, task_id: int) -> None:
        attempts = [e for k, e in self._running_entries(Behaviour.GATE) if k == key]
        deadline = time.monotonic() + CANCEL_S
        while any(e.ended is None for e in attempts) and time.monotonic() < deadline:
            self.run(asyncio.sleep(0.01))
        for e in attempts:
            if e.ended is None:
                self.violations.append(
                    f"the cancellation of task {task_id} never reached its attempt {e.attempt} "
                    f"({CANCEL_S:g}s after cancel() answered)"
                )

    @rule()
    @_step
    def crash_between_steps(self) -> None:
        assert self.gen is not None
        self._crash_now(self.sched)
        self._recover()

    @rule(
        timeout=st.sampled_from([0.05, 0.3]),
        during=st.sampled_from([None, None, "a dispatching commit", "a store outage"]),
    )
    @_step
    def close_gracefully_and_restart(self, timeout: float, during: str | None) -> None:
        # One rule for the three kinds of close, so that closes (which wait out a lease when
        # the store is down) stay a small part of a history.
        if during is not None and not self.faults:
            during = None
        if during == "a store outage" and Capability.UNAVAILABLE not in self.harness.capabilities:
            during = None
        if during == "a dispatching commit":
            self._close_during_a_dispatching_commit(timeout)
        elif during == "a store outage":
            self._close_while_the_store_is_down(timeout)
        else:
            self._close(timeout, "with attempts running")
            self._restart_after_close()

    def _close_during_a_dispatching_commit(self, timeout: float) -> None:
        # Item 6: the step that starts an attempt is still committing when close() begins.
        self._arm(CommitFault.HELD)
        submitting = asyncio.ensure_future(
            self._submit(self._requests(1, Behaviour.OK, 1, timed=False)), loop=self.loop
        )
        self.bounded(self.faulty.faulted.wait(), 5, "the held commit")
        gen = self.gen
        assert gen is not None
        started = time.monotonic()
        self.drain_deadlines[gen.number] = started + timeout
        closing = asyncio.ensure_future(gen.sched.close(timeout=timeout), loop=self.loop)
        for _ in range(10):  # let close() take its snapshot of the running attempts
            self.run(asyncio.sleep(0))
        self.faulty.release_held()
        self.run(asyncio.wait([closing], timeout=timeout + CLOSE_MARGIN))
        if not closing.done():
            self.violations.append(
                f"close(timeout={timeout:g}) during a dispatching commit had not returned after "
                f"{time.monotonic() - started:.2f}s"
            )
            self.bounded(asyncio.wait_for(closing, 30), 31, "close")
        closing.result()
        self._check_answered(submitting, "a submit whose commit was held when close() began")
        self._check_closed(gen)
        self._restart_after_close()

    def _close_while_the_store_is_down(self, timeout: float) -> None:
        # Item 5: the driver retries and rebuilds while the store is down; close() must not
        # wait for the store to come back. Nothing can be written: for the model, a crash.
        gen = self.gen
        assert gen is not None
        self._set_commit_timeout(FAULT_COMMIT_TIMEOUT)
        self.run(self.harness.set_available(gen.instance, False))
        submitting = asyncio.ensure_future(
            self._submit(self._requests(1, Behaviour.OK, 1, timed=False)), loop=self.loop
        )
        self.run(asyncio.sleep(FAULT_COMMIT_TIMEOUT / 2))  # the commit is failing meanwhile
        self._forgive(gen)
        started = time.monotonic()
        closing = asyncio.ensure_future(gen.sched.close(timeout=timeout), loop=self.loop)
        self.run(asyncio.wait([closing], timeout=timeout + CLOSE_MARGIN))
        elapsed = time.monotonic() - started
        self.run(self.harness.set_available(gen.instance, True))
        if not closing.done():
            self.violations.append(
                f"close(timeout={timeout:g}) while the store was down had not returned after "
                f"{elapsed:.2f}s"
            )
            self.bounded(asyncio.wait_for(closing, 30), 31, "close after the store came back")
        closing.result()
        self._check_answered(submitting, "a submit in flight when close() began, the store down")
        self._restart_after_close()

    @rule(pick=st.integers(0, 1 << 16))
    @_step
    def start_waiting(self, pick: int) -> None:
        assert self.gen is not None
        if not self.model.acknowledged:
            return
        ids = sorted(self.model.acknowledged)
        task_id = ids[pick % len(ids)]
        future = asyncio.ensure_future(self.sched.wait(task_id), loop=self.loop)
        self.waiters.append(Waiter(future, self.gen.number, task_id))

    @rule()
    @_step
    def open_gate(self) -> None:
        self._open_gate()
        self.run(asyncio.sleep(0.01))

    @rule()
    @_step
    def let_tasks_run(self) -> None:
        self.run(asyncio.sleep(0.01))

    @rule()
    @_step
    def settle(self) -> None:
        self._settle()

    def _open_gate(self) -> None:
        gate, self.gate = self.gate, asyncio.Event()
        gate.set()

    def _gate_slots(self) -> bool:
        return len(self._running_entries(Behaviour.GATE, Behaviour.STUBBORN)) < 6

    def _entered(self, key: str, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while not self.entries.get(key) and time.monotonic() < deadline:
            self.run(asyncio.sleep(0.005))
        return bool(self.entries.get(key))

    # --- checks ---------------------------------------------------------------------------

    def _report_violations(self) -> None:
        if self.violations:
            raise AssertionError(
                "\n".join(
                    [
                        "the history broke the scheduler's promises:",
                        *self.violations,
                        "history:",
                        *self.history,
                    ]
                )
            )

    async def _infos(self) -> dict[str, TaskInfo]:
        """Every task of this history that exists, by key."""
        found: dict[str, TaskInfo] = {}
        for key in self.known:
            task_id = self.model.keys.get(key)
            if task_id is not None:
                found[key] = await self.sched.get(task_id)
            else:
                info = await self.sched.get_by_key(key)
                if info is not None:
                    found[key] = info
        return found

    def _entered_attempts(self) -> dict[str, list[int]]:
        return {key: [e.attempt for e in entries] for key, entries in self.entries.items()}

    def _observe(self) -> tuple[dict[str, list[int]], dict[str, TaskInfo], dict[str, list[int]]]:
        """Entries before, tasks, entries after: attempts run on while the tasks are read, so
        each task's state lies between the two snapshots of the executor's entries."""
        before = self._entered_attempts()
        infos = self.run(self._infos())
        return before, infos, self._entered_attempts()

    def _check_attempts(
        self,
        before: dict[str, list[int]],
        infos: dict[str, TaskInfo],
        after: dict[str, list[int]],
    ) -> None:
        for key, info in infos.items():
            entered = after.get(key, [])
            earlier = before.get(key, [])
            allowance = self.allowance.get(key, 0)
            if len(set(entered)) != len(entered):
                self.violations.append(f"task {info.task_id} ran attempt numbers {entered}")
            if earlier and max(earlier) > info.attempt:
                self.violations.append(
                    f"task {info.task_id} ran attempt {max(earlier)} but counts {info.attempt}"
                )
            slack = allowance
            if info.status is Status.RUNNING and info.attempt not in earlier:
                slack += 1  # committed and released; the executor may not be entered yet
            if info.attempt > len(entered) + slack:
                self.violations.append(
                    f"task {info.task_id} is {info.status.value} at attempt {info.attempt} but "
                    f"its executor ran {len(entered)} time(s) (crash allowance {allowance}): an "
                    f"attempt that was never released counted as used ({info.message!r})"
                )

    def _check_successes(self, infos: dict[str, TaskInfo]) -> None:
        for key, info in infos.items():
            meta = self.known[key]
            for e in self.entries.get(key, []):
                if e.outcome != "succeeded" or e.exempt or e.saw_cancel or e.ended is None:
                    continue
                gen_deadline = self.drain_deadlines.get(e.generation)
                if gen_deadline is not None and e.ended > gen_deadline:
                    continue  # after the drain time of a graceful close: abandoned
                if meta.timed and (info.attempt > e.attempt or "timed out" in info.message):
                    continue  # its timeout fired before the report came: stale
                if (info.status, info.attempt) != (Status.SUCCEEDED, e.attempt):
                    self.violations.append(
                        f"attempt {e.attempt} of task {info.task_id} succeeded, yet the task is "
                        f"{info.status.value} at attempt {info.attempt} ({info.message!r})"
                    )

    def _settle(self) -> None:
        """Open the gate, wait until every task of the history is finished, check it all."""
        self._open_gate()
        deadline = time.monotonic() + SETTLE_S
        before, infos, after = self._observe()
        while any(not i.status.is_terminal for i in infos.values()) and time.monotonic() < deadline:
            self._open_gate()
            self.run(asyncio.sleep(0.02))
            before, infos, after = self._observe()
        for info in infos.values():
            if not info.status.is_terminal:
                self.violations.append(
                    f"task {info.task_id} still {info.status.value} {SETTLE_S:g}s after the gate "
                    f"opened ({info.message!r})"
                )
        self.seen_terminal |= {k for k, i in infos.items() if i.status.is_terminal}
        self._check_attempts(before, infos, after)
        self._check_successes(infos)
        assert self.gen is not None
        mine = [w.future for w in self.waiters if w.generation == self.gen.number]
        if mine:
            self.run(asyncio.wait(mine, timeout=WAITER_S))
        for w in self.waiters:
            if w.generation == self.gen.number and not w.future.done():
                self.violations.append(
                    f"wait({w.task_id}) still hung {WAITER_S:g}s after every task finished"
                )
            elif w.future.done() and not _resolved_or_cronoq(w.future):
                self.violations.append(
                    f"wait({w.task_id}) failed with {w.future.exception()!r}, not a CronoqError"
                )
        self.waiters = [w for w in self.waiters if not w.future.done()]
        self.last_check = time.monotonic()

    @invariant()
    def no_promise_was_broken(self) -> None:
        self._report_violations()

    @invariant()
    def the_scheduler_is_running(self) -> None:
        assert self.sched.running, f"the scheduler stopped by itself: {self.sched.failure!r}"

    @invariant()
    def every_acknowledged_task_is_durable_and_unchanged(self) -> None:
        for task_id, payload in self.model.acknowledged.items():
            info = self.run(self.sched.get(task_id))
            assert info.payload == payload, f"task {task_id} changed its payload"
            if task_id in self.model.cancelled:
                assert info.status is Status.CANCELLED, f"task {task_id} lost its cancellation"

    @invariant()
    def uncertain_batches_are_all_there_or_absent(self) -> None:
        landed = {
            m.spec.key
            for faulty in self.faulty_stores
            for batch in faulty.landed_uncertainly
            for m in batch
            if isinstance(m, TaskSubmitted) and m.spec.key is not None
        }
        for keys in self.model.uncertain_batches:
            found = [self.run(self.sched.get_by_key(k)) is not None for k in keys]
            assert all(found) or not any(found), f"batch {keys} half-applied: {found}"
            if landed & set(keys):
                assert all(found), f"batch {keys} landed, yet is not there: {found}"

    @invariant()
    def ids_are_never_reused_and_keep_increasing(self) -> None:
        issued = self.model.issued
        assert len(set(issued)) == len(issued), "an id was issued twice"
        assert issued == sorted(issued), "ids must grow in submission order"

    @invariant()
    def an_attempt_counts_only_if_it_was_released(self) -> None:
        before, infos, after = self._observe()
        self.seen_terminal |= {k for k, i in infos.items() if i.status.is_terminal}
        self._check_attempts(before, infos, after)
        self.last_check = time.monotonic()
        self._report_violations()


def _resolved_or_cronoq(future: asyncio.Future[TaskInfo]) -> bool:
    return future.exception() is None or isinstance(future.exception(), CronoqError)


class SimulationSuite:
    """Random histories with crashes and uncertain commits against a model. Needs the
    ``harness`` fixture."""

    simulation_settings = settings(max_examples=12, stateful_step_count=12, deadline=None)
    simulation_shrinks = False
    """Shrinking a failing history replays it hundreds of times, each taking seconds of real
    time, and one that depends on timing may not replay at all: by default the first failure
    is reported at once, with the history of what happened (set True to shrink)."""

    def test_random_histories_with_crashes_keep_every_acknowledged_operation(
        self, harness: StoreHarness
    ) -> None:
        machine = type("Machine", (SchedulerMachine,), {"harness": harness})
        chosen = self.simulation_settings
        if not self.simulation_shrinks:
            chosen = settings(
                chosen,
                phases=[Phase.explicit, Phase.reuse, Phase.generate],
                report_multiple_bugs=False,
            )
        run_state_machine_as_test(machine, settings=chosen)
