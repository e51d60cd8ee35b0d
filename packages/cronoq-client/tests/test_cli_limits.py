"""``cronoq submit --limit`` and ``cronoq limits`` against a real server configured with task
limits (docs/limits.md), and ``cronoq tasks get`` showing what holds a task back."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_thread import ThreadedServer, cli_env, threaded_server
from test_cli import as_json, run

from cronoq import TaskContext
from cronoq_client import Worker
from cronoq_client._cli._errors import ExitCode

TIMEOUT_S = 10.0
POOLS = """
[[pools]]
name = "default"

[[task_limits]]
name = "tenant"
concurrency = 1
per_key = true

[[task_limits]]
name = "stripe"
rate = 1000
per_s = 600
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    with threaded_server(tmp_path_factory.mktemp("cli-limits"), pools=POOLS) as running:
        yield running


@pytest.fixture
def env(server: ThreadedServer, tmp_path: Path) -> dict[str, str]:
    return cli_env(server.target, tmp_path)


def test_submit_with_limits_shows_the_held_task_and_the_limits_table(
    server: ThreadedServer, env: dict[str, str]
) -> None:
    async def events() -> tuple[asyncio.Event, asyncio.Event]:
        return asyncio.Event(), asyncio.Event()

    started, release = server.call(events())

    async def hold(ctx: TaskContext, payload: object) -> None:
        started.set()
        await release.wait()

    worker = Worker(server.target, {"default": hold}, slots=5)
    working = server.start(worker.run())
    try:
        args = ("submit", "cli-limits", "--limit", "tenant=acme", "--limit", "stripe", "-o", "json")
        first = as_json(run(env, *args))["task_id"]
        server.call(asyncio.wait_for(started.wait(), TIMEOUT_S))
        second = as_json(run(env, *args))["task_id"]

        info = as_json(run(env, "tasks", "get", str(second), "-o", "json"))
        assert info["status"] == "ready"
        assert info["limits"] == {"stripe": None, "tenant": "acme"}
        assert info["waiting_for"] == "limit 'tenant' key 'acme': 1 of 1 running"
        shown = run(env, "tasks", "get", str(second)).stdout
        assert "limit 'tenant' key 'acme': 1 of 1 running" in shown
        assert as_json(run(env, "tasks", "get", str(first), "-o", "json"))["waiting_for"] is None

        limits = {r["name"]: r for r in as_json(run(env, "limits", "-o", "json"))}
        assert limits.keys() == {"tenant", "stripe"}
        tenant = limits["tenant"]
        assert (tenant["bound"], tenant["on_full"], tenant["per_key"]) == (
            "1 running, per key", "queue", True,
        )  # fmt: skip
        assert (tenant["keys_in_use"], tenant["running"], tenant["waiting"]) == (1, 1, 1)
        assert tenant["keys"] == [{"key": "acme", "running": 1, "starts": 0, "waiting": 1}]
        stripe = limits["stripe"]
        assert (stripe["bound"], stripe["per_s"], stripe["starts"]) == (
            "1000 starts per 600s", 600, 1,
        )  # fmt: skip
        table = run(env, "limits").stdout.splitlines()
        assert table[0].split()[:3] == ["NAME", "BOUND", "ON"]
        assert any(line.startswith("tenant") and "acme 1/1/0" in line for line in table)
        assert all(
            r["keys"] == [] for r in as_json(run(env, "limits", "--keys", "0", "-o", "json"))
        )
    finally:
        server.call(_set(release))
        worker.stop()
        server.call(asyncio.wait_for(working, TIMEOUT_S))


async def _set(event: asyncio.Event) -> None:
    event.set()


def test_bad_limits_on_the_command_line(env: dict[str, str]) -> None:
    run(env, "submit", "cli-limits", "--limit", "=acme", code=ExitCode.USAGE)
    run(env, "submit", "cli-limits", "--limit", "stripe", "--limit", "stripe", code=ExitCode.USAGE)
    error = run(env, "submit", "cli-limits", "--limit", "nope", code=ExitCode.INVALID).stderr
    assert "unknown limit 'nope'" in error
    run(env, "submit", "cli-limits", "--limit", "tenant", code=ExitCode.INVALID)
    run(env, "limits", "--keys", "1001", code=ExitCode.USAGE)
