"""The server's edges (issue 24, items 2 and 4), through a real ``cronoq-server`` process: every
message it must send fits its limit, every wire string and list is bounded, and Attach streams
are limited, each refusal a precise status with nothing applied."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from server_process import ServerProcess, config_toml, running_server

from cronoq import MemoryStore, Pool, RemotePool, Scheduler, TaskContext, WorkerLink
from cronoq.errors import AdmissionRejected, InvalidCron, PayloadError, UnknownTimeZone
from cronoq_client import AsyncClient, Worker
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb, pb_grpc
from cronoq_server import _links

LIMIT = 1 << 20
"""The server's max_message_bytes."""
TIMEOUT = 10.0
POOLS = '[[pools]]\nname = "default"\n[[pools]]\nname = "edges"\n'
MEMORY = '[store]\nkind = "memory"\n'


def _config(store: str, limit: int = LIMIT) -> str:
    return config_toml(store, pools=POOLS, tables=f"[limits]\nmax_message_bytes = {limit}\n")


@contextlib.asynccontextmanager
async def _server(directory: Path, store: str, limit: int = LIMIT) -> AsyncIterator[ServerProcess]:
    async with running_server(directory, _config(store, limit)) as server:
        await server.leading()
        yield server


@contextlib.asynccontextmanager
async def _working(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """The worker running (attached) for the block; its run() task, to see it never ended."""
    run = asyncio.get_running_loop().create_task(worker.run())
    try:
        async with asyncio.timeout(TIMEOUT):
            await worker.attached()
        yield run
    finally:
        worker.stop()
        worker.stop()
        await asyncio.gather(run, return_exceptions=True)


async def test_a_payload_and_an_output_too_large_together_are_both_read(tmp_path: Path) -> None:
    # Each fits a message alone, not both in one: the task is sent without the one that does
    # not fit, flagged, and the client fetches it alone.
    payload = b"p" * (LIMIT * 6 // 10)
    output = b"o" * (LIMIT * 6 // 10)

    async def echo(ctx: TaskContext, value: Any) -> bytes:
        assert value == payload
        return output

    async with (
        _server(tmp_path, MEMORY) as server,
        AsyncClient(server.target, max_message_bytes=LIMIT) as client,
        _working(Worker(server.target, {"default": echo}, max_message_bytes=LIMIT)),
    ):
        task_id = await client.submit("big", payload, key="big")
        done = await client.wait(task_id, timeout=TIMEOUT)
        assert (done.status.value, done.payload, done.output) == ("succeeded", payload, output)
        got = await client.get(task_id)
        assert (got.payload, got.output) == (payload, output)
        by_key = await client.get_by_key("big")
        assert by_key is not None and (by_key.payload, by_key.output) == (payload, output)
        lean = await client.get(task_id, include_payload=False, include_output=False)
        assert (lean.payload, lean.output) == (None, None)
        async with grpc.aio.insecure_channel(server.target) as channel:
            raw = await pb_grpc.SchedulerServiceStub(channel).Get(
                pb.GetRequest(task_id=task_id, include_payload=True, include_output=True)
            )
        assert raw.payload_omitted and not raw.HasField("payload")
        assert not raw.output_omitted and raw.output == output


async def test_a_payload_whose_attempt_would_not_fit_is_refused_and_the_largest_runs(
    tmp_path: Path,
) -> None:
    # The largest payload a Submit message carries makes an attempt message over the limit:
    # refused at submit, naming the largest payload that fits, which a worker then runs.
    async def size(ctx: TaskContext, value: Any) -> bytes:
        return str(len(value)).encode()

    async with (
        _server(tmp_path, MEMORY) as server,
        AsyncClient(server.target, max_message_bytes=LIMIT) as client,
        _working(Worker(server.target, {"default": size}, max_message_bytes=LIMIT)) as run,
    ):
        with pytest.raises(PayloadError, match="cannot be sent to a worker") as refused:
            await client.submit("job", b"x" * (LIMIT - 20))
        assert refused.value.args[0].count("\n") == 0
        room = int(str(refused.value).split("payload may be at most ")[1].split()[0])
        assert await client.list(kind="job") == []  # nothing applied
        task_id = await client.submit("job", b"x" * room)
        done = await client.wait(task_id, timeout=TIMEOUT)
        assert (done.status.value, done.output) == ("succeeded", str(room).encode())
        assert not run.done()


async def test_an_attempt_too_large_for_the_stream_fails_its_task_and_workers_keep_running(
    tmp_path: Path,
) -> None:
    # A task accepted under a larger limit (or by an older release) whose attempt cannot be
    # sent now: its task fails with a message that says so, and the worker runs the next one.
    store = f'[store]\nkind = "sqlite"\npath = "{tmp_path / "cronoq.db"}"\n'
    async with (
        _server(tmp_path, store, limit=4 * LIMIT) as server,
        AsyncClient(server.target, max_message_bytes=4 * LIMIT) as client,
    ):
        large = await client.submit("job", b"x" * (2 * LIMIT))

    async def ok(ctx: TaskContext, value: Any) -> bytes:
        return b"ran"

    async with (
        _server(tmp_path, store) as server,
        AsyncClient(server.target, max_message_bytes=LIMIT) as client,
        _working(Worker(server.target, {"default": ok}, max_message_bytes=LIMIT)) as run,
    ):
        failed = await client.wait(large, timeout=TIMEOUT, include_payload=False)
        assert failed.status.value == "failed"
        assert "over the server's message limit" in failed.message, failed.message
        assert failed.attempt == 1  # failed for good, not retried
        small = await client.submit("job", b"small")
        done = await client.wait(small, timeout=TIMEOUT)
        assert (done.status.value, done.output) == ("succeeded", b"ran")
        assert not run.done()


async def test_a_list_longer_than_one_message_comes_in_pages(tmp_path: Path) -> None:
    # Each summary is about 16 KiB (64 tags of 255 characters): 80 of them exceed the limit.
    tags = [f"{i:02d}" + "t" * 253 for i in range(64)]
    async with (
        _server(tmp_path, MEMORY) as server,
        AsyncClient(server.target, max_message_bytes=LIMIT) as client,
    ):
        ids = [await client.submit("tagged", None, tags=tags, pool="edges") for _ in range(80)]
        listed = await client.list(kind="tagged")
        assert [t.task_id for t in listed] == ids
        assert all(t.tags == tuple(tags) for t in listed)
        assert [t.task_id for t in await client.list(kind="tagged", limit=70)] == ids[:70]
        async with grpc.aio.insecure_channel(server.target) as channel:
            page = await pb_grpc.SchedulerServiceStub(channel).List(pb.ListRequest(kind="tagged"))
        assert 0 < len(page.tasks) < 80
        assert page.next_page_token == str(page.tasks[-1].task_id)


async def test_long_cron_expressions_zone_names_and_worker_ids_are_refused(
    tmp_path: Path,
) -> None:
    async with (
        _server(tmp_path, MEMORY) as server,
        AsyncClient(server.target) as client,
    ):
        cron = ",".join(["1"] * 513) + " * * * *"  # 1,033 characters
        with pytest.raises(InvalidCron, match="1033 characters long; the limit is 1024"):
            await client.preview(cron)
        with pytest.raises(InvalidCron, match="the limit is 1024"):
            await client.add_schedule("long", cron, kind="job")
        with pytest.raises(UnknownTimeZone, match="256 characters long; the limit is 255"):
            await client.preview("* * * * *", "Z" * 256)
        assert await client.list_schedules() == []
        async with grpc.aio.insecure_channel(server.target) as channel:
            call = pb_grpc.WorkerServiceStub(channel).Attach(
                pb.AttachRequest(worker_id="w" * 256, pools=["edges"], slots=1)
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await call.read()
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "worker_id is 256 characters long; the limit is 255" in (
            refused.value.details() or ""
        )
        assert not any(len(line) > 2000 for line in server.raw)  # never logged whole


async def test_attach_streams_per_connection_are_limited(tmp_path: Path) -> None:
    async with (
        _server(tmp_path, MEMORY) as server,
        grpc.aio.insecure_channel(server.target) as channel,
    ):
        workers = pb_grpc.WorkerServiceStub(channel)
        calls = []
        ids = [uuid.uuid4().hex for _ in range(32)]
        try:
            for worker_id in ids:
                call = workers.Attach(
                    pb.AttachRequest(worker_id=worker_id, pools=["edges"], slots=1)
                )
                calls.append(call)
                first = await call.read()
                assert isinstance(first, pb.AttachResponse)
            extra = workers.Attach(pb.AttachRequest(worker_id="extra", pools=["edges"], slots=1))
            calls.append(extra)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await extra.read()
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            assert isinstance(wire.error_from_rpc(refused.value), AdmissionRejected)
            assert "already holds 32 Attach streams" in (refused.value.details() or "")
            # A stream that ends frees its place.
            calls[0].cancel()
            await server.wait_for("worker detached", worker=ids[0])
            again = workers.Attach(pb.AttachRequest(worker_id="again", pools=["edges"], slots=1))
            calls.append(again)
            assert isinstance(await again.read(), pb.AttachResponse)
        finally:
            for call in calls:
                call.cancel()


async def test_workers_per_pool_are_limited(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24 audit gap 2: ``MAX_LINKS_PER_POOL`` (1,000 links) refuses the next link to a
    full pool, whichever connection it comes on, counts nothing for a refused one, and a
    detach frees a place. (The refusal's RESOURCE_EXHAUSTED on the wire is the per-connection
    test's.)"""
    monkeypatch.setattr(_links, "MAX_LINKS_PER_POOL", 2)
    pools: list[Pool | RemotePool] = [RemotePool("edges"), RemotePool("other")]
    async with Scheduler(pools, store=MemoryStore()) as sched:
        links = _links.Links()

        def attach(peer: str, *pools: str) -> WorkerLink:
            return links.attach(sched, peer, {"pools": pools, "slots": 1}, peer)

        first, _ = attach("ipv4:10.0.0.1:1", "edges"), attach("ipv4:10.0.0.2:1", "edges")
        for refused in (("edges",), ("other", "edges")):
            with pytest.raises(AdmissionRejected) as full:
                attach("ipv4:10.0.0.3:1", *refused)
            assert str(full.value) == (
                "pool 'edges' already has 2 workers attached, the limit: give the workers more "
                "slots each instead"
            )
        other = attach("ipv4:10.0.0.3:1", "other")  # the refusals counted nothing for "other"
        attach("ipv4:10.0.0.4:1", "other")
        assert sorted(w.worker_id for w in links.workers()) == [
            "ipv4:10.0.0.1:1",
            "ipv4:10.0.0.2:1",
            "ipv4:10.0.0.3:1",
            "ipv4:10.0.0.4:1",
        ]
        links.detach(first)
        first.close()
        attach("ipv4:10.0.0.5:1", "edges")
        with pytest.raises(AdmissionRejected):
            attach("ipv4:10.0.0.6:1", "edges")
        links.detach(other)
        other.close()
        with pytest.raises(AdmissionRejected):  # one pool of the two is still full
            attach("ipv4:10.0.0.6:1", "edges", "other")
        attach("ipv4:10.0.0.6:1", "other")
