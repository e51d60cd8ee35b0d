"""The remote Worker against real gRPC servers.

Most tests run against a real ``cronoq-server serve`` process (memory store, a remote pool
``default`` with a 1 s lease), submitting and waiting with ``AsyncClient``. The tests that
restart the server on the same port, make it answer as a standby, or watch the Attach stream
close use an in-process server instead: a Scheduler with a RemotePool behind a minimal
WorkerService (below) that forwards to the Scheduler's public worker API. Workers run in this
process, or in child processes for SIGKILL and SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
from server_process import config_toml, running_server

from cronoq import (
    AttemptToken,
    BytesCodec,
    CancelRequested,
    CodecContext,
    LeaseRenewed,
    MemoryStore,
    RemotePool,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    TaskError,
    TaskRequest,
)
from cronoq.crypto import EncryptedCodec
from cronoq.errors import CronoqError, InvalidArgument, PayloadError, SchedulerError, StaleAttempt
from cronoq_client import AsyncClient
from cronoq_client._channel import Connection
from cronoq_client._heartbeats import Heartbeats
from cronoq_client._reports import Reports
from cronoq_client._worker import MAX_MESSAGE, Worker
from cronoq_client.protocol import (
    Attached,
    Reason,
    attach_kwargs,
    heartbeat_result,
    heartbeat_token,
    lease_renewed_to_pb,
    pb,
    pb_grpc,
    refused_for_good,
    report_from_pb,
    report_result,
    rich_status,
    status_for,
    worker_events_to_pb,
)
from cronoq_client.protocol import ReportSuccess as WireSuccess

LEASE_S = 1.0
WAIT_S = 10.0
CODEC = BytesCodec()
FAST_RETRY = RetryPolicy(max_attempts=3, initial_ns=10_000_000, jitter=0.0)


class _Service(pb_grpc.WorkerServiceServicer):
    """WorkerService over a Scheduler, as the server has it; ``standby`` refuses as a standby
    replica does."""

    def __init__(self, sched: Scheduler, lease: float) -> None:
        self.sched = sched
        self.lease = lease
        self.standby = False
        self.refused = 0
        self.refusals = asyncio.Event()
        self.attaches: list[tuple[tuple[AttemptToken, bytes], ...]] = []
        self.detached = asyncio.Event()
        self.reattached = asyncio.Event()
        self.report_calls: list[int] = []
        """The number of reports of each ReportMany call."""
        self.hold_first_report: asyncio.Event | None = None
        """Set: the first ReportMany call is answered only once it is set."""
        self.heartbeat_calls: list[list[int]] = []
        """The task ids of each HeartbeatMany call."""
        self.unary_heartbeats = 0
        self.renewals: dict[int, int] = {}
        """Task id -> leases renewed."""
        self.renewed = asyncio.Condition()
        self.older = False
        """True: HeartbeatMany is unknown (UNIMPLEMENTED), as on a server of an older release."""
        self.unknown_calls = 0
        """HeartbeatMany calls answered UNIMPLEMENTED."""
        self.stale: set[tuple[int, int]] = set()
        """(task id, attempt) whose heartbeats are answered stale, as if its lease had run out."""
        self.hide_cancels = False
        """True: cancellations are not sent on the stream (a worker learns them by heartbeat)."""

    async def Attach(self, request: pb.AttachRequest, context: Any) -> None:  # type: ignore[override]
        if self.standby:
            self.refused += 1
            if self.refused >= 3:
                self.refusals.set()
            await context.abort_with_status(
                rich_status(grpc.StatusCode.UNAVAILABLE, "a standby", Reason.STANDBY)
            )
        options = attach_kwargs(request)
        try:
            link = self.sched.attach(**options)
        except CronoqError as exc:
            await context.abort_with_status(status_for(exc))
        self.attaches.append(options["running"])
        if len(self.attaches) >= 2:
            self.reattached.set()
        self.detached.clear()
        try:
            leases = dict.fromkeys(options["pools"], self.lease)
            await context.write(worker_events_to_pb([Attached(self.sched.epoch or 0, leases)]))
            async for event in link:
                if self.hide_cancels and isinstance(event, CancelRequested):
                    continue
                await context.write(worker_events_to_pb([event]))
        finally:
            link.close()
            self.detached.set()

    async def _heartbeat(self, request: pb.HeartbeatRequest) -> LeaseRenewed:
        token, lease_id = heartbeat_token(request)
        if (token.task_id, token.attempt) in self.stale:
            raise StaleAttempt(f"task {token.task_id}: the lease ran out", "lease")
        renewed = await self.sched.heartbeat(token, lease_id=lease_id)
        async with self.renewed:
            self.renewals[token.task_id] = self.renewals.get(token.task_id, 0) + 1
            self.renewed.notify_all()
        return renewed

    async def renewed_at_least(self, task_ids: Iterable[int], times: int) -> None:
        """Return once each of these tasks' leases was renewed ``times`` times."""
        async with asyncio.timeout(WAIT_S), self.renewed:
            await self.renewed.wait_for(
                lambda: all(self.renewals.get(t, 0) >= times for t in task_ids)
            )

    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        self.unary_heartbeats += 1
        try:
            return lease_renewed_to_pb(await self._heartbeat(request))
        except CronoqError as exc:
            await context.abort_with_status(status_for(exc))
            raise

    async def HeartbeatMany(
        self, request: pb.HeartbeatManyRequest, context: Any
    ) -> pb.HeartbeatManyResponse:
        if self.older:
            self.unknown_calls += 1
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        self.heartbeat_calls.append([h.token.task_id for h in request.heartbeats])
        outcomes = await asyncio.gather(
            *(self._heartbeat(heartbeat) for heartbeat in request.heartbeats),
            return_exceptions=True,
        )
        results = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, CronoqError):
                raise outcome
            results.append(heartbeat_result(outcome))
        return pb.HeartbeatManyResponse(results=results)

    async def _report(self, request: pb.ReportRequest) -> None:
        token, lease_id, outcome = report_from_pb(request)
        if isinstance(outcome, WireSuccess):
            await self.sched.report_success(token, outcome.output, lease_id=lease_id)
        else:
            await self.sched.report_failure(
                token,
                outcome.message,
                lease_id=lease_id,
                retryable=outcome.retryable,
                retry_after=outcome.retry_after,
            )

    async def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportResponse:
        try:
            await self._report(request)
        except CronoqError as exc:
            await context.abort_with_status(status_for(exc))
        return pb.ReportResponse()

    async def ReportMany(
        self, request: pb.ReportManyRequest, context: Any
    ) -> pb.ReportManyResponse:
        self.report_calls.append(len(request.reports))
        if self.hold_first_report is not None and len(self.report_calls) == 1:
            await self.hold_first_report.wait()
        outcomes = await asyncio.gather(
            *(self._report(report) for report in request.reports), return_exceptions=True
        )
        results = []
        for outcome in outcomes:
            if isinstance(outcome, CronoqError) and not refused_for_good(outcome):
                await context.abort_with_status(status_for(outcome))
            if isinstance(outcome, BaseException) and not isinstance(outcome, CronoqError):
                raise outcome
            results.append(report_result(outcome))
        return pb.ReportManyResponse(results=results)


