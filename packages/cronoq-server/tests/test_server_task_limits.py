"""Task limits (docs/limits.md) on the service path: a real server with authentication on,
limits from its TOML, tasks naming them over gRPC and run by a remote ``cronoq_client.Worker``.

(``test_server_limits.py`` is about message-size limits.)"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess, config_toml, running_server
from test_server_auth import MEMORY, TOKENS, identities_toml

from cronoq import (
    AdmissionRejected,
    Limit,
    LimitFull,
    OnFull,
    Status,
    TaskContext,
    TaskRequest,
    UnknownLimit,
)
from cronoq.errors import InvalidArgument, PermissionDenied
from cronoq_client import AsyncClient, Worker

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 10.0
KEYS = ("acme", "globex", "initech")
PER_KEY = 4
POOLS = '[[pools]]\nname = "matrix"\nlimits = ["pool-wide"]\n'
LIMITS = """
[[task_limits]]
name = "tenant"
concurrency = 2
per_key = true

[[task_limits]]
name = "pool-wide"
concurrency = 1000

[[task_limits]]
name = "gate"
concurrency = 1
on_full = "reject"
"""
AUTH = "[auth]\nreload_interval_s = 600\n" + identities_toml(
    {
        "submitter": {"permissions": ["submit", "read"], "submit_pools": ["matrix"]},
        "worker-a": {"permissions": ["work"], "work_pools": ["matrix"]},
        "reader": {"permissions": ["read"]},
        "watcher": {"permissions": ["metrics"]},
    },
    TOKENS,
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServerProcess]:
    # Arrays of tables come after every plain table: [[task_limits]] goes last.
    config = config_toml(MEMORY, pools=POOLS + LIMITS, tables=AUTH)
    async with running_server(tmp_path_factory.mktemp("task-limits"), config) as process:
        await process.leading()
        yield process


@pytest_asyncio.fixture(loop_scope="module")
async def client(server: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.target, token=TOKENS["submitter"], timeout=TIMEOUT_S) as opened:
        yield opened


class Recorder:
    """The worker's function: records each key's attempts running at once, and holds every
    attempt until ``release`` is set."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.changed = asyncio.Condition()
        self.release = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: bytes | None) -> bytes:
        assert payload is not None
        key = payload.decode()
        async with self.changed:
            self.running[key] += 1
            self.peak[key] = max(self.peak[key], self.running[key])
            self.changed.notify_all()
        try:
            await self.release.wait()
        finally:
            async with self.changed:
                self.running[key] -= 1
                self.changed.notify_all()
        return payload

    async def until(self, running: dict[str, int]) -> None:
        async with asyncio.timeout(TIMEOUT_S), self.changed:
            await self.changed.wait_for(
                lambda: all(self.running[k] == n for k, n in running.items())
            )


