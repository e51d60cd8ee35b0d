"""Every call of both services through a real channel to a real ``cronoq-server`` process.

The happy path of each call; the bad inputs of cronoq's own validation tests in their wire form
(raw messages, built without the client's encoders, which refuse some values earlier), each with
its precise status and ErrorInfo reason, nothing applied and the server still serving; stale
attempt tokens; hypothesis throwing arbitrary bytes and arbitrary field values at every method;
health, reflection and the HTTP endpoints.

One server process per module (memory store) serves the tests that leave nothing behind another
test could see; a second one takes the fuzzing, and a SQLite one the happy path again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import descriptor_pb2, duration_pb2, timestamp_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pb_strategies import messages, variations
from prometheus_client.parser import text_string_to_metric_families
from server_process import AttachStream, ServerProcess, config_toml, running_server

from cronoq.errors import PayloadError, StaleAttempt
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb, pb_grpc

pytestmark = pytest.mark.asyncio(loop_scope="module")

Code = grpc.StatusCode
LIMIT = 1 << 20
"""The server's max_message_bytes (and so the scheduler's payload limit)."""
MANY = wire.MAX_SUBMIT_MANY_TASKS
REFERENCES = wire.MAX_SUBMIT_MANY_REFERENCES
PER_TASK = REFERENCES // MANY
"""Dependencies and tags per task in a call of MANY tasks that names the most it may."""
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
CALL_TIMEOUT = 5.0
BOTH = {"include_payload": True, "include_output": True}
"""Get, GetByKey and Wait send the payload and output only when asked."""
NEVER = "0 0 1 1 *"
"""A cron that fires on January 1st only: a schedule of a test creates no task meanwhile."""

# Pools of their own for the tests that attach a worker, so that no worker is handed a task of
# another test; "bounded" admits one live task.
POOLS = (
    "".join(
        f'[[pools]]\nname = "{name}"\n'
        for name in (
            "default",
            "attach",
            "stale",
            "cancel",
            "fuzz",
            "batched",
            "large",
            "many",
            "beats",
            "forged",
        )
    )
    + '[[pools]]\nname = "bounded"\nmax_live = 1\n'
)
MEMORY = '[store]\nkind = "memory"\n'


def _config(store: str) -> str:
    return config_toml(store, pools=POOLS, tables=f"[limits]\nmax_message_bytes = {LIMIT}\n")


@contextlib.asynccontextmanager
async def _leading(directory: Path, store: str) -> AsyncIterator[ServerProcess]:
    async with running_server(directory, _config(store)) as server:
        await server.leading()
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServerProcess]:
    async with _leading(tmp_path_factory.mktemp("calls"), MEMORY) as running:
        yield running


@dataclass(frozen=True, slots=True)
class Api:
    channel: grpc.aio.Channel
    tasks: pb_grpc.SchedulerServiceAsyncStub
    workers: pb_grpc.WorkerServiceAsyncStub


@pytest_asyncio.fixture(loop_scope="module")
async def api(server: ServerProcess) -> AsyncIterator[Api]:
    async with _api(server) as connected:
        yield connected


@contextlib.asynccontextmanager
async def _api(server: ServerProcess) -> AsyncIterator[Api]:
    async with grpc.aio.insecure_channel(server.target) as channel:
        yield Api(
            channel, pb_grpc.SchedulerServiceStub(channel), pb_grpc.WorkerServiceStub(channel)
        )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- statuses --------------------------------------------------------------------------------


async def rejected(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def assert_status(
    err: grpc.aio.AioRpcError,
    code: grpc.StatusCode,
    reason: str,
    fragment: str = "",
    **metadata: str,
) -> None:
    info = wire.error_info(err)
    assert err.code() is code, (err.code(), err.details())
    assert info is not None, f"no ErrorInfo: {err.code()} {err.details()}"
    assert (info.domain, info.reason) == ("cronoq", reason), (info, err.details())
    assert fragment in (err.details() or ""), err.details()
    assert dict(info.metadata) == metadata


@dataclass(frozen=True, slots=True)
class State:
    """What a bad call must leave as it was."""

    tasks: frozenset[int]
    schedules: tuple[bytes, ...]


async def state(api: Api) -> State:
    ids: set[int] = set()
    token = ""
    while True:
        page = await api.tasks.List(pb.ListRequest(page_size=1000, page_token=token))
        ids.update(t.task_id for t in page.tasks)
        token = page.next_page_token
        if not token:
            break
    listed = await api.tasks.ListSchedules(pb.ListSchedulesRequest())
    return State(frozenset(ids), tuple(sorted(s.SerializeToString() for s in listed.schedules)))


# --- requests ----------------------------------------------------------------------------------


def task(**fields: Any) -> pb.TaskRequest:
    return pb.TaskRequest(**{"kind": "job", **fields})


def submit(**fields: Any) -> pb.SubmitRequest:
    return pb.SubmitRequest(task=task(**fields))


def seconds(s: int, nanos: int = 0) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=s, nanos=nanos)


def instant(s: int, nanos: int = 0) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=s, nanos=nanos)


def schedule(**fields: Any) -> pb.AddScheduleRequest:
    return pb.AddScheduleRequest(**{"name": "s", "cron": NEVER, "kind": "job", **fields})


LATER = {"start_delay": seconds(3600)}
"""A fixed start an hour away: the task stays scheduled for the whole test."""


async def submitted(api: Api, **fields: Any) -> int:
    reply = await api.tasks.Submit(submit(**fields), timeout=CALL_TIMEOUT)
    return reply.task_id


# === 1. every call, end to end ====================================================================


async def test_submit_get_and_get_by_key_carry_every_field(api: Api) -> None:
    key = unique("key")
    parent = await submitted(api, **LATER)
    request = task(
        kind="report",
        payload=b"\x00in",
        key=key,
        tags=["a", "b"],
        name="the report",
        priority=-7,
        retry=pb.RetryPolicy(max_attempts=5, initial=seconds(2), jitter=0.0),
        start_delay=seconds(3600),
        miss_policy=pb.MISS_POLICY_SKIP,
        grace=seconds(5),
        deadline_delay=seconds(7200),
        timeout=seconds(30, 500_000_000),
        after=[parent],
    )
    task_id = (await api.tasks.Submit(pb.SubmitRequest(task=request))).task_id
    got = await api.tasks.Get(pb.GetRequest(**BOTH, task_id=task_id))
    assert (got.task_id, got.status, got.attempt) == (task_id, pb.STATUS_WAITING, 0)
    assert (got.kind, got.pool, got.key, list(got.tags), got.name) == (
        "report", "default", key, ["a", "b"], "the report",
    )  # fmt: skip
    assert (got.priority, got.payload, list(got.after)) == (-7, b"\x00in", [parent])
    assert not got.HasField("output") and not got.HasField("finished_at")
    assert got.submitted_at.seconds > 0
    by_key = await api.tasks.GetByKey(pb.GetByKeyRequest(**BOTH, key=key))
    assert by_key.task == got
    # The key is held: the same submission returns the same task.
    again = await api.tasks.Submit(pb.SubmitRequest(task=request))
    assert again.task_id == task_id
    absent = await api.tasks.GetByKey(pb.GetByKeyRequest(key=unique("absent")))
    assert not absent.HasField("task")
    # No payload and b"" are both "no payload" once stored.
    bare = await api.tasks.Get(pb.GetRequest(task_id=await submitted(api, **LATER)))
    assert not bare.payload


async def test_submit_many_takes_all_in_order(api: Api) -> None:
    kind = unique("many")
    reply = await api.tasks.SubmitMany(
        pb.SubmitManyRequest(tasks=[task(kind=kind, **LATER), task(kind=kind, pool="attach")])
    )
    first, second = reply.task_ids
    assert first < second
    listed = await api.tasks.List(pb.ListRequest(kind=kind))
    assert [(t.task_id, t.pool) for t in listed.tasks] == [(first, "default"), (second, "attach")]
    await api.tasks.Cancel(pb.CancelRequest(task_id=second))  # no worker of "attach" gets it
    empty = await api.tasks.SubmitMany(pb.SubmitManyRequest())
    assert list(empty.task_ids) == []


async def test_submit_many_takes_the_most_one_call_may_carry(api: Api) -> None:
    """As many tasks, dependencies and tags as the server takes in one call (see the refusals
    one past each in ``bad_others``)."""
    kind = unique("most")
    parent = await submitted(api, **LATER)
    batch = [task(kind=kind, after=[parent] * PER_TASK, tags=["t"] * PER_TASK)] * MANY
    reply = await api.tasks.SubmitMany(pb.SubmitManyRequest(tasks=batch))
    assert len(reply.task_ids) == MANY
    await api.tasks.Cancel(pb.CancelRequest(task_id=parent))  # and its dependants with it


async def test_submit_each_answers_each_submission_as_submit_would(api: Api) -> None:
    kind = unique("each")
    unknown_pool = submit(kind=kind, pool="nope", **LATER)
    never_issued = submit(kind=kind, after=[2**62], **LATER)
    bad_key = submit(kind=kind, key="\x00", **LATER)
    alone = [await rejected(api.tasks.Submit(r)) for r in (unknown_pool, never_issued, bad_key)]
    keyed = submit(kind=kind, key=kind, **LATER)
    reply = await api.tasks.SubmitEach(
        pb.SubmitEachRequest(
            submissions=[
                keyed,
                unknown_pool,
                keyed,
                never_issued,
                submit(kind=kind, **LATER),
                bad_key,
            ]
        )
    )
    first, pool, again, dependency, last, key = reply.results
    # The key's second submission finds it held by the first, as a Submit after it would.
    assert first.task_id == again.task_id != last.task_id > 0
    for result, err in zip((pool, dependency, key), alone, strict=True):
        info = wire.error_info(err)
        assert info is not None
        assert (result.refused.reason, result.refused.message) == (info.reason, err.details())
    listed = await api.tasks.List(pb.ListRequest(kind=kind))
    assert [t.task_id for t in listed.tasks] == [first.task_id, last.task_id]
    assert list((await api.tasks.SubmitEach(pb.SubmitEachRequest())).results) == []
    for task_id in (first.task_id, last.task_id):
        await api.tasks.Cancel(pb.CancelRequest(task_id=task_id))


async def test_submit_each_takes_the_most_one_call_may_carry(api: Api) -> None:
    kind = unique("most-each")
    parent = await submitted(api, **LATER)
    batch = [submit(kind=kind, after=[parent] * PER_TASK, tags=["t"] * PER_TASK)] * MANY
    reply = await api.tasks.SubmitEach(pb.SubmitEachRequest(submissions=batch))
    assert len({r.task_id for r in reply.results}) == MANY
    await api.tasks.Cancel(pb.CancelRequest(task_id=parent))  # and its dependants with it


async def test_a_list_page_ends_at_the_servers_page_limit(api: Api) -> None:
    """A page is made on the event loop: one longer than MAX_LIST_PAGE tasks, asked for or
    not, ends there with a token for the next."""
    kind = unique("page")
    batch = pb.SubmitManyRequest(common=task(kind=kind, **LATER), payloads=[b""] * MANY)
    ids = [*(await api.tasks.SubmitMany(batch)).task_ids, await submitted(api, kind=kind, **LATER)]
    assert len(ids) > wire.MAX_LIST_PAGE
    for asked in (None, len(ids)):  # the server's own page size, then more
        first = await api.tasks.List(pb.ListRequest(kind=kind, page_size=asked))
        assert [t.task_id for t in first.tasks] == ids[: wire.MAX_LIST_PAGE]
        assert first.next_page_token == str(ids[wire.MAX_LIST_PAGE - 1])
        token = first.next_page_token
        rest = await api.tasks.List(pb.ListRequest(kind=kind, page_size=asked, page_token=token))
        assert [t.task_id for t in rest.tasks] == ids[wire.MAX_LIST_PAGE :]
    newest = ids[::-1]
    first = await api.tasks.List(pb.ListRequest(kind=kind, newest_first=True))
    assert [t.task_id for t in first.tasks] == newest[: wire.MAX_LIST_PAGE]
    token = first.next_page_token
    assert token == str(newest[wire.MAX_LIST_PAGE - 1])
    rest = await api.tasks.List(pb.ListRequest(kind=kind, newest_first=True, page_token=token))
    assert [t.task_id for t in rest.tasks] == newest[wire.MAX_LIST_PAGE :]
    # The request's own bounds hold with the token: only ids between them.
    bounded = pb.ListRequest(kind=kind, newest_first=True, after=ids[2], before=ids[7])
    assert [t.task_id for t in (await api.tasks.List(bounded)).tasks] == newest[-7:-3]
    for task_id in ids:
        await api.tasks.Cancel(pb.CancelRequest(task_id=task_id))


async def test_list_filters_and_pages(api: Api) -> None:
    kind, tag = unique("list"), unique("tag")
    ids = [
        (await api.tasks.Submit(submit(kind=kind, tags=[tag] if i % 2 else [], **LATER))).task_id
        for i in range(5)
    ]
    pages: list[list[int]] = []
    token = ""
    while True:
        page = await api.tasks.List(pb.ListRequest(kind=kind, page_size=2, page_token=token))
        pages.append([t.task_id for t in page.tasks])
        if not page.next_page_token:
            break
        assert page.next_page_token == str(page.tasks[-1].task_id)
        token = page.next_page_token
    assert pages == [ids[0:2], ids[2:4], ids[4:5]]
    tagged = await api.tasks.List(pb.ListRequest(tag=tag))
    assert [t.task_id for t in tagged.tasks] == [ids[1], ids[3]]
    assert all(list(t.tags) == [tag] for t in tagged.tasks)
    scheduled = pb.StatusFilter(statuses=[pb.STATUS_SCHEDULED])
    by_status = await api.tasks.List(pb.ListRequest(kind=kind, statuses=scheduled, pool="default"))
    assert [t.task_id for t in by_status.tasks] == ids
    assert all(t.status == pb.STATUS_SCHEDULED and t.pool == "default" for t in by_status.tasks)
    running = pb.StatusFilter(statuses=[pb.STATUS_RUNNING, pb.STATUS_READY])
    assert not (await api.tasks.List(pb.ListRequest(kind=kind, statuses=running))).tasks
    # A filter present and empty matches no status; absent, any.
    none = await api.tasks.List(pb.ListRequest(kind=kind, statuses=pb.StatusFilter()))
    assert not none.tasks
    assert not (await api.tasks.List(pb.ListRequest(kind=kind, pool="attach"))).tasks
    # A full last page has a token; the page after it is empty and has none.
    full = await api.tasks.List(pb.ListRequest(kind=kind, page_size=5))
    assert full.next_page_token == str(ids[-1])
    after = await api.tasks.List(pb.ListRequest(kind=kind, page_token=full.next_page_token))
    assert (list(after.tasks), after.next_page_token) == ([], "")


async def test_wait_returns_a_terminal_task_and_times_out_on_a_live_one(api: Api) -> None:
    live = await submitted(api, **LATER)
    err = await rejected(
        api.tasks.Wait(pb.WaitRequest(task_id=live, timeout=seconds(0, 200_000_000)))
    )
    assert_status(err, Code.DEADLINE_EXCEEDED, "WAIT_TIMED_OUT")
    # The call's deadline alone bounds it too, well before the wait could end otherwise.
    began = time.monotonic()
    err = await rejected(api.tasks.Wait(pb.WaitRequest(task_id=live), timeout=0.5))
    assert err.code() is Code.DEADLINE_EXCEEDED
    # The server's answer, or the client's own when it gives up first: they race.
    assert getattr(wire.error_info(err), "reason", "WAIT_TIMED_OUT") == "WAIT_TIMED_OUT"
    assert time.monotonic() - began < 2.0
    # With a timeout longer than the deadline, the deadline wins.
    err = await rejected(
        api.tasks.Wait(pb.WaitRequest(task_id=live, timeout=seconds(60)), timeout=0.5)
    )
    assert err.code() is Code.DEADLINE_EXCEEDED
    assert time.monotonic() - began < 4.0
    await api.tasks.Cancel(pb.CancelRequest(task_id=live, reason="enough"))
    done = await api.tasks.Wait(pb.WaitRequest(task_id=live, timeout=seconds(0)))
    assert (done.status, done.message) == (pb.STATUS_CANCELLED, "enough")
    assert done.HasField("finished_at")
    # A task that ends while waited for: the wait returns with it.
    other = await submitted(api, **LATER)
    waiting = asyncio.ensure_future(
        api.tasks.Wait(pb.WaitRequest(task_id=other), timeout=CALL_TIMEOUT)
    )
    await api.tasks.Cancel(pb.CancelRequest(task_id=other))
    assert (await waiting).status == pb.STATUS_CANCELLED


async def test_cancel_a_queued_task_is_final_and_repeatable(api: Api) -> None:
    task_id = await submitted(api, **LATER)
    reply = await api.tasks.Cancel(pb.CancelRequest(task_id=task_id))
    assert reply.status == pb.STATUS_CANCELLED
    info = await api.tasks.Get(pb.GetRequest(task_id=task_id))
    assert (info.status, info.message) == (pb.STATUS_CANCELLED, "cancelled by request")
    again = await api.tasks.Cancel(pb.CancelRequest(task_id=task_id, reason="twice"))
    assert again.status == pb.STATUS_CANCELLED


async def test_schedules_add_replace_pause_resume_list_remove(api: Api) -> None:
    name = unique("sched")
    added = await api.tasks.AddSchedule(
        schedule(name=name, timezone="Europe/Paris", tags=["t"], priority=3, payload=b"p",
                 overlap=pb.OVERLAP_POLICY_ALLOW, catch_up=pb.CATCH_UP_POLICY_SKIP)
    )  # fmt: skip
    assert (added.name, added.cron, added.timezone, added.kind, added.pool) == (
        name, NEVER, "Europe/Paris", "job", "default",
    )  # fmt: skip
    assert (added.overlap, added.catch_up, added.paused) == (
        pb.OVERLAP_POLICY_ALLOW, pb.CATCH_UP_POLICY_SKIP, False,
    )  # fmt: skip
    assert not added.HasField("last_task_id")
    next_run = added.next_run_at.ToDatetime(UTC)
    assert (next_run.month, next_run.day) in ((12, 31), (1, 1))  # midnight in Paris, in UTC
    duplicate = await rejected(api.tasks.AddSchedule(schedule(name=name)))
    assert_status(duplicate, Code.ALREADY_EXISTS, "DUPLICATE_SCHEDULE", f"'{name}' already exists")
    paused = await api.tasks.PauseSchedule(pb.PauseScheduleRequest(name=name))
    assert paused.paused
    # Replacing keeps an operator's pause.
    replaced = await api.tasks.AddSchedule(schedule(name=name, cron="0 0 1 7 *", replace=True))
    assert (replaced.cron, replaced.paused, replaced.timezone) == ("0 0 1 7 *", True, "UTC")
    resumed = await api.tasks.ResumeSchedule(pb.ResumeScheduleRequest(name=name))
    assert not resumed.paused
    listed = await api.tasks.ListSchedules(pb.ListSchedulesRequest())
    assert [s for s in listed.schedules if s.name == name] == [resumed]
    await api.tasks.RemoveSchedule(pb.RemoveScheduleRequest(name=name))
    listed = await api.tasks.ListSchedules(pb.ListSchedulesRequest())
    assert name not in {s.name for s in listed.schedules}
    for gone in (
        api.tasks.PauseSchedule(pb.PauseScheduleRequest(name=name)),
        api.tasks.ResumeSchedule(pb.ResumeScheduleRequest(name=name)),
        api.tasks.RemoveSchedule(pb.RemoveScheduleRequest(name=name)),
    ):
        assert_status(await rejected(gone), Code.NOT_FOUND, "SCHEDULE_NOT_FOUND", name)


async def test_preview_schedule(api: Api) -> None:
    after = datetime.fromisoformat("2026-03-07T12:00:00+00:00")
    reply = await api.tasks.PreviewSchedule(
        pb.PreviewScheduleRequest(
            cron="30 2 * * *",
            timezone="America/New_York",
            n=3,
            after=instant(int(after.timestamp())),
        )
    )
    # 02:30 on the 8th falls in the spring-forward gap: it fires at 03:00 EDT; then 02:30 EDT.
    assert [ts.ToDatetime(UTC).isoformat() for ts in reply.occurrences] == [
        "2026-03-08T07:00:00+00:00",
        "2026-03-09T06:30:00+00:00",
        "2026-03-10T06:30:00+00:00",
    ]
    default = await api.tasks.PreviewSchedule(pb.PreviewScheduleRequest(cron="* * * * *"))
    assert len(default.occurrences) == 10
    assert default.occurrences[0].seconds > time.time() - 1


async def test_admission_is_resource_exhausted(api: Api) -> None:
    first = await submitted(api, pool="bounded", **LATER)
    before = await state(api)
    err = await rejected(api.tasks.Submit(submit(pool="bounded", **LATER)))
    assert_status(err, Code.RESOURCE_EXHAUSTED, "ADMISSION_REJECTED", "bounded")
    assert wire.outcome(err) is wire.Outcome.ANSWERED
    assert await state(api) == before
    await api.tasks.Cancel(pb.CancelRequest(task_id=first))
    await api.tasks.Cancel(pb.CancelRequest(task_id=await submitted(api, pool="bounded")))


# --- remote workers ------------------------------------------------------------------------------


class Worker:
    """One Attach stream, read event by event."""

    def __init__(
        self,
        api: Api,
        pools: list[str],
        slots: int = 1,
        max_message_bytes: int = 0,
        running: tuple[pb.AttemptToken, ...] = (),
    ) -> None:
        self.api = api
        request = pb.AttachRequest(
            worker_id=unique("worker"),
            pools=pools,
            slots=slots,
            max_message_bytes=max_message_bytes,
            running=running,
        )
        self.stream = AttachStream(api.workers.Attach(request))

    async def event(self) -> pb.WorkerEvent:
        async with asyncio.timeout(CALL_TIMEOUT):
            return await self.stream.raw()

    async def attempt(self) -> pb.Attempt:
        event = await self.event()
        assert event.WhichOneof("event") == "attempt", event
        return event.attempt

    def close(self) -> None:
        self.stream.cancel()


@pytest_asyncio.fixture(loop_scope="module")
async def attach(api: Api) -> AsyncIterator[Attacher]:
    """Attach a worker to a pool; yields it with the leader's epoch (from ``attached``)."""
    opened: list[Worker] = []

    async def open_one(
        pool: str,
        slots: int = 1,
        max_message_bytes: int = 0,
        running: tuple[pb.AttemptToken, ...] = (),
    ) -> tuple[Worker, int]:
        worker = Worker(api, [pool], slots, max_message_bytes, running)
        opened.append(worker)
        first = await worker.event()
        assert first.WhichOneof("event") == "attached", first
        assert first.attached.leases[pool] == seconds(30)
        return worker, first.attached.epoch

    yield open_one
    for worker in opened:
        worker.close()


