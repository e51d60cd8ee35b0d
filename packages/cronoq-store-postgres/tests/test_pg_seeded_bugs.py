"""The conformance kit's checks of issues 25 and 19 fail on PgStore with the matching bug seeded
(pg_seeded_stores), and pass on PgStore itself (test_pg_conformance): a check that cannot fail
proves nothing. Each runs one check of the kit as a store author's test module would."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from pg_harness import PgHarness
from pg_seeded_stores import (
    CancelClearsLeasePgStore,
    CommitSqlSeededPgStore,
    GenerationBlindPgStore,
    NewTaskLeaseDroppedPgStore,
    UnfencedPrunePgStore,
)

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
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
async def test_each_operation_check_fails_on_its_seeded_bug(
    schema: str, store_class: type[PgStore], check: Check, message: str
) -> None:
    with pytest.raises(AssertionError, match=message):
        await run_check(check, PgHarness(schema, store_class=store_class))
