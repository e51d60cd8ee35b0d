"""The commands of issue 32 end to end against a real cronoq-server: ``tasks explain`` for each
kind of hold, ``tasks attempts``, ``tasks rerun`` (and ``Client.rerun``), ``schedules history``,
what ``tasks get`` adds (started_at, rerun_of, dependants), and who may call them.

As in test_cli.py the commands run in this process through click's runner, against one server
shared by the module (each test uses kinds, keys and schedule names of its own); the pool
``default`` never has a worker here, ``other`` has one while a test runs it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result
from server_thread import ThreadedServer, cli_env, threaded_server

from cronoq import JsonCodec, OccurrenceInfo, RetryPolicy, Status, TaskContext
from cronoq.errors import NotRetryable, PermissionDenied
from cronoq_client import Client, Worker
from cronoq_client._cli import cli
from cronoq_client._cli._errors import ExitCode
from cronoq_client._cli._schedules import OCCURRENCE_COLUMNS
from cronoq_client._cli._tasks import ATTEMPT_COLUMNS

WAIT_S = 30.0
LIMITS = '[[task_limits]]\nname = "tenant"\nconcurrency = 1\nper_key = true\n'
FAST_RETRY = RetryPolicy(max_attempts=2, initial_ns=10_000_000, jitter=0.0)
_R = TypeVar("_R")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedServer]:
    with threaded_server(tmp_path_factory.mktemp("cli-explain"), tables=LIMITS) as running:
        yield running


@pytest.fixture
def env(server: ThreadedServer, tmp_path: Path) -> dict[str, str]:
    return cli_env(server.target, tmp_path)


@pytest.fixture
def client(server: ThreadedServer) -> Iterator[Client]:
    with Client(server.target, codec=JsonCodec(), timeout=WAIT_S) as opened:
        yield opened


def run(env: dict[str, str], *args: str, code: int = 0) -> Result:
    result = CliRunner().invoke(cli, list(args), env=env, prog_name="cronoq")
    assert result.exit_code == code, (
        f"cronoq {' '.join(args)} exited {result.exit_code}, not {code}:\n"
        f"{result.stdout}\n{result.stderr}\n{result.exception!r}"
    )
    if code:
        assert result.stderr.startswith("error: ") or "Error:" in result.stderr, result.stderr
    return result


def as_json(result: Result) -> Any:
    return json.loads(result.stdout)


def eventually(fetch: Callable[[], _R], done: Callable[[_R], bool]) -> _R:
    """``fetch()`` once ``done`` holds of it: for what only the clock brings about (a cron
    occurrence), which no event announces."""
    deadline = time.monotonic() + WAIT_S
    while True:
        found = fetch()
        if done(found):
            return found
        assert time.monotonic() < deadline, found
        time.sleep(0.05)


class Blocking:
    """A worker function that holds its attempt until released (threads: the worker runs on
    the server's loop, the test in its own thread)."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        self.started.set()
        await asyncio.to_thread(self.release.wait, WAIT_S)
        return payload


class Working:
    """A Worker of pool ``other`` run on the server's loop while the block runs."""

    def __init__(self, server: ThreadedServer, fn: Any, **options: Any) -> None:
        self.server = server
        self.worker = Worker(server.target, {"other": fn}, codec=JsonCodec(), **options)

    def __enter__(self) -> Worker:
        self.running = self.server.start(self.worker.run())
        self.server.call(self.worker.attached())
        return self.worker

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.server.call(asyncio.wait_for(asyncio.shield(self.running), WAIT_S))


_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d\S*( \S+)?")


def explained(env: dict[str, str], task_id: int) -> tuple[dict[str, Any], str]:
    """The explanation in JSON, and as printed for people (whose times all say UTC)."""
    record = as_json(run(env, "tasks", "explain", str(task_id), "-o", "json"))
    shown = run(env, "tasks", "explain", str(task_id)).stdout
    assert shown.splitlines()[0] == f"task {task_id} ({record['status']}): {record['summary']}"
    for found in _TIME.finditer(shown):
        assert found.group().endswith(" UTC"), shown
    return record, shown


# --- tasks explain ----------------------------------------------------------------------------


def test_explain_says_what_holds_a_task_for_each_kind_of_hold(
    server: ThreadedServer, env: dict[str, str], client: Client
) -> None:
    # No worker takes pool default: a ready task waits for a worker's slot.
    parent = client.submit("cli-explain", 1)
    record, shown = explained(env, parent)
    assert (record["status"], record["hold"], record["pool"]) == (
        "ready",
        "no_worker_slots",
        "default",
    )
    assert "pool" in shown and "default" in shown and "parents" not in shown

    child = client.submit("cli-explain", 2, after=[parent])
    record, shown = explained(env, child)
    assert (record["status"], record["hold"], record["parents"]) == (
        "waiting",
        "dependencies",
        [parent],
    )
    assert re.search(rf"^parents\s+{parent}\s*$", shown, re.M), shown
    since = datetime.fromisoformat(record["since"])
    assert since.tzinfo is not None and since <= datetime.now(UTC)
    # The other end of `after`, in `tasks get`.
    assert as_json(run(env, "tasks", "get", str(parent), "-o", "json"))["dependants"] == [child]
    assert re.search(
        rf"^dependants\s+{child}\s*$", run(env, "tasks", "get", str(parent)).stdout, re.M
    )

    later = int(run(env, "submit", "cli-explain", "--start-at", "+3600").stdout)
    record, shown = explained(env, later)
    assert (record["status"], record["hold"]) == ("scheduled", "start_time")
    until = datetime.fromisoformat(record["until"])
    assert 3500 < (until - datetime.now(UTC)).total_seconds() <= 3600
    assert re.search(r"^until\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\s*$", shown, re.M), shown

    run(env, "pools", "pause", "other")
    try:
        paused = client.submit("cli-explain", 3, pool="other")
        record, shown = explained(env, paused)
        assert (record["hold"], record["pool"]) == ("pool_paused", "other")
        assert "resume it" in shown.splitlines()[0]
    finally:
        run(env, "pools", "resume", "other")

    # A running remote attempt names its worker; the next task of its key waits for the limit.
    blocking = Blocking()
    with Working(server, blocking, slots=3, worker_id="cli-explain-worker"):
        held = client.submit("cli-explain", 4, pool="other", limits={"tenant": "acme"})
        assert blocking.started.wait(WAIT_S)
        try:
            record, shown = explained(env, held)
            assert (record["status"], record["hold"], record["attempt"]) == (
                "running",
                "running",
                1,
            )
            assert record["worker"] == "cli-explain-worker"
            assert re.search(r"^worker\s+cli-explain-worker\s*$", shown, re.M), shown
            assert record["until"] is not None  # its lease's end
            behind = client.submit("cli-explain", 5, pool="other", limits={"tenant": "acme"})
            record, shown = explained(env, behind)
            assert (record["status"], record["hold"]) == ("ready", "limit")
            assert (record["limit"], record["limit_key"]) == ("tenant", "acme")
            assert re.search(r"^limit_key\s+acme\s*$", shown, re.M), shown
        finally:
            blocking.release.set()
        assert client.wait(behind, timeout=WAIT_S).status is Status.SUCCEEDED
    record, shown = explained(env, held)
    assert (record["status"], record["hold"], record["attempt"]) == ("succeeded", "finished", 1)
    # The fields of other holds are left out of the table: none of them applies.
    assert not re.search(r"^(parents|limit|worker|running|concurrency)\s", shown, re.M), shown

    for task_id in (parent, child, later, paused):
        client.cancel(task_id)
    run(env, "tasks", "explain", "987654321", code=ExitCode.NOT_FOUND)
    run(env, "tasks", "explain", "0", code=ExitCode.USAGE)


# --- tasks attempts -----------------------------------------------------------------------


def test_tasks_attempts_lists_each_failed_attempt_with_its_error(
    server: ThreadedServer, env: dict[str, str], client: Client
) -> None:
    async def broken(ctx: TaskContext, payload: Any) -> Any:
        raise LookupError(f"no customer {payload} (attempt {ctx.attempt})")

    with Working(server, broken):
        failed = client.submit("cli-attempts", 7, pool="other", retry=FAST_RETRY)
        info = client.wait(failed, timeout=WAIT_S)
    assert (info.status, info.attempt) == (Status.FAILED, 2)
    found = as_json(run(env, "tasks", "attempts", str(failed), "-o", "json"))
    assert [a["attempt"] for a in found] == [1, 2]
    for number, attempt in enumerate(found, 1):
        assert attempt["message"].startswith(
            f"attempt {number} failed: LookupError: no customer 7 (attempt {number})"
        ), attempt
        assert attempt["traceback"].startswith("Traceback (most recent call last):\n")
        started, ended = (datetime.fromisoformat(attempt[k]) for k in ("started_at", "ended_at"))
        assert started.tzinfo is not None and started <= ended
    rows = run(env, "tasks", "attempts", str(failed)).stdout.splitlines()
    assert rows[0].split() == ["ATTEMPT", "STARTED", "(UTC)", "ENDED", "(UTC)", "MESSAGE"]
    assert [row.split()[0] for row in rows[1:]] == ["1", "2"]
    assert "no customer 7 (attempt 2)" in rows[2] and "Traceback" not in rows[2]
    for key, title in ATTEMPT_COLUMNS:
        assert title.endswith("(UTC)") is key.endswith("_at"), (key, title)
    # Explained: it ended, and how.
    record, _ = explained(env, failed)
    assert (record["hold"], record["attempt"]) == ("finished", 2)
    assert "no customer 7 (attempt 2)" in record["summary"]
    # A task that never failed has none; an unknown one is not found.
    assert (
        as_json(run(env, "tasks", "attempts", str(client.submit("cli-attempts")), "-o", "json"))
        == []
    )
    run(env, "tasks", "attempts", "987654321", code=ExitCode.NOT_FOUND)


# --- tasks rerun --------------------------------------------------------------------------


def test_tasks_rerun_runs_a_finished_task_again_and_refuses_a_live_one(
    server: ThreadedServer, env: dict[str, str], client: Client
) -> None:
    async def double(ctx: TaskContext, payload: Any) -> Any:
        return {"twice": payload * 2}

    with Working(server, double):
        done = client.submit("cli-rerun", 21, pool="other", key="cli-rerun-1")
        assert client.wait(done, timeout=WAIT_S).output == {"twice": 42}
        rerun = as_json(run(env, "tasks", "rerun", str(done), "-o", "json"))
        again = rerun["task_id"]
        assert rerun == {"task_id": again, "rerun_of": done} and again > done
        info = client.wait(again, timeout=WAIT_S)
        # A new task of its spec: payload and key too; the original stays as it ended.
        assert (info.status, info.output, info.key, info.rerun_of) == (
            Status.SUCCEEDED, {"twice": 42}, "cli-rerun-1", done,
        )  # fmt: skip
        shown = as_json(run(env, "tasks", "get", str(again), "-o", "json"))
        assert (shown["rerun_of"], shown["status"]) == (done, "succeeded")
        started = datetime.fromisoformat(shown["started_at"])
        assert datetime.fromisoformat(shown["submitted_at"]) <= started
        assert client.get(done).rerun_of is None
        # Through the client too, and in a table.
        third = client.rerun(done)
        assert third > again and client.wait(third, timeout=WAIT_S).rerun_of == done
        shown_rerun = run(env, "tasks", "rerun", str(third)).stdout
        assert shown_rerun.startswith(f"task {third}: rerun as task "), shown_rerun
        # Run before the worker leaves, or it would stay ready in the list below.
        fourth = int(shown_rerun.removeprefix(f"task {third}: rerun as task ").split()[0])
        assert client.wait(fourth, timeout=WAIT_S).rerun_of == third

    live = client.submit("cli-rerun", 1)  # pool default: no worker, it stays ready
    refused = run(env, "tasks", "rerun", str(live), code=ExitCode.NOT_RETRYABLE)
    assert "cronoq tasks get" in refused.stderr
    with pytest.raises(NotRetryable):
        client.rerun(live)
    assert [t.task_id for t in client.list(kind="cli-rerun", status="ready")] == [live]
    client.cancel(live)
    run(env, "tasks", "rerun", "987654321", code=ExitCode.NOT_FOUND)


# --- schedules history --------------------------------------------------------------------


def test_schedules_history_shows_what_became_of_each_occurrence(
    env: dict[str, str], client: Client
) -> None:
    """Every second, in pool default where nothing runs: the first occurrence starts a task,
    the next ones are skipped while it is live (overlap skip); those that came due while the
    schedule was paused are recorded as paused when it resumes."""
    name = f"cli-history-{secrets.token_hex(3)}"
    run(env, "schedules", "add", name, "* * * * * *", "-k", "cli-history")
    try:

        def ledger() -> list[OccurrenceInfo]:
            return client.occurrences(name)

        found = eventually(ledger, lambda records: len(records) >= 2)
        started, *skipped = reversed(found)
        assert started.outcome == "started" and started.task_id is not None
        assert skipped[0].outcome == "skipped" and skipped[0].task_id == started.task_id
        paused = client.pause_schedule(name)
        # Only the clock brings the next occurrence while paused: wait for its time.
        time.sleep(max(0.0, (paused.next_run_at - datetime.now(UTC)).total_seconds()) + 0.2)
        client.resume_schedule(name)
        # Paused again, the ledger stands still while it is read (an occurrence of every
        # second may still have been decided between the two calls: skipped).
        client.pause_schedule(name)

        records = as_json(run(env, "schedules", "history", name, "-o", "json"))
        [paused_record] = [r for r in records if r["outcome"] == "paused"]
        assert paused_record["task_id"] is None
        assert records[-1]["outcome"] == "started"
        assert {r["outcome"] for r in records} == {"started", "skipped", "paused"}
        for newer, older in itertools.pairwise(records):  # newest first, no gap
            assert older["until"] == newer["due_at"]
            assert datetime.fromisoformat(newer["due_at"]).tzinfo is not None

        newest = as_json(run(env, "schedules", "history", name, "-n", "1", "-o", "json"))
        assert newest == records[:1]
        before = run(
            env, "schedules", "history", name, "--before", records[1]["due_at"], "-o", "json"
        )
        assert as_json(before) == records[2:]

        table = run(env, "schedules", "history", name).stdout.splitlines()
        assert table[0].split()[:4] == ["DUE", "(UTC)", "OUTCOME", "TASK"]
        assert [row.split()[2] for row in table[1:]] == [r["outcome"] for r in records]
        assert table[-1].split()[2] == "started"
        skipped_row = next(row for row in table if row.split()[2] == "skipped")
        assert str(started.task_id) in skipped_row.split()
        for key, title in OCCURRENCE_COLUMNS:
            is_time = key in ("due_at", "until", "decided_at")
            assert title.endswith("(UTC)") is is_time, (key, title)
    finally:
        run(env, "schedules", "remove", name)
        for task in client.list(kind="cli-history", status="ready"):
            client.cancel(task.task_id)
    # The ledger outlives the schedule; a name never recorded is not found.
    assert as_json(run(env, "schedules", "history", name, "-o", "json"))
    run(env, "schedules", "history", "cli-history-nobody", code=ExitCode.NOT_FOUND)
    run(env, "schedules", "history", name, "--before", "2030-01-01T00:00:00", code=ExitCode.USAGE)
    run(env, "schedules", "history", name, "-n", "0", code=ExitCode.USAGE)


# --- who may ------------------------------------------------------------------------------

TOKENS = {name: secrets.token_urlsafe(24) for name in ("admin", "reader", "tenant")}
GRANTS = {
    "admin": '["admin"]',
    "reader": '["read"]',
    # A submitter scoped to pool default, which may read too.
    "tenant": '["submit", "read"]\nsubmit_pools = ["default"]',
}
IDENTITIES = "".join(
    f'[[auth.identities]]\nname = "{name}"\npermissions = {grants}\n'
    f'token_sha256 = ["{hashlib.sha256(TOKENS[name].encode()).hexdigest()}"]\n'
    for name, grants in GRANTS.items()
)


def test_the_reads_are_a_readers_and_a_rerun_an_admins_whatever_the_pool(tmp_path: Path) -> None:
    """As docs/security.md says: explain, attempts, history and the dependants of tasks get
    need `read`; a rerun needs `admin`, as a retry does, so an identity scoped to pools may
    rerun no task, its own pool's included."""
    with threaded_server(tmp_path, tables=IDENTITIES) as secured:
        env = {name: cli_env(secured.target, tmp_path, token) for name, token in TOKENS.items()}
        inside = int(run(env["tenant"], "submit", "cli-auth").stdout)
        outside = int(run(env["admin"], "submit", "cli-auth", "-p", "other").stdout)
        run(env["admin"], "schedules", "add", "cli-auth", "0 3 * * *", "-k", "cli-auth")
        for task_id in (inside, outside):
            run(env["admin"], "tasks", "cancel", str(task_id))
        for task_id in (inside, outside):
            for command in (("tasks", "explain"), ("tasks", "attempts"), ("tasks", "get")):
                run(env["reader"], *command, str(task_id))
        assert as_json(run(env["reader"], "schedules", "history", "cli-auth", "-o", "json")) == []
        for identity in ("reader", "tenant"):
            for task_id in (inside, outside):
                refused = run(env[identity], "tasks", "rerun", str(task_id),
                              code=ExitCode.PERMISSION_DENIED)  # fmt: skip
                assert f"identity {identity!r} lacks the permission 'admin'" in refused.stderr
        again = as_json(run(env["admin"], "tasks", "rerun", str(inside), "-o", "json"))
        assert again["rerun_of"] == inside
        with Client(secured.target, token=TOKENS["tenant"]) as tenant:
            assert tenant.get(again["task_id"]).rerun_of == inside
            with pytest.raises(PermissionDenied, match="lacks the permission 'admin'"):
                tenant.rerun(outside)