Attacher = Callable[..., Awaitable[tuple[Worker, int]]]
"""``attach(pool, slots=1, max_message_bytes=0, running=())``: a worker attached to the pool,
and the leader's epoch."""


def token(epoch: int, task_id: int, attempt: int, lease_id: bytes = bytes(16)) -> pb.AttemptToken:
    """A token as a worker sends it; by default with a well-formed lease id nobody was given."""
    return pb.AttemptToken(epoch=epoch, task_id=task_id, attempt=attempt, lease_id=lease_id)


async def test_a_worker_attaches_heartbeats_and_reports(api: Api, attach: Attacher) -> None:
    worker, epoch = await attach("attach")
    assert epoch >= 1
    task_id = await submitted(api, pool="attach", payload=b"in", key=unique("k"), tags=["w"],
                              name="n", timeout=seconds(9),
                              deadline_delay=seconds(3600))  # fmt: skip
    attempt = await worker.attempt()
    assert attempt.token == token(epoch, task_id, 1, attempt.token.lease_id)
    assert len(attempt.token.lease_id) == 16
    assert (attempt.pool, attempt.kind, list(attempt.tags), attempt.name) == (
        "attach", "job", ["w"], "n",
    )  # fmt: skip
    assert (attempt.payload, attempt.timeout) == (b"in", seconds(9))
    assert attempt.HasField("deadline") and attempt.HasField("key")
    running = await api.tasks.Get(pb.GetRequest(task_id=task_id))
    assert (running.status, running.attempt) == (pb.STATUS_RUNNING, 1)
    renewed = await api.workers.Heartbeat(pb.HeartbeatRequest(token=attempt.token))
    assert renewed.lease_expires_at.ToNanoseconds() >= attempt.lease_expires_at.ToNanoseconds()
    assert (renewed.cancel_requested, renewed.cancel_reason) == (False, "")
    report = pb.ReportRequest(token=attempt.token, success=pb.Success(output=b"out"))
    await api.workers.Report(report)
    done = await api.tasks.Wait(pb.WaitRequest(**BOTH, task_id=task_id, timeout=seconds(5)))
    assert (done.status, done.output, done.attempt) == (pb.STATUS_SUCCEEDED, b"out", 1)
    # The same report again changes nothing: the task is finished.
    for late in (
        api.workers.Report(report),
        api.workers.Heartbeat(pb.HeartbeatRequest(token=attempt.token)),
    ):
        err = await rejected(late)
        assert_status(err, Code.FAILED_PRECONDITION, "STALE_ATTEMPT", str(task_id), why="finished")
    assert await api.tasks.Get(pb.GetRequest(**BOTH, task_id=task_id)) == done
    # A success without an output is "None", not b"".
    second = await submitted(api, pool="attach")
    attempt = await worker.attempt()
    await api.workers.Report(pb.ReportRequest(token=attempt.token, success=pb.Success()))
    info = await api.tasks.Wait(pb.WaitRequest(**BOTH, task_id=second, timeout=seconds(5)))
    assert (info.status, info.HasField("output")) == (pb.STATUS_SUCCEEDED, False)


