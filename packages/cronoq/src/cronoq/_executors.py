"""Executors run attempts. The driver only knows the ``Executor`` seam.

A local executor runs a Python function in this process. A remote one (``_remote.py``, the
server's workers) implements the same seam: it offers its workers' free slots, hands each
attempt to one of them (or withdraws it if none is left), and the worker's heartbeats and
outcome come back through the scheduler; the engine fails an attempt whose pool has a lease and
which stopped heartbeating.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from cronoq._codecs import Codec, CodecContext, binds_context, decode_payload, encode_with
from cronoq._engine import AttemptFailed, AttemptSucceeded, AttemptToken, Dispatch
from cronoq._model import NS_PER_S
from cronoq._parents import ParentLoader, decode_parent_outputs
from cronoq._tracebacks import Raised, call_catching
from cronoq.errors import InvalidArgument, StoreError, TaskError

if TYPE_CHECKING:  # the otel extra, imported only when tracing is on
    from cronoq.tracing import Tracing

__all__ = ["Executor", "LocalExecutor", "Reporter", "TaskContext", "TaskFunction"]

_DECODE_ON_LOOP_BYTES = 256 * 1024
_NO_PARENTS: Mapping[int, Any] = MappingProxyType({})  # shared: no dict made per attempt
"""Parents' outputs above this size are decoded in a thread, off the event loop."""


def _failure(raised: Raised) -> AttemptFailed:
    exc = raised.error
    if isinstance(exc, TaskError):
        return AttemptFailed(exc.message, exc.retryable, exc.retry_after_ns)
    return AttemptFailed(f"{type(exc).__name__}: {exc}", traceback=raised.traceback)


@dataclass(slots=True)
class TaskContext:
    """What an executor function learns about the attempt it runs."""

    task_id: int
    attempt: int
    pool: str
    kind: str
    key: str | None
    tags: tuple[str, ...]
    name: str | None
    deadline: datetime | None
    parent_outputs: Mapping[int, Any] = field(default_factory=lambda: _NO_PARENTS)
    """The outputs of the tasks it was submitted ``after``, decoded, by parent id: each one
    the store still keeps (a parent pruned by its retention is absent)."""
    cancel_reason: str | None = None
    """Why the attempt is asked to stop (a cancel, a timeout, a deadline, a shutdown), once it
    is; thread functions should poll ``cancelled`` and return."""

    @property
    def cancelled(self) -> bool:
        """True once cancellation was requested (a plain attribute read: safe from a thread)."""
        return self.cancel_reason is not None


TaskFunction = Callable[[TaskContext, Any], Awaitable[Any]] | Callable[[TaskContext, Any], Any]


class Reporter(Protocol):
    """How an executor tells the driver what happened to an attempt."""

    def report(self, token: AttemptToken, outcome: AttemptSucceeded | AttemptFailed) -> None: ...

    def withdraw(self, token: AttemptToken, reason: str) -> None: ...


class Executor(Protocol):
    def slot_offer(self) -> Sequence[tuple[frozenset[str], int]] | None:
        """Free slots of remote workers now, as (pools they serve, how many); None for an
        executor that takes as many attempts as its pool's limit."""
        ...

    def start(self, dispatch: Dispatch, reporter: Reporter) -> None:
        """Begin the attempt; report its outcome exactly once, later."""
        ...

    def cancel(self, token: AttemptToken, reason: str) -> None:
        """Ask the attempt to stop; it still reports (a cancelled failure, or its outcome)."""
        ...

    def expired(self, token: AttemptToken) -> None:
        """The engine stopped waiting for this stopped attempt (its lease ended): forget it if
        nothing will report it (a leased attempt whose worker left)."""
        ...

    async def drain(self, timeout: float) -> set[AttemptToken]:
        """Wait up to ``timeout`` for running attempts; return (and stop, without reports) the
        ones still running then. Returns within ``timeout``, whatever the attempts do."""
        ...


