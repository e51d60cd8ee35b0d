"""The conformance kit's database-condition check fails on SqliteStore with a bug seeded
that the kit's older fatal-commit check lets through: every ``sqlite3.OperationalError``
taken as transient. A read-only database (SQLITE_READONLY) is an OperationalError as
SQLITE_BUSY is; the fatal-commit hook's refused write (SQLITE_AUTH) is not."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from sqlite_harness import SqliteHarness

import cronoq_store_sqlite._schema
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


# --- the kit's lease checks (issue 19) fail on SqliteStore with a lease bug seeded ------------


def seed(monkeypatch: pytest.MonkeyPatch, name: str, old: str, new: str) -> None:
    sql = getattr(cronoq_store_sqlite._store, name)
    assert old in sql, "the seeded bug no longer applies to SqliteStore"
    monkeypatch.setattr(cronoq_store_sqlite._store, name, sql.replace(old, new))


@pytest.mark.parametrize("seeded", [False, True])
async def test_the_recovery_check_fails_on_a_store_whose_recovery_reads_no_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeded: bool
) -> None:
    """Lookups read the lease; recovery selects NULL for it (a column list left behind)."""
    if seeded:
        seed(monkeypatch, "_RECOVER", "lease_epoch, lease_hash", "NULL, NULL")
    harness = SqliteHarness(tmp_path / "cronoq.db")
    check = StoreSuite.test_a_lease_survives_a_new_instance_recovery
    try:
        if not seeded:
            await check(StoreSuite(), harness)
            return
        with pytest.raises(AssertionError, match=r"recover\(\) must return each running row"):
            await check(StoreSuite(), harness)
    finally:
        await harness.close_all()


@pytest.mark.parametrize("seeded", [False, True])
async def test_the_clearing_check_fails_on_a_store_whose_updates_only_set_a_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeded: bool
) -> None:
    """An update writes its lease only when it has one (COALESCE): a retry keeps the old."""
    if seeded:
        for column in ("lease_epoch", "lease_hash"):
            old, new = f"ELSE :{column} END", f"ELSE COALESCE(:{column}, {column}) END"
            seed(monkeypatch, "_CHANGE_TASK", old, new)
    harness = SqliteHarness(tmp_path / "cronoq.db")
    check = StoreSuite.test_an_update_without_a_lease_clears_it
    try:
        if not seeded:
            await check(StoreSuite(), harness)
            return
        with pytest.raises(AssertionError, match=r"without a lease .* must clear it"):
            await check(StoreSuite(), harness)
    finally:
        await harness.close_all()


# --- the kit's foreign-path check (issue 24) fails on SqliteStore opening before it looks ----


@pytest.mark.parametrize("seeded", [False, True])
async def test_the_foreign_path_check_fails_on_a_store_that_tightens_before_it_looks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeded: bool
) -> None:
    """The store as it was: an existing path is chmod 0700/0600 first, then SQLite finds it
    is a directory or not a database."""
    if seeded:
        monkeypatch.setattr(cronoq_store_sqlite._schema, "refuse_unless_ours", lambda path: None)
    harness = SqliteHarness(tmp_path / "cronoq.db")
    check = StoreSuite.test_a_path_the_store_does_not_own_is_refused_and_left_as_it_was
    try:
        if not seeded:
            await check(StoreSuite(), harness, tmp_path)
            return
        with pytest.raises(AssertionError, match=r"changed what the store does not own"):
            await check(StoreSuite(), harness, tmp_path)
    finally:
        await harness.close_all()


# --- the kit's checks of the operator calls (issue 21) fail on SqliteStore with a bug seeded --

OPERATION_BUGS = [
    pytest.param(
        "_RECOVER_PAUSED_POOLS",
        "WHERE paused",
        "WHERE NOT paused",
        StoreSuite.test_a_paused_pool_is_recovered_by_a_new_instance,
        "must return every pool a PoolPaused paused",
        id="recovery-reads-resumed-pools",
    ),
    pytest.param(
        "_SAVE_POOL",
        "DO UPDATE SET paused = excluded.paused",
        "DO NOTHING",
        StoreSuite.test_a_resumed_pool_is_not_recovered_as_paused,
        r"PoolPaused\(paused=False\) must replace",
        id="a-resume-keeps-the-pause",
    ),
    pytest.param(
        "_CHANGE_TASK",
        "options = COALESCE(:options, options)",
        "options = options",
        StoreSuite.test_a_retried_task_is_live_again_with_its_new_spec,
        "a TaskRetried must make the row live",
        id="a-retry-keeps-the-options",
    ),
    pytest.param(
        "_CHANGE_TASK",
        "ELSE :cancel END",
        "ELSE cancel_requested OR :cancel END",
        StoreSuite.test_a_retried_task_is_live_again_with_its_new_spec,
        "a TaskRetried must make the row live",
        id="a-retry-keeps-the-cancellation-request",
    ),
    # Issue 34: a finished row's kept lease outlives the retry (the lease columns are kept
    # whenever the options are rewritten).
    pytest.param(
        "_CHANGE_TASK",
        ":status IS NULL THEN lease_",
        ":status IS NULL OR :options IS NOT NULL THEN lease_",
        StoreSuite.test_a_retry_clears_the_lease_a_finished_row_kept,
        "a TaskRetried must clear the row's lease",
        id="a-retry-keeps-a-kept-lease",
    ),
    pytest.param(
        "_CHANGE_TASK",
        "ELSE :finished END",
        "ELSE COALESCE(:finished, finished_ns) END",
        StoreSuite.test_a_retried_task_is_not_pruned,
        "pruning must not delete it",
        id="a-retry-keeps-the-finish-time",
    ),
    # A finished row whose stopped attempt may still run keeps its lease (issue 19).
    pytest.param(
        "_PRUNE",
        " AND lease_hash IS NULL",
        "",
        StoreSuite.test_a_finished_row_keeps_its_lease_and_is_not_pruned_until_cleared,
        "pruning must leave a finished row",
        id="pruning-deletes-a-leased-finished-row",
    ),
    pytest.param(
        "_RECOVER",
        " OR lease_hash IS NOT NULL",
        "",
        StoreSuite.test_a_finished_row_keeps_its_lease_and_is_not_pruned_until_cleared,
        "must return a finished row that keeps a lease",
        id="recovery-misses-an-old-leased-finished-row",
    ),
]


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize(("name", "old", "new", "check", "message"), OPERATION_BUGS)
async def test_each_operation_check_fails_on_its_seeded_bug(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    seeded: bool,
    name: str,
    old: str,
    new: str,
    check: Callable[[StoreSuite, SqliteHarness], Awaitable[None]],
    message: str,
) -> None:
    if seeded:
        seed(monkeypatch, name, old, new)
    harness = SqliteHarness(tmp_path / "cronoq.db")
    try:
        if not seeded:
            await check(StoreSuite(), harness)
            return
        with pytest.raises(AssertionError, match=message):
            await check(StoreSuite(), harness)
    finally:
        await harness.close_all()


# --- the kit's upgrade check (issue 34) fails on SqliteStore whose last migration loses data --


@pytest.mark.parametrize("seeded", [False, True])
async def test_the_upgrade_check_fails_on_a_migration_that_drops_the_leases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seeded: bool
) -> None:
    """The upgrade to the latest version clears the lease columns (as a table rebuilt without
    them would): the files of every earlier version with leases lose them."""
    if seeded:
        steps = cronoq_store_sqlite._schema._MIGRATIONS
        dropped = steps[-1] + "UPDATE cronoq_tasks SET lease_epoch = NULL, lease_hash = NULL;"
        monkeypatch.setattr(cronoq_store_sqlite._schema, "_MIGRATIONS", [*steps[:-1], dropped])
    harness = SqliteHarness(tmp_path / "cronoq.db")
    check = StoreSuite.test_what_an_earlier_schema_holds_reads_back_the_same_after_the_upgrade
    try:
        if not seeded:
            await check(StoreSuite(), harness)
            return
        with pytest.raises(
            AssertionError, match=r"after the upgrade from version 2: recover\(\) must return"
        ):
            await check(StoreSuite(), harness)
    finally:
        await harness.close_all()


# --- the kit's ledger checks (issue 32) fail on SqliteStore with a ledger bug seeded ----------

# Both reads: with a bound and without (the same query, its bound left out).
READS = ("_OCCURRENCES", "_OCCURRENCES_ALL")
LEDGER_BUGS = [
    pytest.param(
        ("_SAVE_OCCURRENCE",),
        "DO NOTHING",
        "DO UPDATE SET outcome = excluded.outcome, message = excluded.message",
        StoreSuite.test_a_repeated_occurrence_record_changes_nothing,
        "the first one written stays",
        id="a-repeated-record-replaces-the-first",
    ),
    pytest.param(
        READS,
        "ORDER BY due_ns DESC",
        "ORDER BY due_ns",
        StoreSuite.test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name,
        "newest first",
        id="oldest-first",
    ),
    pytest.param(
        READS,
        "due_ns < ?",
        "due_ns <= ?",
        StoreSuite.test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name,
        r"before before_ns \(exclusive\)",
        id="an-inclusive-bound",
    ),
    pytest.param(
        READS,
        "LIMIT ?",
        "LIMIT -1 + 0 * ?",
        StoreSuite.test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name,
        "at most limit records",
        id="no-limit",
    ),
    pytest.param(
        READS,
        "schedule = ?",
        "schedule LIKE ?",
        StoreSuite.test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name,
        "names compared exactly",
        id="names-matched-by-like",
    ),
    pytest.param(
        READS,
        "schedule = ?",
        "schedule = ? COLLATE NOCASE",
        StoreSuite.test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name,
        "names compared exactly",
        id="names-compared-ignoring-case",
    ),
    pytest.param(
        ("_PRUNE_OCCURRENCES",),
        "WHERE until_ns < ?",
        "WHERE until_ns < ? AND schedule IN (SELECT name FROM cronoq_schedules)",
        StoreSuite.test_pruning_removes_the_occurrence_records_that_ended_before_the_horizon,
        "whether or not their schedule still exists .*'gone'",
        id="pruning-spares-removed-schedules",
    ),
    pytest.param(
        ("_PRUNE_OCCURRENCES",),
        "until_ns < ?",
        "until_ns <= ?",
        StoreSuite.test_pruning_removes_the_occurrence_records_that_ended_before_the_horizon,
        "and only those",
        id="pruning-takes-the-horizon",
    ),
    pytest.param(
        ("_PRUNE_OCCURRENCES",),
        "until_ns < ?",
        "due_ns < ?",
        StoreSuite.test_pruning_removes_the_occurrence_records_that_ended_before_the_horizon,
        "whose span ended before it, and only those",
        id="pruning-by-the-due-time",
    ),
]


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize(("names", "old", "new", "check", "message"), LEDGER_BUGS)
async def test_each_ledger_check_fails_on_its_seeded_bug(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    seeded: bool,
    names: tuple[str, ...],
    old: str,
    new: str,
    check: Callable[[StoreSuite, SqliteHarness], Awaitable[None]],
    message: str,
) -> None:
    if seeded:
        for name in names:  # the first must hold the text (seed checks); the others may not
            if old in getattr(cronoq_store_sqlite._store, name) or name == names[0]:
                seed(monkeypatch, name, old, new)
    harness = SqliteHarness(tmp_path / "cronoq.db")
    try:
        if not seeded:
            await check(StoreSuite(), harness)
            return
        with pytest.raises(AssertionError, match=message):
            await check(StoreSuite(), harness)
    finally:
        await harness.close_all()
