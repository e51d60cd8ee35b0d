"""docs/outbox.md holds true: every example in it runs, against the real server.

The code blocks are read from the file (the reader's copy is the tested one):

- "A whole example" runs as a program, as a reader would run it;
- each driver's ``place_order`` is run on that driver's connection (or session), with
  ``search_path`` at the test's schema, where the ``orders`` table is; the order is there and
  its confirmation task runs with ``{"order": order_id}`` under its key;
- the SQL blocks run as they are (the trigger's rollback, too, leaves no task);
- the grants of "Privileges" are given to a new role, which then runs the asyncpg example and
  the SQL one, and is refused reading the outbox;
- the helpers' signatures are the functions'.

The docs' schema ``jobs`` (and role ``shop``) become the test's own. The Python blocks are
marked ``docs-test: skip`` for packages/cronoq-server/tests/test_docs.py, naming this file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
import pytest_asyncio
from pg_fault_helpers import query
from pg_harness import DSN
from pg_outbox_cluster import Cluster, ingesting, orders, task_rows
from pg_outbox_drivers import configure_django, sqlalchemy_url

from cronoq import JsonCodec, MissPolicy, RetryPolicy, unix_ns
from cronoq._outbox import OUTBOX_OPTIONS
from cronoq_store_postgres import enqueue, enqueue_many

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "outbox.md"
DOCS_DSN = "postgresql://postgres@127.0.0.1:5432/test"
THIS = "packages/cronoq-store-postgres/tests/test_outbox_docs.py"

_FENCE = re.compile(r"^```(\w*)\s*$")
_HEADING = re.compile(r"^(#{2,3}) (.+?)\s*$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    heading: str
    language: str
    code: str
    line: int
    marker: str | None


def blocks() -> list[Block]:
    found: list[Block] = []
    heading, marker = "", None
    lines = DOC.read_text(encoding="utf-8").splitlines()
    number = 0
    while number < len(lines):
        line = lines[number]
        number += 1
        if match := _HEADING.match(line):
            heading = match.group(2)
        elif match := _MARKER.match(line):
            marker = match.group(1)
        elif (match := _FENCE.match(line)) and match.group(1):
            start = number
            body: list[str] = []
            while not lines[number].startswith("```"):
                body.append(lines[number])
                number += 1
            number += 1
            found.append(Block(heading, match.group(1), "\n".join(body) + "\n", start, marker))
            marker = None
    return found


BLOCKS = blocks()


def block(heading: str, language: str = "python", index: int = 0) -> Block:
    chosen = [b for b in BLOCKS if b.heading == heading and b.language == language]
    return chosen[index]


DRIVERS = ("asyncpg", "psycopg", "psycopg (async)", "SQLAlchemy", "SQLAlchemy (async)", "Django")
RUN = {
    ("A whole example", "python"): 1,
    ("Enqueue from your code", "python"): 1,
    **{(heading, "python"): 1 for heading in DRIVERS},
    ("Plain SQL and triggers", "sql"): 2,
    ("Privileges", "sql"): 1,
    ("What is guaranteed", "sql"): 1,
}
"""Each heading's code blocks, all of which the tests below run or check."""


def test_every_code_block_of_the_doc_is_one_these_tests_run() -> None:
    counted: dict[tuple[str, str], int] = {}
    for b in BLOCKS:
        counted[b.heading, b.language] = counted.get((b.heading, b.language), 0) + 1
    assert counted == RUN
    for b in BLOCKS:
        if b.language == "python":
            # test_docs.py must not run them as programs of its own, and says where they run.
            assert b.marker is not None and b.marker.startswith("skip:"), b
            assert THIS in b.marker or "signatures" in b.marker, b


def test_the_signatures_in_the_doc_are_the_helpers() -> None:
    lines = block("Enqueue from your code").code.strip().splitlines()
    helpers: tuple[Callable[..., Any], ...] = (enqueue, enqueue_many)
    for line, helper in zip(lines, helpers, strict=True):
        # The doc shows the parameters without their annotations.
        signature = inspect.signature(helper)
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        expected = f"{helper.__name__}{bare} -> ".replace("'", '"')
        assert line.startswith(expected), (line, expected)


