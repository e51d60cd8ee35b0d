"""The conformance kit's checks of issues 25, 19, 21, 34 and 32 fail on PgStore with the matching
bug seeded (pg_seeded_stores), and pass on PgStore itself (test_pg_conformance): a check that
cannot fail proves nothing. Each runs one check of the kit as a store author's test module
would."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from pg_harness import PgHarness
from pg_seeded_stores import (
    CancelClearsLeasePgStore,
    CommitSqlSeededPgStore,
    GenerationBlindPgStore,
    NewTaskLeaseDroppedPgStore,
    PoolsMixedUpPgStore,
    SqlSeededPgStore,
    UnfencedPrunePgStore,
)

import cronoq_store_postgres._schema
from cronoq_conformance import StoreHarness, StoreSuite
from cronoq_store_postgres import PgStore

Check = Callable[[StoreSuite, StoreHarness], Awaitable[None]]


async def run_check(check: Check, harness: PgHarness) -> None:
    try:
        await check(StoreSuite(), harness)
    finally:
        await harness.close_all()


@pytest.mark.parametrize("store_class", [PgStore, GenerationBlindPgStore])
async def test_the_late_statement_check_fails_on_a_store_blind_to_its_generation(
    schema: str, store_class: type[PgStore]
) -> None:
    check = (
        StoreSuite.test_a_commit_statement_that_reaches_the_database_after_recovery_changes_nothing
    )
    harness = PgHarness(schema, store_class=store_class)
    if store_class is PgStore:
        await run_check(check, harness)
        return
    with pytest.raises(AssertionError, match=r"reached the database after recover\(\) landed"):
        await run_check(check, harness)


@pytest.mark.parametrize("store_class", [PgStore, UnfencedPrunePgStore])
async def test_the_replaced_leader_prune_check_fails_on_a_store_with_unfenced_pruning(
    schema: str, store_class: type[PgStore]
) -> None:
    check = StoreSuite.test_a_replaced_leader_that_has_not_noticed_prunes_nothing
    harness = PgHarness(schema, store_class=store_class)
    if store_class is PgStore:
        await run_check(check, harness)
        return
    with pytest.raises(AssertionError, match="must be told it is fenced"):
        await run_check(check, harness)


@pytest.mark.parametrize("store_class", [PgStore, NewTaskLeaseDroppedPgStore])
async def test_the_lease_round_trip_check_fails_on_a_store_inserting_new_tasks_without_it(
    schema: str, store_class: type[PgStore]
) -> None:
    check = StoreSuite.test_a_lease_round_trips_through_commit_and_lookups
    harness = PgHarness(schema, store_class=store_class)
    if store_class is PgStore:
        await run_check(check, harness)
        return
    with pytest.raises(AssertionError, match="started in the batch that submitted it"):
        await run_check(check, harness)


@pytest.mark.parametrize("store_class", [PgStore, CancelClearsLeasePgStore])
async def test_the_cancellation_lease_check_fails_on_a_store_whose_request_clears_it(
    schema: str, store_class: type[PgStore]
) -> None:
    check = StoreSuite.test_a_cancellation_request_keeps_the_lease
    harness = PgHarness(schema, store_class=store_class)
    if store_class is PgStore:
        await run_check(check, harness)
        return
    with pytest.raises(AssertionError, match="a CancelRequested must keep the row's lease"):
        await run_check(check, harness)


# --- the kit's checks of the operator calls (issue 21) ------------------------------------


class PausesNotRecoveredPgStore(CommitSqlSeededPgStore):
    recover_paused = "SELECT name FROM {s}.cronoq_pools WHERE NOT paused"


class ResumeIgnoredPgStore(CommitSqlSeededPgStore):
    old, new = "DO UPDATE SET paused = excluded.paused", "DO NOTHING"


class RetryKeepsOptionsPgStore(CommitSqlSeededPgStore):
    old, new = "options = COALESCE(", "options = COALESCE(t.options, "


class RetryKeepsCancelPgStore(CommitSqlSeededPgStore):
    old, new = "cancel_requested = CASE WHEN", "cancel_requested = t.cancel_requested OR CASE WHEN"


class RetryKeepsFinishPgStore(CommitSqlSeededPgStore):
    old, new = "THEN t.finished_ns", "THEN t.finished_ns WHEN t.finished_ns IS NOT NULL THEN 1"


# --- issue 34: pauses and ended attempts not gated on the fence --------------------------


class PausesUnfencedPgStore(CommitSqlSeededPgStore):
    old = """WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (name) DO UPDATE SET paused"""
    new = "ON CONFLICT (name) DO UPDATE SET paused"


class AttemptsUnfencedPgStore(CommitSqlSeededPgStore):
    old = """WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (task_id, attempt)"""
    new = "ON CONFLICT (task_id, attempt)"


# --- issue 32: the occurrence ledger ------------------------------------------------------


class OccurrencesUnfencedPgStore(CommitSqlSeededPgStore):
    old = """WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (schedule, due_ns)"""
    new = "ON CONFLICT (schedule, due_ns)"


class OccurrencesUpsertedPgStore(CommitSqlSeededPgStore):
    old = "ON CONFLICT (schedule, due_ns) DO NOTHING"
    new = """ON CONFLICT (schedule, due_ns) DO UPDATE SET outcome = excluded.outcome,
                    message = excluded.message"""


class OccurrencesByILikePgStore(SqlSeededPgStore):
    statement, old, new = "occurrences", "schedule = $1", "schedule ILIKE $1"


class LedgerPruneSparesRemovedPgStore(SqlSeededPgStore):
    statement = "prune"
    old = "WHERE until_ns < $3"
    new = "WHERE until_ns < $3 AND schedule IN (SELECT name FROM {s}.cronoq_schedules)"


@pytest.mark.parametrize(
    ("store_class", "check", "message"),
    [
        (
            PausesNotRecoveredPgStore,
            StoreSuite.test_a_paused_pool_is_recovered_by_a_new_instance,
            "must return every pool a PoolPaused paused",
        ),
        (
            ResumeIgnoredPgStore,
            StoreSuite.test_a_resumed_pool_is_not_recovered_as_paused,
            r"PoolPaused\(paused=False\) must replace",
        ),
        (
            RetryKeepsOptionsPgStore,
            StoreSuite.test_a_retried_task_is_live_again_with_its_new_spec,
            "a TaskRetried must make the row live",
        ),
        (
            RetryKeepsCancelPgStore,
            StoreSuite.test_a_retried_task_is_live_again_with_its_new_spec,
            "a TaskRetried must make the row live",
        ),
        (
            RetryKeepsFinishPgStore,
            StoreSuite.test_a_retried_task_is_not_pruned,
            "pruning must not delete it",
        ),
        (
            PausesUnfencedPgStore,
            StoreSuite.test_a_pool_pause_by_a_replaced_leader_does_not_land,
            "committed by a leader replaced behind its back landed",
        ),
        (
            PoolsMixedUpPgStore,
            StoreSuite.test_pauses_and_resumes_of_many_pools_land_each_on_its_own_pool,
            "each PoolPaused must pause or resume its own pool",
        ),
        (
            AttemptsUnfencedPgStore,
            StoreSuite.test_a_replaced_leader_that_has_not_noticed_writes_no_attempt,
            "wrote its AttemptEnded",
        ),
        (
            OccurrencesUnfencedPgStore,
            StoreSuite.test_a_replaced_leader_that_has_not_noticed_writes_no_occurrence,
            "wrote its OccurrenceRecorded",
        ),
        (
            OccurrencesUpsertedPgStore,
            StoreSuite.test_a_repeated_occurrence_record_changes_nothing,
            "the first one written stays",
        ),
        (
            OccurrencesByILikePgStore,
            StoreSuite.test_occurrences_come_newest_first_before_the_bound_up_to_the_limit_by_name,
            "names compared exactly",
        ),
        (
            LedgerPruneSparesRemovedPgStore,
            StoreSuite.test_pruning_removes_the_occurrence_records_that_ended_before_the_horizon,
            "whether or not their schedule still exists .*'gone'",
        ),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
async def test_each_operation_check_fails_on_its_seeded_bug(
    schema: str, store_class: type[PgStore], check: Check, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        await run_check(check, PgHarness(schema, store_class=store_class))


async def test_the_fenced_attempt_check_of_issue_22_lets_unfenced_attempts_through(
    schema: str,
) -> None:
    """Why the replaced-leader check exists: PgStore refuses a stale epoch before it sends
    anything, so the older check never reaches the statement whose attempts are unfenced."""
    check = StoreSuite.test_a_fenced_commit_writes_no_attempt
    await run_check(check, PgHarness(schema, store_class=AttemptsUnfencedPgStore))


# --- the kit's upgrade check (issue 34) fails on PgStore whose last migration loses data ----


@pytest.mark.parametrize("seeded", [False, True])
async def test_the_upgrade_check_fails_on_a_migration_that_drops_the_leases(
    schema: str, monkeypatch: pytest.MonkeyPatch, seeded: bool
) -> None:
    """The upgrade to the latest version clears the lease columns (as a table rebuilt without
    them would): the schemas of every earlier version with leases lose them."""
    if seeded:
        migrations = cronoq_store_postgres._schema._migrations

        def dropping(s: str) -> list[list[str]]:
            steps = migrations(s)
            steps[-1] = [
                *steps[-1],
                f"UPDATE {s}.cronoq_tasks SET lease_epoch = NULL, lease_hash = NULL",
            ]
            return steps

        monkeypatch.setattr(cronoq_store_postgres._schema, "_migrations", dropping)
    check = StoreSuite.test_what_an_earlier_schema_holds_reads_back_the_same_after_the_upgrade
    if not seeded:
        await run_check(check, PgHarness(schema))
        return
    with pytest.raises(
        AssertionError, match=r"after the upgrade from version 3: recover\(\) must return"
    ):
        await run_check(check, PgHarness(schema))
