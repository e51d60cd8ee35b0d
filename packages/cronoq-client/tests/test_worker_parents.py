"""The outputs of a task's parents reach a remote worker's function (issue 32): the server
reads them as stored and sends them with the attempt, the Worker decodes them with its codec
into ``ctx.parent_outputs``, as a local pool's attempt gets them. Against real
``cronoq-server`` processes (memory store), with JSON and with end-to-end encryption, and
what happens when they cannot be decoded or sent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from server_process import ServerProcess, config_toml, running_server

from cronoq import BytesCodec, Codec, JsonCodec, RetryPolicy, Status, TaskContext
from cronoq.crypto import EncryptedCodec
from cronoq_client import AsyncClient, Worker

LEASE_S = 1.0
WAIT_S = 15.0
POOL = f'[[pools]]\nname = "default"\nlease_s = {LEASE_S}\n'


@asynccontextmanager
async def _server(directory: Path, tables: str = "") -> AsyncIterator[ServerProcess]:
    config = config_toml('[store]\nkind = "memory"\n', pools=POOL, tables=tables)
    async with running_server(directory, config) as process:
        await process.leading()
        yield process


@asynccontextmanager
async def _working(
    target: str, fn: Callable[[TaskContext, Any], Any], codec: Codec
) -> AsyncIterator[Worker]:
    """A Worker of the pool, attached, until the block ends (then drained)."""
    worker = Worker(target, {"default": fn}, codec=codec, worker_id="parents-worker")
    running = asyncio.ensure_future(worker.run())
    attached = asyncio.ensure_future(worker.attached())
    try:
        done, _ = await asyncio.wait(
            {attached, running}, timeout=WAIT_S, return_when=asyncio.FIRST_COMPLETED
        )
        if running in done:
            running.result()  # a refusal for good: its exception
        assert attached in done, "the worker did not attach"
        yield worker
    finally:
        attached.cancel()
        worker.stop()
        await asyncio.wait_for(running, WAIT_S)


class Seen:
    """What the children's functions were given, by child id."""

    def __init__(self) -> None:
        self.parent_outputs: dict[int, Mapping[int, Any]] = {}

    async def run(self, ctx: TaskContext, payload: Any) -> Any:
        if ctx.kind == "child":
            self.parent_outputs[ctx.task_id] = dict(ctx.parent_outputs)
            return None
        return payload  # a parent: its payload becomes its output


async def _parents_and_child(client: AsyncClient, *outputs: Any) -> tuple[list[int], int]:
    """Parents that succeed with these outputs (None: no output), then a child after them."""
    parents = [await client.submit("parent", value) for value in outputs]
    for parent in parents:
        assert (await client.wait(parent, timeout=WAIT_S)).status is Status.SUCCEEDED
    child = await client.submit("child", after=parents)
    return parents, child


async def test_parent_outputs_reach_the_remote_function_decoded(tmp_path: Path) -> None:
    seen = Seen()
    codec = JsonCodec()
    async with (
        _server(tmp_path) as server,
        AsyncClient(server.target, codec=codec, timeout=WAIT_S) as client,
        _working(server.target, seen.run, codec),
    ):
        (first, second), child = await _parents_and_child(client, {"rows": 21}, None)
        assert (await client.wait(child, timeout=WAIT_S)).status is Status.SUCCEEDED
        # A parent that returned None is there with None; each by its id.
        assert seen.parent_outputs[child] == {first: {"rows": 21}, second: None}
        # A task without parents gets none.
        alone = await client.submit("child")
        assert (await client.wait(alone, timeout=WAIT_S)).status is Status.SUCCEEDED
        assert seen.parent_outputs[alone] == {}


async def test_encrypted_parent_outputs_are_decoded_by_the_workers_key_alone(
    tmp_path: Path,
) -> None:
    """With EncryptedCodec each output is bound to its own task: the worker with the key reads
    its parents' outputs (the server only ever held ciphertext); a worker with another key
    under the same id fails the child's attempt for good, naming the parent, without calling
    the function."""
    codec = EncryptedCodec({"k1": EncryptedCodec.generate_key()}, "k1", inner=JsonCodec())
    wrong = EncryptedCodec({"k1": EncryptedCodec.generate_key()}, "k1", inner=JsonCodec())
    seen = Seen()
    async with (
        _server(tmp_path) as server,
        AsyncClient(server.target, codec=codec, timeout=WAIT_S) as client,
        AsyncClient(server.target, codec=BytesCodec(), timeout=WAIT_S) as raw,
    ):
        async with _working(server.target, seen.run, codec):
            (parent,), child = await _parents_and_child(client, {"secret": "gate 7"})
            assert (await client.wait(child, timeout=WAIT_S)).status is Status.SUCCEEDED
            assert seen.parent_outputs[child] == {parent: {"secret": "gate 7"}}
            stored = (await raw.get(parent)).output
            assert isinstance(stored, bytes) and b"gate 7" not in stored
            parent = await client.submit("parent", {"secret": "gate 8"})
            assert (await client.wait(parent, timeout=WAIT_S)).status is Status.SUCCEEDED
        # Submitted once that worker is gone: the one that comes has the wrong key.
        child = await client.submit("child", after=[parent])
        async with _working(server.target, seen.run, wrong):
            info = await client.wait(child, timeout=WAIT_S)
        assert (info.status, info.attempt) == (Status.FAILED, 1)  # not retried
        assert info.message.startswith("attempt 1 failed (not retryable): ")
        assert info.message == (
            f"attempt 1 failed (not retryable): output of parent task {parent}: an "
            "encrypted value failed authentication with key 'k1': it was altered, or encrypted "
            "with another key under the same id"
        )
        assert child not in seen.parent_outputs, "the function was not called"


async def test_parent_outputs_too_large_for_a_stream_message_fail_the_attempt_on_the_server(
    tmp_path: Path,
) -> None:
    """Each output fits in the message that reported it, but not all of them together in the
    attempt: the server fails the child's attempt for good (no attempt would be smaller),
    saying so, sends the worker nothing of it, and the worker goes on."""
    limit = 64 * 1024
    seen = Seen()
    codec = BytesCodec()
    async with (
        _server(tmp_path, f"[limits]\nmax_message_bytes = {limit}\n") as server,
        AsyncClient(server.target, codec=codec, timeout=WAIT_S) as client,
        _working(server.target, seen.run, codec),
    ):
        large = b"x" * 40_000
        parents = [await client.submit("parent", large) for _ in range(2)]
        for parent in parents:
            assert (await client.wait(parent, timeout=WAIT_S)).output == large
        child = await client.submit("child", after=parents, retry=RetryPolicy(max_attempts=3))
        info = await client.wait(child, timeout=WAIT_S)
        assert (info.status, info.attempt) == (Status.FAILED, 1)
        assert info.message.startswith(
            "attempt 1 failed (not retryable): the outputs of its parents take more than "
        ), info.message
        assert f"over the server's message limit of {limit}" in info.message
        assert "raise limits.max_message_bytes" in info.message
        assert child not in seen.parent_outputs
        # One parent's output fits: its child runs, on the same worker.
        small = await client.submit("child", after=parents[:1])
        assert (await client.wait(small, timeout=WAIT_S)).status is Status.SUCCEEDED
        assert seen.parent_outputs[small] == {parents[0]: large}
