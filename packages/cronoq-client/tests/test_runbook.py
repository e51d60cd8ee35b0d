"""docs/operations.md holds true: every ``cronoq`` line of its blocks marked
``<!-- runbook: run -->`` runs, through bash as an operator would type it, against a real
server holding what the runbook speaks of (a failed task, a schedule, a pool, an attached worker),
and exits 0. Each command runs whatever ran before it: a retry, a pause, a trigger are each
either repeatable or followed by what undoes them."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from server_thread import ThreadedServer, threaded_server

from cronoq import JsonCodec, RetryPolicy, Status, TaskContext, TaskError
from cronoq_client import Client, Worker

ROOT = Path(__file__).resolve().parents[3]
RUNBOOK = ROOT / "docs" / "operations.md"
_RUN = re.compile(r"^<!--\s*runbook:\s*run\s*-->\s*$")


def runbook_commands() -> list[tuple[str, str]]:
    """(section, command) for each ``cronoq`` line of the blocks marked to run."""
    found: list[tuple[str, str]] = []
    lines = RUNBOOK.read_text(encoding="utf-8").splitlines()
    section = ""
    marked = False
    inside = False
    for line in lines:
        if not inside and line.startswith("## "):
            section = line[3:]
        if not inside and _RUN.match(line):
            marked = True
        elif line.startswith("```"):
            inside = not inside
            if not inside:
                marked = False
        elif inside and marked and line.startswith("cronoq "):
            found.append((section, line))
    return found


COMMANDS = runbook_commands()


def test_every_section_of_the_runbook_has_commands_that_run() -> None:
    sections = {
        line[3:] for line in RUNBOOK.read_text(encoding="utf-8").splitlines()
        if line.startswith("## ")
    }  # fmt: skip
    assert sections == {section for section, _ in COMMANDS}


@pytest.fixture(scope="module")
def scene(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A server with what the runbook speaks of, a worker of its pool attached throughout
    (``workers list`` has one to show), and the environment of its commands."""

    async def broken(ctx: TaskContext, payload: Any) -> None:
        raise TaskError("the report's source table is missing", retryable=False)

    with threaded_server(tmp_path_factory.mktemp("runbook")) as server:
        worker = Worker(server.target, {"other": broken}, codec=JsonCodec())
        working = server.start(worker.run())
        try:
            server.call(worker.attached())
            yield _stage(server)
        finally:
            worker.stop()
            server.call(asyncio.wait_for(asyncio.shield(working), 30))


def _stage(server: ThreadedServer) -> dict[str, str]:
    with Client(server.target, codec=JsonCodec()) as client:
        failed = client.submit(
            "report", {"day": "2026-05-01"}, pool="other", retry=RetryPolicy(max_attempts=1)
        )
        assert client.wait(failed, timeout=30).status is Status.FAILED
        client.add_schedule("nightly-report", "0 3 * * *", kind="report", pool="other")
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "CRONOQ_TARGET": server.target,
        "CRONOQ_CONFIG": "",
        "CRONOQ_CONTEXT": "",
        "CRONOQ_TOKEN": "",
        "CRONOQ_TOKEN_FILE": "",
        "TASK_ID": str(failed),
        "SCHEDULE": "nightly-report",
        "POOL": "other",
    }


@pytest.mark.parametrize(("section", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_the_runbook_command_runs(scene: dict[str, str], section: str, command: str) -> None:
    done = subprocess.run(
        ["bash", "-c", command], env=scene, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{section}: {command}\n{done.stdout}{done.stderr}"
    assert done.stdout, f"{section}: {command} printed nothing"
