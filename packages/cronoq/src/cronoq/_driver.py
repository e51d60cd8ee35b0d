"""The driver: the only code that awaits a store. One asyncio task per scheduler.

Each turn drains every queued input, runs one engine step, commits the step's mutations in ONE
store call (group commit: inputs that arrive during a commit form the next, larger step), and
only then answers callers and dispatches attempts. Between turns it sleeps until the next input
or the engine's next due time; it never polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping

from cronoq._engine import (
    AttemptFailed,
    AttemptReport,
    AttemptSucceeded,
    AttemptToken,
    Engine,
    EngineConfig,
    Heartbeat,
    Input,
    StepResult,
)
from cronoq._executors import Executor
from cronoq._model import NS_PER_S
from cronoq.errors import Fenced, SchedulerError, SchedulerStopped, Unavailable
from cronoq.store import Mutation, Store, TimeBase

__all__ = ["Driver"]

log = logging.getLogger("cronoq")

_RETRY_FIRST_S = 0.01
_RETRY_MAX_S = 1.0


class Driver:
    def __init__(
        self,
        config: EngineConfig,
        store: Store,
        executors: Mapping[str, Executor],
        commit_timeout: float,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self._config = config
        self._store = store
        self._executors = executors
        self._commit_timeout = commit_timeout
        self._clock = clock
        self._inbox: deque[Input] = deque()
        self._wakeup = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._engine: Engine | None = None
        self._epoch = 0
        self._inflight: set[AttemptToken] = set()
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._accepting = False
        self._stopping = False
        self._draining = False
        self._committing: StepResult | None = None
        self._last_unavailable: BaseException | None = None
        self.stopped = asyncio.Event()
        self.lost = asyncio.Event()
        self.failure: BaseException | None = None
        self.commits = 0  # committed steps, for tests and diagnostics

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Lead, recover, commit recovery's bookkeeping, then serve."""
        lease = await self._store.acquire_leadership()
        self._epoch = lease.epoch
        await self._rebuild(frozenset())
        self._accepting = True
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._run(), name="cronoq-driver")
        self._watch = loop.create_task(self._watch_leadership(), name="cronoq-leadership")

    async def stop(self, drain_timeout: float) -> None:
        """Stop taking calls, let running attempts finish (up to the timeout), then stop."""
        if self._task is None or self.stopped.is_set():
            return
        self._accepting = False
        # No new attempt may start while the running ones are given their time to finish.
        self._draining = True
        if self._engine is not None:
            self._engine.stop_dispatching()
        await asyncio.gather(*(e.drain(drain_timeout) for e in self._executors.values()))
        self._stopping = True
        self._wake()
        await self.stopped.wait()

    def abort(self) -> None:
        """Stop at once, as if the process died: no commit, no release, attempts abandoned."""
        self._halt(SchedulerStopped("the scheduler was aborted"))
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()

    # --- inputs ---------------------------------------------------------------------------

    def call(self, item: Input) -> None:
        if not self._accepting:
            raise self.failure_error()
        self._inbox.append(item)
        self._wake()

    def failure_error(self) -> SchedulerStopped:
        if self.failure is not None:
            return SchedulerStopped(f"the scheduler stopped: {self.failure}")
        return SchedulerStopped("the scheduler is not running")

    def report(self, token: AttemptToken, outcome: AttemptSucceeded | AttemptFailed) -> None:
        self._inflight.discard(token)
        if not self.stopped.is_set():
            self._inbox.append(AttemptReport(token, outcome))
            self._wake()

    def heartbeat(self, token: AttemptToken) -> None:
        if not self.stopped.is_set():
            self._inbox.append(Heartbeat(token))
            self._wake()

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
        except BaseException as exc:  # a bug or a fatal store error: stop loudly, not silently
            log.exception("cronoq driver stopped")
            self._halt(exc)
            return
        await self._store.release_leadership()
        self._halt(None)

    async def _turn(self) -> None:
        engine = self._engine
        assert engine is not None
        inputs = list(self._inbox)
        self._inbox.clear()
        result = engine.step(self._clock(), inputs)
        if result.mutations:
            self._committing = result
            committed = await self._commit(result.mutations)
            self._committing = None
            if not committed:
                await self._recover_from_failed_step(inputs, result)
                return
        self._release(result)

    async def _commit(self, batch: list[Mutation]) -> bool:
        """Commit, retrying ``Unavailable`` until ``commit_timeout``; False if it never went in."""
        give_up = time.monotonic() + self._commit_timeout
        pause = _RETRY_FIRST_S
        while True:
            remaining = give_up - time.monotonic()
            try:
                async with asyncio.timeout(max(remaining, 0.001)):
                    await self._store.commit(self._epoch, batch)
            except (Unavailable, TimeoutError) as exc:
                if time.monotonic() + pause >= give_up:
                    self._last_unavailable = exc
                    return False
                log.warning("store unavailable, retrying the commit: %s", exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
            else:
                self.commits += 1
                return True

    def _release(self, result: StepResult) -> None:
        for reply_to, value in result.replies:
            future: asyncio.Future[object] = reply_to  # type: ignore[assignment]
            if future.done():
                continue  # the caller gave up waiting
            if isinstance(value, BaseException):
                future.set_exception(value)
            else:
                future.set_result(value)
        for dispatch in result.dispatches:
            self._inflight.add(dispatch.token)
            self._executors[dispatch.spec.pool].start(dispatch, self)
        for cancel in result.cancels:
            self._executors[cancel.pool].cancel(cancel.token, cancel.reason)
        self._set_timer(result.next_wake_ns)

    def _set_timer(self, wake_ns: int | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake_ns is not None:
            loop = asyncio.get_running_loop()
            delay = (wake_ns - self._clock()) / NS_PER_S
            self._timer = loop.call_at(loop.time() + max(delay, 0.0), self._wake)

    # --- faults ---------------------------------------------------------------------------

    async def _recover_from_failed_step(self, inputs: list[Input], result: StepResult) -> None:
        """The step never became durable: fail its callers and rebuild memory from the store."""
        cause = self._last_unavailable
        error = SchedulerError(
            f"the store did not accept the commit within {self._commit_timeout:g}s ({cause}); "
            "the operation was not applied and may be retried"
        )
        for reply_to, _ in result.replies:
            self._fail(reply_to, error)
        # Reports of attempts that ended are re-applied after the rebuild, not lost.
        reports = [i for i in inputs if isinstance(i, AttemptReport)]
        adopt = frozenset(self._inflight) | {r.token for r in reports}
        await self._rebuild(adopt)
        self._inbox.extendleft(reversed(reports))
        self._wake()

    async def _rebuild(self, adopt: frozenset[AttemptToken]) -> None:
        """(Re)load the engine from the store, retrying while it is unavailable."""
        pause = _RETRY_FIRST_S
        while True:
            try:
                state = await self._store.recover(
                    self._epoch, TimeBase(), self._config.retention_ns
                )
                # A recovery of a million tasks takes seconds of pure work: off the loop, so
                # the store's leadership keepalives keep running meanwhile.
                engine, first = await asyncio.to_thread(
                    Engine.recover, self._config, self._epoch, self._clock(), state, adopt
                )
                if first.mutations and not await self._commit(first.mutations):
                    raise Unavailable("could not commit the recovery step")
            except Unavailable as exc:
                log.warning("store unavailable while recovering: %s", exc)
                self._fail_waiting_callers(
                    SchedulerError(f"the store is unavailable while the scheduler recovers: {exc}")
                )
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)
                continue
            if self._draining:
                engine.stop_dispatching()
            self._engine = engine
            self._release(first)
            return

    def _fail_waiting_callers(self, error: BaseException) -> None:
        kept = [i for i in self._inbox if isinstance(i, AttemptReport | Heartbeat)]
        for item in self._inbox:
            if not isinstance(item, AttemptReport | Heartbeat):
                self._fail(item.reply_to, error)
        self._inbox = deque(kept)

    @staticmethod
    def _fail(reply_to: object, error: BaseException) -> None:
        future: asyncio.Future[object] | None = reply_to  # type: ignore[assignment]
        if future is not None and not future.done():
            future.set_exception(error)

    async def _watch_leadership(self) -> None:
        await self._store.leadership_lost()
        if not self._stopping and not self.stopped.is_set():
            self._halt(Fenced("leadership was lost"))
            if self._task is not None:
                self._task.cancel()

    def _halt(self, failure: BaseException | None) -> None:
        if self.stopped.is_set():
            return
        self._accepting = False
        self.failure = failure
        if isinstance(failure, Fenced):
            self.lost.set()
        error = self.failure_error()
        self._fail_waiting_callers(error)
        if self._committing is not None:
            for reply_to, _ in self._committing.replies:
                self._fail(reply_to, error)
        if self._timer is not None:
            self._timer.cancel()
        for executor in self._executors.values():
            with contextlib.suppress(Exception):
                for token in list(self._inflight):
                    executor.cancel(token, "the scheduler stopped")
        self.stopped.set()