class Served:
    """A Scheduler served in process; ``stop`` and ``start`` again keep the port."""

    def __init__(self, sched: Scheduler, lease: float) -> None:
        self.sched = sched
        self.service = _Service(sched, lease)
        self.port = 0
        self.max_receive_bytes: int | None = None
        """Set before ``start``: the server refuses larger messages."""
        self._server: grpc.aio.Server | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        limit = self.max_receive_bytes
        server = grpc.aio.server(
            options=[] if limit is None else [("grpc.max_receive_message_length", limit)]
        )
        pb_grpc.add_WorkerServiceServicer_to_server(self.service, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None


async def _served(lease: float) -> AsyncIterator[Served]:
    sched = Scheduler([RemotePool("default", lease=lease)], store=MemoryStore(), codec=BytesCodec())
    async with sched:
        served = Served(sched, lease)
        await served.start()
        try:
            yield served
        finally:
            await served.stop()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async for s in _served(LEASE_S):
        yield s


@pytest.fixture
async def served_long() -> AsyncIterator[Served]:
    """A lease that outlasts a server restart."""
    async for s in _served(3.0):
        yield s


class Real:
    """A ``cronoq-server serve`` process and a client of it."""

    def __init__(self, target: str, sched: AsyncClient) -> None:
        self.target = target
        self.sched = sched


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Real]:
    pools = f'[[pools]]\nname = "default"\nlease_s = {LEASE_S}\n'
    config = config_toml('[store]\nkind = "memory"\n', pools=pools)
    async with running_server(tmp_path, config) as process:
        await process.wait_for("leading")
        async with AsyncClient(process.target, codec=CODEC, timeout=WAIT_S) as client:
            yield Real(process.target, client)


