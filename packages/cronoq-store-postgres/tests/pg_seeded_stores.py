"""PgStore with one bug seeded each: the conformance kit's checks must fail on them
(test_pg_seeded_bugs). They are copies of the real store in all but the bug, as a third
party's store with that bug would be."""

from __future__ import annotations

import asyncpg

from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._schema import quote_ident

__all__ = ["GenerationBlindPgStore", "UnfencedPrunePgStore"]


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
    leader replaced behind its back still deletes."""

    def __init__(self, dsn: str, pool: asyncpg.Pool, config: PgStoreConfig) -> None:
        super().__init__(dsn, pool, config)
        s = quote_ident(config.schema)
        self._sql.prune = f"""
            WITH pruned AS (
                DELETE FROM {s}.cronoq_tasks WHERE id IN (
                    SELECT id FROM {s}.cronoq_tasks WHERE finished_ns < $3 LIMIT $4)
                    AND $1::bigint IS NOT NULL AND $2::bigint IS NOT NULL
                RETURNING 1
            )
            SELECT 1 AS leading, (SELECT count(*) FROM pruned) AS pruned"""
