"""``cronoq worker MODULE:OBJECT`` as a real process against a real cronoq-server: it runs
tasks of both function kinds, drains on SIGTERM (the running attempt finishes and reports,
then it exits 0), and refuses what it cannot run with its exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_thread import ThreadedServer, threaded_server

from cronoq import JsonCodec, Status
from cronoq_client import Client
from cronoq_client._cli._errors import ExitCode

CRONOQ = str(Path(sys.executable).parent / "cronoq")
JOBS = """
import sys


async def double(ctx, payload):
    return {"twice": payload * 2}


def hold(ctx, payload):  # a plain function: it runs in a thread
    print(f"started {ctx.task_id}", file=sys.stderr, flush=True)
    sys.stdin.readline()  # until the test lets it finish
    return {"held": payload}


pools = {"default": double, "other": hold}
unknown = {"nowhere": double}
not_a_mapping = [double]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    with threaded_server(tmp_path_factory.mktemp("worker")) as running:
        yield running


def _worker(
    server: ThreadedServer, directory: Path, reference: str, *args: str
) -> subprocess.Popen[str]:
    (directory / "jobs.py").write_text(textwrap.dedent(JOBS))
    return subprocess.Popen(
        [CRONOQ, "--target", server.target, "worker", reference, *args],
        cwd=directory,
        env={**os.environ, "CRONOQ_CONFIG": "", "XDG_CONFIG_HOME": str(directory)},
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(process: subprocess.Popen[str], text: str, seen: list[str]) -> None:
    """Read the worker's log until a line contains ``text``."""
    assert process.stderr is not None
    while line := process.stderr.readline():
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"the worker exited before {text!r}:\n{''.join(seen)}")


def test_the_worker_runs_tasks_and_drains_on_sigterm(
    server: ThreadedServer, tmp_path: Path
) -> None:
    seen: list[str] = []
    with (
        _worker(server, tmp_path, "jobs:pools", "--slots", "2") as process,
        Client(server.target, codec=JsonCodec(), timeout=10) as client,
    ):
        try:
            _until(process, "worker attached", seen)
            ids = [client.submit("double", n) for n in range(5)]
            outputs = [client.wait(task_id, timeout=30).output for task_id in ids]
            assert outputs == [{"twice": n * 2} for n in range(5)]

            held = client.submit("hold", "h", pool="other")
            _until(process, f"started {held}", seen)
            process.send_signal(signal.SIGTERM)
            _until(process, "worker draining", seen)
            assert process.poll() is None  # it waits for the running attempt
            assert process.stdin is not None
            process.stdin.write("\n")
            process.stdin.flush()
            assert process.wait(30) == 0
            seen.append(process.stderr.read() if process.stderr else "")
            assert "worker drained" in "".join(seen)
            done = client.wait(held, timeout=10)
            assert (done.status, done.output, done.attempt) == (
                Status.SUCCEEDED, {"held": "h"}, 1,
            )  # fmt: skip
        finally:
            process.kill()


@pytest.mark.parametrize(
    ("reference", "code", "message"),
    [
        ("jobs", ExitCode.USAGE, "must be MODULE:OBJECT"),
        ("missing_module:pools", ExitCode.USAGE, "importing missing_module failed"),
        ("jobs:absent", ExitCode.USAGE, "jobs has no absent"),
        ("jobs:not_a_mapping", ExitCode.USAGE, "must map pool names to functions"),
        ("jobs:unknown", ExitCode.INVALID, "nowhere"),
    ],
)
def test_a_worker_it_cannot_run_exits_with_one_line(
    server: ThreadedServer, tmp_path: Path, reference: str, code: int, message: str
) -> None:
    with _worker(server, tmp_path, reference) as process:
        _, errors = process.communicate(timeout=60)
    assert process.returncode == code, errors
    assert message in errors and errors.startswith("error: "), errors
    assert errors.count("\n") == 1, errors