class Running:
    """A Worker whose run() is a task; ``finish`` stops it and returns run()'s outcome."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task = asyncio.create_task(worker.run())

    async def attached(self) -> None:
        attached = asyncio.ensure_future(self.worker.attached())
        done, _ = await asyncio.wait(
            {attached, self.task}, timeout=WAIT_S, return_when="FIRST_COMPLETED"
        )
        if self.task in done:
            attached.cancel()
            self.task.result()
        assert attached in done, "the worker did not attach"

    async def finish(self) -> None:
        self.worker.stop()
        self.worker.stop()
        await asyncio.wait_for(self.task, WAIT_S)


async def _worker(served: Served | Real, fn: Callable[..., Any], **options: Any) -> Running:
    running = Running(Worker(served.target, {"default": fn}, **options))
    await running.attached()
    return running


# --- running attempts -------------------------------------------------------------------------


async def _run_while_the_first_report_is_held(served: Served, tasks: int, output: bytes) -> None:
    """Run ``tasks`` tasks on a worker with as many slots; the first ReportMany call is
    answered only once every function has returned (so the other reports wait meanwhile)."""
    finished = 0
    all_finished = asyncio.Event()
    served.service.hold_first_report = all_finished

    async def fn(ctx: TaskContext, payload: bytes | None) -> bytes:
        nonlocal finished
        finished += 1
        if finished == tasks:
            all_finished.set()
        return output

    running = await _worker(served, fn, slots=tasks)
    try:
        ids = await served.sched.submit_many([TaskRequest("t") for _ in range(tasks)])
        for task_id in ids:
            info = await served.sched.wait(task_id, timeout=WAIT_S)
            assert (info.status, info.output) == (Status.SUCCEEDED, output)
    finally:
        await running.finish()


async def test_reports_that_finish_during_a_report_call_leave_together_in_the_next(
    served: Served,
) -> None:
    await _run_while_the_first_report_is_held(served, 5, b"done")
    # One call in flight at a time: what finished meanwhile went in one more call.
    assert sum(served.service.report_calls) == 5
    assert len(served.service.report_calls) <= 2, served.service.report_calls


async def test_a_batch_of_reports_over_the_servers_limit_is_split_not_failed(
    served: Served,
) -> None:
    # Two of these outputs exceed the server's message limit together, not alone.
    await served.stop()
    served.max_receive_bytes = 64 * 1024
    await served.start()
    await _run_while_the_first_report_is_held(served, 3, b"o" * (40 * 1024))
    # The first report went alone; the two that waited for it were refused together (the
    # server never saw that call) and then sent one by one.
    assert served.service.report_calls == [1, 1, 1]


# --- heartbeats ---------------------------------------------------------------------------------


async def _hold(ctx: TaskContext, payload: bytes | None) -> None:
    """Runs until cancelled (by a cancellation, a stale lease or the worker's stop)."""
    await asyncio.Event().wait()


async def test_the_heartbeats_of_many_attempts_leave_together(served: Served) -> None:
    # 50 attempts outlasting three renewals each: 150 Heartbeat calls one by one, a few
    # HeartbeatMany calls together (the attempts arrived within a quarter interval).
    release = asyncio.Event()

    async def fn(ctx: TaskContext, payload: bytes | None) -> None:
        await release.wait()

    running = await _worker(served, fn, slots=50)
    try:
        ids = await served.sched.submit_many([TaskRequest("t") for _ in range(50)])
        await served.service.renewed_at_least(ids, 3)
        release.set()
        for task_id in ids:
            info = await served.sched.wait(task_id, timeout=WAIT_S)
            assert (info.status, info.attempt) == (Status.SUCCEEDED, 1)
    finally:
        await running.finish()
    calls = served.service.heartbeat_calls
    assert served.service.unary_heartbeats == 0
    assert sum(map(len, calls)) >= 150
    assert len(calls) <= 12, [len(c) for c in calls]


async def test_a_lone_attempts_heartbeat_leaves_at_its_due_time(served: Served) -> None:
    running = await _worker(served, _hold)
    try:
        [task_id] = await served.sched.submit_many([TaskRequest("t")])
        began = time.monotonic()
        await served.service.renewed_at_least([task_id], 2)
        # Every third of the 1 s lease, as the loop of one attempt had it: no wait for others.
        assert 0.6 <= time.monotonic() - began < 0.6 + 0.5
    finally:
        await running.finish()
    assert served.service.heartbeat_calls[:2] == [[task_id], [task_id]]


async def test_stale_and_cancel_answers_stop_their_own_attempts_only(served: Served) -> None:
    served.service.hide_cancels = True  # the cancellation reaches the worker by heartbeat
    reasons: dict[int, str | None] = {}
    started, stopped = asyncio.Event(), asyncio.Event()

    async def fn(ctx: TaskContext, payload: bytes | None) -> None:
        if running.worker.running == 3:
            started.set()
        try:
            await asyncio.Event().wait()
        finally:
            reasons[ctx.task_id] = ctx.cancel_reason
            if len(reasons) == 2:
                stopped.set()

    running = await _worker(served, fn, slots=3)
    try:
        once = RetryPolicy(max_attempts=1)
        stale, cancelled, kept = await served.sched.submit_many(
            [TaskRequest("t", retry=once) for _ in range(3)]
        )
        async with asyncio.timeout(WAIT_S):
            await started.wait()  # leased, so that the cancel is a running attempt's
        served.service.stale.add((stale, 1))
        assert await served.sched.cancel(cancelled, reason="stop it") is Status.RUNNING
        async with asyncio.timeout(WAIT_S):
            await stopped.wait()
        assert "no longer current" in (reasons[stale] or ""), reasons
        assert reasons[cancelled] == "stop it"
        assert (await served.sched.wait(cancelled, timeout=WAIT_S)).status is Status.CANCELLED
        # The one still held goes on being renewed; the stale one is heard of no more.
        renewals = served.service.renewals.get(kept, 0)
        await served.service.renewed_at_least([kept], renewals + 2)
        assert kept not in reasons
    finally:
        await running.finish()
    calls = served.service.heartbeat_calls
    assert sorted(calls[0]) == sorted([stale, cancelled, kept]), calls
    assert not [call for call in calls[1:] if stale in call], calls


async def test_a_server_without_heartbeat_many_gets_one_heartbeat_per_attempt(
    served: Served,
) -> None:
    served.service.older = True
    running = await _worker(served, _hold, slots=3)
    try:
        ids = await served.sched.submit_many([TaskRequest("t") for _ in range(3)])
        await served.service.renewed_at_least(ids, 3)
        for task_id in ids:
            assert (await served.sched.get(task_id)).attempt == 1  # no lease ran out
    finally:
        await running.finish()
    # HeartbeatMany was tried once on the connection.
    assert served.service.unknown_calls == 1
    assert served.service.unary_heartbeats >= 9


async def test_async_and_thread_functions_run_and_their_outputs_come_back(server: Real) -> None:
    seen: list[tuple[int, int, str, str | None, tuple[str, ...], Any]] = []

    async def upper(ctx: TaskContext, payload: bytes | None) -> bytes | None:
        seen.append((ctx.task_id, ctx.attempt, ctx.kind, ctx.key, ctx.tags, payload))
        return None if payload is None else payload.upper()

    running = await _worker(server, upper)
    try:
        first = await server.sched.submit("greet", b"hello", key="k1", tags=["a", "b"])
        empty = await server.sched.submit("greet")
        info = await server.sched.wait(first, timeout=WAIT_S)
        assert (info.status, info.output) == (Status.SUCCEEDED, b"HELLO")
        info = await server.sched.wait(empty, timeout=WAIT_S)
        assert (info.status, info.output) == (Status.SUCCEEDED, None)
        assert (first, 1, "greet", "k1", ("a", "b"), b"hello") in seen
        assert (empty, 1, "greet", None, (), None) in seen
    finally:
        await running.finish()

    threads: list[str] = []

    def reverse(ctx: TaskContext, payload: bytes) -> bytes:
        threads.append(threading.current_thread().name)
        return payload[::-1]

    running = await _worker(server, reverse, slots=2)
    try:
        ids = [await server.sched.submit("rev", f"ab{i}".encode()) for i in range(4)]
        for i, task_id in enumerate(ids):
            info = await server.sched.wait(task_id, timeout=WAIT_S)
            assert (info.status, info.output) == (Status.SUCCEEDED, f"{i}ba".encode())
        assert threads and all(name.startswith("cronoq-worker") for name in threads)
    finally:
        await running.finish()


async def test_task_errors_and_exceptions_become_failures_with_their_retry(server: Real) -> None:
    starts: dict[str, list[float]] = {}

    async def flaky(ctx: TaskContext, payload: bytes) -> bytes:
        starts.setdefault(ctx.kind, []).append(time.monotonic())
        if ctx.kind == "fatal":
            raise TaskError("bad input", retryable=False)
        if ctx.kind == "later" and ctx.attempt == 1:
            raise TaskError("busy", retry_after=0.3)
        if ctx.kind == "boom" and ctx.attempt == 1:
            raise ValueError("boom")
        if ctx.kind == "long":
            raise TaskError("x" * (3 * MAX_MESSAGE))
        return b"ok"

    running = await _worker(server, flaky)
    try:
        sched = server.sched
        fatal = await sched.submit("fatal", retry=FAST_RETRY)
        later = await sched.submit("later", retry=FAST_RETRY)
        boom = await sched.submit("boom", retry=FAST_RETRY)
        long = await sched.submit("long", retry=RetryPolicy(max_attempts=1))
        info = await sched.wait(fatal, timeout=WAIT_S)
        assert (info.status, info.attempt) == (Status.FAILED, 1)
        assert "not retryable" in info.message and info.message.endswith(": bad input")
        info = await sched.wait(later, timeout=WAIT_S)
        assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 2, b"ok")
        gap = starts["later"][1] - starts["later"][0]
        assert gap >= 0.3, f"retry_after=0.3 was not kept: {gap:.3f}s"
        info = await sched.wait(boom, timeout=WAIT_S)
        assert (info.status, info.attempt) == (Status.SUCCEEDED, 2)
        info = await sched.wait(long, timeout=WAIT_S)
        assert info.status is Status.FAILED
        assert len(info.message) < MAX_MESSAGE + 100, "truncated before it was sent"
        assert f"xx... ({3 * MAX_MESSAGE} characters, truncated)" in info.message
    finally:
        await running.finish()


