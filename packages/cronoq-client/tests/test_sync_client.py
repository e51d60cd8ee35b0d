"""The synchronous Client: AsyncClient's surface (checked name by name), end to end against a
real cronoq-server, shared by threads, refused inside an event loop, closed under calls."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from server_thread import ThreadedServer, threaded_server

from cronoq import JsonCodec, Status, TaskContext, TaskRequest
from cronoq.errors import (
    DuplicateSchedule,
    InvalidArgument,
    InvalidCron,
    ScheduleNotFound,
    SchedulerError,
    SchedulerStopped,
    TaskNotFound,
    UnknownPool,
    WaitTimedOut,
)
from cronoq_client import AsyncClient, Client, Worker

MARGIN = 1.0  # seconds a call may overrun its timeout (scheduling on a shared machine)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ThreadedServer]:
    with threaded_server(tmp_path) as running:
        yield running


@pytest.fixture
def client(server: ThreadedServer) -> Iterator[Client]:
    with Client(server.target, codec=JsonCodec(), timeout=5.0) as c:
        yield c


def _public(cls: type) -> dict[str, Any]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


def test_client_has_the_calls_of_async_client_with_their_signatures_and_docs() -> None:
    # The mirror: a call added to AsyncClient fails this test until Client has it too.
    ours, theirs = _public(Client), _public(AsyncClient)
    assert sorted(ours) == sorted(theirs)
    for name, original in theirs.items():
        if isinstance(original, property):
            mine = ours[name]
            assert isinstance(mine, property) and mine.fget and original.fget, name
            assert inspect.signature(mine.fget) == inspect.signature(original.fget), name
            continue
        assert inspect.iscoroutinefunction(original), name
        assert not inspect.iscoroutinefunction(ours[name]), name
        assert inspect.signature(ours[name]) == inspect.signature(original), name
        if name != "close":  # Client's also stops its thread, and says so
            assert ours[name].__doc__ == original.__doc__, name
    # The constructor, and a context manager of each kind.
    assert inspect.signature(Client.__init__) == inspect.signature(AsyncClient.__init__)
    assert hasattr(Client, "__enter__") and hasattr(Client, "__exit__")


def test_every_call_end_to_end(client: Client) -> None:
    task_id = client.submit("resize", {"image": "a.png"}, key="a.png", tags=["t"], priority=2)
    assert client.submit("resize", {"image": "other"}, key="a.png") == task_id
    info = client.get(task_id)
    assert (info.task_id, info.status, info.payload, info.key, info.tags, info.priority) == (
        task_id, Status.READY, {"image": "a.png"}, "a.png", ("t",), 2,
    )  # fmt: skip
    assert client.get_by_key("a.png") == info
    assert client.get_by_key("nobody") is None
    assert client.get(task_id, include_payload=False).payload is None
    more = client.submit_many([TaskRequest("k", 1), TaskRequest("k", 2, pool="other")])
    assert [s.task_id for s in client.list()] == [task_id, *more]
    assert [s.task_id for s in client.list(pool="other")] == [more[1]]
    assert [s.task_id for s in client.list(limit=1, after=task_id)] == [more[0]]
    started = time.monotonic()
    with pytest.raises(WaitTimedOut):
        client.wait(task_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 0.3 + MARGIN
    assert client.cancel(task_id, "not today") is Status.CANCELLED
    done = client.wait(task_id, timeout=0)
    assert (done.status, done.message) == (Status.CANCELLED, "not today")

    added = client.add_schedule("nightly", "0 3 * * *", kind="report", payload={"n": 1})
    assert (added.name, added.cron, added.paused) == ("nightly", "0 3 * * *", False)
    assert client.pause_schedule("nightly").paused
    assert not client.resume_schedule("nightly").paused
    assert [s.name for s in client.list_schedules()] == ["nightly"]
    client.remove_schedule("nightly")
    assert client.list_schedules() == []
    assert len(client.preview("*/5 * * * *", "Europe/Paris", 3)) == 3


def test_the_exceptions_are_async_clients(client: Client) -> None:
    with pytest.raises(TaskNotFound):
        client.get(123456789)
    with pytest.raises(UnknownPool):
        client.submit("k", pool="nowhere")
    with pytest.raises(InvalidCron):
        client.preview("not cron")
    with pytest.raises(ScheduleNotFound):
        client.pause_schedule("nobody")
    client.add_schedule("once", "0 0 * * *", kind="k")
    with pytest.raises(DuplicateSchedule):
        client.add_schedule("once", "0 1 * * *", kind="k")
    with pytest.raises(InvalidArgument):
        client.submit("k", unknown_option=1)
    with pytest.raises(InvalidArgument):
        Client(["bad", 3])  # type: ignore[list-item]


def test_threads_share_one_client_and_their_calls_run_at_once(
    server: ThreadedServer, client: Client
) -> None:
    # Each task finishes only once every thread's task has started: were the threads' calls
    # run one after another (a wait blocking the next thread's submit), none would finish.
    threads = 8
    started: list[int] = []
    everyone = asyncio.Event()

    async def gathering(ctx: TaskContext, payload: Any) -> Any:
        started.append(ctx.task_id)
        if len(started) == threads:
            everyone.set()
        await everyone.wait()
        return {"echo": payload, "thread": payload["thread"]}

    worker = Worker(server.target, {"default": gathering}, slots=threads, codec=JsonCodec())
    running = server.start(worker.run())
    server.call(worker.attached())
    try:

        def one(n: int) -> tuple[int, Any]:
            task_id = client.submit("gather", {"thread": n}, key=f"thread-{n}")
            return task_id, client.wait(task_id, timeout=30).output

        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(one, range(threads)))
    finally:
        worker.stop()
        server.call(asyncio.wait_for(asyncio.shield(running), 30))
    assert len({task_id for task_id, _ in results}) == threads
    assert [output["thread"] for _, output in results] == list(range(threads))


async def test_a_call_from_a_running_event_loop_is_refused(server: ThreadedServer) -> None:
    client = Client(server.target, timeout=5.0)
    try:
        with pytest.raises(RuntimeError, match=r"Client\.submit\(\) was called from a running"):
            client.submit("k", b"x")
        # Nothing was sent, and the client still serves a thread.
        assert await asyncio.to_thread(client.list) == []
        task_id = await asyncio.to_thread(client.submit, "k", b"x")
        assert (await asyncio.to_thread(client.get, task_id)).payload == b"x"
    finally:
        await asyncio.to_thread(client.close)


def test_close_ends_the_calls_in_flight_and_the_thread(client: Client) -> None:
    task_id = client.submit("k", None)
    before = set(threading.enumerate())
    waiting: list[BaseException] = []
    answered = threading.Event()

    def wait_forever() -> None:
        try:
            client.wait(task_id)  # no timeout: only the close ends it
        except BaseException as exc:
            waiting.append(exc)
        answered.set()

    waiter = threading.Thread(target=wait_forever)
    waiter.start()
    # The wait has reached the server once the client's loop holds a call in flight.
    loop = client._loop
    deadline = time.monotonic() + 10
    while not asyncio.run_coroutine_threadsafe(_calls_on(loop), loop).result():
        assert time.monotonic() < deadline, "the wait never started"
        time.sleep(0.01)
    client.close()
    assert answered.wait(10)
    waiter.join()
    assert len(waiting) == 1 and isinstance(waiting[0], SchedulerStopped), waiting
    assert not any(t.name == "cronoq-client" and t.is_alive() for t in before - {waiter})
    assert not client._thread.is_alive()
    with pytest.raises(SchedulerStopped, match="the client is closed"):
        client.get(task_id)
    client.close()  # again: nothing


async def _calls_on(loop: asyncio.AbstractEventLoop) -> bool:
    return len(asyncio.all_tasks(loop)) > 1  # this coroutine's task, and the call's


def test_timeouts_hold_against_a_server_that_never_answers() -> None:
    with socket.socket() as silent:  # accepts connections, never speaks HTTP/2
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        with Client(target, timeout=0.5) as client:
            started = time.monotonic()
            with pytest.raises(SchedulerError):
                client.get(1)
            assert time.monotonic() - started < 0.5 + MARGIN
