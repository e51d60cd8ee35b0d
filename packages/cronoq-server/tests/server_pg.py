"""PostgreSQL for the server's tests: a schema of its own per test, dropped afterwards.

PostgreSQL is found at ``CRONOQ_TEST_PG_DSN`` (default: the local server, database ``test``);
when it is unreachable the tests that need it skip, unless ``CRONOQ_REQUIRE_POSTGRES=1`` makes
that a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

PG_DSN = os.environ.get("CRONOQ_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")


async def pg_connect() -> asyncpg.Connection:
    try:
        return await asyncpg.connect(PG_DSN, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        reason = f"PostgreSQL unreachable at {PG_DSN}: {exc}"
        if os.environ.get("CRONOQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest_asyncio.fixture
async def pg_schema() -> AsyncIterator[str]:
    name = f"cronoq_test_{uuid.uuid4().hex[:12]}"
    conn = await pg_connect()
    try:
        yield name
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        await conn.close()


async def pg_tables(schema: str) -> set[str]:
    conn = await pg_connect()
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema
        )
    finally:
        await conn.close()
    return {row["table_name"] for row in rows}