async def test_boom_message_names_the_exception_type(server: Real) -> None:
    async def boom(ctx: TaskContext, payload: bytes) -> None:
        raise KeyError("missing")

    running = await _worker(server, boom)
    try:
        task_id = await server.sched.submit("boom", retry=RetryPolicy(max_attempts=1))
        info = await server.sched.wait(task_id, timeout=WAIT_S)
        assert info.status is Status.FAILED
        assert info.error == "attempt 1 failed: KeyError: 'missing'; no attempts left"
        # The worker's traceback travelled in its report: the frame that raised is in it.
        assert info.traceback is not None
        assert info.traceback.startswith("Traceback (most recent call last):\n")
        assert 'raise KeyError("missing")' in info.traceback
        assert "cronoq_client/_worker.py" not in info.traceback  # its own frame left out
        assert info.traceback.endswith("KeyError: 'missing'")
    finally:
        await running.finish()


# --- cancellation -----------------------------------------------------------------------------


async def test_a_cancel_interrupts_a_running_async_function(server: Real) -> None:
    started = asyncio.Event()
    interrupted: list[str | None] = []

    async def forever(ctx: TaskContext, payload: bytes) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            interrupted.append(ctx.cancel_reason)
            raise

    running = await _worker(server, forever)
    try:
        task_id = await server.sched.submit("forever")
        await asyncio.wait_for(started.wait(), WAIT_S)
        await server.sched.cancel(task_id, "enough")
        info = await server.sched.wait(task_id, timeout=WAIT_S)
        assert info.status is Status.CANCELLED
        assert interrupted == ["enough"]
    finally:
        await running.finish()


async def test_a_cancel_reaches_a_thread_function_through_its_ctx(server: Real) -> None:
    started = threading.Event()
    polled: list[bool] = []

    def polling(ctx: TaskContext, payload: bytes) -> bytes:
        started.set()
        deadline = time.monotonic() + WAIT_S
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.005)
        polled.append(ctx.cancelled)
        return b"returned anyway"

    running = await _worker(server, polling)
    try:
        task_id = await server.sched.submit("poll")
        assert await asyncio.to_thread(started.wait, WAIT_S)
        await server.sched.cancel(task_id, "stop polling")
        info = await server.sched.wait(task_id, timeout=WAIT_S)
        # It returned after the cancel reached it: the attempt ends cancelled, not succeeded.
        assert (info.status, info.output) == (Status.CANCELLED, None)
        assert polled == [True]
    finally:
        await running.finish()


