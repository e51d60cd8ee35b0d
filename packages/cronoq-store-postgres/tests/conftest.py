"""Fixtures shared by the fault tests of this directory: a schema of their own, and a TCP proxy
in front of PostgreSQL that a test can black-hole or cut."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from pg_fault_helpers import assert_synchronous_commit, query
from pg_harness import DSN, drop_schema, new_schema, require_postgres
from pg_proxy import PgProxy, upstream_of


@pytest_asyncio.fixture
async def schema() -> AsyncIterator[str]:
    await require_postgres()
    await assert_synchronous_commit()
    name = new_schema()
    try:
        yield name
    finally:
        await drop_schema(name)


@pytest_asyncio.fixture
async def role() -> AsyncIterator[str]:
    """A login role with no privilege of its own, dropped (with its grants) afterwards."""
    await require_postgres()
    name = f"cronoq_app_{uuid.uuid4().hex[:12]}"
    await query(f"CREATE ROLE {name} LOGIN")
    try:
        yield name
    finally:
        # Its sessions first: a role with a session cannot be dropped.
        await query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name
        )
        await query(f"DROP OWNED BY {name}")
        await query(f"DROP ROLE {name}")


@pytest_asyncio.fixture
async def proxy() -> AsyncIterator[PgProxy]:
    upstream = upstream_of(DSN)
    if upstream is None:
        pytest.skip(f"the proxy needs a TCP DSN, not {DSN}")
    started = await PgProxy(upstream).start()
    try:
        yield started
    finally:
        await started.close()
