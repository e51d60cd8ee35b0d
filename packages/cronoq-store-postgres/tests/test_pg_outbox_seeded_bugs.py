"""The conformance kit's checks of the transactional outbox (issue 30) fail on PgStore with the
matching bug seeded, and pass on PgStore itself (test_pg_conformance): a check that cannot fail
proves nothing. Each seeded store is PgStore with one statement of its outbox changed, as a
third party's store with that bug would be. (MemoryStore's: conformance/tests/
test_outbox_seeded_bugs.py.)"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
import pytest
from pg_harness import PgHarness

from cronoq.errors import StoreFatal
from cronoq.store import Mutation, OutboxRow, OutboxTaken
from cronoq_conformance import Capability, StoreHarness, StoreSuite
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._commit import Reference
from cronoq_store_postgres._outbox import PgOutbox
from cronoq_store_postgres._schema import quote_ident

Check = Callable[[StoreSuite, StoreHarness], Awaitable[None]]


def taken_ids(batch: Sequence[Mutation]) -> list[int]:
    return [i for m in batch if isinstance(m, OutboxTaken) for i in m.row_ids]


class OutboxPgStore(PgStore):
    """PgStore with ``seed(s, outbox)`` changing its outbox's statements (``s``: the quoted
    schema), and, when ``taken_part`` is set, the commit's deletion of the taken rows written
    by it: (s, column reference, rows) -> the CTE."""

    taken_part: Callable[[str, Reference, str], str] | None = None

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        s = quote_ident(config.schema)
        assert self.outbox is not None
        self.seed(s, self.outbox)
        taken_part = self.taken_part
        if taken_part is None:
            return
        commit = self._sql.commit
        parts = [p for p in commit._parts if "outbox_taken AS" in p.sql(str, "rows", "")]
        assert len(parts) == 1, "the seeded bug no longer applies to PgStore"
        commit._parts = tuple(
            dataclasses.replace(p, sql=lambda u, rows, _: taken_part(s, u, rows))
            if p is parts[0]
            else p
            for p in commit._parts
        )

    def seed(self, s: str, outbox: PgOutbox) -> None:
        return None

    @staticmethod
    def replace_sql(outbox: PgOutbox, name: str, old: str, new: str) -> None:
        sql: str = getattr(outbox._sql, name)
        assert old in sql, f"the seeded bug no longer applies to PgStore's {name} statement"
        setattr(outbox._sql, name, sql.replace(old, new))


class TakesUpToTheHighestIdPgStore(OutboxPgStore):
    """The commit deletes every outbox row up to the highest id it names (as if rows were
    always taken oldest first)."""

    @staticmethod
    def taken_part(s: str, u: Reference, rows: str) -> str:
        return f"""outbox_taken AS (
            DELETE FROM {s}.cronoq_outbox
            WHERE id <= (SELECT max({u("row_id")}) FROM {rows}) AND EXISTS (SELECT FROM fence)
        )"""


class TakenUnfencedPgStore(OutboxPgStore):
    """The commit's deletion of the taken rows is not gated on the fence."""

    @staticmethod
    def taken_part(s: str, u: Reference, rows: str) -> str:
        return f"""outbox_taken AS (
            DELETE FROM {s}.cronoq_outbox WHERE id IN (SELECT {u("row_id")} FROM {rows})
        )"""


class TakenAfterTheBatchPgStore(PgStore):
    """The batch's statement writes its tasks; its outbox rows are deleted by a statement of
    their own after it, as a source outside the store's database must do: a failure between
    the two leaves the tasks written and their rows in the outbox."""

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        await super().commit(epoch, [m for m in batch if not isinstance(m, OutboxTaken)])
        taken = taken_ids(batch)
        if taken:
            assert self.outbox is not None
            await self.outbox.take(epoch, taken)


class TakenBeforeTheBatchPgStore(PgStore):
    """A batch's outbox rows are deleted, fenced, by a statement of their own before the
    batch's: a batch that does not land has taken them all the same."""

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        taken = taken_ids(batch)
        if taken:
            assert self.outbox is not None
            await self.outbox.take(epoch, taken)
        await super().commit(epoch, [m for m in batch if not isinstance(m, OutboxTaken)])


class MissingRowFailsPgStore(PgStore):
    """A commit first checks that every outbox row it names is there, and fails the batch if
    one is missing (taking it for corruption)."""

    async def commit(self, epoch: int, batch: Sequence[Mutation]) -> None:
        taken = taken_ids(batch)
        if taken:
            sql = (
                f"SELECT count(*) FROM {quote_ident(self.config.schema)}.cronoq_outbox "
                "WHERE id = ANY($1::bigint[])"
            )
            found = await self._read("checking the outbox", lambda c: c.fetchval(sql, taken))
            if found < len(set(taken)):
                raise StoreFatal("outbox rows of the batch are missing: corrupt outbox?")
        await super().commit(epoch, batch)


class NewestFirstPgStore(OutboxPgStore):
    """The outbox is read newest first."""

    def seed(self, s: str, outbox: PgOutbox) -> None:
        self.replace_sql(outbox, "read", "ORDER BY id", "ORDER BY id DESC")