async def test_stale_tokens_are_failed_precondition_and_change_nothing(
    api: Api, attach: Attacher
) -> None:
    worker, epoch = await attach("stale")
    retry = pb.RetryPolicy(max_attempts=3, initial=seconds(0), maximum=seconds(0))
    task_id = await submitted(api, pool="stale", retry=retry)
    first = await worker.attempt()
    failure = pb.Failure(message="flaky", retry_after=seconds(0))
    await api.workers.Report(pb.ReportRequest(token=first.token, failure=failure))
    second = await worker.attempt()
    assert second.token == token(epoch, task_id, 2, second.token.lease_id)
    before = await api.tasks.Get(pb.GetRequest(task_id=task_id))
    assert (before.status, before.attempt) == (pb.STATUS_RUNNING, 2)
    stale = [
        ("attempt", first.token),
        ("unknown", token(epoch, task_id + 10**6, 1)),
        # The current attempt's token, read by anyone from Get, without its lease id.
        ("unknown", token(epoch, task_id, 2)),
    ]
    for why, old in stale:
        for call in (
            api.workers.Report(pb.ReportRequest(token=old, success=pb.Success(output=b"old"))),
            api.workers.Report(pb.ReportRequest(
                token=old, failure=pb.Failure(message="x", retryable=False))),
            api.workers.Heartbeat(pb.HeartbeatRequest(token=old)),
        ):  # fmt: skip
            err = await rejected(call)
            assert_status(err, Code.FAILED_PRECONDITION, "STALE_ATTEMPT", why=why)
            assert wire.outcome(err) is wire.Outcome.ANSWERED
    # A token of a later epoch than the leader's: it was replaced (it may not know yet), so
    # the worker is told to ask again elsewhere, not that its attempt is stale.
    later = token(epoch + 1, task_id, 2, second.token.lease_id)
    for call in (
        api.workers.Report(pb.ReportRequest(token=later, success=pb.Success(output=b"old"))),
        api.workers.Heartbeat(pb.HeartbeatRequest(token=later)),
    ):
        err = await rejected(call)
        assert_status(err, Code.UNAVAILABLE, "NOT_APPLIED", "later leader")
        assert wire.outcome(err) is wire.Outcome.NOT_APPLIED
    after = await api.tasks.Get(pb.GetRequest(task_id=task_id))
    assert (after.status, after.attempt, after.updated_at) == (
        pb.STATUS_RUNNING, 2, before.updated_at,
    )  # fmt: skip
    # The current attempt's outcome stands.
    await api.workers.Report(
        pb.ReportRequest(token=second.token, success=pb.Success(output=b"new"))
    )
    done = await api.tasks.Wait(pb.WaitRequest(**BOTH, task_id=task_id, timeout=seconds(5)))
    assert (done.status, done.attempt, done.output) == (pb.STATUS_SUCCEEDED, 2, b"new")


async def test_a_token_read_by_anyone_does_not_let_an_impostor_take_the_attempt(
    server: ServerProcess, api: Api, attach: Attacher
) -> None:
    # Issue 19, item 2: a token is (epoch, task id, attempt), all visible through List/Get.
    # Attaching with someone else's token moved the attempt to the impostor (its cancel went
    # there, and the real worker's slot leaked for good); anyone could heartbeat or complete it.
    worker, epoch = await attach("forged")
    task_id = await submitted(api, pool="forged")
    attempt = await worker.attempt()
    guessed = token(epoch, task_id, 1)  # everything but the lease id, which only the worker has
    impostor, _ = await attach("forged", running=(guessed,))
    for call in (
        api.workers.Heartbeat(pb.HeartbeatRequest(token=guessed)),
        api.workers.Report(pb.ReportRequest(token=guessed, success=pb.Success(output=b"forged"))),
    ):
        err = await rejected(call)
        assert_status(err, Code.FAILED_PRECONDITION, "STALE_ATTEMPT", why="unknown")
        assert attempt.token.lease_id.hex() not in str(err.details())
    info = await api.tasks.Get(pb.GetRequest(task_id=task_id))
    assert (info.status, info.attempt) == (pb.STATUS_RUNNING, 1)
    assert attempt.token.lease_id not in info.SerializeToString(), "no read shows the lease id"
    await api.tasks.Cancel(pb.CancelRequest(task_id=task_id, reason="stop"))
    event = await worker.event()
    assert event.WhichOneof("event") == "cancel", "the cancel goes to the worker that runs it"
    await api.workers.Report(
        pb.ReportRequest(token=attempt.token, failure=pb.Failure(message="stopped"))
    )
    done = await api.tasks.Wait(pb.WaitRequest(task_id=task_id, timeout=seconds(5)))
    assert (done.status, done.HasField("output")) == (pb.STATUS_CANCELLED, False)
    # The real worker's slot came back with its report: the next attempt is its.
    await submitted(api, pool="forged")
    assert (await worker.attempt()).token.task_id != task_id
    impostor.close()
    # Issue 19 audit gap 3: nor does any other read, the metrics or the server's log.
    await server.wait_for("worker detached")
    await _assert_secret(server, api, attempt.token.lease_id, task_id)


async def _assert_secret(server: ServerProcess, api: Api, lease_id: bytes, task_id: int) -> None:
    """``lease_id`` (its bytes, hex and base64 forms) is in no List page, Get, /metrics text
    or line the server logged."""
    assert len(lease_id) == 16
    forms = {
        lease_id.hex(),
        lease_id.hex().upper(),
        base64.b64encode(lease_id).decode().rstrip("="),
        base64.urlsafe_b64encode(lease_id).decode().rstrip("="),
        repr(lease_id)[2:-1],
    }
    listed, page_token = [], ""
    while True:
        page = await api.tasks.List(pb.ListRequest(page_size=1000, page_token=page_token))
        listed.append(page)
        page_token = page.next_page_token
        if not page_token:
            break
    assert any(t.task_id == task_id for page in listed for t in page.tasks)
    got = await api.tasks.Get(pb.GetRequest(task_id=task_id, **BOTH))
    status, metrics = await asyncio.to_thread(_get, f"{server.http}/metrics")
    assert status == 200
    texts = {
        "List": "".join(str(page) for page in listed),
        "Get": str(got),
        "/metrics": metrics.decode(),
        # Its lines as written and as parsed (logfmt escapes a backslash).
        "the log": "\n".join([*server.raw, *(v for line in server.lines for v in line.values())]),
    }
    for where, text in texts.items():
        assert not [form for form in forms if form in text], where
    for message in (*listed, got):
        assert lease_id not in message.SerializeToString()


