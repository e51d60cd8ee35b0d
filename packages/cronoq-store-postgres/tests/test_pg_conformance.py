"""The whole conformance kit against PgStore, each test in a schema of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from pg_harness import PgHarness, drop_schema, new_schema, require_postgres

from cronoq_conformance import StoreConformance, StoreHarness


class TestPgStore(StoreConformance):
    @pytest_asyncio.fixture
    async def harness(self) -> AsyncIterator[StoreHarness]:
        await require_postgres()
        schema = new_schema()
        try:
            yield PgHarness(schema)
        finally:
            await drop_schema(schema)
