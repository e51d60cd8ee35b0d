"""The conformance kit's database-condition check fails on SqliteStore with a bug seeded
that the kit's older fatal-commit check lets through: every ``sqlite3.OperationalError``
taken as transient. A read-only database (SQLITE_READONLY) is an OperationalError as
SQLITE_BUSY is; the fatal-commit hook's refused write (SQLITE_AUTH) is not."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlite_harness import SqliteHarness

import cronoq_store_sqlite._store
from cronoq.errors import StoreError, Unavailable
from cronoq_conformance import DatabaseCondition, StoreSuite
from cronoq_store_sqlite._errors import classify


@pytest.fixture
def operational_errors_transient(monkeypatch: pytest.MonkeyPatch) -> None:
    def seeded(exc: sqlite3.Error, doing: str, path: str | None = None) -> StoreError:
        if isinstance(exc, sqlite3.OperationalError):
            return Unavailable(f"SQLite failed while {doing}: {exc}")
        return classify(exc, doing, path)

    monkeypatch.setattr(cronoq_store_sqlite._store, "classify", seeded)


async def run_check(harness: SqliteHarness, condition: DatabaseCondition) -> None:
    check = StoreSuite.test_each_database_condition_is_fatal_or_transient_as_it_is
    try:
        await check(StoreSuite(), harness, condition)
    finally:
        await harness.close_all()


@pytest.mark.usefixtures("operational_errors_transient")
async def test_the_condition_check_fails_on_a_store_retrying_every_operational_error(
    tmp_path: Path,
) -> None:
    harness = SqliteHarness(tmp_path / "cronoq.db")
    with pytest.raises(AssertionError, match=r"read-only .* must be StoreFatal, not Unavailable"):
        await run_check(harness, DatabaseCondition.READ_ONLY)


@pytest.mark.usefixtures("operational_errors_transient")
async def test_the_fatal_commit_check_lets_that_bug_through(tmp_path: Path) -> None:
    """Why the condition check exists: the refused write of FATAL_COMMIT is SQLITE_AUTH, a
    DatabaseError, so the seeded store passes it."""
    harness = SqliteHarness(tmp_path / "cronoq.db")
    try:
        await StoreSuite().test_a_fatal_database_error_is_reported_as_store_fatal(harness)
    finally:
        await harness.close_all()