async def test_an_encrypted_codec_runs_end_to_end_and_the_server_holds_only_ciphertext(
    tmp_path: Path,
) -> None:
    """Issue 20 audit gap 4: a client with ``EncryptedCodec`` submits, a remote Worker with the
    same keys decrypts the payload and encrypts its output, the client reads it back; the
    server and its SQLite file see only ciphertext. A worker with another key under the same
    id fails the attempt, for good and saying why, and goes on serving."""
    keys = {"k1": EncryptedCodec.generate_key()}
    codec = EncryptedCodec(keys, "k1")
    secret, answer = b"attack at dawn, gate 7", b"ATTACK AT DAWN, GATE 7"
    store = tmp_path / "store.db"
    config = config_toml(
        f'[store]\nkind = "sqlite"\npath = "{store}"\n',
        pools=f'[[pools]]\nname = "default"\nlease_s = {LEASE_S}\n',
    )

    async def upper(ctx: TaskContext, payload: bytes | None) -> bytes | None:
        return None if payload is None else payload.upper()

    def stored_bytes() -> bytes:
        return b"".join(p.read_bytes() for p in tmp_path.glob("store.db*"))  # with its WAL

    async with (
        running_server(tmp_path, config) as process,
        AsyncClient(process.target, codec=codec, timeout=WAIT_S) as client,
        AsyncClient(process.target, timeout=WAIT_S) as raw,  # BytesCodec: the stored bytes
    ):
        await process.wait_for("leading")
        running = Running(Worker(process.target, {"default": upper}, codec=codec))
        await running.attached()
        try:
            task_id = await client.submit("seal", secret)
            info = await client.wait(task_id, timeout=WAIT_S)
            assert (info.status, info.payload, info.output) == (Status.SUCCEEDED, secret, answer)
        finally:
            await running.finish()
        stored = await raw.get(task_id)
        assert isinstance(stored.payload, bytes) and isinstance(stored.output, bytes)
        # Each bound to where it belongs (issue 29 item 3): the payload to the task's kind
        # and pool, the output to the task too.
        payload_context = CodecContext("payload", "seal", "default")
        output_context = CodecContext("output", "seal", "default", task_id=task_id)
        for sealed, plain, context in (
            (stored.payload, secret, payload_context),
            (stored.output, answer, output_context),
        ):
            assert sealed.startswith(b"CQE2\x02k1") and plain not in sealed
            assert codec.decode_for(sealed, context) == plain
        files = await asyncio.to_thread(stored_bytes)
        assert stored.payload in files and stored.output in files, "the rows were read"
        assert secret not in files and answer not in files
        assert secret.decode() not in "\n".join(process.raw)

        wrong = EncryptedCodec({"k1": EncryptedCodec.generate_key()}, "k1")
        running = Running(Worker(process.target, {"default": upper}, codec=wrong))
        await running.attached()
        try:
            task_id = await client.submit("seal", secret)
            info = await client.wait(task_id, timeout=WAIT_S)
            assert (info.status, info.attempt, info.output) == (Status.FAILED, 1, None)
            assert info.message == (
                "attempt 1 failed (not retryable): payload could not be decoded: an encrypted "
                "value failed authentication with key 'k1': it was altered, or encrypted with "
                "another key under the same id"
            )
            assert not running.task.done(), "the worker goes on"
            again = await client.submit("empty")  # no payload: nothing to decrypt
            assert (await client.wait(again, timeout=WAIT_S)).status is Status.SUCCEEDED
        finally:
            await running.finish()


async def test_a_ciphertext_copied_into_another_task_is_refused_by_the_keyed_worker(
    tmp_path: Path,
) -> None:
    """Issue 29 item 3: an identity that may read and submit but has no key copies task X's
    encrypted payload, and its encrypted output, into tasks of its own of another kind and
    pool (the raw wire: BytesCodec sends the bytes as they are). The keyed worker runs none
    of them on X's payload: each attempt fails for good, saying the value belongs to another
    context, and the worker goes on. An output copied into another task's row in the
    database is refused the same way by the keyed client's get()."""
    codec = EncryptedCodec({"k1": EncryptedCodec.generate_key()}, "k1")
    secret = b"pay 1250 to account 7"
    store = tmp_path / "store.db"
    pools = "".join(
        f'[[pools]]\nname = "{name}"\nlease_s = {LEASE_S}\n' for name in ("default", "other")
    )
    config = config_toml(f'[store]\nkind = "sqlite"\npath = "{store}"\n', pools=pools)
    ran: list[tuple[str, str, bytes | None]] = []

    async def record(ctx: TaskContext, payload: bytes | None) -> bytes:
        ran.append((ctx.kind, ctx.pool, payload))
        return b"receipt for " + (payload or b"nothing")

    async with (
        running_server(tmp_path, config) as process,
        AsyncClient(process.target, codec=codec, timeout=WAIT_S) as client,
        AsyncClient(process.target, timeout=WAIT_S) as raw,  # no key: the bytes as stored
    ):
        await process.wait_for("leading")
        worker = Worker(process.target, {"default": record, "other": record}, codec=codec)
        running = Running(worker)
        await running.attached()
        try:
            x = await client.submit("charge", secret, key="order-17")
            assert (await client.wait(x, timeout=WAIT_S)).status is Status.SUCCEEDED
            stolen = await raw.get(x)
            assert isinstance(stolen.payload, bytes) and isinstance(stolen.output, bytes)
            copies = {
                "X's payload, another kind and pool": await raw.submit(
                    "refund", stolen.payload, pool="other"
                ),
                "X's payload, another key": await raw.submit(
                    "charge", stolen.payload, key="order-18"
                ),
                "X's output, another kind and pool": await raw.submit(
                    "refund", stolen.output, pool="other"
                ),
                "X's output as a payload of its kind and pool": await raw.submit(
                    "charge", stolen.output, key="order-17b"
                ),
            }
            for what, task_id in copies.items():
                info = await raw.wait(task_id, timeout=WAIT_S)
                assert (info.status, info.attempt, info.output) == (Status.FAILED, 1, None), what
                assert info.message.startswith(
                    "attempt 1 failed (not retryable): payload could not be decoded: an "
                    "encrypted value that belongs to another context: it was not encrypted for "
                    f"the payload of a task of kind {info.kind!r} in pool {info.pool!r}"
                ), (what, info.message)
            assert ran == [("charge", "default", secret)], "X's payload ran only as X"
            assert not running.task.done(), "the worker goes on"

            y = await client.submit("refund", b"refund 3", pool="other")
            assert (await client.wait(y, timeout=WAIT_S)).output == b"receipt for refund 3"
        finally:
            await running.finish()

        def copy_output(source: int, target: int) -> None:
            """What database credentials allow: one row's output into another's."""
            with sqlite3.connect(store, timeout=WAIT_S) as db:
                db.execute(
                    "UPDATE cronoq_tasks SET output = (SELECT output FROM cronoq_tasks "
                    "WHERE id = ?) WHERE id = ?",
                    (source, target),
                )
            db.close()

        await asyncio.to_thread(copy_output, x, y)
        with pytest.raises(PayloadError, match=f"task {y} .*belongs to another context"):
            await client.get(y)
        assert (await client.get(x)).output == b"receipt for " + secret


