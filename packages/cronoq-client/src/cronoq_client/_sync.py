"""``Client``: ``AsyncClient``'s calls for code that is not async (Django, Flask, scripts, the
``cronoq`` command).

One background thread runs an event loop that owns an ``AsyncClient``; each call is submitted to
it with ``run_coroutine_threadsafe`` and its caller's thread waits for the answer, so any number
of threads may share one Client (their calls run concurrently on the loop). Each method is
``AsyncClient``'s, awaited: its docstring is copied from there and a test checks that the two
classes have the same public names and signatures, so they cannot drift apart. Time is bounded
as ``AsyncClient`` bounds it (the client's ``timeout`` per call, ``wait``'s own timeout): the
thread adds no bound of its own, and a caller interrupted (KeyboardInterrupt) cancels its call.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, Self, TypeVar

import grpc

from cronoq import (
    AttemptInfo,
    Codec,
    Explanation,
    LimitInfo,
    OccurrenceInfo,
    PoolInfo,
    ScheduleInfo,
    Status,
    TaskInfo,
    TaskRequest,
    TaskSummary,
    WorkerInfo,
)
from cronoq.errors import SchedulerStopped
from cronoq_client._client import DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_STALL_TIMEOUT, AsyncClient
from cronoq_client._credentials import Tls
from cronoq_client._outbox import OutboxStatus, QuarantinedOutboxRow

if TYPE_CHECKING:  # the otel extra's
    from opentelemetry.trace import TracerProvider

__all__ = ["Client"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _mirrors(original: Callable[..., Any]) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Give a method of Client the docstring of its AsyncClient original (one text, two
    classes); the signatures are compared by the package's tests."""

    def copy(method: Callable[_P, _R]) -> Callable[_P, _R]:
        method.__doc__ = original.__doc__
        return method

    return copy


