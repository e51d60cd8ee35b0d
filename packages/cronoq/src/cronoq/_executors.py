"""Executors run attempts. The driver only knows the :class:`Executor` seam.

A local executor runs a Python function in this process. A remote one (the server's workers)
implements the same seam: it leases the attempt to a worker, forwards the worker's heartbeats
with :meth:`Reporter.heartbeat` and its outcome with :meth:`Reporter.report`; the engine fails
an attempt whose pool has a lease and which stopped heartbeating.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from cronoq._codecs import Codec, encode_with
from cronoq._engine import AttemptFailed, AttemptSucceeded, AttemptToken, Dispatch
from cronoq._model import NS_PER_S
from cronoq.errors import PayloadError, TaskError

__all__ = ["Executor", "LocalExecutor", "Reporter", "TaskContext", "TaskFunction"]


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
    cancel_reason: str | None = None
    """Set when cancellation is requested; thread functions should poll ``cancelled``."""

    @property
    def cancelled(self) -> bool:
        """True once cancellation was requested (a plain attribute read: safe from a thread)."""
        return self.cancel_reason is not None


TaskFunction = Callable[[TaskContext, Any], Awaitable[Any]] | Callable[[TaskContext, Any], Any]


class Reporter(Protocol):
    """How an executor tells the driver what happened to an attempt."""

    def report(self, token: AttemptToken, outcome: AttemptSucceeded | AttemptFailed) -> None: ...

    def heartbeat(self, token: AttemptToken) -> None: ...


class Executor(Protocol):
    def start(self, dispatch: Dispatch, reporter: Reporter) -> None:
        """Begin the attempt; report its outcome exactly once, later."""
        ...

    def cancel(self, token: AttemptToken, reason: str) -> None:
        """Ask the attempt to stop; it still reports (a cancelled failure, or its outcome)."""
        ...

    async def drain(self, timeout: float) -> None:
        """Wait up to ``timeout`` for running attempts, then stop the rest without reporting."""
        ...


class LocalExecutor:
    """Runs ``async def fn(ctx, payload)`` on the loop, or a plain function in a thread."""

    def __init__(self, fn: TaskFunction, codec: Codec) -> None:
        self._fn = fn
        # A callable object with ``async def __call__`` is async too.
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )
        self._codec = codec
        self._running: dict[AttemptToken, tuple[asyncio.Task[None], TaskContext]] = {}

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
        if entry is None:
            return
        task, ctx = entry
        ctx.cancel_reason = reason
        if self._is_async:
            task.cancel(reason)

    async def drain(self, timeout: float) -> None:
        tasks = [task for task, _ in self._running.values()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _run(self, dispatch: Dispatch, ctx: TaskContext, reporter: Reporter) -> None:
        token = dispatch.token
        try:
            outcome = await self._attempt(dispatch.spec.payload, ctx)
        except asyncio.CancelledError:
            if ctx.cancel_reason is None:
                return  # the executor is being drained: the attempt is left for recovery
            outcome = AttemptFailed(ctx.cancel_reason)
        finally:
            del self._running[token]
        reporter.report(token, outcome)

    async def _attempt(self, payload: bytes, ctx: TaskContext) -> AttemptSucceeded | AttemptFailed:
        try:
            value = None if payload == b"" else self._codec.decode(payload)  # b"": no payload
        except Exception as exc:
            return AttemptFailed(f"payload could not be decoded: {exc!r}", retryable=False)
        try:
            if self._is_async:
                result = await self._fn(ctx, value)
            else:
                result = await asyncio.to_thread(self._fn, ctx, value)
        except TaskError as exc:
            retry_after = exc.retry_after_ns  # bounded when the TaskError was made
            return AttemptFailed(exc.message, exc.retryable, retry_after)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return AttemptFailed(f"{type(exc).__name__}: {exc}")
        if result is None:
            return AttemptSucceeded(None)
        try:
            return AttemptSucceeded(encode_with(self._codec, result, "output"))
        except PayloadError as exc:
            return AttemptFailed(str(exc), retryable=False)
