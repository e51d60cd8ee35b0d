"""The whole conformance kit against SqliteStore, with every hook implemented."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings
from sqlite_harness import SqliteHarness

from cronoq_conformance import StoreConformance, StoreHarness


class TestSqliteStore(StoreConformance):
    # Every crash in a simulated history waits out a lease: fewer, still random, histories.
    simulation_settings = settings(max_examples=8, stateful_step_count=12, deadline=None)

    @pytest.fixture
    def harness(self, tmp_path: Path) -> StoreHarness:
        return SqliteHarness(tmp_path / "cronoq.db")
