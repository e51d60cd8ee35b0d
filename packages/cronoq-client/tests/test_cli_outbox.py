"""``cronoq outbox status|quarantine|requeue|discard`` end to end against a real cronoq-server
on PostgreSQL with authentication on: each command in table and JSON output, and its errors as
one line with the documented exit code (a reader's requeue, bad ids, a server without an
outbox). The commands run in this process through click's runner, as test_cli's do."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from outbox_rows import (
    correct_options,
    drop_schema,
    enqueue,
    logged_quarantine,
    reserve_schema,
    wait_until,
)
from server_pg import PG_DSN
from server_thread import ThreadedServer, cli_env, threaded_server
from test_cli import as_json, run

from cronoq_client import AsyncClient
from cronoq_client._cli._errors import ExitCode
from cronoq_server._config import NO_OUTBOX

TOKENS = {"admin": secrets.token_urlsafe(24), "reader": secrets.token_urlsafe(24)}
GRANTS = {"admin": "admin", "reader": "read"}
AUTH = "[auth]\nreload_interval_s = 600\n" + "".join(
    f'[[auth.identities]]\nname = "{name}"\npermissions = ["{GRANTS[name]}"]\n'
    f'token_sha256 = ["{hashlib.sha256(token.encode()).hexdigest()}"]\n'
    for name, token in TOKENS.items()
)


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    name = asyncio.run(reserve_schema())
    yield name
    asyncio.run(drop_schema(name))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, schema: str) -> Iterator[ThreadedServer]:
    store = (
        f'[store]\nkind = "postgres"\ndsn = "{PG_DSN}"\nschema = "{schema}"\noutbox_poll_s = 0.1\n'
    )
    with threaded_server(tmp_path_factory.mktemp("cli-outbox"), tables=AUTH, store=store) as on:
        yield on


@pytest.fixture
def env(server: ThreadedServer, tmp_path: Path) -> dict[str, str]:
    return cli_env(server.target, tmp_path, TOKENS["admin"])


def _quarantined(server: ThreadedServer, schema: str, *kinds: str) -> list[int]:
    """Rows of an unknown pool, once the leader quarantined each."""

    async def written() -> list[int]:
        ids = await enqueue(schema, *[(kind, b'{"n": 1}', '{"pool": "nope"}') for kind in kinds])
        for row_id in ids:
            await logged_quarantine(server.server, row_id)
        return ids

    return server.call(written())


def test_status_quarantine_requeue_and_discard_in_tables_and_json(
    server: ThreadedServer, schema: str, env: dict[str, str]
) -> None:
    before = as_json(run(env, "outbox", "status", "-o", "json"))
    ids = _quarantined(server, schema, "cli-a", "cli-b", "cli-c")
    status = as_json(run(env, "outbox", "status", "-o", "json"))
    assert status == {
        "depth": 0,
        "oldest_enqueued_at": None,
        "quarantined": before["quarantined"] + 3,
        "ingested_by_leader": before["ingested_by_leader"],
        "quarantined_by_leader": before["quarantined_by_leader"] + 3,
        "oldest_age_s": None,
    }
    shown = dict(
        [*line.split(maxsplit=1), ""][:2]
        for line in run(env, "outbox", "status").stdout.splitlines()
    )
    assert shown["quarantined"] == str(before["quarantined"] + 3)
    assert shown["oldest_age_s"] == ""  # none waits

    listed = as_json(run(env, "outbox", "quarantine", "--after", str(ids[0] - 1), "-n", "2",
                         "-o", "json"))  # fmt: skip
    assert [(row["row_id"], row["kind"]) for row in listed] == [
        (ids[0], "cli-a"),
        (ids[1], "cli-b"),
    ]
    first = listed[0]
    assert first["reason"] == "UnknownPool: unknown pool 'nope'; configured: default, other"
    assert (first["options"], first["payload_size"]) == ('{"pool": "nope"}', 8)
    assert base64.b64decode(first["payload_head"]["base64"]) == b'{"n": 1}'
    assert datetime.fromisoformat(first["enqueued_at"]) <= datetime.now(UTC)
    table = run(env, "outbox", "quarantine", "--after", str(ids[0] - 1)).stdout.splitlines()
    assert table[0].split() == ["ID", "KIND", "ENQUEUED", "(UTC)", "REASON"]
    assert [line.split()[:2] for line in table[1:]] == [
        [str(row_id), kind] for row_id, kind in zip(ids, ("cli-a", "cli-b", "cli-c"), strict=True)
    ]
    assert table[1].endswith("UnknownPool: unknown pool 'nope'; configured: default, other")

    # Corrected by SQL, requeued: a task. Requeued as it is: quarantined again.
    server.call(correct_options(schema, ids[0], '{"key": "cli-outbox-fixed"}'))
    assert run(env, "outbox", "requeue", str(ids[0])).stdout == "1 of 1 row requeued\n"
    assert run(env, "outbox", "requeue", str(ids[1]), "-o", "json").stdout == (
        json.dumps({"requeued": 1, "row_ids": [ids[1]]}) + "\n"
    )
    server.call(logged_quarantine(server.server, ids[1], times=2))

    async def task_of_the_requeued_row() -> str:
        async with AsyncClient(server.target, token=TOKENS["admin"], timeout=10) as client:

            async def ingested() -> bool:
                return await client.get_by_key("cli-outbox-fixed") is not None

            await wait_until(ingested, "the requeued row's task")
            info = await client.get_by_key("cli-outbox-fixed")
        assert info is not None
        return info.kind

    assert server.call(task_of_the_requeued_row()) == "cli-a"

    gone = run(env, "outbox", "discard", str(ids[1]), str(ids[2]), str(ids[2]), "999999999")
    assert gone.stdout == (
        "2 of 3 rows discarded; 1 not in the quarantine (requeued or discarded already)\n"
    )
    assert as_json(run(env, "outbox", "discard", str(ids[2]), "-o", "json")) == {
        "discarded": 0,
        "row_ids": [ids[2]],
    }
    assert as_json(run(env, "outbox", "quarantine", "--after", str(ids[0] - 1), "-o", "json")) == []


def test_errors_are_one_line_with_their_exit_code(
    server: ThreadedServer, schema: str, env: dict[str, str], tmp_path: Path
) -> None:
    [row_id] = _quarantined(server, schema, "cli-guarded")
    reader = cli_env(server.target, tmp_path, TOKENS["reader"])
    assert as_json(run(reader, "outbox", "status", "-o", "json"))["quarantined"] >= 1
    refused = run(reader, "outbox", "discard", str(row_id), code=ExitCode.PERMISSION_DENIED)
    assert refused.stderr == (
        "error: identity 'reader' lacks the permission 'admin'; an identity with the 'admin' "
        "permission is needed\n"
    )
    listed = as_json(run(reader, "outbox", "quarantine", "--after", str(row_id - 1), "-o", "json"))
    assert [row["row_id"] for row in listed] == [row_id]  # refused: nothing changed
    # Bad ids and bounds: the command line's (exit 2), or the server's (exit 4).
    for bad in (["discard"], ["discard", "0"], ["requeue", "x"], ["quarantine", "-n", "1001"]):
        usage = run(env, "outbox", *bad, code=ExitCode.USAGE)
        assert "Usage:" in usage.stderr
    many = [str(n) for n in range(1, 1002)]
    too_many = run(env, "outbox", "requeue", *many, code=ExitCode.INVALID)
    assert too_many.stderr == "error: row_ids: more than 1000 items given; the limit is 1000\n"
    assert run(env, "outbox", "discard", str(row_id)).stdout == "1 of 1 row discarded\n"


def test_a_server_without_an_outbox_says_how_to_have_one(tmp_path: Path) -> None:
    with threaded_server(tmp_path) as memory:
        env = cli_env(memory.target, tmp_path, "")  # a server without authentication
        for command in (["status"], ["quarantine"], ["requeue", "1"], ["discard", "1"]):
            refused = run(env, "outbox", *command, code=ExitCode.INVALID)
            assert refused.stderr == f"error: {NO_OUTBOX}\n"
