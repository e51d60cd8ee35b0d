"""AsyncClient end to end against real cronoq-server processes, and its retry rule against
scripted grpc.aio servers (real channels, real ports) that answer what a test needs.

Every server binds port 0; the client's timeouts are short, so that a retry loop that does not
stop fails the test quickly.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

import cronoq
from cronoq import JsonCodec, Status, TaskRequest
from cronoq.errors import (
    DuplicateSchedule,
    InvalidArgument,
    InvalidCron,
    PayloadError,
    ScheduleNotFound,
    SchedulerError,
    SchedulerStopped,
    TaskNotFound,
    UnknownPool,
    WaitTimedOut,
)
from cronoq_client import AsyncClient
from cronoq_client._client import WAIT_MARGIN, Unreachable
from cronoq_client.protocol import MAX_LIST_PAGE, Reason, pb, pb_grpc, rich_status

Code = grpc.StatusCode
MARGIN = 0.75  # seconds a call may overrun its timeout (scheduling, the last try in flight, a
# loaded CI machine); far below what retries without a bound would take

# --- real cronoq-server processes -----------------------------------------------------------

_LISTENING = re.compile(r"listening grpc_port=(\d+) http_port=(\d+)")


@dataclass
class ServerProcess:
    process: asyncio.subprocess.Process
    target: str
    http_port: int
    lines: list[str] = field(default_factory=list)
    seen: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, text: str, timeout: float = 10.0) -> None:
        """Until a log line of the server contains ``text``."""
        async with asyncio.timeout(timeout):
            while not any(text in line for line in self.lines):
                self.seen.clear()
                await self.seen.wait()


def _config(tmp_path: Path, store: str) -> Path:
    path = tmp_path / f"cronoq-{len(list(tmp_path.glob('*.toml')))}.toml"
    path.write_text(
        '[listen]\ngrpc = "127.0.0.1:0"\nhttp = "127.0.0.1:0"\n'
        f"[store]\n{store}\n"
        '[[pools]]\nname = "default"\n[[pools]]\nname = "other"\n'
    )
    return path


async def _start(config: Path) -> tuple[ServerProcess, asyncio.Task[None]]:
    script = Path(sys.executable).parent / "cronoq-server"
    process = await asyncio.create_subprocess_exec(
        str(script), "serve", "--config", str(config), stderr=asyncio.subprocess.PIPE
    )
    assert process.stderr is not None
    stderr = process.stderr
    port: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
    lines: list[str] = []
    seen = asyncio.Event()

    async def read() -> None:
        # Read the whole log, so that the server never blocks on a full pipe.
        while line := (await stderr.readline()).decode():
            lines.append(line)
            seen.set()
            found = _LISTENING.search(line.replace('"', ""))
            if found and not port.done():
                port.set_result((int(found.group(1)), int(found.group(2))))
        if not port.done():
            port.set_exception(RuntimeError(f"cronoq-server exited: {''.join(lines)}"))

    reader = asyncio.create_task(read())
    async with asyncio.timeout(20):
        grpc_port, http_port = await port
    return ServerProcess(process, f"127.0.0.1:{grpc_port}", http_port, lines, seen), reader


async def _stop(server: ServerProcess, reader: asyncio.Task[None]) -> None:
    if server.process.returncode is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(10):
                await server.process.wait()
        except TimeoutError:
            server.process.kill()
            await server.process.wait()
    await reader


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerProcess]:
    process, reader = await _start(_config(tmp_path, 'kind = "memory"'))
    try:
        await process.until('msg="leading"')
        yield process
    finally:
        await _stop(process, reader)


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.target, timeout=5.0) as c:
        yield c


def _closed_port() -> str:
    with socket.socket() as probe:  # nothing listens once the probe is closed
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


# --- end to end, every call -----------------------------------------------------------------


async def test_submit_get_wait_cancel(client: AsyncClient) -> None:
    task_id = await client.submit("k", b"\x00raw", key="k-1", tags=["a", "b"], priority=3)
    info = await client.get(task_id)
    assert (info.task_id, info.kind, info.key, info.tags, info.priority, info.payload) == (
        task_id, "k", "k-1", ("a", "b"), 3, b"\x00raw",
    )  # fmt: skip
    assert info.status is Status.READY
    assert info.submitted_at.tzinfo is not None
    # The key is held: the same id, no second task.
    assert await client.submit("k", b"other", key="k-1") == task_id
    assert (await client.get_by_key("k-1")) == info
    assert await client.get_by_key("nobody") is None
    # No worker serves the pool: the wait times out with the embedded API's exception.
    started = time.monotonic()
    with pytest.raises(WaitTimedOut):
        await client.wait(task_id, timeout=0.2)
    assert 0.2 <= time.monotonic() - started < 0.2 + 1.0
    assert await client.cancel(task_id, reason="not today") is Status.CANCELLED
    done = await client.wait(task_id, timeout=0)
    assert (done.status, done.message) == (Status.CANCELLED, "not today")
    assert done.finished_at is not None
    assert await client.cancel(task_id) is Status.CANCELLED  # finished: its final status


async def test_submit_many_and_list_pages(client: AsyncClient) -> None:
    ids = await client.submit_many(
        [TaskRequest("page", key=f"p{n}", pool="other" if n % 2 else "default") for n in range(7)]
    )
    assert ids == sorted(ids) and len(set(ids)) == 7
    assert await client.submit_many([]) == []
    seen: list[int] = []
    after: int | None = None
    pages = 0
    while page := await client.list(kind="page", limit=3, after=after):
        pages += 1
        assert len(page) <= 3
        seen.extend(t.task_id for t in page)
        after = page[-1].task_id
    assert (seen, pages) == (ids, 3)
    newest = [t.task_id for t in await client.list(kind="page", newest_first=True)]
    assert newest == ids[::-1]
    below = await client.list(kind="page", newest_first=True, before=ids[4], limit=3)
    assert [t.task_id for t in below] == ids[3:0:-1]
    others = await client.list(pool="other")
    assert [t.task_id for t in others] == ids[1::2]
    await client.cancel(ids[0])
    [cancelled] = await client.list(status="cancelled")
    assert (cancelled.task_id, cancelled.error) == (ids[0], "cancelled by request")
    ready_default = await client.list(status=[Status.READY], pool="default")
    assert [t.task_id for t in ready_default] == ids[2::2]


async def test_a_list_longer_than_a_server_page_is_followed_in_both_orders(
    client: AsyncClient,
) -> None:
    """The server ends a page at MAX_LIST_PAGE tasks with a token: the client asks for the
    next page with it, keeping its own bounds, in either order."""
    many = MAX_LIST_PAGE + 5
    ids = await client.submit_many([TaskRequest("paged-both", pool="other")] * (many - 5))
    ids += await client.submit_many([TaskRequest("paged-both", pool="other")] * 5)
    newest = await client.list(kind="paged-both", newest_first=True)
    assert [t.task_id for t in newest] == ids[::-1]
    oldest = await client.list(kind="paged-both")
    assert [t.task_id for t in oldest] == ids
    bounded = await client.list(kind="paged-both", newest_first=True, after=ids[2], before=ids[-2])
    assert [t.task_id for t in bounded] == ids[-3:2:-1]


async def test_definite_answers_raise_the_embedded_exceptions(client: AsyncClient) -> None:
    with pytest.raises(TaskNotFound):
        await client.get(10**9)
    with pytest.raises(TaskNotFound):
        await client.wait(10**9, timeout=1)
    with pytest.raises(UnknownPool):
        await client.submit("k", pool="nope")
    with pytest.raises(InvalidArgument, match="kind"):
        await client.submit("")
    with pytest.raises(InvalidArgument):  # refused on this side: no wire form
        await client.get("1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        await client.submit("k", bogus=1)
    with pytest.raises(InvalidCron):
        await client.add_schedule("s", "not a cron", kind="k")
    with pytest.raises(ScheduleNotFound):
        await client.pause_schedule("nobody")


async def test_schedules(client: AsyncClient) -> None:
    first = await client.add_schedule("nightly", "0 3 * * *", kind="backup", timezone="UTC")
    assert (first.name, first.cron, first.kind, first.paused) == (
        "nightly", "0 3 * * *", "backup", False,
    )  # fmt: skip
    with pytest.raises(DuplicateSchedule):
        await client.add_schedule("nightly", "0 4 * * *", kind="backup")
    replaced = await client.add_schedule("nightly", "0 4 * * *", kind="backup", replace=True)
    assert replaced.cron == "0 4 * * *"
    assert (await client.pause_schedule("nightly")).paused is True
    assert (await client.resume_schedule("nightly")).paused is False
    assert [s.name for s in await client.list_schedules()] == ["nightly"]
    await client.remove_schedule("nightly")
    assert await client.list_schedules() == []
    with pytest.raises(ScheduleNotFound):
        await client.remove_schedule("nightly")
    after = datetime(2026, 3, 28, tzinfo=UTC)
    got = await client.preview("30 2 * * *", "Europe/Paris", 3, after=after)
    assert got == cronoq.preview("30 2 * * *", "Europe/Paris", 3, after=after)
    assert len(got) == 3


async def test_json_codec_round_trip(server: ServerProcess) -> None:
    async with AsyncClient(server.target, codec=JsonCodec(), timeout=5.0) as client:
        payload = {"to": "ada@example.com", "n": [1, 2.5, None], "ok": True}
        task_id = await client.submit("mail", payload)
        assert (await client.get(task_id)).payload == payload
        [second] = await client.submit_many([TaskRequest("mail", ["a"], key="j")])
        assert (await client.get(second)).payload == ["a"]
        assert (await client.get(await client.submit("mail"))).payload is None
        with pytest.raises(PayloadError):
            await client.submit("mail", object())
    # A client with another codec sees the bytes the JSON codec made.
    async with AsyncClient(server.target, timeout=5.0) as raw:
        assert isinstance((await raw.get(task_id)).payload, bytes)


async def test_a_message_over_the_limit_is_a_payload_error(server: ServerProcess) -> None:
    async with AsyncClient(server.target, timeout=5.0, max_message_bytes=1024) as small:
        with pytest.raises(PayloadError, match="larger than max"):
            await small.submit("k", b"x" * 2048)


async def test_a_refused_replica_is_skipped_even_for_a_submit_without_key(
    server: ServerProcess,
) -> None:
    async with AsyncClient([_closed_port(), server.target], timeout=5.0) as client:
        task_id = await client.submit("k")
        assert (await client.get(task_id)).task_id == task_id


async def test_a_real_standby_is_retried_and_the_leader_reached(tmp_path: Path) -> None:
    config = _config(tmp_path, f'kind = "sqlite"\npath = "{tmp_path / "shared.db"}"')
    leader, leader_reader = await _start(config)
    try:
        await leader.until('msg="leading"')
        standby, standby_reader = await _start(config)
        try:
            await standby.until('msg="standby"')
            async with AsyncClient(standby.target, timeout=1.0) as only_standby:
                with pytest.raises(SchedulerError) as caught:
                    await only_standby.submit("k")
                # Refused each time: not applied, unless the client's own deadline cut its last
                # try short (a loaded machine), which leaves the outcome open for the client.
                assert caught.value.applied in (False, None)
            async with AsyncClient([standby.target, leader.target], timeout=5.0) as client:
                assert await client.list() == [], "a standby applied a submit"
                for _ in range(3):  # each call starts on the replica the last one reached
                    task_id = await client.submit("k")
                    assert (await client.get(task_id)).task_id == task_id
        finally:
            await _stop(standby, standby_reader)
    finally:
        await _stop(leader, leader_reader)


# --- the retry rule, against scripted servers -----------------------------------------------

STANDBY = rich_status(Code.UNAVAILABLE, "this replica is a standby", Reason.STANDBY)
NOT_DURABLE = rich_status(Code.UNAVAILABLE, "the commit was not confirmed", Reason.NOT_DURABLE)
NOT_FOUND = rich_status(Code.NOT_FOUND, "no task 5", Reason.TASK_NOT_FOUND)
DUPLICATE = rich_status(Code.ALREADY_EXISTS, "schedule exists", Reason.DUPLICATE_SCHEDULE)
NO_SCHEDULE = rich_status(Code.NOT_FOUND, "no schedule nightly", Reason.SCHEDULE_NOT_FOUND)
HOLD = "hold"  # wait until ``released`` is set, then answer with the next entry's rule
BREAK = "break"  # stop the server while the call is in flight: the connection breaks mid-call
PARK = "park"  # wait until ``released`` is set, then succeed
Answer = grpc.Status | str | None


@dataclass
class Scripted(pb_grpc.SchedulerServiceServicer):
    """Answers each call with the next entry of ``script`` (the last one repeats): a status to
    abort with, BREAK, or None for success. Records calls and the connections they came on."""

    script: list[Answer]
    server: aio.Server | None = None
    stopping: asyncio.Task[None] | None = None
    peers: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)
    remaining: list[float | None] = field(default_factory=list)
    schedules: list[pb.ScheduleInfo] = field(default_factory=list)
    """What ListSchedules answers (it is not scripted)."""
    list_refusal: grpc.Status | None = None
    """Set: ListSchedules answers with this status."""
    held: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a call is held (HOLD)."""
    parked: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a call is parked (PARK)."""
    released: asyncio.Event = field(default_factory=asyncio.Event)
    """Ends every parked call, with success."""
    knows_compact: bool = True
    """False: SubmitMany reads only ``tasks``, as a server older than the compact form does."""
    knows_submit_each: bool = True
    """False: SubmitEach answers UNIMPLEMENTED, as a server older than it does."""
    each: list[pb.SubmitResult] | None = None
    """What a SubmitEach that succeeds answers; None: task id 7 for every submission."""

    @property
    def calls(self) -> int:
        return len(self.requests)

    async def _answer(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.peers.append(context.peer())
        self.requests.append(request)
        self.remaining.append(context.time_remaining())
        answer = self.script[min(self.calls, len(self.script)) - 1]
        if answer == PARK:
            self.parked.set()
            await self.released.wait()
        if answer == HOLD:
            self.held.set()
            await asyncio.sleep(30)  # until the client gives up on the call
        if answer == BREAK:
            assert self.server is not None
            # A task of its own: the stop cancels this very call, and must outlive it.
            self.stopping = asyncio.get_running_loop().create_task(self.server.stop(None))
            await asyncio.sleep(30)
        if isinstance(answer, grpc.Status):
            await context.abort_with_status(answer)

    async def Submit(self, request: Any, context: Any) -> pb.SubmitResponse:
        await self._answer(request, context)
        return pb.SubmitResponse(task_id=7)

    async def SubmitMany(self, request: Any, context: Any) -> pb.SubmitManyResponse:
        await self._answer(request, context)
        count = len(request.tasks) + (len(request.payloads) if self.knows_compact else 0)
        return pb.SubmitManyResponse(task_ids=range(1, count + 1))

    async def SubmitEach(self, request: Any, context: Any) -> pb.SubmitEachResponse:
        if not self.knows_submit_each:
            self.requests.append(request)
            await context.abort(Code.UNIMPLEMENTED, "Method not implemented!")
        await self._answer(request, context)
        if self.each is not None:
            return pb.SubmitEachResponse(results=self.each)
        return pb.SubmitEachResponse(
            results=[pb.SubmitResult(task_id=7)] * len(request.submissions)
        )

    async def List(self, request: Any, context: Any) -> pb.ListResponse:
        await self._answer(request, context)
        return pb.ListResponse()

    async def AddSchedule(self, request: Any, context: Any) -> pb.ScheduleInfo:
        await self._answer(request, context)
        return pb.ScheduleInfo(name=request.name, cron=request.cron, kind=request.kind)

    async def RemoveSchedule(self, request: Any, context: Any) -> pb.RemoveScheduleResponse:
        await self._answer(request, context)
        return pb.RemoveScheduleResponse()

    async def ListSchedules(self, request: Any, context: Any) -> pb.ListSchedulesResponse:
        if self.list_refusal is not None:
            await context.abort_with_status(self.list_refusal)
        return pb.ListSchedulesResponse(schedules=self.schedules)

    async def Wait(self, request: Any, context: Any) -> pb.TaskInfo:
        await self._answer(request, context)
        info = pb.TaskInfo(task_id=1, status=pb.STATUS_SUCCEEDED, pool="default", kind="k")
        info.submitted_at.GetCurrentTime()
        info.updated_at.GetCurrentTime()
        return info


Start = Callable[..., Awaitable[tuple[Scripted, str]]]


@pytest.fixture
async def scripted() -> AsyncIterator[Start]:
    servers: list[aio.Server] = []
    servicers: list[Scripted] = []

    async def start(*script: Answer) -> tuple[Scripted, str]:
        # Only the calls the tests make; the rest answer UNIMPLEMENTED, the servicer's default.
        servicer = Scripted(list(script))  # type: ignore[abstract]
        servicers.append(servicer)
        server = aio.server()
        pb_grpc.add_SchedulerServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servicer.server = server
        servers.append(server)
        return servicer, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(None)
    await asyncio.gather(*(s.stopping for s in servicers if s.stopping is not None))


async def test_standby_is_retried_on_a_new_connection_each_time(scripted: Start) -> None:
    servicer, target = await scripted(STANDBY, STANDBY, STANDBY, None)
    async with AsyncClient(target, timeout=5.0) as client:
        assert await client.submit("k") == 7  # no key: nothing was applied, so retried
    assert servicer.calls == 4
    assert len(set(servicer.peers)) == 4, servicer.peers  # four TCP connections


async def test_standby_sends_the_retry_to_the_next_target(scripted: Start) -> None:
    standby, first = await scripted(STANDBY)
    leader, second = await scripted(None)
    async with AsyncClient([first, second], timeout=5.0) as client:
        assert await client.submit("k") == 7
        assert await client.submit("k") == 7  # stays on the replica that answered
    assert (standby.calls, leader.calls) == (1, 2)


async def test_a_server_that_answers_fewer_ids_than_tasks_is_an_error(scripted: Start) -> None:
    servicer, target = await scripted(None)
    bulk = [TaskRequest("k", b"%d" % i) for i in range(3)]
    async with AsyncClient(target, timeout=5.0) as client:
        assert await client.submit_many(bulk) == [1, 2, 3]
        assert servicer.requests[-1].payloads == [b"0", b"1", b"2"]  # the compact form
        servicer.knows_compact = False  # an older server: it reads no task, answers no id
        with pytest.raises(SchedulerError, match="answered 0 task ids for 3 tasks") as caught:
            await client.submit_many(bulk)
        assert caught.value.applied is None


async def test_keyless_submit_with_an_unknown_outcome_is_not_retried(scripted: Start) -> None:
    servicer, target = await scripted(NOT_DURABLE, None)
    async with AsyncClient(target, timeout=5.0) as client:
        with pytest.raises(SchedulerError) as caught:
            await client.submit("k")
        assert type(caught.value) is SchedulerError
        assert caught.value.applied is None
        assert servicer.calls == 1
        servicer.script = [NOT_DURABLE]
        with pytest.raises(SchedulerError) as many:
            await client.submit_many([TaskRequest("k", key="a"), TaskRequest("k")])
        assert many.value.applied is None
    assert servicer.calls == 2  # one call each: one task without a key is enough


async def test_keyed_submit_with_an_unknown_outcome_is_retried(scripted: Start) -> None:
    servicer, target = await scripted(NOT_DURABLE, NOT_DURABLE, None)
    async with AsyncClient(target, timeout=5.0) as client:
        assert await client.submit("k", key="once") == 7
        assert servicer.calls == 3
        assert all(r.task.key == "once" for r in servicer.requests)
        servicer.script = [NOT_DURABLE, NOT_DURABLE, NOT_DURABLE, NOT_DURABLE, None]
        keyed = [TaskRequest("k", key="a"), TaskRequest("k", key="b")]
        assert await client.submit_many(keyed) == [1, 2]
        assert servicer.calls == 5


async def test_a_call_broken_mid_flight(scripted: Start) -> None:
    # Without a key: the server had the request when the connection broke; not repeated.
    broken, first = await scripted(BREAK)
    spare, second = await scripted(None)
    async with AsyncClient([first, second], timeout=5.0) as client:
        with pytest.raises(SchedulerError) as caught:
            await client.submit("k")
        assert caught.value.applied is None
    assert (broken.calls, spare.calls) == (1, 0)
    # With a key, and for a read, the retry goes to the next replica.
    broken, first = await scripted(BREAK)
    async with AsyncClient([first, second], timeout=5.0) as client:
        assert await client.submit("k", key="x") == 7
    assert (broken.calls, spare.calls) == (1, 1)
    broken, first = await scripted(BREAK)
    async with AsyncClient([first, second], timeout=5.0) as client:
        assert await client.list() == []
    assert (broken.calls, spare.calls) == (1, 2)


async def test_a_definite_answer_is_raised_at_once(scripted: Start) -> None:
    servicer, target = await scripted(NOT_FOUND)
    async with AsyncClient(target, timeout=5.0) as client:
        with pytest.raises(TaskNotFound, match="no task 5"):
            await client.list()
    assert servicer.calls == 1


@pytest.mark.parametrize("timeout", [0.3, 0.8])
async def test_the_overall_timeout_bounds_the_retries(scripted: Start, timeout: float) -> None:
    servicer, target = await scripted(STANDBY)
    async with AsyncClient(target, timeout=timeout) as client:
        started = time.monotonic()
        with pytest.raises(SchedulerError) as caught:
            await client.list()
        elapsed = time.monotonic() - started
    assert elapsed < timeout + MARGIN, elapsed
    # The standby's refusal, or (a loaded machine) the last try cut short by the deadline.
    refused = (caught.value.applied, "standby" in str(caught.value))
    cut = (caught.value.applied, "DEADLINE_EXCEEDED" in str(caught.value))
    assert refused == (False, True) or cut == (None, True), caught.value
    assert servicer.calls >= 2  # it did retry


class _Stalling(pb_grpc.SchedulerServiceServicer):
    """A server on a thread of its own whose event loop stalls in a ``stall`` Submit, then
    stops the server: the calls that arrived meanwhile wait in gRPC core for the loop, which
    takes up one of them before the stop kills the rest (as a loaded replica's standby object
    does once the replica leads)."""

    def __init__(self) -> None:
        self.stalling = threading.Event()
        self.stopped = threading.Event()
        self.handled = 0
        self.target = ""
        self._started = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        self._started.wait()

    async def _serve(self) -> None:
        server = aio.server()
        pb_grpc.add_SchedulerServiceServicer_to_server(self, server)
        self.target = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        self._server = server
        await server.start()
        self._started.set()
        await server.wait_for_termination()
        self.stopped.set()

    async def Submit(self, request: Any, context: Any) -> pb.SubmitResponse:
        if request.task.kind == "stall":
            self.stalling.set()
            time.sleep(0.5)  # noqa: ASYNC251  # the stall: calls sent now wait in gRPC core
            self._stop = asyncio.get_running_loop().create_task(self._server.stop(5.0))
        else:
            self.handled += 1
        return pb.SubmitResponse(task_id=1)


async def test_a_submit_a_stopping_server_never_took_up_is_retried(scripted: Start) -> None:
    stalling = _Stalling()  # type: ignore[abstract]
    _, good = await scripted(None)
    async with (
        AsyncClient([stalling.target, good], timeout=10.0) as client,
        aio.insecure_channel(stalling.target) as raw,
    ):
        await client.submit("warm", key="warm")  # the client's connection to the stalling one
        stall = asyncio.ensure_future(
            pb_grpc.SchedulerServiceStub(raw).Submit(
                pb.SubmitRequest(task=pb.TaskRequest(kind="stall")), timeout=10.0
            )
        )
        await asyncio.to_thread(stalling.stalling.wait, 5.0)
        submitted = 4
        # Without keys: an unknown outcome would raise; these were never applied.
        ids = await asyncio.gather(*(client.submit("k") for _ in range(submitted)))
        await stall
    assert await asyncio.to_thread(stalling.stopped.wait, 5.0)
    taken = stalling.handled - 1  # the warm-up call aside
    # Core kept all but (about) one call waiting for the stalled loop; the stop killed those,
    # and the client sent each again to the next replica (the scripted one answers 7).
    assert taken < submitted
    assert sorted(ids) == [1] * taken + [7] * (submitted - taken)


async def test_a_refused_connection_is_retried_until_the_deadline() -> None:
    async with AsyncClient([_closed_port(), _closed_port()], timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(SchedulerError) as caught:
            await client.submit("k")  # without a key: never sent, so retried all the same
        elapsed = time.monotonic() - started
    assert caught.value.applied is False
    found = re.search(r"after (\d+) tries", str(caught.value))
    assert found is not None and int(found.group(1)) >= 2, str(caught.value)
    assert "no connection could be made" in str(caught.value)
    assert elapsed < 0.5 + MARGIN, elapsed


async def test_the_connect_timeout_ends_the_tries_while_no_server_answers() -> None:
    closed = [_closed_port(), _closed_port()]
    async with AsyncClient(closed, timeout=60.0, connect_timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(Unreachable) as caught:
            await client.list()
        elapsed = time.monotonic() - started
    assert caught.value.applied is False
    message = str(caught.value)
    assert message.startswith(f"no cronoq server answered at {closed[0]}, {closed[1]} ("), message
    assert message.endswith("; last error: Connection refused)"), message
    # Far below the call's timeout: the connect timeout ended it.
    assert 0.5 <= elapsed < 0.5 + MARGIN, elapsed


async def test_once_a_server_answered_the_connect_timeout_no_longer_applies(
    scripted: Start,
) -> None:
    # A standby answers (it refuses): a failover is under way, worth the call's whole timeout.
    servicer, target = await scripted(STANDBY)
    async with AsyncClient(target, timeout=1.0, connect_timeout=0.1) as client:
        with pytest.raises(SchedulerError) as caught:
            await client.list()
    assert not isinstance(caught.value, Unreachable)
    assert "in 1 s)" in str(caught.value) and caught.value.applied is False, str(caught.value)
    assert len(servicer.requests) >= 2


@pytest.mark.parametrize("value", [0, -1.0, True, "2", float("inf")])
def test_a_bad_connect_timeout_is_refused(value: object) -> None:
    with pytest.raises(InvalidArgument, match="connect_timeout must be a positive number"):
        AsyncClient("127.0.0.1:1", connect_timeout=value)  # type: ignore[arg-type]


async def test_wait_deadline_covers_the_wait(scripted: Start) -> None:
    servicer, target = await scripted(STANDBY, None)
    async with AsyncClient(target, timeout=0.5) as client:
        info = await client.wait(1, timeout=2.0)
        assert info.status is Status.SUCCEEDED
        await client.wait(1)  # no timeout: no deadline
    first, retry, unbounded = servicer.remaining
    # The deadline is max(2 s, the client's 0.5 s) + WAIT_MARGIN, not the client's timeout.
    # (With room for a loaded machine's connection setup, still clearly above the 0.5 s.)
    # (grpc-timeout is sent rounded up: a few ms above the deadline read back, seen 7.009 s.)
    assert first is not None and 2.5 < first <= 2 + WAIT_MARGIN + 0.5
    # (grpc-timeout is relative: the first call's connection setup counts against it, so the
    # retry's may read higher; both are within the one overall deadline.)
    assert retry is not None and retry <= 2 + WAIT_MARGIN + 0.5  # the relative encoding's slack
    assert unbounded is None
    # The retry asks the server to wait only for what is left of the 2 s.
    left = servicer.requests[1].timeout.ToTimedelta()
    assert timedelta(0) < left < timedelta(seconds=2)
    assert not servicer.requests[2].HasField("timeout")


async def test_a_closed_client_refuses_calls(scripted: Start) -> None:
    _, target = await scripted(None)
    client = AsyncClient(target, timeout=1.0)
    assert await client.submit("k") == 7
    await client.close()
    with pytest.raises(SchedulerStopped):
        await client.submit("k")


@pytest.mark.parametrize(
    "bad",
    [
        {"timeout": 0},
        {"timeout": True},
        {"max_message_bytes": 0},
        {"max_message_bytes": 2**31},
        {"max_message_bytes": 1.5},
        {"tls": "yes"},
    ],
)
def test_constructor_options_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        AsyncClient("127.0.0.1:1", **bad)


@pytest.mark.parametrize("target", [[], "", [""]])
def test_a_target_is_required(target: Any) -> None:
    with pytest.raises(InvalidArgument):
        AsyncClient(target)


async def test_an_earlier_unknown_outcome_is_not_reported_as_not_applied(
    scripted: Start,
) -> None:
    # Try 1 reached a leader that could not confirm the commit (it may have landed); the
    # retries then only meet standbys until the deadline: applied must stay None.
    servicer, target = await scripted(NOT_DURABLE, STANDBY)
    async with AsyncClient(target, timeout=0.5) as client:
        with pytest.raises(SchedulerError) as caught:
            await client.submit("k", key="once")
    assert servicer.calls >= 2
    assert caught.value.applied is None, f"applied={caught.value.applied}: {caught.value}"


def _nightly(**fields: Any) -> pb.ScheduleInfo:
    info = {"cron": "0 3 * * *", "timezone": "UTC", "kind": "report", "pool": "default"}
    message = pb.ScheduleInfo(
        name="nightly",
        overlap=pb.OVERLAP_POLICY_SKIP,
        catch_up=pb.CATCH_UP_POLICY_COALESCE,
        **{**info, **fields},
    )
    message.next_run_at.GetCurrentTime()
    return message


@pytest.mark.parametrize(
    ("found", "returned"),
    [([_nightly()], True), ([_nightly(cron="0 4 * * *")], False), ([], False)],
    ids=["its-own", "another-cron", "gone-again"],
)
async def test_add_schedule_repeated_after_an_unknown_outcome_finds_its_own(
    scripted: Start, found: list[pb.ScheduleInfo], returned: bool
) -> None:
    # Try 1 may have made the schedule: try 2's DuplicateSchedule is then its own trace,
    # when the schedule under that name shows what was asked.
    servicer, target = await scripted(NOT_DURABLE, DUPLICATE)
    servicer.schedules = found
    async with AsyncClient(target, timeout=5.0) as client:
        if returned:
            info = await client.add_schedule("nightly", "0 3 * * *", kind="report")
            assert (info.name, info.cron) == ("nightly", "0 3 * * *")
        else:
            with pytest.raises(DuplicateSchedule):
                await client.add_schedule("nightly", "0 3 * * *", kind="report")
    assert servicer.calls == 2


async def test_add_schedule_whose_check_fails_may_have_been_applied(scripted: Start) -> None:
    servicer, target = await scripted(NOT_DURABLE, DUPLICATE)
    servicer.list_refusal = STANDBY  # the check never gets an answer
    async with AsyncClient(target, timeout=0.5) as client:
        began = asyncio.get_running_loop().time()
        with pytest.raises(SchedulerError) as caught:
            await client.add_schedule("nightly", "0 3 * * *", kind="report")
        took = asyncio.get_running_loop().time() - began
    assert caught.value.applied is None, caught.value
    assert took < 0.5 + 0.25, f"{took:.2f} s: the check had a timeout of its own"


async def test_add_schedule_answered_duplicate_at_once_raises(scripted: Start) -> None:
    servicer, target = await scripted(DUPLICATE)
    servicer.schedules = [_nightly()]  # the same, but made by somebody else's call
    async with AsyncClient(target, timeout=5.0) as client:
        with pytest.raises(DuplicateSchedule):
            await client.add_schedule("nightly", "0 3 * * *", kind="report")
    assert servicer.calls == 1


async def test_remove_schedule_repeated_after_an_unknown_outcome_is_done(
    scripted: Start,
) -> None:
    servicer, target = await scripted(NOT_DURABLE, NO_SCHEDULE)
    async with AsyncClient(target, timeout=5.0) as client:
        await client.remove_schedule("nightly")  # try 1 removed it
        assert servicer.calls == 2
        servicer.script = [NO_SCHEDULE]
        with pytest.raises(ScheduleNotFound):  # answered at once: it never existed
            await client.remove_schedule("nightly")
    assert servicer.calls == 3


async def test_a_call_whose_channel_another_call_retired_is_retried_not_cancelled(
    scripted: Start,
) -> None:
    # A Wait without a timeout has no deadline; another call's failure replaces the channel,
    # which is closed under the Wait once its grace is over: grpc.aio then ends the Wait with
    # CancelledError, which must not reach a caller that cancelled nothing.
    servicer, target = await scripted(HOLD, None)
    async with AsyncClient(target, timeout=0.3) as client:
        waiting = asyncio.create_task(client.wait(1))
        await servicer.held.wait()
        client._channels.replace(client._channels.current())  # as a failed call does
        info = await asyncio.wait_for(waiting, 5)
        assert info.status is Status.SUCCEEDED
        assert servicer.calls == 2
        assert len(set(servicer.peers)) == 2  # retried on the new connection


async def test_a_keyless_submit_whose_channel_was_retired_has_an_unknown_outcome(
    scripted: Start,
) -> None:
    servicer, target = await scripted(HOLD, None)
    async with AsyncClient(target, timeout=0.3) as client:
        # No deadline for this one call, so that only the retired channel can end it.
        submitting = asyncio.create_task(
            client._call(
                lambda stub, _: stub.Submit(pb.SubmitRequest(task=pb.TaskRequest(kind="k"))),
                idempotent=False,
                seconds=None,
            )
        )
        await servicer.held.wait()
        client._channels.replace(client._channels.current())
        with pytest.raises(SchedulerError) as caught:
            await asyncio.wait_for(submitting, 5)
        assert caught.value.applied is None
        assert servicer.calls == 1  # not repeated


async def test_after_an_unknown_outcome_the_next_call_goes_on_a_new_connection(
    scripted: Start,
) -> None:
    # A frozen leader: it takes calls and never answers. A keyless submit's deadline passes
    # (an unknown outcome, raised); the next call must not go back to the frozen process, while
    # a call already in flight on the old connection still gets its answer there.
    frozen, first = await scripted(PARK, HOLD)
    spare, second = await scripted(None)
    async with AsyncClient([first, second], timeout=1.0) as client:
        parked = asyncio.create_task(client.wait(1))  # no timeout: no deadline
        await frozen.parked.wait()
        with pytest.raises(SchedulerError) as caught:
            await client.submit("k")
        assert caught.value.applied is None
        assert frozen.calls == 2
        assert await client.submit("k") == 7
        assert (frozen.calls, spare.calls) == (2, 1)
        frozen.released.set()
        info = await asyncio.wait_for(parked, 5)
        assert info.status is Status.SUCCEEDED
    assert (frozen.calls, spare.calls) == (2, 1)  # the wait was answered where it was sent


async def test_after_an_unknown_outcome_from_the_server_the_client_reconnects(
    scripted: Start,
) -> None:
    servicer, target = await scripted(NOT_DURABLE, None)
    async with AsyncClient(target, timeout=5.0) as client:
        with pytest.raises(SchedulerError) as caught:
            await client.submit("k")
        assert caught.value.applied is None
        assert await client.submit("k") == 7
    assert servicer.calls == 2
    assert len(set(servicer.peers)) == 2, servicer.peers  # two TCP connections