class _Watched(Worker):
    """A Worker that counts the server's renewals of its stopped attempts' leases: each says
    the server still holds that attempt's slot and its task."""

    def __init__(self, *args: Any, renewals: int, **options: Any) -> None:
        super().__init__(*args, **options)
        self.stopped_renewals = 0
        self.renewed_enough = asyncio.Event()
        self._enough = renewals

    def _renewed(self, token: AttemptToken, sent: float, renewed: LeaseRenewed) -> None:
        super()._renewed(token, sent, renewed)
        if renewed.stopped:
            self.stopped_renewals += 1
            if self.stopped_renewals >= self._enough:
                self.renewed_enough.set()


async def test_a_thread_that_outlives_its_timeout_keeps_its_slot_until_it_returns(
    tmp_path: Path,
) -> None:
    """Issue 19 audit gap 5, on a real server and Worker with one slot: attempt 1's thread
    ignores its timeout while its worker heartbeats it as stopped for longer than a lease.
    Meanwhile the retry, due at once, has not started (the task waits); it starts once the
    thread returned, and the two executions never overlap."""
    lease_s = 0.3
    config = config_toml(
        '[store]\nkind = "memory"\n',
        pools=f'[[pools]]\nname = "default"\nlease_s = {lease_s}\n',
    )
    runs: list[tuple[str, int]] = []
    timed_out, release = threading.Event(), threading.Event()

    def stubborn(ctx: TaskContext, payload: bytes | None) -> bytes:
        runs.append(("start", ctx.attempt))
        if ctx.attempt == 1:
            deadline = time.monotonic() + WAIT_S
            while not ctx.cancelled and time.monotonic() < deadline:
                time.sleep(0.005)  # a thread function polls ctx.cancelled
            timed_out.set()
            release.wait(WAIT_S)  # runs on after it was stopped
        runs.append(("end", ctx.attempt))
        return b"done"

    async with (
        running_server(tmp_path, config) as process,
        AsyncClient(process.target, timeout=WAIT_S) as client,
    ):
        await process.wait_for("leading")
        # Heartbeats every third of a lease: six renewals outlast the stopped attempt's lease.
        worker = _Watched(process.target, {"default": stubborn}, slots=1, renewals=6)
        running = Running(worker)
        await running.attached()
        try:
            retry = RetryPolicy(max_attempts=2, initial_ns=0, jitter=0.0)
            task_id = await client.submit("stubborn", timeout=0.2, retry=retry)
            assert await asyncio.to_thread(timed_out.wait, WAIT_S)
            await asyncio.wait_for(worker.renewed_enough.wait(), WAIT_S)
            held = await client.get(task_id)
            assert (held.status, held.attempt) == (Status.READY, 1), held
            assert runs == [("start", 1)]
            release.set()
            info = await client.wait(task_id, timeout=WAIT_S)
        finally:
            release.set()
            await running.finish()
    assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 2, b"done")
    assert runs == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]


# --- connections ------------------------------------------------------------------------------


async def test_running_attempts_survive_a_server_restart_and_report_on_the_new_one(
    served_long: Served,
) -> None:
    served = served_long
    gates = {"during": asyncio.Event(), "after": asyncio.Event()}
    started = {kind: asyncio.Event() for kind in gates}

    async def gated(ctx: TaskContext, payload: bytes) -> bytes:
        started[ctx.kind].set()
        await gates[ctx.kind].wait()
        return ctx.kind.encode()

    running = await _worker(served, gated)
    try:
        during = await served.sched.submit("during")
        after = await served.sched.submit("after")
        for event in started.values():
            await asyncio.wait_for(event.wait(), WAIT_S)
        await served.stop()
        await asyncio.wait_for(served.service.detached.wait(), WAIT_S)
        gates["during"].set()  # it reports while the server is gone: the report is retried
        await asyncio.sleep(0.2)
        await served.start()
        await asyncio.wait_for(served.service.reattached.wait(), WAIT_S)
        # It reattached naming the attempt it still runs, which keeps its slot and lease.
        assert after in {token.task_id for token, _ in served.service.attaches[1]}
        gates["after"].set()
        for task_id, output in ((during, b"during"), (after, b"after")):
            info = await served.sched.wait(task_id, timeout=WAIT_S)
            assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 1, output)
    finally:
        await running.finish()


async def test_the_worker_retries_a_standby_until_it_serves(served: Served) -> None:
    async def echo(ctx: TaskContext, payload: bytes) -> bytes:
        return payload

    served.service.standby = True
    running = Running(Worker(served.target, {"default": echo}))
    try:
        await asyncio.wait_for(served.service.refusals.wait(), WAIT_S)
        assert not running.task.done()
        served.service.standby = False
        await running.attached()
        task_id = await served.sched.submit("echo", b"x")
        info = await served.sched.wait(task_id, timeout=WAIT_S)
        assert (info.status, info.output) == (Status.SUCCEEDED, b"x")
    finally:
        await running.finish()


async def test_the_worker_waits_for_a_server_not_yet_listening(served: Served) -> None:
    await served.stop()  # the port is known; nothing listens on it

    async def echo(ctx: TaskContext, payload: bytes) -> bytes:
        return payload

    running = Running(Worker(served.target, {"default": echo}))
    try:
        await asyncio.sleep(0.3)  # refused connections meanwhile: it must keep trying
        assert not running.task.done()
        await served.start()
        await running.attached()
        task_id = await served.sched.submit("echo", b"y")
        info = await served.sched.wait(task_id, timeout=WAIT_S)
        assert info.output == b"y"
    finally:
        await running.finish()


