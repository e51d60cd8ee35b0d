"""The ``cronoq`` command end to end against a real cronoq-server: every command in table and
JSON output, its errors as one line with the documented exit code, contexts and credentials,
``--watch`` and the console script in a real process (``test_cli_worker.py``: ``worker``).

The commands run in this process through click's runner (the real command, a real Client, a
real server); the tests that need signals run the ``cronoq`` script itself. The server is
shared by the module: each test uses kinds, keys and schedule names of its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from server_thread import ThreadedServer, cli_env, threaded_server

from cronoq import (
    JsonCodec,
    RetryPolicy,
    ScheduleInfo,
    Status,
    TaskContext,
    TaskError,
    TaskInfo,
    WorkerInfo,
)
from cronoq_client import Client, Worker
from cronoq_client._cli import cli
from cronoq_client._cli._errors import ConfigError, ExitCode
from cronoq_client._cli._pools import POOL_COLUMNS
from cronoq_client._cli._render import listing
from cronoq_client._cli._schedules import SCHEDULE_COLUMNS
from cronoq_client._cli._settings import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TARGET, Flags, resolve
from cronoq_client._cli._tasks import TASK_COLUMNS
from cronoq_client._cli._workers import WORKER_COLUMNS
from cronoq_client._client import Unreachable

CRONOQ = str(Path(sys.executable).parent / "cronoq")
TOKENS = {"app": secrets.token_urlsafe(24), "reader": secrets.token_urlsafe(24)}
IDENTITIES = "".join(
    f'[[auth.identities]]\nname = "{name}"\npermissions = {json.dumps(grants)}\n'
    f'token_sha256 = ["{hashlib.sha256(TOKENS[name].encode()).hexdigest()}"]\n'
    for name, grants in (("app", ["read", "submit", "cancel", "schedules"]), ("reader", ["read"]))
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    with threaded_server(tmp_path_factory.mktemp("cli")) as running:
        yield running


@pytest.fixture
def env(server: ThreadedServer, tmp_path: Path) -> dict[str, str]:
    return cli_env(server.target, tmp_path)


def run(env: dict[str, str], *args: str, code: int = 0, stdin: str | None = None) -> Result:
    result = CliRunner().invoke(cli, list(args), env=env, input=stdin, prog_name="cronoq")
    assert result.exit_code == code, (
        f"cronoq {' '.join(args)} exited {result.exit_code}, not {code}:\n"
        f"{result.stdout}\n{result.stderr}\n{result.exception!r}"
    )
    if code not in (0, ExitCode.TASK_FAILED):
        assert result.stderr.startswith("error: ") or "Error:" in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1 or "Usage:" in result.stderr, result.stderr
    return result


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


# --- tasks and submit ---------------------------------------------------------------------


def test_submit_get_list_cancel_in_tables_and_json(env: dict[str, str]) -> None:
    first = int(run(env, "submit", "cli-a", '{"image": "a.png"}', "--key", "cli-a-1",
                    "--tag", "x", "--tag", "y", "--priority", "3").stdout)  # fmt: skip
    # The key is held: the same id.
    again = as_json(run(env, "submit", "cli-a", "{}", "--key", "cli-a-1", "-o", "json"))
    assert again == {"task_id": first}
    second = as_json(run(env, "submit", "cli-a", "-p", "other", "--start-at", "+3600",
                         "-o", "json"))["task_id"]  # fmt: skip

    info = as_json(run(env, "tasks", "get", str(first), "-o", "json"))
    assert (info["task_id"], info["kind"], info["status"], info["payload"], info["tags"]) == (
        first, "cli-a", "ready", {"image": "a.png"}, ["x", "y"],
    )  # fmt: skip
    assert (info["key"], info["priority"], info["output"]) == ("cli-a-1", 3, None)
    shown = run(env, "tasks", "get", str(first)).stdout
    assert "cli-a-1" in shown and '{"image": "a.png"}' in shown and "ready" in shown
    assert (
        as_json(run(env, "tasks", "get", str(first), "--no-payload", "-o", "json"))["payload"]
        is None
    )

    listed = as_json(run(env, "tasks", "list", "--kind", "cli-a", "-o", "json"))
    assert [(t["task_id"], t["status"], t["pool"]) for t in listed] == [
        (second, "scheduled", "other"),
        (first, "ready", "default"),
    ]  # fmt: skip  (the newest first)
    oldest = as_json(run(env, "tasks", "list", "-k", "cli-a", "--oldest-first", "-o", "json"))
    assert [t["task_id"] for t in oldest] == [first, second]
    below = run(env, "tasks", "list", "-k", "cli-a", "--before", str(second), "-o", "json")
    assert [t["task_id"] for t in as_json(below)] == [first]
    assert [t["task_id"] for t in as_json(
        run(env, "tasks", "list", "-k", "cli-a", "-s", "scheduled", "-o", "json")
    )] == [second]  # fmt: skip
    assert len(as_json(run(env, "tasks", "list", "-k", "cli-a", "-n", "1", "-o", "json"))) == 1
    table = run(env, "tasks", "list", "--kind", "cli-a").stdout.splitlines()
    assert table[0].split()[:5] == ["ID", "STATUS", "ATTEMPT", "POOL", "KIND"]
    assert table[0].split()[-1] == "ERROR"
    assert table[2].split()[:5] == [str(first), "ready", "0", "default", "cli-a"]

    assert run(env, "tasks", "cancel", str(first), "-r", "no").stdout == (
        f"task {first}: cancelled\n"
    )
    assert as_json(run(env, "tasks", "cancel", str(second), "-o", "json")) == {
        "task_id": second, "status": "cancelled",
    }  # fmt: skip
    assert as_json(run(env, "tasks", "get", str(first), "-o", "json"))["message"] == "no"


def test_failed_tasks_list_the_newest_first_with_their_error_and_get_shows_the_traceback(
    server: ThreadedServer, env: dict[str, str]
) -> None:
    """The runbook's "a task failed" lines: the most recent failures first, each with why, and
    the traceback the remote worker sent for the one opened."""

    async def broken(ctx: TaskContext, payload: Any) -> Any:
        raise LookupError(f"no customer {payload}")

    worker = Worker(server.target, {"other": broken}, codec=JsonCodec())
    working = server.start(worker.run())
    server.call(worker.attached())
    try:
        ids = [
            int(run(env, "submit", "cli-fail", str(n), "-p", "other", "--max-attempts", "1").stdout)
            for n in range(3)
        ]
        for n, task_id in enumerate(ids):
            ended = run(
                env, "tasks", "wait", str(task_id), "--timeout", "30", code=ExitCode.TASK_FAILED
            )
            assert ended.stderr == (  # one line, the traceback left to the record above it
                f"error: task {task_id} ended failed: attempt 1 failed: LookupError: "
                f"no customer {n}; no attempts left\n"
            )
    finally:
        worker.stop()
        server.call(asyncio.wait_for(asyncio.shield(working), 30))
    table = run(env, "tasks", "list", "-k", "cli-fail", "-s", "failed", "-n", "2").stdout
    rows = table.splitlines()[1:]
    assert [row.split()[0] for row in rows] == [str(ids[2]), str(ids[1])]
    assert rows[0].endswith("attempt 1 failed: LookupError: no customer 2; no attempts left")
    info = as_json(run(env, "tasks", "get", str(ids[2]), "-o", "json"))
    assert info["message"] == "attempt 1 failed: LookupError: no customer 2; no attempts left"
    assert info["traceback"].startswith("Traceback (most recent call last):\n")
    assert 'raise LookupError(f"no customer {payload}")' in info["traceback"]
    shown = run(env, "tasks", "get", str(ids[2])).stdout
    assert "traceback" in shown and "LookupError: no customer 2" in shown


def test_tasks_wait_exits_by_how_the_task_ended(
    server: ThreadedServer, env: dict[str, str]
) -> None:
    waiting = run(env, "submit", "cli-wait", "1").stdout.strip()
    result = run(env, "tasks", "wait", waiting, "--timeout", "0.2", code=ExitCode.TIMED_OUT)
    assert "the task carries on" in result.stderr
    run(env, "tasks", "cancel", waiting)
    ended = run(env, "tasks", "wait", waiting, "-o", "json", code=ExitCode.TASK_FAILED)
    assert as_json(ended)["status"] == "cancelled"
    assert ended.stderr == f"error: task {waiting} ended cancelled: cancelled by request\n"

    async def double(ctx: TaskContext, payload: Any) -> Any:
        return {"twice": payload * 2}

    worker = Worker(server.target, {"other": double}, codec=JsonCodec())
    working = server.start(worker.run())
    server.call(worker.attached())
    try:
        done = run(env, "submit", "cli-wait", "21", "-p", "other").stdout.strip()
        info = as_json(run(env, "tasks", "wait", done, "--timeout", "30", "-o", "json"))
        assert (info["status"], info["output"], info["attempt"]) == ("succeeded", {"twice": 42}, 1)
    finally:
        worker.stop()
        server.call(asyncio.wait_for(asyncio.shield(working), 30))


def test_submit_from_a_json_lines_file(env: dict[str, str], tmp_path: Path) -> None:
    lines: list[dict[str, Any]] = [
        {"kind": "cli-file", "payload": {"n": n}, "key": f"cli-file-{n}"} for n in range(7)
    ]
    lines[3].update(pool="other", tags=["t"], priority=5, max_attempts=2, timeout=10)
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    ids = as_json(run(env, "submit", "--file", str(path), "--batch-size", "3", "-o", "json"))
    assert len(ids) == 7 and ids == sorted(ids)
    listed = as_json(run(env, "tasks", "list", "-k", "cli-file", "--oldest-first", "-o", "json"))
    assert [t["task_id"] for t in listed] == ids
    assert (listed[3]["pool"], listed[3]["tags"]) == ("other", ["t"])
    assert run(env, "submit", "-f", str(path)).stdout == "submitted 7 tasks\n"  # keys: no more
    assert len(as_json(run(env, "tasks", "list", "-k", "cli-file", "-o", "json"))) == 7

    # Read from stdin.
    piped = run(env, "submit", "-f", "-", "-o", "json", stdin='{"kind": "cli-stdin"}\n')
    assert len(as_json(piped)) == 1

    # A malformed line: nothing of the file is sent, and the error names the line.
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "cli-bad"}\n{"kind": "cli-bad", "colour": "red"}\n')
    result = run(env, "submit", "-f", str(bad), code=ExitCode.USAGE)
    assert f"{bad}:2: unknown fields colour" in result.stderr
    bad.write_text('{"kind": "cli-bad"}\nnot json\n')
    assert f"{bad}:2: not JSON" in run(env, "submit", "-f", str(bad), code=2).stderr
    # A batch the server refuses: the error says what was submitted before it.
    bad.write_text('{"kind": "cli-bad"}\n{"kind": "cli-bad", "pool": "nowhere"}\n')
    refused = run(env, "submit", "-f", str(bad), "--batch-size", "1", code=ExitCode.INVALID)
    assert "the batch of tasks 2-2 failed (the 1 tasks before it were submitted)" in (
        refused.stderr
    )
    assert len(as_json(run(env, "tasks", "list", "-k", "cli-bad", "-o", "json"))) == 1


def test_errors_are_one_line_with_their_exit_code(env: dict[str, str]) -> None:
    assert (
        "no task" in run(env, "tasks", "get", "987654321", code=ExitCode.NOT_FOUND).stderr.lower()
    )
    run(env, "submit", "k", "-p", "nowhere", code=ExitCode.INVALID)
    run(env, "submit", "k", "{not json", code=ExitCode.USAGE)
    run(env, "tasks", "get", "abc", code=ExitCode.USAGE)
    run(env, "submit", "k", "--start-at", "2026-01-01T00:00:00", code=ExitCode.USAGE)
    run(env, "submit", code=ExitCode.USAGE)
    closed = _closed_port()
    down = run(env, "--target", closed, "--timeout", "0.3", "tasks", "list",
               code=ExitCode.UNAVAILABLE)  # fmt: skip
    assert "nothing was applied: run the command again" in down.stderr


def _closed_port() -> str:
    with socket.socket() as probe:  # nothing listens once the probe is closed
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def test_a_closed_port_is_reported_within_the_connect_timeout(env: dict[str, str]) -> None:
    # The console script in its own process, with the default timeouts (30 s per call, 2 s
    # to connect): what a person at a terminal runs.
    closed = _closed_port()
    started = time.monotonic()
    down = subprocess.run(
        [CRONOQ, "tasks", "list"],
        env={**os.environ, **env, "CRONOQ_TARGET": closed},
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - started
    assert (down.returncode, down.stdout) == (ExitCode.UNAVAILABLE, ""), down.stderr
    assert down.stderr.startswith(f"error: no cronoq server answered at {closed} ("), down.stderr
    assert "Connection refused" in down.stderr and "is cronoq-server running there?" in (
        down.stderr
    )
    assert down.stderr.count("\n") == 1, down.stderr
    # 2 s of tries and the interpreter's start; the 30 s timeout would take 30.
    assert DEFAULT_CONNECT_TIMEOUT <= elapsed < 15, elapsed

    # Shorter or longer: the flag, the environment.
    for args, extra in (
        (["--connect-timeout", "0.2"], {}),
        ([], {"CRONOQ_CONNECT_TIMEOUT": "0.2"}),
    ):
        started = time.monotonic()
        quick = run({**env, **extra, "CRONOQ_TARGET": closed}, *args, "pools", "list",
                    code=ExitCode.UNAVAILABLE)  # fmt: skip
        assert "--connect-timeout" in quick.stderr
        assert time.monotonic() - started < DEFAULT_CONNECT_TIMEOUT, args


_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\S*( \S+)?")


def test_every_time_printed_carries_its_zone(env: dict[str, str]) -> None:
    task_id = run(env, "submit", "cli-zone", "--start-at", "+3600").stdout.strip()
    run(env, "schedules", "add", "cli-zone", "0 3 * * *", "-k", "cli-zone", "-z", "Asia/Tokyo")
    try:
        shown = {
            "tasks get": run(env, "tasks", "get", task_id).stdout,
            "schedules add": run(
                env, "schedules", "add", "cli-zone", "0 4 * * *", "-k", "z", "--replace"
            ).stdout,
            "schedules preview": run(
                env, "schedules", "preview", "0 3 * * *", "-z", "Asia/Tokyo"
            ).stdout,
        }
    finally:
        run(env, "schedules", "remove", "cli-zone")
    for command, text in shown.items():
        times = [m.group() for m in _TIME.finditer(text)]
        assert times, (command, text)
        for time_shown in times:
            # " UTC" after a time of a record; an ISO offset on the preview's times.
            assert time_shown.endswith(" UTC") or re.search(r"[+-]\d\d:\d\d$", time_shown), (
                command,
                time_shown,
            )
    assert len(_TIME.findall(shown["tasks get"])) >= 2  # submitted_at, updated_at
    # A listing's times are in UTC, which each time column's title says.
    model_times = {
        name
        for model in (TaskInfo, ScheduleInfo, WorkerInfo)
        for name, hint in typing.get_type_hints(model).items()
        if datetime in (hint, *typing.get_args(hint))
    } | {"finished_at"}  # TaskSummary's finished_ns, shown as a time
    for columns in (TASK_COLUMNS, SCHEDULE_COLUMNS, WORKER_COLUMNS, POOL_COLUMNS):
        for key, title in columns:
            if key in model_times:
                assert title.endswith("(UTC)"), (key, title)


# --- schedules ----------------------------------------------------------------------------


def test_schedules_add_list_pause_resume_preview_remove(env: dict[str, str]) -> None:
    added = as_json(run(env, "schedules", "add", "cli-nightly", "0 3 * * *", "--kind", "report",
                        "--payload", '{"full": true}', "-z", "Europe/Paris", "--overlap", "allow",
                        "-o", "json"))  # fmt: skip
    assert (added["name"], added["cron"], added["timezone"], added["overlap"]) == (
        "cli-nightly", "0 3 * * *", "Europe/Paris", "allow",
    )  # fmt: skip
    assert (
        "cli-nightly"
        in run(env, "schedules", "add", "cli-hourly", "0 * * * *", "-k", "r").stdout + "cli-nightly"
    )
    names = [s["name"] for s in as_json(run(env, "schedules", "list", "-o", "json"))]
    assert {"cli-nightly", "cli-hourly"} <= set(names)
    table = run(env, "schedules", "list").stdout
    assert table.splitlines()[0].split()[:3] == ["NAME", "CRON", "ZONE"]
    assert as_json(run(env, "schedules", "pause", "cli-nightly", "-o", "json"))["paused"] is True
    assert "yes" in run(env, "schedules", "pause", "cli-nightly").stdout
    assert as_json(run(env, "schedules", "resume", "cli-nightly", "-o", "json"))["paused"] is False
    times = as_json(run(env, "schedules", "preview", "30 2 * * *", "-z", "Europe/Paris", "-n", "3",
                        "-o", "json"))  # fmt: skip
    assert len(times) == 3 and all(t.endswith(("+01:00", "+02:00")) for t in times)
    assert run(env, "schedules", "preview", "0 0 1 1 *", "-n", "2").stdout.count("-01-01T") == 2
    assert as_json(run(env, "schedules", "remove", "cli-hourly", "-o", "json")) == {
        "name": "cli-hourly", "removed": True,
    }  # fmt: skip
    run(env, "schedules", "remove", "cli-hourly", code=ExitCode.NOT_FOUND)
    run(env, "schedules", "pause", "cli-nobody", code=ExitCode.NOT_FOUND)
    run(env, "schedules", "add", "cli-nightly", "0 4 * * *", "-k", "r", code=ExitCode.INVALID)
    run(env, "schedules", "add", "cli-bad", "61 * * * *", "-k", "r", code=ExitCode.INVALID)
    run(env, "schedules", "preview", "* * *", code=ExitCode.INVALID)
    replaced = as_json(run(env, "schedules", "add", "cli-nightly", "0 4 * * *", "-k", "r",
                           "--replace", "-o", "json"))  # fmt: skip
    assert replaced["cron"] == "0 4 * * *"
    run(env, "schedules", "remove", "cli-nightly")


def test_schedules_trigger_runs_one_occurrence_through_the_overlap_policy(
    env: dict[str, str],
) -> None:
    run(env, "schedules", "add", "cli-trigger", "0 3 1 1 *", "-k", "cli-trigger")
    try:
        triggered = as_json(run(env, "schedules", "trigger", "cli-trigger", "-o", "json"))
        task_id = triggered["task_id"]
        assert triggered == {"name": "cli-trigger", "task_id": task_id}
        info = as_json(run(env, "tasks", "get", str(task_id), "-o", "json"))
        assert (info["kind"], info["status"]) == ("cli-trigger", "ready")
        # No worker takes it: it is live, and the policy (skip) runs no second occurrence.
        assert run(env, "schedules", "trigger", "cli-trigger").stdout == (
            "schedule cli-trigger: skipped by its overlap policy (its last task is live)\n"
        )
        assert as_json(run(env, "schedules", "trigger", "cli-trigger", "-o", "json")) == {
            "name": "cli-trigger", "task_id": None,
        }  # fmt: skip
        assert [t["task_id"] for t in as_json(
            run(env, "tasks", "list", "-k", "cli-trigger", "-o", "json")
        )] == [task_id]  # fmt: skip
        run(env, "tasks", "cancel", str(task_id))
        again = int(run(env, "schedules", "trigger", "cli-trigger").stdout.split()[-1])
        assert again > task_id
        run(env, "tasks", "cancel", str(again))
    finally:
        run(env, "schedules", "remove", "cli-trigger")
    run(env, "schedules", "trigger", "cli-trigger", code=ExitCode.NOT_FOUND)


# --- tasks retry --------------------------------------------------------------------------


def test_tasks_retry_runs_a_failed_task_again_and_refuses_a_live_one(
    server: ThreadedServer, env: dict[str, str]
) -> None:
    async def broken(ctx: TaskContext, payload: Any) -> None:
        raise TaskError("the source is missing", retryable=False)

    with Client(server.target, codec=JsonCodec()) as client:
        worker = Worker(server.target, {"other": broken}, codec=JsonCodec())
        working = server.start(worker.run())
        server.call(worker.attached())
        try:
            failed = client.submit(
                "cli-retry", {"n": 1}, pool="other", key="cli-retry-1",
                retry=RetryPolicy(max_attempts=1),
            )  # fmt: skip
            assert client.wait(failed, timeout=30).status is Status.FAILED
        finally:
            worker.stop()
            server.call(asyncio.wait_for(asyncio.shield(working), 30))
        retried = as_json(run(env, "tasks", "retry", str(failed), "-o", "json"))
        # Back to ready, its one attempt counted, one more allowed, its key and payload kept.
        assert (retried["task_id"], retried["status"], retried["attempt"]) == (failed, "ready", 1)
        assert (retried["key"], retried["payload"]) == ("cli-retry-1", {"n": 1})
        # Live now: refused, with its own exit code, and nothing applied.
        refused = run(env, "tasks", "retry", str(failed), code=ExitCode.NOT_RETRYABLE)
        assert "cronoq tasks get" in refused.stderr
        assert client.get(failed).status is Status.READY

        # A cancelled task: the table shows it ready again.
        client.cancel(failed)
        shown = run(env, "tasks", "retry", str(failed), "--no-payload").stdout
        assert "ready" in shown and "cli-retry-1" in shown and '{"n": 1}' not in shown
        client.cancel(failed)
    run(env, "tasks", "retry", "987654321", code=ExitCode.NOT_FOUND)
    run(env, "tasks", "retry", "0", code=ExitCode.USAGE)


# --- pools and workers --------------------------------------------------------------------


def test_pools_list_pause_resume(server: ThreadedServer, env: dict[str, str]) -> None:
    queued = run(env, "submit", "cli-pool", "-p", "other").stdout.strip()
    try:
        listed = {p["name"]: p for p in as_json(run(env, "pools", "list", "-o", "json"))}
        assert set(listed) == {"default", "other"}
        other = listed["other"]
        assert (other["paused"], other["remote"], other["running"]) == (False, True, 0)
        assert other["concurrency"] >= 1
        assert set(other["depth"]) == {"waiting", "scheduled", "ready", "running", "retrying"}
        assert other["depth"]["ready"] >= 1
        table = run(env, "pools", "list").stdout.splitlines()
        assert table[0].split() == [
            "NAME", "PAUSED", "REMOTE", "CONCURRENCY", "SLOTS", "USED",
            "WAITING", "SCHEDULED", "READY", "RUNNING", "RETRYING",
        ]  # fmt: skip
        assert sorted(line.split()[0] for line in table[1:]) == ["default", "other"]

        paused = as_json(run(env, "pools", "pause", "other", "-o", "json"))
        assert (paused["name"], paused["paused"]) == ("other", True)
        assert as_json(run(env, "pools", "pause", "other", "-o", "json"))["paused"] is True
        shown = {p["name"]: p["paused"] for p in as_json(run(env, "pools", "list", "-o", "json"))}
        assert shown == {"default": False, "other": True}
        assert "yes" in run(env, "pools", "pause", "other").stdout

        # Paused: an attached worker is given nothing; resumed, it runs the queued task.
        async def done(ctx: TaskContext, payload: Any) -> str:
            return "done"

        worker = Worker(server.target, {"other": done}, codec=JsonCodec())
        working = server.start(worker.run())
        server.call(worker.attached())
        try:
            with Client(server.target, codec=JsonCodec()) as client:
                # That a paused pool never starts one is the core's test; here the pause has
                # reached the leader, which gave the attached worker nothing.
                assert client.get(int(queued)).status is Status.READY
                resumed = as_json(run(env, "pools", "resume", "other", "-o", "json"))
                assert resumed["paused"] is False
                assert client.wait(int(queued), timeout=30).status is Status.SUCCEEDED
        finally:
            worker.stop()
            server.call(asyncio.wait_for(asyncio.shield(working), 30))
    finally:
        run(env, "pools", "resume", "other")
        run(env, "tasks", "cancel", queued)
    refused = run(env, "pools", "pause", "nowhere", code=ExitCode.INVALID)
    assert "nowhere" in refused.stderr
    run(env, "pools", "resume", "nowhere", code=ExitCode.INVALID)


def test_workers_list_shows_the_attached_workers(
    server: ThreadedServer, env: dict[str, str]
) -> None:
    assert as_json(run(env, "workers", "list", "-o", "json")) == []

    async def idle(ctx: TaskContext, payload: Any) -> None:
        return None

    worker = Worker(server.target, {"other": idle}, codec=JsonCodec(), slots=3,
                    worker_id="cli-worker-1")  # fmt: skip
    working = server.start(worker.run())
    server.call(worker.attached())
    try:
        (found,) = as_json(run(env, "workers", "list", "-o", "json"))
        assert (found["worker_id"], found["pools"], found["slots"], found["in_flight"]) == (
            "cli-worker-1", ["other"], 3, 0,
        )  # fmt: skip
        assert found["address"].startswith(("ipv4:127.0.0.1:", "ipv6:"))
        assert found["identity"] is None  # the server runs without authentication
        attached = datetime.fromisoformat(found["attached_at"])
        assert attached.tzinfo is not None
        assert attached <= datetime.now(UTC)
        table = run(env, "workers", "list").stdout.splitlines()
        assert table[0].split()[:6] == ["WORKER", "IDENTITY", "ADDRESS", "POOLS", "SLOTS", "IN"]
        assert table[1].split()[:5] == ["cli-worker-1", found["address"], "other", "3", "0"]
    finally:
        worker.stop()
        server.call(asyncio.wait_for(asyncio.shield(working), 30))
    assert as_json(run(env, "workers", "list", "-o", "json")) == []


# --- where it connects, with what ---------------------------------------------------------


def test_settings_come_from_flags_then_environment_then_context(tmp_path: Path) -> None:
    token = tmp_path / "prod.token"
    token.write_text("s3cret\n")
    config = tmp_path / "config.toml"
    config.write_text(
        'current-context = "prod"\n'
        '[contexts.prod]\ntarget = ["a:1", "b:2"]\n'
        f'token-file = "{token}"\ntimeout = 5\ntls-ca = "/ca.pem"\n'
        '[contexts.local]\ntarget = "127.0.0.1:9"\ncodec = "bytes"\n'
    )
    none: dict[str, str] = {"CRONOQ_CONFIG": str(config)}
    prod = resolve(Flags(), none)
    assert (prod.context, prod.target, prod.token, prod.timeout) == (
        "prod", ("a:1", "b:2"), "s3cret", 5.0,
    )  # fmt: skip
    assert prod.tls is not None and not isinstance(prod.tls, bool) and prod.tls.ca == "/ca.pem"
    local = resolve(Flags(context="local"), none)
    assert (local.target, local.token, local.tls, type(local.codec).__name__) == (
        ("127.0.0.1:9",), None, None, "BytesCodec",
    )  # fmt: skip
    assert resolve(Flags(), {**none, "CRONOQ_CONTEXT": "local"}).context == "local"
    # The environment beats the context, a flag beats both.
    env = {**none, "CRONOQ_TARGET": "c:3,d:4", "CRONOQ_TOKEN": "t", "CRONOQ_TLS_CA": "/env.pem"}
    found = resolve(Flags(), env)
    assert (found.target, found.token) == (("c:3", "d:4"), None)  # None: AsyncClient reads it
    assert not isinstance(found.tls, bool | None) and found.tls.ca == "/env.pem"
    flagged = resolve(Flags(target=("e:5",), tls=False, timeout=1.0), env)
    assert (flagged.target, flagged.tls, flagged.timeout) == (("e:5",), False, 1.0)
    # The connect timeout: the flag, CRONOQ_CONNECT_TIMEOUT, the context, the default.
    assert prod.connect_timeout == DEFAULT_CONNECT_TIMEOUT
    config.write_text(config.read_text().replace("timeout = 5", "timeout = 5\nconnect-timeout = 7"))
    assert resolve(Flags(), none).connect_timeout == 7.0
    assert resolve(Flags(), {**none, "CRONOQ_CONNECT_TIMEOUT": "0.5"}).connect_timeout == 0.5
    given = Flags(connect_timeout=9.0)
    assert resolve(given, {**none, "CRONOQ_CONNECT_TIMEOUT": "0.5"}).connect_timeout == 9.0
    for bad in ("soon", "0", "-1"):
        with pytest.raises(ConfigError, match=r"(CRONOQ_CONNECT_TIMEOUT|connect-timeout) must be"):
            resolve(Flags(), {**none, "CRONOQ_CONNECT_TIMEOUT": bad})
    # Nothing anywhere: the server's default address, plaintext unless CRONOQ_TLS_* says.
    bare = resolve(Flags(), {"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert (bare.target, bare.tls, bare.token, bare.context) == (
        (DEFAULT_TARGET,),
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("text", "flags", "message"),
    [
        ('[contexts.a]\ntarget = "x:1"\n', Flags(context="b"), "no context 'b' in config file"),
        ('[contexts.a]\ntargets = "x:1"\n', Flags(context="a"), "unknown keys targets"),
        ('[contexts.a]\ntimeout = "5"\n', Flags(context="a"), "timeout has the wrong type"),
        ('[contexts.a]\ntarget = []\n', Flags(context="a"), "target must be 'host:port'"),
        ("contexts = [", Flags(), "is not valid TOML"),
        ('current = "a"\n', Flags(), "unknown keys current"),
        ('[contexts.a]\ntoken-file = "/nonexistent/t"\n', Flags(context="a"), "cannot read it"),
        ('[contexts.a]\ncodec = "yaml"\n', Flags(context="a"), "codec must be json, bytes"),
        ('[contexts.a]\ncodec = "nomodule_here:codec"\n', Flags(context="a"),
         "importing nomodule_here failed"),
    ],
)  # fmt: skip
def test_a_bad_config_fails_with_a_precise_error(
    tmp_path: Path, env: dict[str, str], text: str, flags: Flags, message: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(text)
    args = ["--config", str(config), *(["--context", flags.context] if flags.context else [])]
    assert (
        message
        in run({**env, "CRONOQ_TARGET": ""}, *args, "tasks", "list", code=ExitCode.USAGE).stderr
    )


def test_a_context_with_a_token_file_reaches_an_authenticating_server(
    tmp_path: Path, env: dict[str, str]
) -> None:
    with threaded_server(tmp_path, tables=IDENTITIES) as secured:
        for name, token in TOKENS.items():
            (tmp_path / f"{name}.token").write_text(token)
        config = tmp_path / "config.toml"
        config.write_text(
            "".join(
                f'[contexts.{name}]\ntarget = "{secured.target}"\n'
                f'token-file = "{tmp_path / name}.token"\n'
                for name in TOKENS
            )
        )
        base = {**env, "CRONOQ_TARGET": "", "CRONOQ_CONFIG": str(config)}
        task_id = run(base, "--context", "app", "submit", "k").stdout.strip()
        run(base, "--context", "reader", "tasks", "get", task_id)
        denied = run(base, "--context", "reader", "tasks", "cancel", task_id,
                     code=ExitCode.PERMISSION_DENIED)  # fmt: skip
        assert "'cancel' permission" in denied.stderr
        run(base, "--context", "reader", "pools", "list")
        run(base, "--context", "reader", "workers", "list")
        for operator in (("pools", "pause", "default"), ("tasks", "retry", task_id),
                         ("schedules", "trigger", "any")):  # fmt: skip
            refused_op = run(base, "--context", "app", *operator,
                             code=ExitCode.PERMISSION_DENIED)  # fmt: skip
            assert "'admin' permission" in refused_op.stderr
        refused = run({**env, "CRONOQ_TARGET": secured.target, "CRONOQ_TOKEN": "wrong-token"},
                      "tasks", "list", code=ExitCode.UNAUTHENTICATED)  # fmt: skip
        assert "wrong-token" not in refused.stderr  # never a secret in a message
        run({**env, "CRONOQ_TARGET": secured.target}, "tasks", "list",
            code=ExitCode.UNAUTHENTICATED)  # fmt: skip


# --- the console script, --watch, completion ----------------------------------------------


def test_the_console_script_exits_with_the_code_of_its_error(
    server: ThreadedServer, env: dict[str, str]
) -> None:
    found = subprocess.run(
        [CRONOQ, "tasks", "get", "987654321"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (found.returncode, found.stdout) == (ExitCode.NOT_FOUND, "")
    assert found.stderr.startswith("error: ") and found.stderr.count("\n") == 1


def test_watch_prints_each_refresh_until_interrupted(
    server: ThreadedServer, env: dict[str, str]
) -> None:
    with Client(server.target) as client:
        task_id = client.submit("cli-watch", b"")
        with subprocess.Popen(
            [CRONOQ, "tasks", "list", "-k", "cli-watch", "--watch", "--interval", "0.1",
             "-o", "json"],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as process:  # fmt: skip
            try:
                assert process.stdout is not None
                first = json.loads(process.stdout.readline())
                assert [(t["task_id"], t["status"]) for t in first] == [(task_id, "ready")]
                client.cancel(task_id)
                # A later refresh shows the change.
                while (line := process.stdout.readline()) and json.loads(line)[0][
                    "status"
                ] == "ready":
                    pass
                assert json.loads(line)[0]["status"] == "cancelled"
                process.send_signal(signal.SIGINT)
                assert process.wait(30) == 0
            finally:
                process.kill()


def test_a_watch_rides_out_a_server_that_cannot_be_reached_once_it_has_shown_a_listing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The first fetch fails fast (nothing listens: exit 7); a later one that cannot reach
    the server (it restarts) is a warning, and the watch goes on."""
    answers: list[object] = [[{"n": 1}], Unreachable("no cronoq server answered"), [{"n": 2}]]

    def fetch() -> list[dict[str, object]]:
        if not answers:
            raise KeyboardInterrupt  # what Ctrl-C raises: the watch's end
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, list)
        return answer

    listing("json", True, 0.01, fetch, (("n", "N"),))
    shown = capsys.readouterr()
    assert [json.loads(line) for line in shown.out.splitlines()] == [[{"n": 1}], [{"n": 2}]]
    assert shown.err == "warning: no cronoq server answered (still watching)\n"

    def unreachable() -> list[dict[str, object]]:
        raise Unreachable("no cronoq server answered")

    with pytest.raises(Unreachable):
        listing("json", True, 0.01, unreachable, (("n", "N"),))