async def test_cancel_of_a_running_task_reaches_its_worker(api: Api, attach: Attacher) -> None:
    worker, _ = await attach("cancel")
    task_id = await submitted(api, pool="cancel")
    attempt = await worker.attempt()
    reply = await api.tasks.Cancel(pb.CancelRequest(task_id=task_id, reason="stop it"))
    assert reply.status == pb.STATUS_RUNNING
    event = await worker.event()
    assert event.WhichOneof("event") == "cancel"
    assert (wire.token_from_pb(event.cancel.token), event.cancel.reason) == (
        wire.token_from_pb(attempt.token),
        "stop it",
    )
    assert event.cancel.token.lease_id == b"", "a cancellation does not repeat the lease id"
    renewed = await api.workers.Heartbeat(pb.HeartbeatRequest(token=attempt.token))
    assert (renewed.cancel_requested, renewed.cancel_reason) == (True, "stop it")
    # Bad reports of the current attempt are refused and leave it running.
    err = await rejected(api.workers.Report(pb.ReportRequest(token=attempt.token)))
    assert_status(err, Code.INVALID_ARGUMENT, "INVALID_ARGUMENT", "a report needs an outcome")
    bad = pb.Failure(message="x", retry_after=seconds(-1))
    err = await rejected(api.workers.Report(pb.ReportRequest(token=attempt.token, failure=bad)))
    assert_status(err, Code.INVALID_ARGUMENT, "INVALID_ARGUMENT", "retry_after")
    long = pb.Failure(message="m" * (64 * 1024 + 1))
    err = await rejected(api.workers.Report(pb.ReportRequest(token=attempt.token, failure=long)))
    assert_status(err, Code.INVALID_ARGUMENT, "INVALID_ARGUMENT", "message is 65537 characters")
    assert (await api.tasks.Get(pb.GetRequest(task_id=task_id))).status == pb.STATUS_RUNNING
    await api.workers.Heartbeat(pb.HeartbeatRequest(token=attempt.token))
    failure = pb.Failure(message="cancelled", retryable=False)
    await api.workers.Report(pb.ReportRequest(token=attempt.token, failure=failure))
    done = await api.tasks.Wait(pb.WaitRequest(task_id=task_id, timeout=seconds(5)))
    assert (done.status, done.message) == (pb.STATUS_CANCELLED, "stop it")


async def test_attempts_that_are_ready_together_leave_in_one_stream_message(
    api: Api, attach: Attacher
) -> None:
    # Due before the worker attaches: its three slots take them in one step.
    ids = [await submitted(api, pool="batched") for _ in range(3)]
    worker, epoch = await attach("batched", 3)
    async with asyncio.timeout(CALL_TIMEOUT):
        message = await worker.stream.call.read()
    assert isinstance(message, pb.AttachResponse)
    assert sorted(e.attempt.token.task_id for e in message.events) == ids
    assert {e.attempt.token.epoch for e in message.events} == {epoch}
    reports = [
        pb.ReportRequest(token=e.attempt.token, success=pb.Success()) for e in message.events
    ]
    reply = await api.workers.ReportMany(pb.ReportManyRequest(reports=reports))
    assert list(reply.results) == [pb.ReportResult()] * 3
    for task_id in ids:
        done = await api.tasks.Wait(pb.WaitRequest(task_id=task_id, timeout=seconds(5)))
        assert done.status == pb.STATUS_SUCCEEDED


