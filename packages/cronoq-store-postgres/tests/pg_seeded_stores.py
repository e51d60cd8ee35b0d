"""PgStore with one bug seeded each: the conformance kit's checks must fail on them
(test_pg_seeded_bugs). They are copies of the real store in all but the bug, as a third
party's store with that bug would be."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import asyncpg

from cronoq.store import CollapsedBatch
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._commit import Reference, Shape
from cronoq_store_postgres._schema import quote_ident

__all__ = [
    "CancelClearsLeasePgStore",
    "CommitSqlSeededPgStore",
    "GenerationBlindPgStore",
    "NewTaskLeaseDroppedPgStore",
    "PoolsMixedUpPgStore",
    "SqlSeededPgStore",
    "UnfencedPrunePgStore",
]


class GenerationBlindPgStore(PgStore):
    """The commit's statement is gated on the epoch only, not on the generation: a statement
    of this leader that reaches the server after its recovery still writes."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        commit = self._sql.commit
        gate = "AND generation = $3"
        assert gate in commit._head, "the seeded bug no longer applies to PgStore"
        # $3 stays in the statement (a parameter PostgreSQL cannot type fails it).
        commit._head = commit._head.replace(gate, "AND $3::bigint IS NOT NULL")


class UnfencedPrunePgStore(PgStore):
    """Pruning asks only the instance's own belief that it leads, not the leader row: a
    leader replaced behind its back still deletes (tasks and ledger records alike)."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        s = quote_ident(config.schema)
        self._sql.prune = f"""
            WITH pruned AS (
                DELETE FROM {s}.cronoq_tasks WHERE id IN (
                    SELECT id FROM {s}.cronoq_tasks WHERE finished_ns < $3 LIMIT $4)
                    AND $1::bigint IS NOT NULL AND $2::bigint IS NOT NULL
                RETURNING 1
            ), records AS (
                DELETE FROM {s}.cronoq_occurrences WHERE until_ns < $3 RETURNING 1
            )
            SELECT 1 AS leading, (SELECT count(*) FROM pruned) AS pruned,
                (SELECT count(*) FROM records) AS records"""


class RowsSeededPgStore(PgStore):
    """The commit's collapsed batch rewritten by ``seed`` before its arguments are made (a
    subclass overrides it): a store that sends the batch's rows wrongly."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        commit = self._sql.commit
        arguments = commit.arguments

        def seeded(
            rows: CollapsedBatch, epoch: int, unix: Callable[[int], int]
        ) -> tuple[Shape, list[object]]:
            self.seed(rows)
            return arguments(rows, epoch, unix)

        commit.arguments = seeded  # type: ignore[method-assign]

    def seed(self, rows: CollapsedBatch) -> None:
        raise NotImplementedError


class NewTaskLeaseDroppedPgStore(RowsSeededPgStore):
    """A task submitted and started in one batch is inserted without its lease (the insert's
    column list was not extended); updates of existing rows keep theirs."""

    def seed(self, rows: CollapsedBatch) -> None:
        for task in rows.new_tasks:
            task.lease = None


class PoolsMixedUpPgStore(RowsSeededPgStore):
    """A batch's pool names are sent sorted (say, to write them in one order) but their flags
    in the batch's order: a batch that pauses some pools and resumes others swaps them."""

    def seed(self, rows: CollapsedBatch) -> None:
        flags = list(rows.paused_pools.values())
        rows.paused_pools = dict(zip(sorted(rows.paused_pools), flags, strict=True))


class CancelClearsLeasePgStore(PgStore):
    """An update writes the lease of its change even when the change is a cancellation
    request alone (no status), so the request clears the row's lease."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        commit = self._sql.commit
        sql = commit.sql
        guarded = re.compile(r"CASE WHEN \S+ IS NULL THEN t\.(lease_\w+)\s+ELSE (\S+) END")

        def seeded(shape: Shape, *, taken_ids: bool = False) -> str:
            statement = sql(shape, taken_ids=taken_ids)
            if "changed AS" in statement:
                assert guarded.search(statement), "the seeded bug no longer applies to PgStore"
            return guarded.sub(r"\2", statement)

        commit.sql = seeded  # type: ignore[method-assign]


class CommitSqlSeededPgStore(PgStore):
    """The commit statement's text ``old`` replaced by ``new`` in every part that has it (a
    subclass sets both), and ``recover_paused`` as the recovery's query of paused pools when
    set: the SQL of a store with that one bug."""

    old = ""
    new = ""
    recover_paused: str | None = None

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        commit = self._sql.commit
        if self.old:
            assert any(
                self.old in part.sql(lambda name: f"u.{name}", "rows", "") for part in commit._parts
            ), "the seeded bug no longer applies to PgStore"
            commit._parts = tuple(
                dataclasses.replace(part, sql=self._seeded(part.sql)) for part in commit._parts
            )
        if self.recover_paused is not None:
            s = quote_ident(config.schema)
            self._sql.paused_pools = self.recover_paused.format(s=s)

    def _seeded(
        self, sql: Callable[[Reference, str, str], str]
    ) -> Callable[[Reference, str, str], str]:
        def seeded(u: Reference, rows: str, conflict: str) -> str:
            return sql(u, rows, conflict).replace(self.old, self.new)

        return seeded


class SqlSeededPgStore(PgStore):
    """The text ``old`` of the store's statement ``statement`` (an attribute of its ``_Sql``)
    replaced by ``new``, in which ``{s}`` is the quoted schema (a subclass sets all three):
    the SQL of a store with that one bug in a read or a prune."""

    statement = ""
    old = ""
    new = ""

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        sql = getattr(self._sql, self.statement)
        assert self.old in sql, "the seeded bug no longer applies to PgStore"
        new = self.new.format(s=quote_ident(config.schema))
        setattr(self._sql, self.statement, sql.replace(self.old, new))