class LocalExecutor:
    """Runs ``async def fn(ctx, payload)`` on the loop, or a plain function in a thread.

    Plain functions run on threads of this pool's own, as many as its concurrency: a pool's
    queued work never waits for another pool's threads, nor for the scheduler's.
    """

    def __init__(
        self,
        fn: TaskFunction,
        codec: Codec,
        concurrency: int,
        name: str,
        tracing: Tracing | None = None,
        parents: ParentLoader | None = None,
    ) -> None:
        self._fn = fn
        self._parents = parents
        self._tracing = tracing
        # A callable object with ``async def __call__`` is async too.
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        self._codec = codec
        self._binds = binds_context(codec)
        self._running: dict[AttemptToken, tuple[asyncio.Task[None], TaskContext]] = {}
        self._threads: ThreadPoolExecutor | None = None
        if not self._is_async:
            # A slot stays taken while a thread outlives its attempt's timeout (the engine
            # holds it), so the pool never needs more threads than its concurrency.
            self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix=f"cronoq-{name}")

    def slot_offer(self) -> None:
        return None

    def start(self, dispatch: Dispatch, reporter: Reporter) -> None:
        spec = dispatch.spec
        token = dispatch.token
        deadline = None
        if spec.deadline_ns is not None:
            deadline = datetime.fromtimestamp(spec.deadline_ns / NS_PER_S, UTC)
        ctx = TaskContext(
            token.task_id,
            token.attempt,
            spec.pool,
            spec.kind,
            spec.key,
            spec.tags,
            spec.name,
            deadline,
        )
        task = asyncio.get_running_loop().create_task(self._run(dispatch, ctx, reporter))
        self._running[token] = (task, ctx)

    def cancel(self, token: AttemptToken, reason: str) -> None:
        entry = self._running.get(token)
        if entry is None or entry[1].cancel_reason is not None:
            return
        task, ctx = entry
        ctx.cancel_reason = reason
        if self._is_async:
            task.cancel(reason)

    def expired(self, token: AttemptToken) -> None:
        pass  # a local attempt has no lease: the engine waits for its report

    async def drain(self, timeout: float) -> set[AttemptToken]:
        running = dict(self._running)
        if running:
            await asyncio.wait([task for task, _ in running.values()], timeout=timeout)
        left = {token for token in running if token in self._running}
        for token in left:
            task, ctx = self._running.pop(token)
            ctx.cancel_reason = ctx.cancel_reason or "the scheduler is closing"
            task.cancel()  # a thread keeps running (Python cannot stop it), told by its ctx
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        return left

    async def _run(self, dispatch: Dispatch, ctx: TaskContext, reporter: Reporter) -> None:
        if self._tracing is None:
            await self._run_attempt(dispatch, ctx, reporter)
            return
        spec, token = dispatch.spec, dispatch.token
        with self._tracing.attempt(spec.trace_context, spec.pool, token.task_id, token.attempt):
            await self._run_attempt(dispatch, ctx, reporter)

    async def _run_attempt(self, dispatch: Dispatch, ctx: TaskContext, reporter: Reporter) -> None:
        token = dispatch.token
        try:
            outcome = await self._attempt(dispatch, ctx)
        except asyncio.CancelledError:
            outcome = AttemptFailed(ctx.cancel_reason or "cancelled")
        if self._running.pop(token, None) is None:
            return  # abandoned by a drain: the attempt is left for the next leader
        if ctx.cancel_reason is not None and isinstance(outcome, AttemptSucceeded):
            # It returned after being asked to stop: as an async function interrupted by its
            # cancellation would, the attempt ends cancelled (a thread cannot be interrupted).
            outcome = AttemptFailed(ctx.cancel_reason)
        if self._tracing is not None:
            if isinstance(outcome, AttemptFailed):
                self._tracing.outcome(outcome.message, outcome.retryable)
            else:
                self._tracing.outcome(None)
        reporter.report(token, outcome)

    async def _attempt(
        self, dispatch: Dispatch, ctx: TaskContext
    ) -> AttemptSucceeded | AttemptFailed:
        spec = dispatch.spec
        context = None
        try:
            if self._binds:  # as the submitter encoded the payload (from the spec: the
                # function may change its ctx)
                context = CodecContext("payload", spec.kind, spec.pool, spec.key)
            value = decode_payload(self._codec, spec.payload, context)  # b"": no payload
        except InvalidArgument as exc:  # PayloadError is one; a recovered row's odd kind too
            return AttemptFailed(f"payload could not be decoded: {exc}", retryable=False)
        if spec.after and self._parents is not None:
            try:
                parents = await self._parents(spec.after)
                if sum(len(p.output or b"") for p in parents) < _DECODE_ON_LOOP_BYTES:
                    ctx.parent_outputs = decode_parent_outputs(self._codec, parents)
                else:  # large: decoding them must not hold the event loop
                    decode = decode_parent_outputs
                    ctx.parent_outputs = await asyncio.to_thread(decode, self._codec, parents)
            except StoreError as exc:  # the next attempt may find the store again
                return AttemptFailed(f"the outputs of its parents could not be read: {exc}")
            except InvalidArgument as exc:  # too large, or refused by the codec: for good
                return AttemptFailed(str(exc), retryable=False)
        try:
            if self._is_async:
                result = await self._fn(ctx, value)
            else:
                loop = asyncio.get_running_loop()
                # A thread does not inherit the attempt's span unless handed its context; the
                # span's wrapper goes outside the catch, so no traceback shows its frame.
                call: Callable[..., Any] = call_catching
                if self._tracing is not None:
                    call = self._tracing.in_context(call_catching)
                result = await loop.run_in_executor(self._threads, call, self._fn, ctx, value)
                if isinstance(result, Raised):
                    return _failure(result)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return _failure(Raised.of(exc))
        if result is None:
            return AttemptSucceeded(None)
        try:
            if self._binds:  # bound to this task: get() and wait() decode it for its id
                task_id = dispatch.token.task_id
                context = CodecContext("output", spec.kind, spec.pool, spec.key, task_id)
            return AttemptSucceeded(encode_with(self._codec, result, "output", context))
        except InvalidArgument as exc:
            return AttemptFailed(str(exc), retryable=False)