async def test_an_unknown_pool_is_refused_for_good(served: Served) -> None:
    async def echo(ctx: TaskContext, payload: bytes) -> bytes:
        return payload

    worker = Worker(served.target, {"nope": echo})
    with pytest.raises(CronoqError, match="nope"):
        await asyncio.wait_for(worker.run(), WAIT_S)


# --- drain and stop ---------------------------------------------------------------------------


async def test_stop_drains_the_running_attempt_and_takes_no_new_one(served: Served) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()
    runs: list[int] = []

    async def gated(ctx: TaskContext, payload: bytes) -> bytes:
        runs.append(ctx.task_id)
        started.set()
        await gate.wait()
        return b"drained"

    running = await _worker(served, gated)
    task_id = await served.sched.submit("gated")
    await asyncio.wait_for(started.wait(), WAIT_S)
    running.worker.stop()
    await asyncio.wait_for(served.service.detached.wait(), WAIT_S)  # its stream is gone
    later = await served.sched.submit("later")
    assert not running.task.done()
    gate.set()
    await asyncio.wait_for(running.task, WAIT_S)
    info = await served.sched.get(task_id)
    assert (info.status, info.output) == (Status.SUCCEEDED, b"drained")
    assert runs == [task_id]
    assert (await served.sched.get(later)).status is Status.READY


async def test_a_second_stop_cancels_the_running_attempt_and_returns(served: Served) -> None:
    started = asyncio.Event()
    cancelled: list[str | None] = []

    async def stuck(ctx: TaskContext, payload: bytes) -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(ctx.cancel_reason)
            raise

    running = await _worker(served, stuck)
    task_id = await served.sched.submit("stuck", retry=RetryPolicy(max_attempts=1))
    await asyncio.wait_for(started.wait(), WAIT_S)
    running.worker.stop()
    await asyncio.sleep(0.05)
    assert not running.task.done()
    running.worker.stop()
    await asyncio.wait_for(running.task, WAIT_S)
    # (In process: cronoq-server's Attach withdraws an attempt whose write was still pending
    # when the worker cancelled the stream, so this would read READY there.)
    assert cancelled == ["the worker is stopping"]
    # Not reported: the attempt is lost when its lease runs out.
    assert (await served.sched.get(task_id)).status is Status.RUNNING
    info = await served.sched.wait(task_id, timeout=WAIT_S)
    assert info.status is Status.FAILED


# --- worker processes -------------------------------------------------------------------------

_WORKER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, time
    from cronoq_client._worker import Worker

    def slow(ctx, payload):
        print(f"started {ctx.task_id} {ctx.attempt}", flush=True)
        time.sleep(float(sys.argv[2]))
        return b"from the process"

    asyncio.run(Worker(sys.argv[1], {"default": slow}).run())
    print("exited", flush=True)
    """
)


def _spawn(tmp_path: Path, target: str, sleep_s: float) -> subprocess.Popen[str]:
    script = tmp_path / "worker.py"
    script.write_text(_WORKER_SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), target, str(sleep_s)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _reap(process: subprocess.Popen[str]) -> None:
    process.kill()
    process.wait()
    assert process.stdout is not None
    process.stdout.close()


async def _line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(process.stdout.readline), WAIT_S)
    return line.strip()


async def test_a_sigkilled_worker_loses_its_lease_and_another_worker_runs_it(
    server: Real, tmp_path: Path
) -> None:
    process = _spawn(tmp_path, server.target, 60)
    try:
        task_id = await server.sched.submit("slow", retry=FAST_RETRY)
        assert await _line(process) == f"started {task_id} 1"
        process.send_signal(signal.SIGKILL)
        await asyncio.to_thread(process.wait, WAIT_S)
    finally:
        _reap(process)

    attempts: list[int] = []

    async def quick(ctx: TaskContext, payload: bytes) -> bytes:
        attempts.append(ctx.attempt)
        return b"second worker"

    lost_at = time.monotonic()
    running = await _worker(server, quick)
    try:
        info = await server.sched.wait(task_id, timeout=WAIT_S)
        assert (info.status, info.output, info.attempt) == (Status.SUCCEEDED, b"second worker", 2)
        assert attempts == [2]
        assert time.monotonic() - lost_at < LEASE_S + 2.0
    finally:
        await running.finish()


async def test_sigterm_drains_a_worker_process(server: Real, tmp_path: Path) -> None:
    process = _spawn(tmp_path, server.target, 0.5)
    try:
        task_id = await server.sched.submit("slow")
        assert await _line(process) == f"started {task_id} 1"
        process.send_signal(signal.SIGTERM)
        assert await _line(process) == "exited"
        assert await asyncio.to_thread(process.wait, WAIT_S) == 0
        info = await server.sched.get(task_id)
        assert (info.status, info.output) == (Status.SUCCEEDED, b"from the process")
    finally:
        _reap(process)


async def test_stop_drains_the_running_attempt_on_a_real_server(server: Real) -> None:
    gate = asyncio.Event()
    started = asyncio.Event()

    async def gated(ctx: TaskContext, payload: bytes) -> bytes:
        started.set()
        await gate.wait()
        return b"drained"

    running = await _worker(server, gated)
    task_id = await server.sched.submit("gated", retry=RetryPolicy(max_attempts=1))
    await asyncio.wait_for(started.wait(), WAIT_S)
    running.worker.stop()
    await asyncio.sleep(0.1)
    gate.set()
    await asyncio.wait_for(running.task, WAIT_S)
    info = await server.sched.get(task_id)  # reported before run() returned
    assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 1, b"drained"), info


async def test_a_reconnect_while_the_stream_is_healthy_keeps_the_worker_and_its_attempt(
    served_long: Served,
) -> None:
    # A heartbeat or report that fails with a retryable status replaces the connection; the
    # old channel, closed after its grace, ends the healthy Attach stream (and any call still
    # on it) with CancelledError: the worker must attach again, not stop.
    release = asyncio.Event()
    started = asyncio.Event()

    async def held(ctx: TaskContext, payload: bytes | None) -> bytes:
        started.set()
        await release.wait()
        return b"after"

    running = await _worker(served_long, held, slots=1)
    try:
        task_id = await served_long.sched.submit("t")
        await asyncio.wait_for(started.wait(), WAIT_S)
        worker = running.worker
        worker._reconnect(worker._current()[0])  # what a failed heartbeat or report does
        await asyncio.wait_for(served_long.service.reattached.wait(), WAIT_S)
        assert not running.task.done(), "the worker stopped after a reconnect"
        assert [token for token, _ in served_long.service.attaches[-1]] == [
            AttemptToken(1, task_id, 1)
        ]
        release.set()
        info = await served_long.sched.wait(task_id, timeout=WAIT_S)
        assert (info.status, info.attempt, info.output) == (Status.SUCCEEDED, 1, b"after")
    finally:
        release.set()
        await running.finish()


class _ClosedUnderTheFirstCall:
    """A WorkerService stub whose first ReportMany ends as grpc.aio ends a call whose channel
    is closed under it: CancelledError, in a task nobody cancelled."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.called = asyncio.Event()
        self.release = asyncio.Event()

    async def ReportMany(self, request: pb.ReportManyRequest, timeout: float) -> Any:
        self.calls.append(len(request.reports))
        self.called.set()
        if len(self.calls) == 1:
            await self.release.wait()
            raise asyncio.CancelledError
        return pb.ReportManyResponse(results=[pb.ReportResult() for _ in request.reports])