def in_schema(code: str, schema: str, role: str | None = None) -> str:
    """The block with the docs' schema (and role) replaced by the test's."""
    replaced = code.replace('schema="jobs"', f'schema="{schema}"')
    replaced = re.sub(r"\bjobs\.", f"{schema}.", replaced)
    replaced = re.sub(r"SCHEMA jobs\b", f"SCHEMA {schema}", replaced)
    if role is not None:
        replaced = re.sub(r"\bTO shop\b", f"TO {role}", replaced)
    assert "jobs" not in replaced, replaced
    return replaced


def load(heading: str, schema: str) -> Callable[..., Any]:
    """The ``place_order`` of a heading's block, run as a module of its own."""
    b = block(heading)
    code = in_schema(b.code, schema)
    assert f'schema="{schema}"' in code
    namespace: dict[str, Any] = {"__name__": f"outbox_doc_{b.line}"}
    exec(compile(code, f"{DOC}:{b.line}", "exec"), namespace)
    place_order: Callable[..., Any] = namespace["place_order"]
    return place_order


async def confirmed(cluster: Cluster, order_id: int) -> None:
    """The order's confirmation task ran with its payload, under its key."""
    await cluster.runs.ran("send_confirmation", {"order": order_id})
    info = await cluster.sched.get_by_key(f"confirmation-{order_id}")
    assert info is not None
    assert (info.kind, info.payload) == ("send_confirmation", {"order": order_id})


@pytest_asyncio.fixture
async def cluster(schema: str) -> AsyncIterator[Cluster]:
    async with ingesting(schema, codec=JsonCodec()) as started:
        yield started


# --- the whole program ------------------------------------------------------------------------


async def test_the_whole_example_runs(schema: str, tmp_path: Path) -> None:
    code = in_schema(block("A whole example").code, schema)
    assert DOCS_DSN in code
    script = tmp_path / "outbox_example.py"
    script.write_text(code.replace(DOCS_DSN, DSN), encoding="utf-8")
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(script), cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with asyncio.timeout(60):
        output, _ = await process.communicate()
    text = output.decode("utf-8", "replace")
    assert process.returncode == 0, text
    assert text.splitlines()[-2:] == ["mailing the confirmation of order 1", "succeeded"], text
    assert await orders(schema) == ["book"]


# --- each driver's place_order ----------------------------------------------------------------


async def run_asyncpg(place_order: Callable[..., Any], schema: str) -> int:
    conn = await asyncpg.connect(DSN, server_settings={"search_path": schema})
    try:
        order_id: int = await place_order(conn, "book")
        return order_id
    finally:
        await conn.close()


async def run_psycopg(place_order: Callable[..., Any], schema: str) -> int:
    def run() -> int:
        with psycopg.connect(DSN, options=f"-c search_path={schema}") as conn:
            order_id: int = place_order(conn, "book")
            return order_id

    return await asyncio.to_thread(run)


async def run_psycopg_async(place_order: Callable[..., Any], schema: str) -> int:
    async with await psycopg.AsyncConnection.connect(
        DSN, options=f"-c search_path={schema}"
    ) as conn:
        order_id: int = await place_order(conn, "book")
        return order_id


async def run_sqlalchemy(place_order: Callable[..., Any], schema: str) -> int:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    engine = create_engine(
        sqlalchemy_url("psycopg"), connect_args={"options": f"-c search_path={schema}"}
    )

    def run() -> int:
        with Session(engine) as session:
            order_id: int = place_order(session, "book")
            return order_id

    try:
        return await asyncio.to_thread(run)
    finally:
        await asyncio.to_thread(engine.dispose)


async def run_sqlalchemy_async(place_order: Callable[..., Any], schema: str) -> int:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(
        sqlalchemy_url("asyncpg"), connect_args={"server_settings": {"search_path": schema}}
    )
    try:
        async with AsyncSession(engine) as session:
            order_id: int = await place_order(session, "book")
            return order_id
    finally:
        await engine.dispose()


