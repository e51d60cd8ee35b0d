"""The whole conformance kit against SqliteStore, with every hook implemented."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlite_harness import SqliteHarness

from cronoq_conformance import StoreConformance, StoreHarness


class TestSqliteStore(StoreConformance):
    @pytest.fixture
    def harness(self, tmp_path: Path) -> StoreHarness:
        return SqliteHarness(tmp_path / "cronoq.db")
