"""A client leaves a frozen replica (SIGSTOP: its TCP connections stay open, its kernel even
accepts new ones) within its stall timeout, instead of waiting out the calls' deadlines: what
was in flight there ends as cut mid-call, what never left goes to the next replica.

Two real ``cronoq-server`` processes, each with a store of its own, stand for the frozen
leader and its successor: what each one applied is read from it afterwards, so that an
acknowledgement from one replica is checked never to have landed on the other."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from server_process import ServerProcess, config_toml, start_server

from cronoq.errors import InvalidArgument, SchedulerError, WaitTimedOut
from cronoq_client import AsyncClient

STALL_S = 1.0
CLIENT_TIMEOUT_S = 20.0
"""Far beyond the stall timeout: a client that waited for its deadline fails the test."""


@contextlib.asynccontextmanager
async def two_servers(directory: Path) -> AsyncIterator[tuple[ServerProcess, ServerProcess]]:
    config = config_toml('[store]\nkind = "memory"\n')
    first, second = await asyncio.gather(
        start_server(directory, config), start_server(directory, config)
    )
    try:
        await asyncio.gather(first.leading(), second.leading())
        yield first, second
    finally:
        first.signal(signal.SIGCONT)
        await asyncio.gather(first.stop(), second.stop())


async def _kinds(target: str) -> set[str]:
    """The kinds of the tasks a replica holds (each test's submissions differ by kind)."""
    async with AsyncClient(target, timeout=CLIENT_TIMEOUT_S) as client:
        return {task.kind for task in await client.list(limit=1000)}


async def test_calls_queued_behind_a_frozen_replica_go_to_the_next_one(tmp_path: Path) -> None:
    async with two_servers(tmp_path) as (frozen, spare):
        async with AsyncClient(
            [frozen.target, spare.target], timeout=CLIENT_TIMEOUT_S, stall_timeout=STALL_S
        ) as client:
            await client.submit("warm")  # the connection to the first one is up
            frozen.signal(signal.SIGSTOP)
            loop = asyncio.get_running_loop()
            began = loop.time()
            kinds = [f"k{i}" for i in range(200)]
            outcomes = await asyncio.gather(
                *(client.submit(kind) for kind in kinds), return_exceptions=True
            )
            took = loop.time() - began
        acknowledged = {k for k, o in zip(kinds, outcomes, strict=True) if isinstance(o, int)}
        unknown = [o for o in outcomes if not isinstance(o, int)]
        for error in unknown:
            assert isinstance(error, SchedulerError), repr(error)
            assert error.applied is None, error  # only what was in flight on the frozen one
            assert "stalled" in str(error), error
        # One call was in flight when the replica froze (a Submit or one SubmitEach): every
        # other submission waited behind it and was acknowledged by the next replica.
        assert acknowledged and len(unknown) < len(kinds) // 2, (len(unknown), took)
        assert took < CLIENT_TIMEOUT_S / 2, took
        frozen.signal(signal.SIGCONT)
        on_frozen, on_spare = await asyncio.gather(_kinds(frozen.target), _kinds(spare.target))
    assert acknowledged <= on_spare
    assert not acknowledged & on_frozen  # an acknowledgement landed once, where it says
    assert on_frozen - {"warm"} <= set(kinds) - acknowledged


async def test_a_connection_a_frozen_replica_never_answered_carried_nothing(
    tmp_path: Path,
) -> None:
    """A keyless submit is retried, not answered "outcome unknown": the frozen process's kernel
    took the TCP connection, but nothing on it ever reached the server."""
    async with two_servers(tmp_path) as (frozen, spare):
        frozen.signal(signal.SIGSTOP)
        async with AsyncClient(
            [frozen.target, spare.target], timeout=CLIENT_TIMEOUT_S, stall_timeout=STALL_S
        ) as client:
            task_id = await client.submit("once")
            assert (await client.get(task_id)).kind == "once"
        frozen.signal(signal.SIGCONT)
        assert await _kinds(frozen.target) == set()
        assert await _kinds(spare.target) == {"once"}


async def test_a_slow_answer_of_a_live_replica_is_waited_for(tmp_path: Path) -> None:
    """A call the server holds (a wait) on a replica that answers health checks is never cut:
    the stall timeout is about a replica's silence, not about a call's length."""
    async with (
        two_servers(tmp_path) as (first, second),
        AsyncClient(
            [first.target, second.target], timeout=CLIENT_TIMEOUT_S, stall_timeout=STALL_S
        ) as client,
    ):
        task_id = await client.submit("job", b"never runs")  # no worker: it waits
        # Held three stall timeouts: a connection cut meanwhile would send the wait to the
        # other server, which does not know the task (TaskNotFound, not WaitTimedOut).
        with pytest.raises(WaitTimedOut):
            await client.wait(task_id, timeout=3 * STALL_S)


@pytest.mark.parametrize("value", [0, -1.0, True, "2", float("nan"), float("inf")])
def test_stall_timeout_is_checked(value: object) -> None:
    with pytest.raises(InvalidArgument, match="stall_timeout"):
        AsyncClient("127.0.0.1:1", stall_timeout=value)  # type: ignore[arg-type]