async def run_django(place_order: Callable[..., Any], schema: str) -> int:
    configure_django()

    def run() -> int:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                cursor.execute(f"SET search_path TO {schema}")
            order_id: int = place_order("book")
            return order_id
        finally:
            connection.close()  # the thread's connection, and its search_path, are gone

    with concurrent.futures.ThreadPoolExecutor(1) as thread:
        return await asyncio.get_running_loop().run_in_executor(thread, run)


RUNNERS: dict[str, Callable[[Callable[..., Any], str], Any]] = {
    "asyncpg": run_asyncpg,
    "psycopg": run_psycopg,
    "psycopg (async)": run_psycopg_async,
    "SQLAlchemy": run_sqlalchemy,
    "SQLAlchemy (async)": run_sqlalchemy_async,
    "Django": run_django,
}


@pytest.mark.parametrize("heading", DRIVERS)
async def test_each_drivers_example_writes_the_order_and_its_task(
    heading: str, schema: str, cluster: Cluster
) -> None:
    place_order = load(heading, schema)
    order_id = await RUNNERS[heading](place_order, schema)
    assert await orders(schema) == ["book"]
    await confirmed(cluster, order_id)


# --- SQL ------------------------------------------------------------------------------------


async def app_connection(schema: str, user: str | None = None) -> asyncpg.Connection:
    return await asyncpg.connect(DSN, user=user, server_settings={"search_path": schema})


async def test_the_plain_sql_enqueues_with_the_order(schema: str, cluster: Cluster) -> None:
    conn = await app_connection(schema)
    try:
        await conn.execute(in_schema(block("Plain SQL and triggers", "sql").code, schema))
    finally:
        await conn.close()
    [row] = await query(f"SELECT id FROM {cluster.s}.orders")
    await confirmed(cluster, row["id"])
    info = await cluster.sched.get_by_key(f"confirmation-{row['id']}")
    assert info is not None and info.priority == 5


async def test_the_notify_trigger_switched_off_as_documented_leaves_the_poll_ingesting(
    schema: str, cluster: Cluster
) -> None:
    await query(in_schema(block("What is guaranteed", "sql").code, schema))
    [trigger] = await query(
        "SELECT tgenabled FROM pg_trigger WHERE tgname = 'cronoq_outbox_notify' "
        "AND tgrelid = $1::regclass",
        f"{cluster.s}.cronoq_outbox",
    )
    assert trigger["tgenabled"] == b"D"
    conn = await app_connection(schema)
    try:
        await conn.execute(in_schema(block("Plain SQL and triggers", "sql").code, schema))
    finally:
        await conn.close()
    [row] = await query(f"SELECT id FROM {cluster.s}.orders")
    await confirmed(cluster, row["id"])


async def test_the_trigger_enqueues_in_the_orders_transaction(
    schema: str, cluster: Cluster
) -> None:
    conn = await app_connection(schema)
    try:
        await conn.execute(in_schema(block("Plain SQL and triggers", "sql", 1).code, schema))

        async def rolled_back() -> None:
            async with conn.transaction():
                await conn.execute("INSERT INTO orders (item) VALUES ('pen')")
                raise RuntimeError("rolled back")

        with pytest.raises(RuntimeError, match="rolled back"):
            await rolled_back()
        kept = await conn.fetchval("INSERT INTO orders (item) VALUES ('ink') RETURNING id")
    finally:
        await conn.close()
    await confirmed(cluster, kept)
    # The rolled-back order's row came first (a lower id): had it committed, it would have
    # been ingested by the time the kept one's task ran. It is nowhere.
    assert len(await task_rows(schema, "send_confirmation")) == 1
    assert list(cluster.runs.of_kind("send_confirmation")) == [(("order", kept),)]
    assert await orders(schema) == ["ink"]


# --- privileges -----------------------------------------------------------------------------