class Client:
    """``AsyncClient`` for synchronous code: the same constructor, calls, return values and
    exceptions, each call blocking its thread until answered. Safe to share between threads.

    A background thread (``cronoq-client``, a daemon) runs the event loop that owns the
    ``AsyncClient``; ``close()`` (or leaving a ``with`` block) closes the connection and ends
    the thread, and later calls raise ``SchedulerStopped``. A call made from a thread that runs
    an event loop raises ``RuntimeError`` instead of blocking that loop: use ``AsyncClient``
    there. A Client belongs to the process that made it: after a fork (a pre-forking web server
    with the app loaded before the fork), make one in each process, on first use.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        codec: Codec | None = None,
        tls: grpc.ChannelCredentials | Tls | bool | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        stall_timeout: float | None = DEFAULT_STALL_TIMEOUT,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        tracing: bool | TracerProvider = False,
    ) -> None:
        # Made here, so that a bad argument raises in the caller's thread before any thread
        # starts; its channel opens on the first call, on the loop.
        self._async = AsyncClient(
            target,
            codec=codec,
            tls=tls,
            token=token,
            timeout=timeout,
            connect_timeout=connect_timeout,
            stall_timeout=stall_timeout,
            max_message_bytes=max_message_bytes,
            # A call runs on the loop in a copy of its caller's context (run_coroutine_threadsafe
            # copies it), so a span current in the caller's thread is its submission's parent.
            tracing=tracing,
        )
        self._pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closed = False
        # The thread holds the loop, not the Client, so a Client is never kept alive by it.
        self._thread = threading.Thread(
            target=_serve, args=(self._loop,), name="cronoq-client", daemon=True
        )
        self._thread.start()

    @property
    def codec(self) -> Codec:
        return self._async.codec

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection and stop the client's thread; calls in flight end with
        ``SchedulerStopped`` (or ``SchedulerError``, applied unknown, for a submit without a
        key), later calls raise ``SchedulerStopped``. Closing again does nothing."""
        if threading.current_thread() is self._thread:
            raise RuntimeError(
                "Client.close() was called on the client's own event loop thread, which it "
                "would deadlock: call it from another thread"
            )
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() != self._pid:
            return  # the loop's thread does not exist in a forked child: nothing to stop
        asyncio.run_coroutine_threadsafe(_shutdown(self._async), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()

    def _run(self, call: Coroutine[Any, Any, _R]) -> _R:
        """Run ``call`` on the client's loop and wait for its answer in this thread."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # no loop runs in this thread: blocking it is what the caller asked
        else:
            name = getattr(call, "__name__", "call")  # the AsyncClient method's
            call.close()
            raise RuntimeError(
                f"cronoq_client.Client.{name}() was called from a running event loop, which it "
                f"would block: use AsyncClient there (await client.{name}(...)), or call it from "
                "a thread (asyncio.to_thread)"
            )
        if os.getpid() != self._pid:
            call.close()
            raise RuntimeError(
                f"this cronoq_client.Client was made in process {self._pid}, before a fork: "
                "make a Client in each process (on first use, not at import)"
            )
        with self._lock:
            if self._closed:
                call.close()
                raise SchedulerStopped("the client is closed")
            future = asyncio.run_coroutine_threadsafe(call, self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            # close() cancelled the call while it waited (a backoff between tries, a wait).
            raise SchedulerStopped("the client was closed during the call", applied=None) from None
        except BaseException:
            future.cancel()  # the caller gave up (KeyboardInterrupt): so does the call
            raise

    # --- tasks ------------------------------------------------------------------------------

    @_mirrors(AsyncClient.submit)
    def submit(self, kind: str, payload: Any = None, **options: Any) -> int:
        return self._run(self._async.submit(kind, payload, **options))

    @_mirrors(AsyncClient.submit_many)
    def submit_many(self, requests: Iterable[TaskRequest]) -> builtins.list[int]:
        return self._run(self._async.submit_many(requests))

    @_mirrors(AsyncClient.get)
    def get(
        self, task_id: int, *, include_payload: bool = True, include_output: bool = True
    ) -> TaskInfo:
        return self._run(
            self._async.get(task_id, include_payload=include_payload, include_output=include_output)
        )

    @_mirrors(AsyncClient.get_by_key)
    def get_by_key(
        self, key: str, *, include_payload: bool = True, include_output: bool = True
    ) -> TaskInfo | None:
        return self._run(
            self._async.get_by_key(
                key, include_payload=include_payload, include_output=include_output
            )
        )

    @_mirrors(AsyncClient.wait)
    def wait(
        self,
        task_id: int,
        timeout: float | None = None,
        *,
        include_payload: bool = True,
        include_output: bool = True,
    ) -> TaskInfo:
        return self._run(
            self._async.wait(
                task_id, timeout, include_payload=include_payload, include_output=include_output
            )
        )

    @_mirrors(AsyncClient.list)
    def list(
        self,
        *,
        status: Status | str | Iterable[Status | str] | None = None,
        pool: str | None = None,
        kind: str | None = None,
        tag: str | None = None,
        limit: int | None = None,
        after: int | None = None,
        before: int | None = None,
        newest_first: bool = False,
    ) -> builtins.list[TaskSummary]:
        return self._run(
            self._async.list(
                status=status,
                pool=pool,
                kind=kind,
                tag=tag,
                limit=limit,
                after=after,
                before=before,
                newest_first=newest_first,
            )
        )

    @_mirrors(AsyncClient.cancel)
    def cancel(self, task_id: int, reason: str = "cancelled by request") -> Status:
        return self._run(self._async.cancel(task_id, reason))

    # --- schedules --------------------------------------------------------------------------

    @_mirrors(AsyncClient.add_schedule)
    def add_schedule(self, name: str, cron: str, *, kind: str, **options: Any) -> ScheduleInfo:
        return self._run(self._async.add_schedule(name, cron, kind=kind, **options))

    @_mirrors(AsyncClient.pause_schedule)
    def pause_schedule(self, name: str) -> ScheduleInfo:
        return self._run(self._async.pause_schedule(name))

    @_mirrors(AsyncClient.resume_schedule)
    def resume_schedule(self, name: str) -> ScheduleInfo:
        return self._run(self._async.resume_schedule(name))

    @_mirrors(AsyncClient.remove_schedule)
    def remove_schedule(self, name: str) -> None:
        return self._run(self._async.remove_schedule(name))

    @_mirrors(AsyncClient.list_schedules)
    def list_schedules(self) -> builtins.list[ScheduleInfo]:
        return self._run(self._async.list_schedules())

    @_mirrors(AsyncClient.preview)
    def preview(
        self, cron: str, timezone: str = "UTC", n: int = 10, *, after: datetime | None = None
    ) -> builtins.list[datetime]:
        return self._run(self._async.preview(cron, timezone, n, after=after))

    @_mirrors(AsyncClient.pause_pool)
    def pause_pool(self, name: str) -> PoolInfo:
        return self._run(self._async.pause_pool(name))

    @_mirrors(AsyncClient.resume_pool)
    def resume_pool(self, name: str) -> PoolInfo:
        return self._run(self._async.resume_pool(name))

    @_mirrors(AsyncClient.list_pools)
    def list_pools(self) -> builtins.list[PoolInfo]:
        return self._run(self._async.list_pools())

    @_mirrors(AsyncClient.list_limits)
    def list_limits(self, *, keys: int = 20) -> builtins.list[LimitInfo]:
        return self._run(self._async.list_limits(keys=keys))

    @_mirrors(AsyncClient.retry)
    def retry(self, task_id: int, *, include_payload: bool = True) -> TaskInfo:
        return self._run(self._async.retry(task_id, include_payload=include_payload))

    @_mirrors(AsyncClient.rerun)
    def rerun(self, task_id: int) -> int:
        return self._run(self._async.rerun(task_id))

    @_mirrors(AsyncClient.trigger_schedule)
    def trigger_schedule(self, name: str) -> int | None:
        return self._run(self._async.trigger_schedule(name))

    @_mirrors(AsyncClient.list_workers)
    def list_workers(self) -> builtins.list[WorkerInfo]:
        return self._run(self._async.list_workers())

    @_mirrors(AsyncClient.explain)
    def explain(self, task_id: int) -> Explanation:
        return self._run(self._async.explain(task_id))

    @_mirrors(AsyncClient.occurrences)
    def occurrences(
        self, name: str, *, before: datetime | None = None, limit: int = 100
    ) -> builtins.list[OccurrenceInfo]:
        return self._run(self._async.occurrences(name, before=before, limit=limit))

    @_mirrors(AsyncClient.attempts)
    def attempts(self, task_id: int) -> builtins.list[AttemptInfo]:
        return self._run(self._async.attempts(task_id))

    @_mirrors(AsyncClient.dependants)
    def dependants(self, task_id: int) -> builtins.list[int]:
        return self._run(self._async.dependants(task_id))

    @_mirrors(AsyncClient.outbox_status)
    def outbox_status(self) -> OutboxStatus:
        return self._run(self._async.outbox_status())

    @_mirrors(AsyncClient.outbox_quarantine)
    def outbox_quarantine(
        self, *, after: int = 0, limit: int = 100
    ) -> builtins.list[QuarantinedOutboxRow]:
        return self._run(self._async.outbox_quarantine(after=after, limit=limit))

    @_mirrors(AsyncClient.requeue_outbox)
    def requeue_outbox(self, row_ids: Iterable[int]) -> int:
        return self._run(self._async.requeue_outbox(row_ids))

    @_mirrors(AsyncClient.discard_outbox)
    def discard_outbox(self, row_ids: Iterable[int]) -> int:
        return self._run(self._async.discard_outbox(row_ids))


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


async def _shutdown(client: AsyncClient) -> None:
    """Close the client, then end every call still on the loop (one sleeping between tries
    would otherwise never answer its caller)."""
    await client.close()
    current = asyncio.current_task()
    rest = [task for task in asyncio.all_tasks() if task is not current]
    for task in rest:
        task.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