class ReadInDoubtPgStore(OutboxPgStore):
    """The outbox is read on any connection of the pool, as lookups are: not once the
    leader's writes in doubt are over or fenced."""

    def seed(self, s: str, outbox: PgOutbox) -> None:
        async def read(epoch: int, limit: int) -> Sequence[OutboxRow]:
            sql = outbox._sql.read
            cap = outbox._max_read_bytes
            rows = await self._read("reading the outbox", lambda c: c.fetch(sql, limit, cap))
            return [OutboxRow(*row) for row in rows]

        outbox.read = read  # type: ignore[method-assign]


class QuarantinedFromAfterPgStore(OutboxPgStore):
    """The quarantine is listed from ``after`` on, ``after`` included."""

    def seed(self, s: str, outbox: PgOutbox) -> None:
        self.replace_sql(outbox, "quarantined", "WHERE id > $1", "WHERE id >= $1")


class QuarantineUnfencedPgStore(OutboxPgStore):
    """The quarantine's move is not gated on the fence (it still says Fenced after)."""

    def seed(self, s: str, outbox: PgOutbox) -> None:
        self.replace_sql(
            outbox, "quarantine", "WHERE o.id = u.id AND EXISTS (SELECT FROM fence)",
            "WHERE o.id = u.id",
        )  # fmt: skip


class RequeueCountsIdsPgStore(OutboxPgStore):
    """A requeue returns how many ids it was given, not how many rows it moved."""

    def seed(self, s: str, outbox: PgOutbox) -> None:
        self.replace_sql(
            outbox, "requeue", "SELECT count(*) FROM moved", "SELECT cardinality($1::bigint[])"
        )


class StatsNewestPgStore(OutboxPgStore):
    """``stats()`` gives the newest row's enqueue time as the oldest's."""

    def seed(self, s: str, outbox: PgOutbox) -> None:
        self.replace_sql(outbox, "stats", "min(enqueued_at)", "max(enqueued_at)")


class UndeclaredPgHarness(PgHarness):
    """The harness of a PgStore that forgot to declare its outbox."""

    capabilities = PgHarness.capabilities - {Capability.OUTBOX}


CASES: list[tuple[type[PgHarness], type[PgStore], Check, str]] = [
    (
        UndeclaredPgHarness,
        PgStore,
        StoreSuite.test_a_store_with_a_transactional_outbox_declares_it,
        "the harness does not declare Capability.OUTBOX",
    ),
    (
        PgHarness,
        TakesUpToTheHighestIdPgStore,
        StoreSuite.test_a_landed_batch_takes_exactly_the_outbox_rows_it_names,
        "an OutboxTaken deletes exactly the rows it names",
    ),
    (
        PgHarness,
        TakenAfterTheBatchPgStore,
        StoreSuite.test_a_batch_that_fails_midway_takes_no_outbox_row,
        "wrote tasks .* and left the outbox rows they came from",
    ),
    (
        PgHarness,
        TakenUnfencedPgStore,
        StoreSuite.test_a_fenced_commit_takes_no_outbox_row,
        "fenced commits took outbox rows",
    ),
    (
        PgHarness,
        MissingRowFailsPgStore,
        StoreSuite.test_a_retried_commit_skips_the_outbox_rows_already_taken,
        "a commit retried after it landed must not fail",
    ),
    (
        PgHarness,
        NewestFirstPgStore,
        StoreSuite.test_an_outbox_read_returns_committed_rows_oldest_id_first_up_to_its_limit,
        "oldest id first",
    ),
    (
        PgHarness,
        ReadInDoubtPgStore,
        StoreSuite.test_an_outbox_read_never_returns_a_row_a_commit_in_doubt_may_still_take,
        r"read\(\) returned rows \[\d+\] that a commit statement in doubt then took \(task 1 "
        "written",
    ),
    (
        PgHarness,
        TakenBeforeTheBatchPgStore,
        StoreSuite.test_an_outbox_read_never_returns_a_row_a_commit_in_doubt_may_still_take,
        r"a commit that did not land \(task 1 was not written\) took outbox row",
    ),
    (
        PgHarness,
        QuarantinedFromAfterPgStore,
        StoreSuite.test_quarantined_outbox_rows_keep_their_reasons_and_are_listed_in_id_order,
        "lists only ids above `after`",
    ),
    (
        PgHarness,
        QuarantineUnfencedPgStore,
        StoreSuite.test_a_fenced_quarantine_moves_no_outbox_row,
        "a quarantine by an epoch that no longer leads moved rows",
    ),
    (
        PgHarness,
        RequeueCountsIdsPgStore,
        StoreSuite.test_requeue_and_discard_move_quarantined_rows_and_stats_count_them,
        "must return 1",
    ),
    (
        PgHarness,
        StatsNewestPgStore,
        StoreSuite.test_requeue_and_discard_move_quarantined_rows_and_stats_count_them,
        r"stats\(\) of five rows",
    ),
]


@pytest.mark.parametrize(
    ("harness_class", "store_class", "check", "message"),
    CASES,
    ids=[(h if s is PgStore else s).__name__ for h, s, _, _ in CASES],
)
async def test_each_outbox_check_fails_on_its_seeded_bug(
    schema: str,
    harness_class: type[PgHarness],
    store_class: type[PgStore],
    check: Check,
    message: str,
) -> None:
    harness = harness_class(schema, store_class=store_class)
    try:
        with pytest.raises(AssertionError, match=message):
            await check(StoreSuite(), harness)
    finally:
        await harness.close_all()