@pytest.mark.parametrize("group", ["pools", "workers"])
def test_watch_of_pools_and_workers_refreshes_until_interrupted(
    server: ThreadedServer, env: dict[str, str], group: str
) -> None:
    with subprocess.Popen(
        [CRONOQ, group, "list", "--watch", "--interval", "0.1", "-o", "json"],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            first, second = (json.loads(process.stdout.readline()) for _ in range(2))
            assert isinstance(first, list) and isinstance(second, list)
            if group == "pools":
                assert {p["name"] for p in second} == {"default", "other"}
            process.send_signal(signal.SIGINT)
            assert process.wait(30) == 0
        finally:
            process.kill()


def test_completion_scripts_and_completions(env: dict[str, str]) -> None:
    for shell in ("bash", "zsh", "fish"):
        assert "_CRONOQ_COMPLETE" in run(env, "completion", shell).stdout
    run(env, "completion", "tcsh", code=ExitCode.USAGE)
    completing = {**env, "_CRONOQ_COMPLETE": "bash_complete", "COMP_WORDS": "cronoq sch",
                  "COMP_CWORD": "1"}  # fmt: skip
    assert "plain,schedules" in run(completing).stdout
    completing.update({"COMP_WORDS": "cronoq tasks list --status r", "COMP_CWORD": "4"})
    offered = run(completing).stdout.split()
    assert offered == ["plain,ready", "plain,running", "plain,retrying"]