@pytest.mark.parametrize("worker_limit", [0, LIMIT], ids=["unnamed", "named"])
async def test_attempts_too_large_to_share_a_message_leave_one_by_one(
    api: Api, attach: Attacher, worker_limit: int
) -> None:
    # Two of these payloads exceed the message limit together: each attempt is sent alone,
    # none is lost or sent twice.
    payload = b"p" * (LIMIT * 6 // 10)
    ids = [await submitted(api, pool="large", payload=payload) for _ in range(3)]
    worker, _ = await attach("large", 3, worker_limit)
    seen = []
    async with asyncio.timeout(CALL_TIMEOUT):
        for _ in ids:
            message = await worker.stream.call.read()
            assert isinstance(message, pb.AttachResponse) and len(message.events) == 1
            seen.append(message.events[0].attempt)
    assert sorted(a.token.task_id for a in seen) == ids
    assert {a.payload for a in seen} == {payload}
    for attempt in seen:
        await api.workers.Report(pb.ReportRequest(token=attempt.token, success=pb.Success()))


async def test_report_many_judges_each_report_alone(api: Api, attach: Attacher) -> None:
    worker, epoch = await attach("many", 2)
    ok, refused = await submitted(api, pool="many"), await submitted(api, pool="many")
    attempts = {}
    for _ in range(2):
        attempt = await worker.attempt()
        attempts[attempt.token.task_id] = attempt
    current, other = attempts[ok].token, attempts[refused].token
    reply = await api.workers.ReportMany(
        pb.ReportManyRequest(
            reports=[
                pb.ReportRequest(token=current, success=pb.Success(output=b"out")),
                pb.ReportRequest(token=token(epoch, refused, 1), success=pb.Success()),
                pb.ReportRequest(token=other),  # no outcome
                pb.ReportRequest(token=current, success=pb.Success(output=b"again")),
            ]
        )
    )
    accepted, stale_epoch, bad, repeated = reply.results
    assert accepted == pb.ReportResult()
    # The other attempt's token without its lease id: unknown to that caller.
    assert (stale_epoch.reason, stale_epoch.metadata["why"]) == ("STALE_ATTEMPT", "unknown")
    assert (bad.reason, bad.message) == (
        "INVALID_ARGUMENT", "a report needs an outcome: success or failure",
    )  # fmt: skip
    # The same attempt twice in one call: one outcome stands, the other is answered stale.
    assert (repeated.reason, repeated.metadata["why"]) == ("STALE_ATTEMPT", "finished")
    assert isinstance(wire.error_from_report_result(stale_epoch), StaleAttempt)
    done = await api.tasks.Wait(pb.WaitRequest(**BOTH, task_id=ok, timeout=seconds(5)))
    assert (done.status, done.output) == (pb.STATUS_SUCCEEDED, b"out")
    # The refused reports changed nothing: the other attempt still runs, and reports.
    running = await api.tasks.Get(pb.GetRequest(task_id=refused))
    assert (running.status, running.attempt) == (pb.STATUS_RUNNING, 1)
    failure = pb.Failure(message="no", retryable=False)
    reply = await api.workers.ReportMany(
        pb.ReportManyRequest(reports=[pb.ReportRequest(token=other, failure=failure)])
    )
    assert list(reply.results) == [pb.ReportResult()]
    failed = await api.tasks.Wait(pb.WaitRequest(**BOTH, task_id=refused, timeout=seconds(5)))
    assert (failed.status, failed.message) == (
        pb.STATUS_FAILED,
        "attempt 1 failed (not retryable): no",
    )


async def test_heartbeat_many_answers_each_heartbeat_alone(api: Api, attach: Attacher) -> None:
    worker, epoch = await attach("beats", 2)
    renewed_id, cancelled_id = (
        await submitted(api, pool="beats"),
        await submitted(api, pool="beats"),
    )
    attempts = {}
    for _ in range(2):
        attempt = await worker.attempt()
        attempts[attempt.token.task_id] = attempt
    current, cancelled = attempts[renewed_id].token, attempts[cancelled_id].token
    await api.tasks.Cancel(pb.CancelRequest(task_id=cancelled_id, reason="stop it"))
    before = await api.tasks.Get(pb.GetRequest(task_id=renewed_id))
    reply = await api.workers.HeartbeatMany(
        pb.HeartbeatManyRequest(
            heartbeats=[
                pb.HeartbeatRequest(token=current),
                pb.HeartbeatRequest(token=token(epoch, renewed_id, 1)),  # without its lease id
                pb.HeartbeatRequest(),  # no token
                pb.HeartbeatRequest(token=cancelled),
            ]
        )
    )
    renewed, unknown, bad, cancel = reply.results
    assert renewed.WhichOneof("result") == "renewed"
    assert renewed.renewed.lease_expires_at.ToNanoseconds() >= (
        attempts[renewed_id].lease_expires_at.ToNanoseconds()
    )
    assert (renewed.renewed.cancel_requested, renewed.renewed.stopped) == (False, False)
    # Each refusal is the error a Heartbeat would have failed with.
    assert (unknown.refused.reason, unknown.refused.metadata["why"]) == ("STALE_ATTEMPT", "unknown")
    assert isinstance(wire.heartbeat_result_from_pb(unknown), StaleAttempt)
    assert (bad.refused.reason, bad.refused.message) == (
        "INVALID_ARGUMENT", "a heartbeat needs the token of its attempt",
    )  # fmt: skip
    assert (cancel.renewed.cancel_requested, cancel.renewed.cancel_reason) == (True, "stop it")
    assert wire.heartbeat_result_from_pb(cancel) == wire.lease_renewed_from_pb(cancel.renewed)
    # A token of a later leader's is no refusal for good (this replica may no longer lead):
    # the call fails as a whole, as a Heartbeat would, and the worker sends it all again.
    later = token(epoch + 1, renewed_id, 1, current.lease_id)
    err = await rejected(
        api.workers.HeartbeatMany(
            pb.HeartbeatManyRequest(
                heartbeats=[pb.HeartbeatRequest(token=current), pb.HeartbeatRequest(token=later)]
            )
        )
    )
    assert_status(err, Code.UNAVAILABLE, "NOT_APPLIED", "later leader")
    after = await api.tasks.Get(pb.GetRequest(task_id=renewed_id))
    assert (after.status, after.attempt) == (before.status, before.attempt)
    # The finished attempt's heartbeat is answered stale, as a Heartbeat's.
    await api.workers.Report(pb.ReportRequest(token=current, success=pb.Success()))
    reply = await api.workers.HeartbeatMany(
        pb.HeartbeatManyRequest(heartbeats=[pb.HeartbeatRequest(token=current)])
    )
    [finished] = reply.results
    assert (finished.refused.reason, finished.refused.metadata["why"]) == (
        "STALE_ATTEMPT", "finished",
    )  # fmt: skip
    failure = pb.Failure(message="cancelled", retryable=False)
    await api.workers.Report(pb.ReportRequest(token=cancelled, failure=failure))


# === 2. the bad inputs of tests/test_validation.py, in their wire form ============================


@dataclass(frozen=True, slots=True)
class Bad:
    id: str
    method: str
    request: Message
    code: grpc.StatusCode
    reason: str
    fragment: str


def bad(
    id: str, method: str, request: Message, fragment: str, reason: str = "INVALID_ARGUMENT",
    code: grpc.StatusCode = Code.INVALID_ARGUMENT,
) -> Bad:  # fmt: skip
    return Bad(id, method, request, code, reason, fragment)


def bad_submits() -> Iterator[Bad]:
    cases: list[tuple[str, dict[str, Any], str, str]] = [
        ("kind-nul", {"kind": "a\x00b"}, "kind must not contain NUL", "INVALID_ARGUMENT"),
        ("kind-empty", {"kind": ""}, "kind must not be empty", "INVALID_ARGUMENT"),
        ("kind-long", {"kind": "k" * 256}, "kind is 256 characters long; the limit is 255",
         "INVALID_ARGUMENT"),
        ("key-nul", {"key": "a\x00"}, "key must not contain NUL", "INVALID_ARGUMENT"),
        ("key-empty", {"key": ""}, "key must not be empty", "INVALID_ARGUMENT"),
        ("key-long", {"key": "k" * 1025}, "key is 1025 characters long; the limit is 1024",
         "INVALID_ARGUMENT"),
        ("tag-nul", {"tags": ["ok", "b\x00d"]}, "tag must not contain NUL", "INVALID_ARGUMENT"),
        ("tag-empty", {"tags": [""]}, "tag must not be empty", "INVALID_ARGUMENT"),
        ("tag-long", {"tags": ["t" * 256]}, "tag is 256 characters long", "INVALID_ARGUMENT"),
        ("tags-too-many", {"tags": ["t"] * 65}, "tags: more than 64 items given",
         "INVALID_ARGUMENT"),
        ("name-nul", {"name": "x\x00"}, "name must not contain NUL", "INVALID_ARGUMENT"),
        ("name-empty", {"name": ""}, "name must not be empty", "INVALID_ARGUMENT"),
        ("name-long", {"name": "n" * 256}, "name is 256 characters long", "INVALID_ARGUMENT"),
        ("pool-unknown", {"pool": "nope"}, "unknown pool 'nope'; configured: ", "UNKNOWN_POOL"),
        ("pool-empty", {"pool": ""}, "pool must not be empty", "INVALID_ARGUMENT"),
        ("pool-nul", {"pool": "de\x00fault"}, "pool must not contain NUL", "INVALID_ARGUMENT"),
        ("priority-huge", {"priority": INT64_MAX}, "priority must be between", "INVALID_ARGUMENT"),
        ("priority-negative", {"priority": INT64_MIN}, "priority must be between",
         "INVALID_ARGUMENT"),
        ("priority-above-int32", {"priority": 2**31}, "priority must be between",
         "INVALID_ARGUMENT"),
        ("timeout-negative", {"timeout": seconds(-1)}, "timeout must be > 0 seconds",
         "INVALID_ARGUMENT"),
        ("timeout-zero", {"timeout": seconds(0)}, "timeout must be > 0 seconds",
         "INVALID_ARGUMENT"),
        ("timeout-ten-years", {"timeout": seconds(10**12)}, "longer than ten years",
         "INVALID_ARGUMENT"),
        ("timeout-int64-max", {"timeout": seconds(INT64_MAX)}, "timeout of 9.22",
         "INVALID_ARGUMENT"),
        ("timeout-int64-min", {"timeout": seconds(INT64_MIN)}, "timeout must be > 0 seconds",
         "INVALID_ARGUMENT"),
        ("timeout-int64-max-nanos", {"timeout": seconds(INT64_MAX, 999_999_999)},
         "timeout of 9.22",
         "INVALID_ARGUMENT"),
        ("timeout-nanos-sign", {"timeout": seconds(1, -1)},
         "timeout: a Duration's nanos must be within", "INVALID_ARGUMENT"),
        ("timeout-nanos-range", {"timeout": seconds(0, 1_000_000_000)},
         "timeout: a Duration's nanos must be within", "INVALID_ARGUMENT"),
        ("grace-negative", {"grace": seconds(-5)}, "grace must be >= 0 seconds",
         "INVALID_ARGUMENT"),
        ("grace-huge", {"grace": seconds(INT64_MAX)}, "grace of 9.22",
         "INVALID_ARGUMENT"),
        ("grace-nanos", {"grace": seconds(-1, 5)}, "grace: a Duration's nanos", "INVALID_ARGUMENT"),
        ("start-negative-delay", {"start_delay": seconds(-3600)}, "start_at must be >= 0",
         "INVALID_ARGUMENT"),
        ("start-delay-4000-days", {"start_delay": seconds(4000 * 86400)},
         "start_at of 4000 days, 0:00:00 is longer", "INVALID_ARGUMENT"),
        ("start-delay-int64-max", {"start_delay": seconds(INT64_MAX)},
         "start_at: a delay of 9223372036854775807 seconds is beyond any date",
         "INVALID_ARGUMENT"),
        ("start-delay-nanos", {"start_delay": seconds(5, -5)}, "start_at: a Duration's nanos",
         "INVALID_ARGUMENT"),
        ("start-time-int64-max", {"start_time": instant(INT64_MAX)}, "outside years 1..9999",
         "INVALID_ARGUMENT"),
        ("start-time-int64-min", {"start_time": instant(INT64_MIN)}, "outside years 1..9999",
         "INVALID_ARGUMENT"),
        ("start-time-nanos", {"start_time": instant(2_000_000_000, -1)},
         "a Timestamp's nanos must be 0..999999999", "INVALID_ARGUMENT"),
        ("start-time-year-9999", {"start_time": instant(253_402_300_799, 999_999_999)},
         "more than ten years from now", "INVALID_ARGUMENT"),
        ("start-time-year-1", {"start_time": instant(-62_135_596_800)},
         "more than ten years from now", "INVALID_ARGUMENT"),
        ("deadline-before-start", {"start_delay": seconds(7200), "deadline_delay": seconds(3600)},
         "deadline must be after start_at", "INVALID_ARGUMENT"),
        ("deadline-at-start", {"start_time": instant(2_000_000_000),
                               "deadline_time": instant(2_000_000_000)},
         "deadline must be after start_at", "INVALID_ARGUMENT"),
        ("deadline-time-range", {"deadline_time": instant(10**15)},
         "deadline: a Timestamp of 1000000000000000 seconds since 1970 is outside years 1..9999",
         "INVALID_ARGUMENT"),
        ("deadline-negative-delay", {"deadline_delay": seconds(-1)}, "deadline must be >= 0",
         "INVALID_ARGUMENT"),
        ("miss-policy-unknown", {"miss_policy": 99}, "miss_policy is an unknown value (99)",
         "INVALID_ARGUMENT"),
        ("miss-policy-negative", {"miss_policy": -1}, "miss_policy is an unknown value (-1)",
         "INVALID_ARGUMENT"),
        ("after-zero", {"after": [0]}, "a dependency id must be between 1 and",
         "INVALID_ARGUMENT"),
        ("after-negative", {"after": [INT64_MIN]}, "a dependency id must be between 1 and",
         "INVALID_ARGUMENT"),
        ("after-never-issued", {"after": [2**62]}, f"depends on task {2**62}, which was never",
         "UNKNOWN_DEPENDENCY"),
        ("after-too-many", {"after": list(range(1, 1002))}, "after: more than 1000 items given",
         "INVALID_ARGUMENT"),
        ("retry-zero-attempts", {"retry": pb.RetryPolicy(max_attempts=0)},
         "max_attempts must be 1..1000, got 0", "INVALID_ARGUMENT"),
        ("retry-huge-attempts", {"retry": pb.RetryPolicy(max_attempts=INT64_MAX)},
         "max_attempts must be 1..1000", "INVALID_ARGUMENT"),
        ("retry-initial-above-max", {"retry": pb.RetryPolicy(initial=seconds(10),
                                                             maximum=seconds(1))},
         "initial <= max", "INVALID_ARGUMENT"),
        ("retry-jitter", {"retry": pb.RetryPolicy(jitter=2.0)}, "jitter must be 0..1",
         "INVALID_ARGUMENT"),
        ("retry-jitter-nan", {"retry": pb.RetryPolicy(jitter=float("nan"))},
         "jitter must be 0..1", "INVALID_ARGUMENT"),
        ("retry-multiplier-nan", {"retry": pb.RetryPolicy(multiplier=float("nan"))},
         "multiplier must be 1..100, got nan", "INVALID_ARGUMENT"),
        ("retry-multiplier-inf", {"retry": pb.RetryPolicy(multiplier=float("inf"))},
         "multiplier must be 1..100", "INVALID_ARGUMENT"),
        ("retry-initial-negative", {"retry": pb.RetryPolicy(initial=seconds(-1))},
         "backoff must satisfy 0 <= initial <= max",
         "INVALID_ARGUMENT"),
        ("retry-maximum-huge", {"retry": pb.RetryPolicy(maximum=seconds(INT64_MAX))},
         "max_ns=an int of 93 bits",
         "INVALID_ARGUMENT"),
        ("retry-initial-nanos", {"retry": pb.RetryPolicy(initial=seconds(1, -1))},
         "retry initial: a Duration's nanos", "INVALID_ARGUMENT"),
    ]  # fmt: skip
    for id, fields, fragment, reason in cases:
        yield bad(f"Submit-{id}", "Submit", submit(**fields), fragment, reason)
        # SubmitMany refuses the whole batch when one of its tasks is bad.
        many = pb.SubmitManyRequest(tasks=[task(), task(**fields), task()])
        yield bad(f"SubmitMany-{id}", "SubmitMany", many, fragment, reason)


def bad_others() -> Iterator[Bad]:
    nul_statuses = pb.StatusFilter(statuses=[pb.STATUS_UNSPECIFIED])
    yield from [
        bad("Submit-no-task", "Submit", pb.SubmitRequest(), "kind must not be empty"),
        bad("SubmitMany-too-many", "SubmitMany",
            pb.SubmitManyRequest(tasks=[task(kind="j")] * (MANY + 1)),
            f"SubmitMany: {MANY + 1} tasks in one call; the server takes at most {MANY} per call"),
        bad("SubmitMany-too-many-compact", "SubmitMany",
            pb.SubmitManyRequest(common=task(kind="j"), payloads=[b"p"] * (MANY + 1)),
            f"SubmitMany: {MANY + 1} tasks in one call"),
        # Checked before any task is decoded: these dependencies were never issued.
        bad("SubmitMany-too-many-dependencies", "SubmitMany",
            pb.SubmitManyRequest(tasks=[task(after=[2**62] * (PER_TASK + 1))] * MANY),
            f"its tasks name {(PER_TASK + 1) * MANY} dependencies in all; the server takes at "
            f"most {REFERENCES} per call"),
        bad("SubmitMany-too-many-dependencies-compact", "SubmitMany",
            pb.SubmitManyRequest(common=task(after=[2**62] * (PER_TASK + 1)),
                                 payloads=[b"p"] * MANY),
            f"name {(PER_TASK + 1) * MANY} dependencies in all"),
        bad("SubmitMany-too-many-tags", "SubmitMany",
            pb.SubmitManyRequest(tasks=[task(tags=["t"] * (PER_TASK + 1))] * MANY),
            f"name {(PER_TASK + 1) * MANY} tags in all"),
        bad("SubmitEach-too-many", "SubmitEach",
            pb.SubmitEachRequest(submissions=[submit(kind="j")] * (MANY + 1)),
            f"SubmitEach: {MANY + 1} submissions in one call; the server takes at most {MANY} "
            "per call"),
        bad("SubmitEach-too-many-dependencies", "SubmitEach",
            pb.SubmitEachRequest(submissions=[submit(after=[2**62] * (PER_TASK + 1))] * MANY),
            f"SubmitEach: its tasks name {(PER_TASK + 1) * MANY} dependencies in all; the "
            f"server takes at most {REFERENCES} per call"),
        bad("SubmitEach-too-many-tags", "SubmitEach",
            pb.SubmitEachRequest(submissions=[submit(tags=["t"] * (PER_TASK + 1))] * MANY),
            f"name {(PER_TASK + 1) * MANY} tags in all"),
        bad("Get-zero", "Get", pb.GetRequest(task_id=0), "task_id must be between 1 and"),
        bad("Get-negative", "Get", pb.GetRequest(task_id=INT64_MIN), "task_id must be between"),
        bad("Get-unknown", "Get", pb.GetRequest(task_id=12345), "no task 12345", "TASK_NOT_FOUND",
            Code.NOT_FOUND),
        bad("Get-never-issued", "Get", pb.GetRequest(task_id=INT64_MAX), str(INT64_MAX),
            "TASK_NOT_FOUND", Code.NOT_FOUND),
        bad("GetByKey-empty", "GetByKey", pb.GetByKeyRequest(), "key must not be empty"),
        bad("GetByKey-nul", "GetByKey", pb.GetByKeyRequest(key="\x00"), "key must not contain NUL"),
        bad("GetByKey-long", "GetByKey", pb.GetByKeyRequest(key="k" * 1025),
            "key is 1025 characters long"),
        bad("List-unspecified-status", "List", pb.ListRequest(statuses=nul_statuses),
            "a status of the filter is unspecified"),
        bad("List-unknown-status", "List",
            pb.ListRequest(
                statuses=pb.StatusFilter(statuses=[pb.STATUS_READY, pb.Status.ValueType(77)])),
            "a status of the filter is an unknown value (77)"),
        bad("List-empty-pool", "List", pb.ListRequest(pool=""), "pool must not be empty"),
        bad("List-nul-kind", "List", pb.ListRequest(kind="\x00"), "kind must not contain NUL"),
        bad("List-long-tag", "List", pb.ListRequest(tag="t" * 256), "tag is 256 characters"),
        bad("List-page-size-zero", "List", pb.ListRequest(page_size=0),
            "limit must be between 1 and"),
        bad("List-page-size-negative", "List", pb.ListRequest(page_size=-1),
            "limit must be between 1 and"),
        bad("List-page-token-garbage", "List", pb.ListRequest(page_token="abc"),
            "page_token must be the next_page_token of an earlier page"),
        bad("List-page-token-spaces", "List", pb.ListRequest(page_token=" 12"),
            "page_token must be the next_page_token"),
        bad("List-page-token-long", "List", pb.ListRequest(page_token="9" * 5000),
            "page_token must be the next_page_token"),
        bad("List-page-token-negative", "List", pb.ListRequest(page_token="-5"),
            "after must be between 0 and"),
        bad("List-page-token-above-int64", "List", pb.ListRequest(page_token="9" * 19),
            "after must be between 0 and"),
        bad("Wait-zero", "Wait", pb.WaitRequest(task_id=0), "task_id must be between 1 and"),
        bad("Wait-unknown", "Wait", pb.WaitRequest(task_id=12345), "no task 12345",
            "TASK_NOT_FOUND", Code.NOT_FOUND),
        bad("Wait-timeout-negative", "Wait", pb.WaitRequest(task_id=1, timeout=seconds(-1)),
            "timeout must be >= 0 seconds"),
        bad("Wait-timeout-ten-years", "Wait", pb.WaitRequest(task_id=1, timeout=seconds(10**12)),
            "is longer than ten years"),
        bad("Wait-timeout-int64-max", "Wait",
            pb.WaitRequest(task_id=1, timeout=seconds(INT64_MAX)),
            "timeout of 9.22"),
        bad("Wait-timeout-nanos", "Wait", pb.WaitRequest(task_id=1, timeout=seconds(-1, 1)),
            "timeout: a Duration's nanos"),
        bad("Cancel-zero", "Cancel", pb.CancelRequest(task_id=0), "task_id must be between 1"),
        bad("Cancel-unknown", "Cancel", pb.CancelRequest(task_id=12345), "12345",
            "TASK_NOT_FOUND", Code.NOT_FOUND),
        bad("Cancel-reason-nul", "Cancel", pb.CancelRequest(task_id=12345, reason="\x00"),
            "reason must not contain NUL"),
        bad("Cancel-reason-empty", "Cancel", pb.CancelRequest(task_id=12345, reason=""),
            "reason must not be empty"),
        bad("Cancel-reason-long", "Cancel", pb.CancelRequest(task_id=12345, reason="r" * 4097),
            "reason is 4097 characters long; the limit is 4096"),
        bad("AddSchedule-cron-61", "AddSchedule", schedule(cron="61 * * * *"), "61 * * * *",
            "INVALID_CRON"),
        bad("AddSchedule-cron-3-fields", "AddSchedule", schedule(cron="* * *"),
            "has 3 fields; expected 5", "INVALID_CRON"),
        bad("AddSchedule-cron-never", "AddSchedule", schedule(cron="0 0 30 2 *"), "never",
            "INVALID_CRON"),
        bad("AddSchedule-cron-empty", "AddSchedule", schedule(cron=""), "is empty", "INVALID_CRON"),
        bad("AddSchedule-cron-nul", "AddSchedule", schedule(cron="* * * * *\x00"),
            "contains a NUL character", "INVALID_CRON"),
        bad("AddSchedule-zone-mars", "AddSchedule", schedule(timezone="Mars/Olympus"),
            "unknown time zone 'Mars/Olympus'", "UNKNOWN_TIME_ZONE"),
        bad("AddSchedule-zone-path", "AddSchedule", schedule(timezone="../etc/passwd"),
            "unknown time zone", "UNKNOWN_TIME_ZONE"),
        bad("AddSchedule-zone-empty", "AddSchedule", schedule(timezone=""), "unknown time zone ''",
            "UNKNOWN_TIME_ZONE"),
        bad("AddSchedule-pool-gone", "AddSchedule", schedule(pool="gone"), "unknown pool 'gone'",
            "UNKNOWN_POOL"),
        bad("AddSchedule-name-nul", "AddSchedule", schedule(name="s\x00"),
            "schedule name must not contain NUL"),
        bad("AddSchedule-name-empty", "AddSchedule", schedule(name=""),
            "schedule name must not be empty"),
        bad("AddSchedule-name-long", "AddSchedule", schedule(name="s" * 256),
            "schedule name is 256 characters long"),
        bad("AddSchedule-kind-empty", "AddSchedule", schedule(kind=""), "kind must not be empty"),
        bad("AddSchedule-tags-too-many", "AddSchedule", schedule(tags=["t"] * 65),
            "tags: more than 64 items given"),
        bad("AddSchedule-tag-nul", "AddSchedule", schedule(tags=["\x00"]), "tag must not contain"),
        bad("AddSchedule-priority", "AddSchedule", schedule(priority=INT64_MIN),
            "priority must be between"),
        bad("AddSchedule-overlap", "AddSchedule", schedule(overlap=5),
            "overlap is an unknown value (5)"),
        bad("AddSchedule-catch-up", "AddSchedule", schedule(catch_up=-3),
            "catch_up is an unknown value (-3)"),
        bad("AddSchedule-grace-negative", "AddSchedule", schedule(grace=seconds(-1)),
            "grace must be >= 0 seconds"),
        bad("AddSchedule-grace-huge", "AddSchedule", schedule(grace=seconds(INT64_MAX)),
            "grace of 9.22"),
        bad("AddSchedule-timeout-zero", "AddSchedule", schedule(timeout=seconds(0)),
            "timeout must be > 0 seconds"),
        bad("AddSchedule-timeout-nanos", "AddSchedule",
            schedule(timeout=seconds(0, -1_000_000_000)), "timeout: a Duration's nanos"),
        bad("AddSchedule-retry", "AddSchedule", schedule(retry=pb.RetryPolicy(max_attempts=0)),
            "max_attempts must be 1..1000"),
        *[
            bad(f"{method}-{what}", method, request, fragment, reason, code)
            for method in ("PauseSchedule", "ResumeSchedule", "RemoveSchedule")
            for what, request, fragment, reason, code in [
                ("unknown", pb.PauseScheduleRequest(name="x"), "no schedule named 'x'",
                 "SCHEDULE_NOT_FOUND", Code.NOT_FOUND),
                ("empty", pb.PauseScheduleRequest(), "schedule name must not be empty",
                 "INVALID_ARGUMENT", Code.INVALID_ARGUMENT),
                ("nul", pb.PauseScheduleRequest(name="\x00"), "schedule name must not contain NUL",
                 "INVALID_ARGUMENT", Code.INVALID_ARGUMENT),
            ]
        ],
        bad("PreviewSchedule-cron", "PreviewSchedule", pb.PreviewScheduleRequest(cron="* * *"),
            "has 3 fields", "INVALID_CRON"),
        bad("PreviewSchedule-zone", "PreviewSchedule",
            pb.PreviewScheduleRequest(cron="* * * * *", timezone="Mars/Olympus"),
            "unknown time zone", "UNKNOWN_TIME_ZONE"),
        bad("PreviewSchedule-n-zero", "PreviewSchedule",
            pb.PreviewScheduleRequest(cron="* * * * *", n=0), "n must be between 1 and"),
        bad("PreviewSchedule-n-huge", "PreviewSchedule",
            pb.PreviewScheduleRequest(cron="* * * * *", n=INT64_MAX), "n must be between 1 and"),
        bad("PreviewSchedule-after-range", "PreviewSchedule",
            pb.PreviewScheduleRequest(cron="* * * * *", after=instant(INT64_MAX)),
            "outside years 1..9999"),
        bad("PreviewSchedule-after-far", "PreviewSchedule",
            pb.PreviewScheduleRequest(cron="* * * * *", after=instant(253_402_300_000)),
            "after 9999-12-31T23:46:40 (UTC offset 0:00:00) is more than ten years from now"),
        bad("PreviewSchedule-beyond-2262", "PreviewSchedule",
            pb.PreviewScheduleRequest(cron="0 0 1 1 *", n=10_000),
            "the end of the int64 nanosecond range"),
        bad("Attach-unknown-pool", "Attach", pb.AttachRequest(pools=["nope"], slots=1),
            "unknown pool 'nope'", "UNKNOWN_POOL"),
        bad("Attach-no-pool", "Attach", pb.AttachRequest(slots=1),
            "a worker must attach to at least one pool"),
        bad("Attach-empty-pool", "Attach", pb.AttachRequest(pools=[""], slots=1),
            "pool must not be empty"),
        bad("Attach-slots-zero", "Attach", pb.AttachRequest(pools=["attach"]),
            "slots must be between 1 and 10000, got 0"),
        bad("Attach-slots-huge", "Attach", pb.AttachRequest(pools=["attach"], slots=INT64_MAX),
            "a worker may have at most 10000 slots"),
        bad("Attach-slots-negative", "Attach", pb.AttachRequest(pools=["attach"], slots=-1),
            "slots must be between 1 and 10000, got -1"),
        # A worker may name more running attempts than its slots (it asks for fewer now): not
        # bad input. Past the most slots any worker may have, it is. Each needs its lease id.
        bad("Attach-running-endless", "Attach",
            pb.AttachRequest(pools=["attach"], slots=1, running=[token(1, 1, 1)] * 10_001),
            "with 10001 running"),
        bad("Attach-running-without-its-lease-id", "Attach",
            pb.AttachRequest(pools=["attach"], slots=1, running=[token(1, 1, 1, b"short")]),
            "lease_id is 5 bytes long; a lease id is 16 bytes"),
        bad("Attach-running-zero-token", "Attach",
            pb.AttachRequest(pools=["attach"], slots=1, running=[token(0, 0, 0)]),
            "token epoch must be between 1"),
        bad("Attach-message-limit-below-the-servers", "Attach",
            pb.AttachRequest(pools=["attach"], slots=1, max_message_bytes=LIMIT - 1),
            f"this worker accepts messages of at most {LIMIT - 1} bytes, below the server's "
            f"limit of {LIMIT}"),
        bad("Attach-negative-message-limit", "Attach",
            pb.AttachRequest(pools=["attach"], slots=1, max_message_bytes=-1),
            "max_message_bytes must be >= 0 (0: unknown), got -1"),
        bad("Heartbeat-no-token", "Heartbeat", pb.HeartbeatRequest(),
            "a heartbeat needs the token of its attempt"),
        bad("Heartbeat-zero-token", "Heartbeat", pb.HeartbeatRequest(token=token(0, 0, 0)),
            "token epoch must be between 1"),
        bad("Heartbeat-attempt-huge", "Heartbeat",
            pb.HeartbeatRequest(token=token(1, 1, INT64_MAX)), "token attempt must be between 1"),
        bad("Report-no-token", "Report", pb.ReportRequest(success=pb.Success()),
            "a report needs the token of its attempt"),
        bad("Report-no-outcome", "Report", pb.ReportRequest(token=token(1, 1, 1)),
            "a report needs an outcome: success or failure"),
        bad("Report-negative-task", "Report",
            pb.ReportRequest(token=token(1, -1, 1), success=pb.Success()),
            "token task_id must be between 1"),
        bad("Report-retry-after-negative", "Report",
            pb.ReportRequest(token=token(1, 1, 1), failure=pb.Failure(retry_after=seconds(-1))),
            "retry_after must be 0..316224000 seconds"),
        bad("Report-retry-after-huge", "Report",
            pb.ReportRequest(token=token(1, 1, 1),
                             failure=pb.Failure(retry_after=seconds(INT64_MAX))),
            "retry_after must be 0..316224000 seconds"),
        bad("Report-retry-after-nanos", "Report",
            pb.ReportRequest(token=token(1, 1, 1), failure=pb.Failure(retry_after=seconds(1, -1))),
            "retry_after: a Duration's nanos"),
        bad("ReportMany-too-many", "ReportMany",
            pb.ReportManyRequest(reports=[pb.ReportRequest(token=token(1, 1, 1))] * 1001),
            "reports: 1001 given; the limit is 1000"),
        bad("HeartbeatMany-too-many", "HeartbeatMany",
            pb.HeartbeatManyRequest(heartbeats=[pb.HeartbeatRequest(token=token(1, 1, 1))] * 1001),
            "heartbeats: 1001 given; the limit is 1000"),
        bad("Report-unknown-task", "Report",
            pb.ReportRequest(token=token(1, 10**15, 1), success=pb.Success()),
            "unknown with this lease id", "STALE_ATTEMPT", Code.FAILED_PRECONDITION),
    ]  # fmt: skip


BAD = [*bad_submits(), *bad_others()]


WORKER_METHODS = ("Heartbeat", "HeartbeatMany", "Report", "ReportMany")


def invoke(api: Api, method: str, request: Message, **kwargs: Any) -> Awaitable[Any]:
    """The call; for Attach (a stream), its first event."""
    if method == "Attach":
        assert isinstance(request, pb.AttachRequest)
        stream = api.workers.Attach(request, **kwargs)

        async def first() -> Any:
            try:
                return await stream.read()
            finally:
                stream.cancel()

        return first()
    stub = api.workers if method in WORKER_METHODS else api.tasks
    result: Awaitable[Any] = getattr(stub, method)(request, **kwargs)
    return result


@pytest.mark.parametrize("case", BAD, ids=[case.id for case in BAD])
async def test_bad_input_gets_its_precise_status_and_changes_nothing(api: Api, case: Bad) -> None:
    before = await state(api)
    err = await rejected(invoke(api, case.method, case.request, timeout=CALL_TIMEOUT))
    metadata = {"why": "unknown"} if case.reason == "STALE_ATTEMPT" else {}
    assert_status(err, case.code, case.reason, case.fragment, **metadata)
    assert wire.outcome(err) is wire.Outcome.ANSWERED
    assert await state(api) == before  # a good call, and nothing was applied


async def test_bad_cancel_reasons_for_a_real_task_change_nothing(api: Api) -> None:
    task_id = await submitted(api, **LATER)
    before = await state(api)
    for reason, fragment in [("\x00", "NUL"), ("", "empty"), ("r" * 4097, "4097")]:
        err = await rejected(api.tasks.Cancel(pb.CancelRequest(task_id=task_id, reason=reason)))
        assert_status(err, Code.INVALID_ARGUMENT, "INVALID_ARGUMENT", fragment)
    assert await state(api) == before
    assert (await api.tasks.Get(pb.GetRequest(task_id=task_id))).status == pb.STATUS_SCHEDULED
    await api.tasks.Cancel(pb.CancelRequest(task_id=task_id))


async def test_messages_above_the_size_limit_are_resource_exhausted(api: Api) -> None:
    """gRPC itself refuses a request above max_message_bytes: RESOURCE_EXHAUSTED with no
    ErrorInfo, which the client reads as a definite answer (PayloadError), nothing applied.
    A request that fits whose attempt would not is refused by the server (PAYLOAD_ERROR,
    naming the largest payload that fits), and that payload is accepted."""
    kind = unique("big")
    # Payloads of about LIMIT bytes all have length prefixes of the same size.
    near = LIMIT - 100
    largest = LIMIT - (
        len(submit(kind=kind, payload=b"x" * near, **LATER).SerializeToString()) - near
    )
    before = await state(api)
    for request in (
        submit(kind=kind, payload=b"x" * LIMIT, **LATER),
        pb.SubmitManyRequest(tasks=[task(kind=kind, payload=b"x" * (LIMIT // 2))] * 2),
        pb.SubmitEachRequest(submissions=[submit(kind=kind, payload=b"x" * (LIMIT // 2))] * 2),
        schedule(name=kind, payload=b"x" * LIMIT),
        pb.ReportRequest(token=token(1, 1, 1), success=pb.Success(output=b"x" * LIMIT)),
        pb.ReportManyRequest(
            reports=[
                pb.ReportRequest(
                    token=token(1, 1, 1), success=pb.Success(output=b"x" * (LIMIT // 2))
                )
            ]
            * 2
        ),
    ):
        method = {
            pb.SubmitRequest: "Submit", pb.SubmitManyRequest: "SubmitMany",
            pb.SubmitEachRequest: "SubmitEach",
            pb.AddScheduleRequest: "AddSchedule", pb.ReportRequest: "Report",
            pb.ReportManyRequest: "ReportMany",
        }[type(request)]  # fmt: skip
        err = await rejected(invoke(api, method, request, timeout=CALL_TIMEOUT))
        assert err.code() is Code.RESOURCE_EXHAUSTED, err
        assert wire.error_info(err) is None
        assert "larger than max" in (err.details() or "")
        assert wire.outcome(err) is wire.Outcome.ANSWERED
        assert isinstance(wire.error_from_rpc(err), PayloadError)
    assert await state(api) == before
    fits = submit(kind=kind, payload=b"x" * largest, **LATER)
    assert len(fits.SerializeToString()) == LIMIT
    err = await rejected(api.tasks.Submit(fits))
    assert_status(err, Code.INVALID_ARGUMENT, "PAYLOAD_ERROR", "cannot be sent to a worker")
    room = int((err.details() or "").split("payload may be at most ")[1].split()[0])
    assert LIMIT - 200 < room < largest  # the attempt's own fields take this little
    task_id = (await api.tasks.Submit(submit(kind=kind, payload=b"x" * room, **LATER))).task_id
    err = await rejected(api.tasks.Submit(submit(kind=kind, payload=b"x" * (largest + 1), **LATER)))
    assert err.code() is Code.RESOURCE_EXHAUSTED
    await api.tasks.Cancel(pb.CancelRequest(task_id=task_id))
    assert [t.task_id for t in (await api.tasks.List(pb.ListRequest(kind=kind))).tasks] == [task_id]


# === 4. health, reflection and HTTP ===============================================================


async def test_health_serves_on_the_leader(api: Api) -> None:
    check = api.channel.unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
        response_deserializer=health_pb2.HealthCheckResponse.FromString,
    )
    for service in ("", "cronoq.v1.SchedulerService", "cronoq.v1.WorkerService"):
        reply = await check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    err = await rejected(check(health_pb2.HealthCheckRequest(service="no.Such")))
    assert err.code() is Code.NOT_FOUND


async def test_reflection_lists_and_describes_the_services(api: Api) -> None:
    info = api.channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="cronoq.v1.WorkerService"),
    ]
    replies = [reply async for reply in info(iter(requests))]
    listed = {s.name for s in replies[0].list_services_response.service}
    assert {
        "cronoq.v1.SchedulerService",
        "cronoq.v1.WorkerService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= listed
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(data)
        for data in replies[1].file_descriptor_response.file_descriptor_proto
    ]
    [ours] = [f for f in files if f.package == "cronoq.v1"]
    services = {s.name: [m.name for m in s.method] for s in ours.service}
    assert services["WorkerService"] == ["Attach", *WORKER_METHODS]
    assert "PreviewSchedule" in services["SchedulerService"]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=CALL_TIMEOUT) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def _submitted_total(server: ServerProcess, pool: str) -> float:
    status, body = await asyncio.to_thread(_get, f"{server.http}/metrics")
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name == "cronoq_tasks_submitted_total" and sample.labels == {"pool": pool}:
                return sample.value
    return 0.0


async def test_http_health_readiness_and_metrics(server: ServerProcess, api: Api) -> None:
    assert await asyncio.to_thread(_get, f"{server.http}/healthz") == (200, b'{"status":"alive"}')
    status, body = await asyncio.to_thread(_get, f"{server.http}/readyz")
    assert status == 200
    assert json.loads(body) == {"ready": True, "reason": "leading"}
    before = await _submitted_total(server, "default")
    task_id = await submitted(api, **LATER)
    assert await _submitted_total(server, "default") == before + 1
    await api.tasks.Cancel(pb.CancelRequest(task_id=task_id))


# === 3. hypothesis: arbitrary bytes and arbitrary field values at every method ====================

METHODS = [
    (service, method)
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]
ANSWERED_CODES = frozenset(Code) - {Code.INTERNAL, Code.UNKNOWN}
FUZZ_DEADLINE = 1.0
"""Per call: a valid Wait or Attach would otherwise last; DEADLINE_EXCEEDED is an answer."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServerProcess]:
    """A server of its own: what the fuzzing submits and attaches must not reach other tests."""
    async with _leading(tmp_path_factory.mktemp("fuzz"), MEMORY) as running:
        yield running


VALID: dict[str, Message] = {
    "Submit": submit(pool="fuzz", **LATER),
    "SubmitMany": pb.SubmitManyRequest(tasks=[task(pool="fuzz", **LATER)]),
    "SubmitEach": pb.SubmitEachRequest(
        submissions=[submit(pool="fuzz", **LATER), submit(pool="fuzz", key="k", **LATER)]
    ),
    "GetByKey": pb.GetByKeyRequest(key="k"),
    "List": pb.ListRequest(kind="job", page_size=2),
    "Wait": pb.WaitRequest(task_id=1, timeout=seconds(0)),
    "AddSchedule": schedule(name="fuzzed", pool="fuzz", replace=True),
    "PreviewSchedule": pb.PreviewScheduleRequest(cron="* * * * *", n=3),
    "Attach": pb.AttachRequest(pools=["fuzz"], slots=1),
    "Heartbeat": pb.HeartbeatRequest(token=token(1, 1, 1)),
    "Report": pb.ReportRequest(token=token(1, 1, 1), success=pb.Success()),
    "ReportMany": pb.ReportManyRequest(
        reports=[pb.ReportRequest(token=token(1, 1, 1), success=pb.Success())]
    ),
    "HeartbeatMany": pb.HeartbeatManyRequest(
        heartbeats=[pb.HeartbeatRequest(token=token(1, 1, 1))]
    ),
    "Explain": pb.ExplainRequest(task_id=1),
    "ListOccurrences": pb.ListOccurrencesRequest(name="fuzzed", limit=3),
    "GetAttempts": pb.GetAttemptsRequest(task_id=1),
    "GetDependants": pb.GetDependantsRequest(task_id=1),
    "Rerun": pb.RerunRequest(task_id=1),
}
"""A valid request of each method with arguments, for the fuzzing to vary a field or two of."""

READS = ("Get", "GetByKey", "Wait", "GetTaskData")
"""The calls that send a task's payload and output, each only when asked."""


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def read_bases(fuzz_server: ServerProcess) -> dict[str, Message]:
    """Valid requests of the READS naming a task of the fuzz server that succeeded with a
    payload and an output too large to be sent together, the output as large as its report
    could carry (too large to be sent with the rest of the task): every combination of the
    fields that ask for them (and GetTaskData's choice) gets past the lookup to the omission
    rules."""
    key = unique("fuzz-read")
    async with _api(fuzz_server) as api:
        task_id = await submitted(api, pool="large", key=key, payload=b"p" * (LIMIT // 2))
        worker = Worker(api, ["large"])
        try:
            assert (await worker.event()).WhichOneof("event") == "attached"
            attempt = await worker.attempt()
            # Less the report's other fields, and the two length prefixes' growth.
            room = LIMIT - pb.ReportRequest(token=attempt.token, success=pb.Success()).ByteSize()
            success = pb.Success(output=b"o" * (room - 8))
            await api.workers.Report(pb.ReportRequest(token=attempt.token, success=success))
        finally:
            worker.close()
    both = {"include_payload": True, "include_output": True}
    return {
        "Get": pb.GetRequest(task_id=task_id, **both),
        "GetByKey": pb.GetByKeyRequest(key=key, **both),
        "Wait": pb.WaitRequest(task_id=task_id, timeout=seconds(0), **both),
        "GetTaskData": pb.GetTaskDataRequest(task_id=task_id, data=pb.TASK_DATA_OUTPUT),
    }


def _sync_call(channel: grpc.Channel, method: Any, data: bytes) -> grpc.StatusCode:
    """One call with these request bytes; its status (OK for an answer), never INTERNAL or
    UNKNOWN."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    code, details = Code.OK, ""
    try:
        if method.server_streaming:
            stream: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(path)
            events = stream(data, timeout=FUZZ_DEADLINE)
            try:
                next(events)  # the first event, or the call's error
            finally:
                events.cancel()
        else:
            unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(path)
            unary(data, timeout=FUZZ_DEADLINE)
    except grpc.RpcError as exc:
        if isinstance(exc, grpc.Call):
            code, details = exc.code(), exc.details() or ""
        else:
            code, details = Code.UNKNOWN, repr(exc)
    if code is Code.CANCELLED and method.server_streaming:
        return Code.OK  # our own cancel of a stream that answered
    assert code in ANSWERED_CODES, (path, data, code, details)
    return code


def _serves(channel: grpc.Channel) -> None:
    reply = pb_grpc.SchedulerServiceStub(channel).Submit(
        submit(kind="still-serving"), timeout=CALL_TIMEOUT
    )
    assert reply.task_id > 0


@pytest.mark.parametrize("method", [m for _, m in METHODS], ids=lambda m: m.name)
async def test_undecodable_requests_are_invalid_argument(api: Api, method: Any) -> None:
    path = f"/{method.containing_service.full_name}/{method.name}"
    # A field number of wire type 7 (none is), and a length-delimited field cut short.
    for data in (b"\xff\xff\xff", b"\x0a\x05ab"):
        before = await state(api)
        if method.server_streaming:
            stream: grpc.aio.UnaryStreamMultiCallable[bytes, bytes]
            stream = api.channel.unary_stream(path)
            err = await rejected(stream(data, timeout=CALL_TIMEOUT).read())
        else:
            unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]
            unary = api.channel.unary_unary(path)
            err = await rejected(unary(data, timeout=CALL_TIMEOUT))
        assert_status(err, Code.INVALID_ARGUMENT, "INVALID_ARGUMENT", method.input_type.name)
        assert await state(api) == before


def _raw(method: Any) -> st.SearchStrategy[bytes]:
    """Any bytes, or a valid-looking request cut anywhere and followed by a few any bytes."""
    encoded = messages(method.input_type).map(lambda m: m.SerializeToString())
    spliced = st.tuples(encoded, st.integers(0, 64), st.binary(max_size=4)).map(
        lambda parts: parts[0][: parts[1]] + parts[2]
    )
    return st.binary(max_size=64) | spliced


_FUZZ_SETTINGS = settings(
    max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), database=None
)
"""Each fuzz test: calls on a real server from a thread, no example database."""


async def test_arbitrary_bytes_never_get_internal_or_unknown(fuzz_server: ServerProcess) -> None:
    def fuzz() -> None:
        with grpc.insecure_channel(fuzz_server.target) as channel:

            @_FUZZ_SETTINGS
            @given(st.data())
            def check(data: st.DataObject) -> None:
                _, method = data.draw(st.sampled_from(METHODS))
                _sync_call(channel, method, data.draw(_raw(method)))

            check()
            _serves(channel)

    await asyncio.to_thread(fuzz)


async def test_arbitrary_field_values_never_get_internal_or_unknown(
    fuzz_server: ServerProcess, read_bases: dict[str, Message]
) -> None:
    bases = {**VALID, **read_bases}

    def fuzz() -> None:
        with grpc.insecure_channel(fuzz_server.target) as channel:

            @_FUZZ_SETTINGS
            @given(st.data())
            def check(data: st.DataObject) -> None:
                _, method = data.draw(st.sampled_from(METHODS))
                anything = messages(method.input_type)
                base = bases.get(method.name)
                request = data.draw(anything if base is None else anything | variations(base))
                _sync_call(channel, method, request.SerializeToString())

            check()
            _serves(channel)

    await asyncio.to_thread(fuzz)


async def test_arbitrary_reads_of_a_large_task_never_get_internal_or_unknown(
    fuzz_server: ServerProcess, read_bases: dict[str, Message]
) -> None:
    """The fields that ask for a payload and an output (Get, GetByKey, Wait) and GetTaskData's
    choice, varied around a task whose payload and output do not fit in one message: each
    answer fits the limit (a reply over it fails the call RESOURCE_EXHAUSTED)."""
    methods = {m.name: m for _, m in METHODS if m.name in READS}

    def fuzz() -> None:
        with grpc.insecure_channel(fuzz_server.target) as channel:

            @_FUZZ_SETTINGS
            @given(st.data())
            def check(data: st.DataObject) -> None:
                name = data.draw(st.sampled_from(READS))
                request = data.draw(variations(read_bases[name]))
                code = _sync_call(channel, methods[name], request.SerializeToString())
                assert code is not Code.RESOURCE_EXHAUSTED, request

            check()
            _serves(channel)

    await asyncio.to_thread(fuzz)


# === the happy path again, on SQLite ==============================================================


async def happy_path(api: Api) -> None:
    """Each call once, as a client and a worker use them."""
    key = unique("key")
    task_id = await submitted(api, pool="attach", payload=b"in", key=key, tags=["t"])
    assert (await api.tasks.Get(pb.GetRequest(task_id=task_id))).status == pb.STATUS_READY
    assert (await api.tasks.GetByKey(pb.GetByKeyRequest(key=key))).task.task_id == task_id
    many = await api.tasks.SubmitMany(
        pb.SubmitManyRequest(tasks=[task(**LATER), task(after=[task_id], **LATER)])
    )
    page = await api.tasks.List(pb.ListRequest(tag="t"))
    assert [t.task_id for t in page.tasks] == [task_id]
    first_page = await api.tasks.List(pb.ListRequest(page_size=1))
    assert first_page.next_page_token == str(task_id)
    assert (
        await api.tasks.Cancel(pb.CancelRequest(task_id=many.task_ids[0]))
    ).status == pb.STATUS_CANCELLED
    worker = Worker(api, ["attach"])
    try:
        assert (await worker.event()).WhichOneof("event") == "attached"
        attempt = await worker.attempt()
        assert attempt.token.task_id == task_id
        await api.workers.Heartbeat(pb.HeartbeatRequest(token=attempt.token))
        await api.workers.Report(
            pb.ReportRequest(token=attempt.token, success=pb.Success(output=b"out"))
        )
    finally:
        worker.close()
    done = await api.tasks.Wait(pb.WaitRequest(**BOTH, task_id=task_id, timeout=seconds(5)))
    assert (done.status, done.output) == (pb.STATUS_SUCCEEDED, b"out")
    explained = await api.tasks.Explain(pb.ExplainRequest(task_id=task_id))
    assert (explained.status, explained.hold) == (pb.STATUS_SUCCEEDED, pb.HOLD_FINISHED)
    dependants = await api.tasks.GetDependants(pb.GetDependantsRequest(task_id=task_id))
    assert list(dependants.task_ids) == [many.task_ids[1]]
    assert not (await api.tasks.GetAttempts(pb.GetAttemptsRequest(task_id=task_id))).attempts
    rerun = await api.tasks.Rerun(pb.RerunRequest(task_id=task_id))
    again = await api.tasks.Get(pb.GetRequest(task_id=rerun.task_id))
    assert (again.rerun_of, again.key, again.status) == (task_id, key, pb.STATUS_READY)
    assert done.HasField("started_at") and not again.HasField("started_at")
    name = unique("s")
    await api.tasks.AddSchedule(schedule(name=name))
    assert (await api.tasks.PauseSchedule(pb.PauseScheduleRequest(name=name))).paused
    assert not (await api.tasks.ResumeSchedule(pb.ResumeScheduleRequest(name=name))).paused
    assert name in {
        s.name for s in (await api.tasks.ListSchedules(pb.ListSchedulesRequest())).schedules
    }
    await api.tasks.RemoveSchedule(pb.RemoveScheduleRequest(name=name))
    preview = await api.tasks.PreviewSchedule(pb.PreviewScheduleRequest(cron="* * * * *", n=2))
    assert len(preview.occurrences) == 2
    err = await rejected(api.tasks.Submit(submit(kind="")))
    assert_status(err, Code.INVALID_ARGUMENT, "INVALID_ARGUMENT", "kind must not be empty")


async def test_the_happy_path_on_sqlite(tmp_path: Path) -> None:
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path / "cronoq.db"}"\n'
    async with _leading(tmp_path, store) as running, _api(running) as connected:
        await happy_path(connected)