async def test_a_per_key_limit_holds_each_key_to_its_concurrency_on_remote_workers(
    server: ServerProcess, client: AsyncClient
) -> None:
    recorder = Recorder()
    worker = Worker(server.target, {"matrix": recorder}, slots=50, token=TOKENS["worker-a"])
    working = asyncio.ensure_future(worker.run())
    try:
        # One key through Submit (SubmitEach), the others through SubmitMany.
        ids = [
            await client.submit("k", b"acme", pool="matrix", limits={"tenant": "acme"})
            for _ in range(PER_KEY)
        ]
        ids += await client.submit_many(
            TaskRequest("k", key.encode(), "matrix", limits={"tenant": key})
            for key in KEYS[1:]
            for _ in range(PER_KEY)
        )
        # Two of each key run and are held; the other two of each wait for the limit.
        await recorder.until(dict.fromkeys(KEYS, 2))
        waiting = {s.task_id: s for s in await client.list(pool="matrix", status=[Status.READY])}
        assert len(waiting) == 2 * len(KEYS)
        for summary in waiting.values():
            assert summary.waiting_for is not None
            assert summary.waiting_for.startswith("limit 'tenant' key '")
            assert summary.waiting_for.endswith("': 2 of 2 running")
        held = await client.get(next(iter(waiting)))
        assert held.status is Status.READY
        assert held.limits == (("pool-wide", None), ("tenant", held.payload.decode()))
        assert held.waiting_for == f"limit 'tenant' key '{held.payload.decode()}': 2 of 2 running"

        by_name = {info.limit.name: info for info in await client.list_limits(keys=10)}
        assert by_name.keys() == {"tenant", "pool-wide", "gate"}
        tenant = by_name["tenant"]
        assert tenant.limit == Limit("tenant", concurrency=2, per_key=True)
        assert (tenant.keys_in_use, tenant.running, tenant.waiting) == (3, 6, 6)
        assert {(k.key, k.running, k.waiting) for k in tenant.keys} == {(key, 2, 2) for key in KEYS}
        pool_wide = by_name["pool-wide"]
        assert (pool_wide.running, [k.key for k in pool_wide.keys]) == (6, [None])
        assert by_name["gate"].limit.on_full is OnFull.REJECT
        assert [len(i.keys) for i in await client.list_limits(keys=0)] == [0, 0, 0]
        # Prometheus: by limit, never by key.
        series = await _limit_series(server)
        assert series["cronoq_limit_running"] == {"gate": 0, "pool-wide": 6, "tenant": 6}
        assert series["cronoq_limit_waiting"] == {"gate": 0, "pool-wide": 6, "tenant": 6}
        assert series["cronoq_limit_keys"] == {"gate": 0, "pool-wide": 1, "tenant": 3}
        assert series["cronoq_limit_starts"] == {"gate": 0, "pool-wide": 0, "tenant": 0}

        recorder.release.set()
        done = [await client.wait(task_id, timeout=TIMEOUT_S) for task_id in ids]
    finally:
        worker.stop()
        await asyncio.gather(working, return_exceptions=True)
    assert [t.status for t in done] == [Status.SUCCEEDED] * len(KEYS) * PER_KEY
    assert recorder.peak == dict.fromkeys(KEYS, 2)
    assert done[0].waiting_for is None


async def _limit_series(server: ServerProcess) -> dict[str, dict[str, float]]:
    """The cronoq_limit_* samples of a scrape, by name and then by their ``limit`` label."""
    headers = {"Authorization": f"Bearer {TOKENS['watcher']}"}
    url = f"{server.http}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as response:
        assert response.status == 200
        text = await response.text()
    series: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("cronoq_limit_"):
            for sample in family.samples:
                assert set(sample.labels) == {"limit"}
                series.setdefault(sample.name, {})[sample.labels["limit"]] = sample.value
    return series


async def test_a_full_reject_limit_refuses_the_submission_with_limit_full(
    server: ServerProcess, client: AsyncClient
) -> None:
    recorder = Recorder()
    worker = Worker(server.target, {"matrix": recorder}, slots=5, token=TOKENS["worker-a"])
    working = asyncio.ensure_future(worker.run())
    try:
        first = await client.submit("k", b"gate", pool="matrix", limits={"gate": None})
        await recorder.until({"gate": 1})
        # Submit (through SubmitEach) and SubmitMany both answer with the core's class.
        with pytest.raises(LimitFull, match="gate") as caught:
            await client.submit("k", b"gate", pool="matrix", limits={"gate": None})
        assert isinstance(caught.value, AdmissionRejected)
        with pytest.raises(LimitFull, match="gate"):
            await client.submit_many([TaskRequest("k", b"gate", "matrix", limits={"gate": None})])
        recorder.release.set()
        assert (await client.wait(first, timeout=TIMEOUT_S)).status is Status.SUCCEEDED
    finally:
        worker.stop()
        await asyncio.gather(working, return_exceptions=True)


async def test_limits_a_submission_names_are_checked_by_the_server(client: AsyncClient) -> None:
    with pytest.raises(UnknownLimit, match="unknown limit 'nope'"):
        await client.submit("k", pool="matrix", limits={"nope": None})
    with pytest.raises(InvalidArgument, match="per key: the task must name its key"):
        await client.submit("k", pool="matrix", limits={"tenant": None})
    with pytest.raises(InvalidArgument, match="at most 16 limits"):
        await client.submit("k", pool="matrix", limits={f"l{i}": None for i in range(17)})


async def test_list_limits_is_a_read(server: ServerProcess) -> None:
    async with AsyncClient(server.target, token=TOKENS["reader"], timeout=TIMEOUT_S) as reader:
        assert {i.limit.name for i in await reader.list_limits()} == {"tenant", "pool-wide", "gate"}
    async with AsyncClient(server.target, token=TOKENS["worker-a"], timeout=TIMEOUT_S) as worker:
        with pytest.raises(PermissionDenied):
            await worker.list_limits()
