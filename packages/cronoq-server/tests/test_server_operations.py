"""The operator calls (issue 21) through real ``cronoq-server`` processes: a pool pause and a
manual retry survive a SIGKILL of the leader on both stores; a paused pool starts nothing with
a worker attached; ListWorkers shows that worker. (The permissions each call needs are in
test_server_auth's matrix.)"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from server_cluster import Balancer
from server_pg import pg_schema
from test_server_ha import StoreSection, cluster, store

from cronoq import NotRetryable, RetryPolicy, Status, TaskContext, TaskError
from cronoq_client import AsyncClient, Worker

__all__ = ["pg_schema", "store"]  # fixtures: requested by name

ONCE = RetryPolicy.exponential(1, initial=0.01, jitter=0.0)


async def test_a_pool_pause_and_a_retry_survive_a_sigkill_of_the_leader(
    tmp_path: Path, store: StoreSection
) -> None:
    runs: list[tuple[str, int]] = []
    ran = asyncio.Event()
    broken = True

    async def work(ctx: TaskContext, payload: bytes) -> bytes:
        runs.append((ctx.kind, ctx.attempt))
        ran.set()
        if broken:
            raise TaskError("broken", retryable=False)
        return b"ok"

    async with (
        cluster(tmp_path, store(1.5)) as (old, new),
        Balancer([old.grpc_port, new.grpc_port]) as balancer,
    ):
        worker = Worker(balancer.target, {"default": work}, slots=2, worker_id="w-1")
        working = asyncio.ensure_future(worker.run())
        try:
            async with AsyncClient(old.target, timeout=10) as client:
                failed = await client.submit("fails", b"", retry=ONCE)
                assert (await client.wait(failed, timeout=10)).status is Status.FAILED
                (attached,) = await client.list_workers()
                assert (attached.worker_id, attached.pools, attached.slots) == (
                    "w-1",
                    ("default",),
                    2,
                )
                assert attached.last_heartbeat_at is not None  # it reported the attempt
                assert attached.identity is None  # this server runs without authentication
                paused = await client.pause_pool("default")
                assert paused.paused and paused.remote
                # With the worker attached and its slots free, nothing starts: every step
                # dispatches, and the submission's step committed before submit returned.
                queued = await client.submit("queued", b"")
                assert (await client.get(queued)).status is Status.READY
                retried = await client.retry(failed)
                assert (retried.status, retried.attempt) == (Status.READY, 1)
                refusal = (
                    f"^task {failed} is ready: only a failed or cancelled task can be retried$"
                )
                with pytest.raises(NotRetryable, match=refusal):
                    await client.retry(failed)
                (pool,) = await client.list_pools()
                assert (pool.paused, pool.depth[Status.READY], pool.running) == (True, 2, 0)
            assert runs == [("fails", 1)]
            broken = False
            old.signal(signal.SIGKILL)
            await new.leading()
            async with AsyncClient(new.target, timeout=10) as client:
                (pool,) = await client.list_pools()
                assert (pool.paused, pool.depth[Status.READY]) == (True, 2)
                assert (await client.get(failed)).message == "retried by request"
                await client.resume_pool("default")
                done = await client.wait(failed, timeout=20)
                other = await client.wait(queued, timeout=20)
        finally:
            worker.stop()
            await asyncio.gather(working, return_exceptions=True)
    assert (done.status, done.attempt, done.output) == (Status.SUCCEEDED, 2, b"ok")
    assert other.status is Status.SUCCEEDED
    assert sorted(runs) == [("fails", 1), ("fails", 2), ("queued", 1)]
