"""The driver: the only code that awaits a store. One asyncio task per scheduler.

Each turn drains every queued input, runs one engine step, commits the step's mutations in ONE
store call (group commit: inputs that arrive during a commit form the next, larger step), and
only then answers callers and dispatches attempts. Between turns it sleeps until the next input
or the engine's next due time; it never polls.

A commit that fails may still have landed. The driver then rebuilds the engine from the store,
telling it which attempts it really released (``InFlight``), re-applies the reports and
reads of the failed step, and answers its writers by what the store shows (``batch_landed()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from cronoq._engine import (
    AttemptFailed,
    AttemptReport,
    AttemptSucceeded,
    AttemptToken,
    Engine,
    EngineConfig,
    GetDependants,
    GetTask,
    GetTaskByKey,
    Heartbeat,
    InFlight,
    Input,
    ListPools,
    ListSchedules,
    ListTasks,
    OfferSlots,
    StepResult,
    WaitTask,
    WithdrawAttempts,
)
from cronoq._executors import Executor
from cronoq._metrics import BATCH_BOUNDS, LATENCY_BOUNDS, Counters, HistogramCounter
from cronoq._model import NS_PER_S
from cronoq._reconcile import batch_landed
from cronoq.errors import (
    CronoqError,
    Fenced,
    SchedulerError,
    SchedulerStopped,
    StoreFatal,
    Unavailable,
    WaitTimedOut,
)
from cronoq.store import Mutation, RecoveredState, Store, TaskRecord, TimeBase

if TYPE_CHECKING:  # the otel extra, imported only when tracing is on
    from cronoq.tracing import Tracing

__all__ = ["Driver"]

log = logging.getLogger("cronoq")

_RETRY_FIRST_S = 0.01
_RETRY_MAX_S = 1.0
_CLOSE_GRACE_S = 1.0
"""How far past its timeout ``close`` may go to commit the last reports and release."""

_READS = (GetTask, GetDependants, GetTaskByKey, WaitTask, ListTasks, ListSchedules, ListPools)
_REPORTS = (AttemptReport, Heartbeat)


class _Closing(SchedulerStopped):
    """The scheduler was closed while its store was unavailable."""


class _Refused(Fenced):
    """The store fenced a commit before any try of it could have landed: nothing was written."""


class Driver:
    def __init__(
        self,
        config: EngineConfig,
        store: Store,
        executors: Mapping[str, Executor],
        commit_timeout: float,
        clock: Callable[[], int] = time.time_ns,
        tracing: Tracing | None = None,
    ) -> None:
        self._config = config
        self._tracing = tracing
        self._store = store
        self._executors = executors
        # Executors of leased pools (one may serve several): they offer their workers' slots.
        unique = {id(e): e for e in executors.values()}.values()
        self._offering = [e for e in unique if e.slot_offer() is not None]
        self._commit_timeout = commit_timeout
        self._clock = clock
        self._inbox: deque[Input] = deque()
        self._wakeup = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._engine: Engine | None = None
        self._epoch = 0
        # Attempts released to executors that have not reported, and those a close left
        # running: what a rebuild in this epoch must know (see InFlight).
        self._executing: dict[AttemptToken, str] = {}
        self._lanes: dict[AttemptToken, tuple[tuple[str, str | None], ...]] = {}
        self._lease_ids: dict[AttemptToken, bytes] = {}  # of the remote ones among them
        # Attempts whose executor reported them (a remote one with its lease id), until the
        # step that applies the report commits: a rebuild counts only these as reported.
        self._verified_reports: set[AttemptToken] = set()
        self._abandoned: set[AttemptToken] = set()
        # Waiters taken from an engine being rebuilt, until the new one takes them over.
        self._moving_waiters: list[tuple[int, object]] = []
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._release_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The scheduler's own thread work (decoding a recovery): never behind user threads.
        self._work = ThreadPoolExecutor(1, thread_name_prefix="cronoq-scheduler")
        self._accepting = False
        self._stopping = False
        self._draining = False
        self._close_deadline = 0.0
        self._committing: StepResult | None = None
        # The store refused the committing step before any try of it could land (Fenced on
        # the first try): its callers are told it was not applied, not "maybe".
        self._committing_refused = False
        self._last_unavailable = ""
        self.stopped = asyncio.Event()
        self.failure: BaseException | None = None
        self.commits = 0  # committed steps, for tests and diagnostics
        self.counters = Counters()  # kept across the engines a rebuild replaces
        self.commit_seconds = HistogramCounter(LATENCY_BOUNDS)
        self.commit_batch_size = HistogramCounter(BATCH_BOUNDS)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Lead, recover, commit recovery's bookkeeping, then serve. A start that fails or is
        cancelled leaves the driver stopped (with the failure), never seemingly running."""
        try:
            self._epoch = (await self._store.acquire_leadership()).epoch
            await self._rebuild(None)
        except BaseException as exc:
            if self._epoch:  # a standby must not wait for this process to exit
                await self._release_quietly()
            self._halt(None if isinstance(exc, asyncio.CancelledError) else exc)
            raise
        self._accepting = True
        self._loop = loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="cronoq-driver")
        self._watch = loop.create_task(self._watch_leadership(), name="cronoq-leadership")

    async def stop(self, timeout: float) -> None:
        """Stop taking calls, let running attempts finish until ``timeout``, commit their
        reports, release leadership. Returns within ``timeout`` + ``_CLOSE_GRACE_S``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self._close_deadline = deadline
        if self._task is None or self.stopped.is_set():
            await self._released_after_halt()
            return
        self._accepting = False
        # No new attempt may start while the running ones are given their time to finish.
        self._draining = True
        if self._engine is not None:
            self._engine.stop_dispatching()
        left = await asyncio.gather(*(e.drain(timeout) for e in self._executors.values()))
        for tokens in left:
            self._abandoned |= tokens
            for token in tokens:
                self._forget(token)
        self._stopping = True
        self._wake()
        final = max(deadline, loop.time() + _CLOSE_GRACE_S)
        try:
            async with asyncio.timeout_at(final):
                await self.stopped.wait()
                await self._release_quietly()
        except TimeoutError:
            log.warning("close: the store did not take the last commit in time; stopping anyway")
            self._halt(SchedulerStopped(f"the scheduler was closed (timeout {timeout:g}s)"))
            self._cancel_tasks()
            await self._released_after_halt(final)

    def abort(self) -> None:
        """Stop at once, as if the process died: no commit, attempts abandoned. Leadership is
        given up in the background, so that a standby need not wait for it to expire."""
        self._halt(SchedulerStopped("the scheduler was aborted"))
        self._cancel_tasks()

    def _cancel_tasks(self) -> None:
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()

    async def _released_after_halt(self, deadline: float | None = None) -> None:
        if self._release_task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await asyncio.shield(self._release_task)

    # --- inputs ---------------------------------------------------------------------------

    def call(self, item: Input) -> None:
        if not self._accepting:
            raise self.failure_error()
        self._inbox.append(item)
        self._wake()

    def wait(self, task_id: int, timeout: float | None) -> asyncio.Future[object]:
        """A future for the task's final record; ``timeout`` counts once it is known live."""
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.call(WaitTask(task_id, future, timeout))
        # A caller that gives up (timeout, cancellation) leaves nothing registered behind.
        future.add_done_callback(lambda done: self._forget_waiter(task_id, done))
        return future

    def _forget_waiter(self, task_id: int, future: asyncio.Future[object]) -> None:
        if self._engine is not None:
            self._engine.drop_waiter(task_id, future)

    def failure_error(self) -> SchedulerStopped:
        if self.failure is not None:
            return SchedulerStopped(f"the scheduler stopped: {self.failure}")
        return SchedulerStopped("the scheduler is not running")

    def report(
        self,
        token: AttemptToken,
        outcome: AttemptSucceeded | AttemptFailed,
        reply_to: asyncio.Future[object] | None = None,
        remote: bool = False,
        lease_id: bytes | None = None,
    ) -> None:
        """An attempt ended. With ``reply_to``, it is answered once the outcome is committed
        (or with StaleAttempt); reports are taken while closing, unlike calls. A remote one
        carries its lease id: a report without the right one leaves the attempt running."""
        if self.stopped.is_set():
            if reply_to is not None:
                _resolve(reply_to, self.failure_error())
            return
        known = self._lease_ids.get(token)
        proven = known is None or (lease_id is not None and hmac.compare_digest(known, lease_id))
        if proven and self._forget(token) is not None:
            self._verified_reports.add(token)
        received = self._clock() if remote else None
        self._inbox.append(AttemptReport(token, outcome, reply_to, remote, received, lease_id))
        self._wake()

    def heartbeat(
        self, token: AttemptToken, lease_id: bytes, reply_to: asyncio.Future[object]
    ) -> None:
        """A remote worker's heartbeat, answered after the step that applied it."""
        if self.stopped.is_set():
            _resolve(reply_to, self.failure_error())
            return
        self._inbox.append(Heartbeat(token, reply_to, True, self._clock(), lease_id))
        self._wake()

    def withdraw(self, token: AttemptToken, reason: str) -> None:
        """A released attempt that its executor could not start after all (a remote worker
        left in the meantime): back to its queue, not counted."""
        self._forget(token)
        if not self.stopped.is_set():
            self._inbox.append(WithdrawAttempts([token], reason))
            self._wake()

    def nudge(self) -> None:
        """Run a step soon: an executor has free slots to offer."""
        self._wake()

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def engine(self) -> Engine | None:
        return self._engine

    def _wake(self) -> None:
        self._wakeup.set()

    # --- the loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                if not self._inbox:
                    if self._stopping:
                        break  # every report of the drained attempts is committed
                    await self._wakeup.wait()
                self._wakeup.clear()
                if self._inbox or not self._stopping:
                    await self._turn()
        except asyncio.CancelledError:
            raise
        except Fenced as exc:
            log.warning("cronoq stopped: another instance leads (%s)", exc)
            self._halt(exc)
            return
        except _Closing as exc:
            log.warning("cronoq stopped: %s", exc)
            self._halt(exc)
            return
        except BaseException as exc:  # a bug or a fatal store error: stop loudly, not silently
            log.exception("cronoq driver stopped")
            self._halt(exc)
            return
        self._halt(None)

    def _take_inbox(self) -> list[Input]:
        # A waiter whose caller already gave up is not worth registering.
        inputs = [i for i in self._inbox if not (isinstance(i, WaitTask) and _done(i.reply_to))]
        self._inbox.clear()
        return inputs

    async def _turn(self) -> None:
        engine = self._engine
        assert engine is not None
        inputs = self._take_inbox()
        if self._offering:
            groups = [g for executor in self._offering for g in executor.slot_offer() or ()]
            inputs.insert(0, OfferSlots(groups))
        result = engine.step(self._clock(), inputs)
        if result.mutations:
            self._committing = result
            try:
                committed = await self._commit(result.mutations)
            except _Refused:
                self._committing_refused = True
                raise
            if not committed:
                # Should the rebuild end in a stop, _halt answers the callers of this step.
                await self._reconcile(inputs, result)
                self._committing = None
                return
            self._committing = None
        for item in inputs:
            if isinstance(item, AttemptReport):
                self._verified_reports.discard(item.token)
        self._release(result, inputs)

    async def _commit(self, batch: list[Mutation]) -> bool:
        """Commit, retrying ``Unavailable`` until ``commit_timeout``; False if the store never
        confirmed it (it may still have landed)."""
        give_up = time.monotonic() + self._commit_timeout
        pause = _RETRY_FIRST_S
        uncertain = False  # an earlier try failed in flight: it may have landed
        while True:
            began = time.monotonic()
            remaining = give_up - began
            try:
                async with asyncio.timeout(max(remaining, 0.001)):
                    if self._tracing is None:
                        await self._store.commit(self._epoch, batch)
                    else:
                        with self._tracing.commit(len(batch), self._epoch):
                            await self._store.commit(self._epoch, batch)
            except Fenced as exc:
                # A fenced commit changes nothing (the Store contract); only an earlier try
                # that failed in flight can have written the batch.
                if uncertain:
                    raise
                raise _Refused(str(exc)) from exc
            except (Unavailable, TimeoutError) as exc:
                uncertain = True
                if time.monotonic() + pause >= give_up:
                    self._last_unavailable = str(exc) or "the commit timed out"
                    return False
                log.warning("store unavailable, retrying the commit: %s", exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
            else:
                self.commits += 1
                self.commit_seconds.observe(time.monotonic() - began)
                self.commit_batch_size.observe(len(batch))
                return True

    def _release(self, result: StepResult, inputs: Iterable[Input] = ()) -> None:
        for reply_to, value in result.replies:
            _resolve(reply_to, value)
        # Cancellations and let-go attempts first: an executor then knows, as it places this
        # step's new attempts, which worker let an attempt lapse (it gets none of them).
        for cancel in result.cancels:
            self._executors[cancel.pool].cancel(cancel.token, cancel.reason)
        for token in result.expired:
            # Its worker is gone or will hear it is stale: no rebuild may hold it again.
            pool = self._forget(token)
            if pool is not None:
                self._executors[pool].expired(token)
            else:
                # Adopted from an earlier leader (never released here): the executors of leased
                # pools may still hold it, from its worker's proving heartbeat.
                for executor in self._offering:
                    executor.expired(token)
        if result.dispatches and self._draining:
            # The close began while this step committed: these attempts never start here.
            tokens = [d.token for d in result.dispatches]
            self._inbox.append(WithdrawAttempts(tokens, "the scheduler was closing"))
            self._wake()
        else:
            for dispatch in result.dispatches:
                self._executing[dispatch.token] = dispatch.spec.pool
                if dispatch.spec.limits:
                    self._lanes[dispatch.token] = dispatch.spec.limits
                if dispatch.lease_id is not None:
                    self._lease_ids[dispatch.token] = dispatch.lease_id
                if self._tracing is not None:
                    spec, token = dispatch.spec, dispatch.token
                    self._tracing.dispatched(
                        spec.trace_context, spec.pool, token.task_id, token.attempt,
                        remote=dispatch.lease_id is not None,
                    )  # fmt: skip
                self._executors[dispatch.spec.pool].start(dispatch, self)
        for item in inputs:
            if isinstance(item, WaitTask) and item.timeout_s is not None:
                self._arm_wait_timeout(item, item.timeout_s)
        self._set_timer(result.next_wake_ns)

    def _forget(self, token: AttemptToken) -> str | None:
        """The attempt no longer runs here (reported, withdrawn, let go): its pool, if it did."""
        self._lease_ids.pop(token, None)
        self._lanes.pop(token, None)
        return self._executing.pop(token, None)

    def _arm_wait_timeout(self, item: WaitTask, timeout: float) -> None:
        future: asyncio.Future[object] = item.reply_to  # type: ignore[assignment]
        if future.done():
            return
        error = WaitTimedOut(f"task {item.task_id} did not finish within {timeout:g}s")
        handle = asyncio.get_running_loop().call_later(timeout, _resolve, future, error)
        future.add_done_callback(lambda _: handle.cancel())

    def _set_timer(self, wake_ns: int | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake_ns is not None:
            loop = asyncio.get_running_loop()
            delay = (wake_ns - self._clock()) / NS_PER_S
            self._timer = loop.call_at(loop.time() + max(delay, 0.0), self._wake)

    # --- faults ---------------------------------------------------------------------------

    async def _reconcile(self, inputs: list[Input], result: StepResult) -> None:
        """The store did not confirm the step, which may or may not have landed: rebuild from
        what the store holds, then settle the step's inputs by what it shows."""
        engine = self._engine
        assert engine is not None
        self._moving_waiters = engine.take_waiters()
        # Only reports of attempts released here, from their executor (a remote one proved
        # its lease id): a forged one must not make the rebuild take an attempt that never
        # began for one that ran.
        reported = [
            i.token
            for i in (*inputs, *self._inbox)
            if isinstance(i, AttemptReport) and i.token in self._verified_reports
        ]
        inflight = InFlight(
            executing=dict(self._executing),
            reported=frozenset(reported),
            abandoned=frozenset(self._abandoned),
            lease_ids=dict(self._lease_ids),
            lanes={t: lane for t, lane in self._lanes.items() if t in self._executing},
        )
        writers = [
            item
            for item in inputs
            if not isinstance(item, (*_READS, *_REPORTS, WithdrawAttempts))
            and item.reply_to is not None
        ]

        replies = {id(reply_to): value for reply_to, value in result.replies}
        for item in inputs:  # a wait's timeout runs while the store is down, too
            if isinstance(item, WaitTask) and item.timeout_s is not None:
                self._arm_wait_timeout(item, item.timeout_s)

        def answer_writers(landed: bool | None) -> None:
            if landed is None:  # reads are not held for the store either
                error = SchedulerError(
                    "the store is unavailable while the scheduler recovers", applied=False
                )
                for item in inputs:
                    if isinstance(item, _READS) and not isinstance(item, WaitTask):
                        _resolve(item.reply_to, error)
            if landed:
                for item in writers:
                    _resolve(item.reply_to, replies.get(id(item.reply_to)))
                return
            if landed is False:
                outcome = "the operation was not applied and may be retried"
            else:
                outcome = "the store may have applied the operation: retry it with a key"
            error = SchedulerError(
                f"the store did not confirm the commit within {self._commit_timeout:g}s "
                f"({self._last_unavailable}); {outcome}",
                applied=landed,
            )
            for item in writers:
                _resolve(item.reply_to, error)

        # Writers are told as soon as the store shows whether their step landed; if it is
        # still down, or its recovery is slow, at once that it may have: no caller waits for
        # the store to come back.
        undecided = asyncio.get_running_loop().call_later(
            self._commit_timeout, answer_writers, None
        )
        landed: bool | None = None

        def decide(state: RecoveredState) -> None:
            # The first state read is what the store held before the rebuild wrote anything:
            # a later pass would read the rebuild's own first step too, which may have landed
            # although its commit failed, and a schedule it fired can hold the id of a
            # submission that never landed.
            nonlocal landed
            landed = batch_landed(result.mutations, state)
            undecided.cancel()
            answer_writers(landed)

        try:
            await self._rebuild(inflight, lambda: answer_writers(None), decide)
        except BaseException:
            answer_writers(None)  # stopped (closed, fenced) before the store could tell
            raise
        finally:
            undecided.cancel()
        # Waiters the step answered (its task finished in it) registered in an earlier step:
        # they are answered if the finish landed, else they wait on the rebuilt engine.
        asked = {id(item.reply_to) for item in inputs}
        for reply_to, value in result.replies:
            if id(reply_to) not in asked and isinstance(value, TaskRecord):
                if landed:
                    _resolve(reply_to, value)
                else:
                    self._moving_waiters.append((value.task_id, reply_to))
        again = [
            item
            for item in inputs
            # Read again, or applied, by the rebuilt engine. A report of a step that landed is
            # in the store already: applying it again would only find it stale.
            if (isinstance(item, _READS) and not _done(item.reply_to))
            or (isinstance(item, _REPORTS) and not landed)
        ]
        if landed:
            for item in inputs:
                if isinstance(item, _REPORTS):
                    _resolve(item.reply_to, replies.get(id(item.reply_to)))
                if isinstance(item, AttemptReport):
                    self._verified_reports.discard(item.token)  # applied: not sent again
        again.extend(WaitTask(task_id, w) for task_id, w in self._moving_waiters)
        self._moving_waiters = []
        self._inbox.extendleft(reversed(again))
        self._wake()

    async def _rebuild(
        self,
        inflight: InFlight | None,
        on_unavailable: Callable[[], None] | None = None,
        on_first_read: Callable[[RecoveredState], None] | None = None,
    ) -> None:
        """(Re)load the engine from the store, retrying while it is unavailable.
        ``on_first_read`` is given the first state read, before the rebuild writes anything."""
        pause = _RETRY_FIRST_S
        loop = asyncio.get_running_loop()
        while True:
            try:
                state = await self._store.recover(
                    self._epoch, TimeBase(), self._config.retention_ns
                )
                if on_first_read is not None:
                    on_first_read(state)
                    on_first_read = None
                # A recovery of a million tasks takes seconds of pure work: off the loop, so
                # the store's leadership keepalives keep running meanwhile.
                engine, step = await loop.run_in_executor(
                    self._work,
                    Engine.recover,
                    self._config,
                    self._epoch,
                    self._clock(),
                    state,
                    inflight,
                    self.counters,
                )
                if step.mutations and not await self._commit(step.mutations):
                    raise Unavailable("could not commit the recovery step")
            except Unavailable as exc:
                if self._stopping and loop.time() >= self._close_deadline:
                    raise _Closing(
                        "the scheduler was closed while its store was unavailable"
                    ) from exc
                log.warning("store unavailable while recovering: %s", exc)
                if on_unavailable is not None:
                    on_unavailable()
                self._fail_waiting_callers(
                    SchedulerError(
                        f"the store is unavailable while the scheduler recovers: {exc}",
                        applied=False,
                    )
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
                continue
            if self._draining:
                engine.stop_dispatching()
            self._engine = engine
            self._release(step)
            self._wake()  # a fresh engine offers no worker slots until its next step
            return

    def _fail_waiting_callers(self, error: BaseException) -> None:
        # Reports and withdrawals stay for the rebuilt engine: a withdrawal that arrived after
        # the rebuild's InFlight was taken is the only word that its attempt never left.
        kept = [i for i in self._inbox if isinstance(i, (*_REPORTS, WithdrawAttempts))]
        for item in self._inbox:
            if not isinstance(item, (*_REPORTS, WithdrawAttempts)):
                _resolve(item.reply_to, error)
        self._inbox = deque(kept)

    async def _watch_leadership(self) -> None:
        reason: CronoqError | None
        try:
            reason = await self._store.leadership_lost()  # why, if the store says
        except Exception as exc:  # a store's bug: still a loss, never a watch that just dies
            reason = StoreFatal(f"leadership was lost: the store raised {exc!r}")
        if reason is None:
            reason = Fenced("leadership was lost")
        if not self._stopping and not self.stopped.is_set():
            log.warning("cronoq stopped: %s", reason)
            self._halt(reason)
            if self._task is not None:
                self._task.cancel()

    def _halt(self, failure: BaseException | None) -> None:
        """Stop serving: every caller still waiting is answered, every attempt cancelled."""
        if self.stopped.is_set():
            return
        self._accepting = False
        self.failure = failure
        error = self.failure_error()
        self._fail_waiting_callers(error)
        for item in self._inbox:  # no engine will apply them now: their callers are told
            _resolve(item.reply_to, error)
        self._inbox.clear()
        if self._committing is not None:
            answer = error
            if not self._committing_refused:
                answer = SchedulerStopped(
                    f"{error}; it stopped while committing the operation, which may have been "
                    "applied: retry it with a key",
                    applied=None,
                )
            for reply_to, _ in self._committing.replies:
                _resolve(reply_to, answer)
        waiters = self._moving_waiters
        if self._engine is not None:
            waiters = [*waiters, *self._engine.take_waiters()]
        for _, reply_to in waiters:
            _resolve(reply_to, error)
        if self._timer is not None:
            self._timer.cancel()
        for token, pool in list(self._executing.items()):
            if token in self._lease_ids:
                continue  # a remote attempt runs on: the next leader adopts it from its row
            with contextlib.suppress(Exception):
                self._executors[pool].cancel(token, "the scheduler stopped")
        self._work.shutdown(wait=False)
        if failure is not None and self._loop is not None:
            # As a crash would, but at once: a standby must not wait for a lease to expire.
            # (abort() may be called from synchronous code on the loop's thread while the
            # loop is not running: the release then runs when it next does.)
            self._release_task = self._loop.create_task(
                self._release_quietly(), name="cronoq-release"
            )
        self.stopped.set()

    async def _release_quietly(self) -> None:
        try:
            await self._store.release_leadership()
        except CronoqError as exc:
            log.warning("could not release leadership after stopping: %s", exc)


def _done(reply_to: object) -> bool:
    return isinstance(reply_to, asyncio.Future) and reply_to.done()


def _resolve(reply_to: object, value: object) -> None:
    """Answer a caller unless it is gone or already answered."""
    future: asyncio.Future[object] | None = reply_to  # type: ignore[assignment]
    if future is None or future.done():
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)