async def test_a_report_call_ended_by_a_closed_channel_is_answered_and_the_queue_goes_on() -> None:
    stub = _ClosedUnderTheFirstCall()
    reports = Reports(lambda: ("connection", stub), 1 << 20)  # type: ignore[arg-type,return-value]
    deadline = asyncio.get_running_loop().time() + 30
    first = asyncio.create_task(reports.send(pb.ReportRequest(), deadline))
    await stub.called.wait()
    second = asyncio.create_task(reports.send(pb.ReportRequest(), deadline))  # queued behind
    stub.release.set()
    _, answer = await asyncio.wait_for(first, 5)
    # Not a cancellation of the caller: an unknown outcome, which the worker retries.
    assert isinstance(answer, SchedulerError) and answer.applied is None, answer
    _, accepted = await asyncio.wait_for(second, 5)
    assert accepted is None
    assert stub.calls == [1, 1]
    await reports.close()


class _HeartbeatStub:
    """A WorkerService stub for ``Heartbeats``: its first HeartbeatMany ends as grpc.aio ends a
    call whose channel is closed under it, and a call of more than ``limit`` heartbeats is
    refused as too large, as gRPC refuses a message over the server's limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.calls: list[int] = []

    async def HeartbeatMany(self, request: pb.HeartbeatManyRequest, timeout: float) -> Any:
        self.calls.append(len(request.heartbeats))
        if len(self.calls) == 1:
            raise asyncio.CancelledError
        if len(request.heartbeats) > self.limit:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.aio.Metadata(),
                grpc.aio.Metadata(),
                "Received message larger than max (1200 vs. 1024)",
            )
        renewed = LeaseRenewed(datetime.now(UTC), None, False)
        return pb.HeartbeatManyResponse(
            results=[heartbeat_result(renewed) for _ in request.heartbeats]
        )


async def test_a_cut_heartbeat_call_is_tried_again_and_a_too_large_one_in_halves() -> None:
    stub = _HeartbeatStub(limit=2)
    connection = Connection(None, None, 1)  # type: ignore[arg-type]
    reconnects: list[Connection] = []
    renewed: dict[int, int] = {}
    all_renewed = asyncio.Event()

    def on_renewed(token: AttemptToken, sent: float, renewal: LeaseRenewed) -> None:
        renewed[token.task_id] = renewed.get(token.task_id, 0) + 1
        if len(renewed) == 3:
            all_renewed.set()

    beats = Heartbeats(
        lambda: (connection, stub),  # type: ignore[arg-type,return-value]
        reconnects.append,
        on_renewed,
        lambda token, error: None,
        1 << 20,
    )
    for task_id in (1, 2, 3):
        beats.add(AttemptToken(1, task_id, 1), bytes(16), 0.3)
    try:
        async with asyncio.timeout(WAIT_S):
            await all_renewed.wait()
    finally:
        await beats.close()
    # Cut by a closed channel (a reconnect made already): all three again soon, refused as too
    # large, then in halves; nothing renewed twice, no new connection asked for.
    assert stub.calls[:4] == [3, 3, 1, 2], stub.calls
    assert renewed == {1: 1, 2: 1, 3: 1}
    assert reconnects == []


async def test_a_worker_whose_message_limit_is_below_the_servers_is_refused(server: Real) -> None:
    # The server takes 4 MiB payloads: a worker that cannot receive them would break its
    # stream on the first large attempt, and again at every retry.
    worker = Worker(server.target, {"default": _noop}, max_message_bytes=64 * 1024)
    with pytest.raises(InvalidArgument, match="below the server's limit of 4194304"):
        await asyncio.wait_for(worker.run(), WAIT_S)


async def _noop(ctx: TaskContext, payload: bytes | None) -> None:
    return None


@pytest.mark.parametrize("limit", [0, 2**31, True, "4MiB"])
def test_the_workers_message_limit_is_checked(limit: Any) -> None:
    with pytest.raises(InvalidArgument, match="max_message_bytes"):
        Worker("127.0.0.1:1", {"default": _noop}, max_message_bytes=limit)