async def test_the_documented_grants_let_a_role_enqueue_and_not_read(
    schema: str, cluster: Cluster, role: str
) -> None:
    grants = in_schema(block("Privileges", "sql").code, schema, role)
    assert role in grants
    admin = await asyncpg.connect(DSN)
    try:
        await admin.execute(grants)  # the block as it is: two statements
    finally:
        await admin.close()
    # The application's own privileges on its own table.
    await query(f"GRANT INSERT, SELECT ON {cluster.s}.orders TO {role}")

    order_id = await run_asyncpg_as(load("asyncpg", schema), schema, role)
    await confirmed(cluster, order_id)
    conn = await app_connection(schema, role)
    try:
        await conn.execute(in_schema(block("Plain SQL and triggers", "sql").code, schema))
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch(f"SELECT kind, payload, options FROM {cluster.s}.cronoq_outbox")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(f"DELETE FROM {cluster.s}.cronoq_outbox")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch(f"SELECT 1 FROM {cluster.s}.cronoq_tasks")
    finally:
        await conn.close()
    [_, second] = await query(f"SELECT id FROM {cluster.s}.orders ORDER BY id")
    await confirmed(cluster, second["id"])


async def run_asyncpg_as(place_order: Callable[..., Any], schema: str, role: str) -> int:
    conn = await app_connection(schema, role)
    try:
        assert await conn.fetchval("SELECT current_user") == role
        order_id: int = await place_order(conn, "book")
        return order_id
    finally:
        await conn.close()


# --- the options' JSON form -------------------------------------------------------------------

_OPTION = re.compile(r'`("(\w+)": [^`]+)`')


def documented_options() -> list[tuple[str, Any]]:
    """(option, value) of every JSON example in the third column of "The options"' table."""
    found = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `"):
            for snippet, name in _OPTION.findall(line.split(" | ")[2]):
                found.append((name, json.loads("{" + snippet + "}")[name]))
    return found


def test_the_options_table_shows_each_options_json_form() -> None:
    shown = {name for name, _ in documented_options()}
    assert shown == OUTBOX_OPTIONS - {"deadline", "grace"}  # those two are "as" another


async def test_each_documented_json_form_becomes_the_option_it_says(schema: str) -> None:
    """Written by SQL as the table shows, each row becomes a task with that option: none is
    quarantined."""
    forms = [
        *documented_options(),
        # What the table says besides its examples: null is the default, a missing retry
        # field is RetryPolicy's default, any UTC offset.
        ("pool", None),
        ("retry", {"max_attempts": 5}),
        ("start_at", "2027-01-01T10:00:00.5+05:30"),
    ]
    async with ingesting(schema, codec=JsonCodec(), pools=("default", "mail")) as cluster:
        conn = await asyncpg.connect(DSN)
        try:
            for number, (name, value) in enumerate(forms):
                await conn.execute(
                    f"SELECT {cluster.s}.cronoq_enqueue($1, '\\x', $2::jsonb)",
                    f"form-{number}",
                    json.dumps({name: value}),
                )
            await enqueue(conn, "marker", None, schema=schema)
        finally:
            await conn.close()
        await cluster.runs.ran("marker", None)
        assert await cluster.sched.outbox_quarantine() == []
        for number, (name, value) in enumerate(forms):
            [summary] = await cluster.sched.list(kind=f"form-{number}")
            record = await cluster.store.get_task(summary.task_id)
            assert record is not None
            spec = record.spec
            field, expected = meant(name, value)
            assert getattr(spec, field) == expected, (name, value, spec)


def meant(name: str, value: Any) -> tuple[str, Any]:
    """The TaskSpec field an option's JSON value sets, and to what."""
    match name:
        case "pool":
            return "pool", value or "default"
        case "tags":
            return "tags", tuple(value)
        case "retry":
            return "retry", RetryPolicy(**value)
        case "start_at":
            return "start_at_ns", unix_ns(datetime.fromisoformat(value), name)
        case "timeout":
            return "timeout_ns", round(value * 1_000_000_000)
        case "miss_policy":
            return "miss_policy", MissPolicy(value)
        case _:
            return name, value
