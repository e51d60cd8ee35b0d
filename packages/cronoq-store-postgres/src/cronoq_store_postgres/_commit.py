"""The commit statement of a batch, and its arguments: ONE statement (one round trip).

The batch is folded into the final state of each row it touches (``collapse_batch``); each
part of the statement (new tasks, changed tasks, saved and removed schedules, paused pools,
ended attempts, taken outbox rows, occurrence records) writes its rows from ``unnest`` of one
array per column, and is gated on the fence: an ``UPDATE ... WHERE
epoch = $2 AND generation = $3`` of the leader row. That row lock makes a concurrent takeover
(which bumps the row) wait until the commit is over; a stale epoch or generation writes nothing.

A column whose values are all equal (the pool, the status, a NULL key; every column of a
one-task batch) is sent as one value, not an array: asyncpg encodes an array element by
element, asking of each whether it is a nested array (checks in Python), which costs 0.6 to
1.2 ms for a column of 1,000 values, about 12 ms for the 16 columns of 1,000 new tasks, more
than PostgreSQL takes to insert them. So the statement depends on the batch's shape (which
parts it has, which columns vary); each shape is built once, and their number is bounded
(``MAX_SHAPES``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from cronoq.store import (
    ATTEMPTS_KEPT,
    NEW_TASK_COLUMNS,
    CollapsedBatch,
    TaskChange,
    encode_schedule_spec,
    new_task_columns,
    varies,
)

__all__ = ["ID_CLASH", "MAX_SHAPES", "STATEMENT_CACHE_SIZE", "CommitStatements", "Shape"]

ID_CLASH = "id of a new task already taken:"

Reference = Callable[[str], str]
"""A column's name -> what the part's SQL reads for it (``u.name``, or a parameter)."""

Shape = tuple[tuple[bool, ...] | None, ...]
"""Per part: None if the batch has none of its rows, else which of its columns vary."""

MAX_SHAPES = 64
"""Shapes with scalar columns, per store; a batch of another shape sends every column as an
array (255 statements at most, by the parts present). Each statement is prepared once on each
pooled connection: with the ON CONFLICT variants and the store's other statements they stay
within the pool's statement cache (``STATEMENT_CACHE_SIZE``), so no commit prepares again."""
STATEMENT_CACHE_SIZE = 2 * (MAX_SHAPES + 256) + 32


_NEW_TASK_TYPES = {
    "id": "bigint",
    "pool": "text",
    "kind": "text",
    "key": "text",
    "payload": "bytea",
    "options": "text",
    "status": "text",
    "attempt": "integer",
    "message": "text",
    "submitted": "bigint",
    "updated": "bigint",
    "due": "bigint",
    "finished": "bigint",
    "output": "bytea",
    "cancel": "boolean",
    "lease_epoch": "bigint",
    "lease_hash": "bytea",
    "started": "bigint",
}


@dataclass(frozen=True, slots=True)
class _Part:
    columns: tuple[tuple[str, str], ...]
    """Each column's name and PostgreSQL type; the first (the row's key) is always an array."""
    sql: Callable[[Reference, str, str], str]
    """(column reference, the FROM clause of the rows, the ON CONFLICT clause) -> the CTE."""


def _parts(s: str) -> tuple[_Part, ...]:
    """The parts over the quoted schema ``s``, in the order of the batch's columns."""
    new_tasks = _Part(
        (*((name, _NEW_TASK_TYPES[name]) for name in NEW_TASK_COLUMNS), ("after", "text")),
        lambda u, rows, conflict: (
            f"""new_tasks AS (
                INSERT INTO {s}.cronoq_tasks AS t (id, pool, kind, key, payload, options, after_ids,
                    status, attempt, message, submitted_ns, updated_ns, due_ns, finished_ns,
                    output, cancel_requested, lease_epoch, lease_hash, started_ns)
                SELECT {u("id")}, {u("pool")}, {u("kind")}, {u("key")}, {u("payload")},
                    {u("options")}, ({u("after")})::bigint[], {u("status")}, {u("attempt")},
                    {u("message")}, {u("submitted")}, {u("updated")}, {u("due")},
                    {u("finished")}, {u("output")}, {u("cancel")}, {u("lease_epoch")},
                    {u("lease_hash")}, {u("started")}
                FROM {rows}
                WHERE EXISTS (SELECT FROM fence){conflict}
            )"""
        ),
    )
    changed = _Part(
        (
            ("id", "bigint"),
            ("status", "text"),
            ("attempt", "integer"),
            ("message", "text"),
            ("updated", "bigint"),
            ("due", "bigint"),
            ("finished", "bigint"),
            ("output", "bytea"),
            ("cancel", "boolean"),
            ("lease_epoch", "bigint"),
            ("lease_hash", "bytea"),
            ("options", "text"),
            ("started", "bigint"),
        ),
        # A retry (options given) rewrites the options and replaces the cancellation flag
        # instead of or-ing it. An attempt's start is written when one started, else kept.
        lambda u, rows, _: (
            f"""changed AS (
                UPDATE {s}.cronoq_tasks AS t SET
                    options = COALESCE({u("options")}, t.options),
                    status = COALESCE({u("status")}, t.status),
                    attempt = CASE WHEN {u("status")} IS NULL THEN t.attempt
                        ELSE {u("attempt")} END,
                    message = {u("message")},
                    updated_ns = CASE WHEN {u("status")} IS NULL THEN t.updated_ns
                        ELSE {u("updated")} END,
                    due_ns = CASE WHEN {u("status")} IS NULL THEN t.due_ns ELSE {u("due")} END,
                    finished_ns = CASE WHEN {u("status")} IS NULL THEN t.finished_ns
                        ELSE {u("finished")} END,
                    output = CASE WHEN {u("status")} IS NULL THEN t.output
                        ELSE {u("output")} END,
                    cancel_requested = CASE WHEN {u("options")} IS NULL
                        THEN t.cancel_requested OR {u("cancel")} ELSE {u("cancel")} END,
                    lease_epoch = CASE WHEN {u("status")} IS NULL THEN t.lease_epoch
                        ELSE {u("lease_epoch")} END,
                    lease_hash = CASE WHEN {u("status")} IS NULL THEN t.lease_hash
                        ELSE {u("lease_hash")} END,
                    started_ns = COALESCE({u("started")}, t.started_ns)
                FROM {rows}
                WHERE t.id = {u("id")} AND EXISTS (SELECT FROM fence)
            )"""
        ),
    )
    saved = _Part(
        (
            ("name", "text"),
            ("spec", "text"),
            ("next", "bigint"),
            ("paused", "boolean"),
            ("last_task_id", "bigint"),
        ),
        lambda u, rows, _: (
            f"""saved AS (
                INSERT INTO {s}.cronoq_schedules (name, spec, next_ns, paused, last_task_id)
                SELECT {u("name")}, {u("spec")}, {u("next")}, {u("paused")}, {u("last_task_id")}
                FROM {rows}
                WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (name) DO UPDATE SET spec = excluded.spec,
                    next_ns = excluded.next_ns, paused = excluded.paused,
                    last_task_id = excluded.last_task_id
            )"""
        ),
    )
    removed = _Part(
        (("name", "text"),),
        lambda u, rows, _: (
            f"""removed AS (
                DELETE FROM {s}.cronoq_schedules
                WHERE name IN (SELECT {u("name")} FROM {rows}) AND EXISTS (SELECT FROM fence)
            )"""
        ),
    )
    pools = _Part(
        (("name", "text"), ("paused", "boolean")),
        lambda u, rows, _: (
            f"""pools AS (
                INSERT INTO {s}.cronoq_pools (name, paused)
                SELECT {u("name")}, {u("paused")}
                FROM {rows}
                WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (name) DO UPDATE SET paused = excluded.paused
            )"""
        ),
    )
    # Written once (a commit retried after it landed changes nothing); the task's attempts
    # older than its latest ATTEMPTS_KEPT go. The delete sees the table as the statement
    # began, so it trims earlier rows only: collapse_batch bounds the batch's own.
    attempts = _Part(
        (
            ("task_id", "bigint"),
            ("attempt", "integer"),
            ("started", "bigint"),
            ("ended", "bigint"),
            ("message", "text"),
        ),
        lambda u, rows, _: (
            f"""attempts AS (
                INSERT INTO {s}.cronoq_attempts (task_id, attempt, started_ns, ended_ns, message)
                SELECT {u("task_id")}, {u("attempt")}, {u("started")}, {u("ended")},
                    {u("message")}
                FROM {rows}
                WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (task_id, attempt) DO NOTHING
            ), trimmed AS (
                DELETE FROM {s}.cronoq_attempts AS a
                USING {rows}
                WHERE a.task_id = {u("task_id")}
                    AND a.attempt <= {u("attempt")} - {ATTEMPTS_KEPT:d}
                    AND EXISTS (SELECT FROM fence)
            )"""
        ),
    )
    # The outbox rows whose tasks the batch makes durable: gone with the same transaction.
    outbox = _Part(
        (("row_id", "bigint"),),
        lambda u, rows, _: (
            f"""outbox_taken AS (
                DELETE FROM {s}.cronoq_outbox
                WHERE id IN (SELECT {u("row_id")} FROM {rows}) AND EXISTS (SELECT FROM fence)
            )"""
        ),
    )
    # Written once, as attempts are; collapse_batch gives each key once (the batch's first).
    occurrences = _Part(
        (
            ("schedule", "text"),
            ("due", "bigint"),
            ("until", "bigint"),
            ("outcome", "text"),
            ("task_id", "bigint"),
            ("at", "bigint"),
            ("message", "text"),
        ),
        lambda u, rows, _: (
            f"""occurrences AS (
                INSERT INTO {s}.cronoq_occurrences (schedule, due_ns, until_ns, outcome,
                    task_id, at_ns, message)
                SELECT {u("schedule")}, {u("due")}, {u("until")}, {u("outcome")},
                    {u("task_id")}, {u("at")}, {u("message")}
                FROM {rows}
                WHERE EXISTS (SELECT FROM fence)
                ON CONFLICT (schedule, due_ns) DO NOTHING
            )"""
        ),
    )
    return new_tasks, changed, saved, removed, pools, attempts, outbox, occurrences


class CommitStatements:
    """The commit statements of one schema, by batch shape, and each batch's arguments."""

    def __init__(self, s: str) -> None:
        """``s``: the quoted schema name."""
        # $1 is the new high-water mark, $2 the epoch, $3 the generation; then the parts'.
        self._head = f"""
            WITH fence AS (
                UPDATE {s}.cronoq_leader SET max_task_id = GREATEST(max_task_id, $1)
                WHERE id = 1 AND epoch = $2 AND generation = $3 RETURNING epoch
            )"""
        self._parts = _parts(s)
        # A batch's new tasks are first inserted plainly; only when one of their ids is taken
        # (the only unique key; the statement then wrote nothing) does the commit run again
        # with this clause, which tells a batch applied before (the driver retries one whose
        # outcome it did not learn) from a clash: a new task whose id holds another task (ids
        # are never reused: a bug, or a restored backup) must fail the whole batch, not be
        # dropped. SQL has no RAISE: the clash casts a message to integer, and the error
        # carries it. A plain insert costs PostgreSQL a quarter less CPU than a speculative
        # one (measured: 2.9 ms instead of 4.0 ms for 1,000 tasks).
        self._on_conflict = f"""
                ON CONFLICT (id) DO UPDATE
                    SET attempt = ('{ID_CLASH} ' || excluded.id)::integer
                    WHERE (t.pool, t.kind, t.key, t.submitted_ns)
                        IS DISTINCT FROM (excluded.pool, excluded.kind, excluded.key,
                            excluded.submitted_ns)"""
        self._built: dict[tuple[Shape, bool], str] = {}
        self._shapes: set[Shape] = set()
        """The shapes with scalar columns taken so far, at most MAX_SHAPES."""

    def sql(self, shape: Shape, *, taken_ids: bool = False) -> str:
        """The statement for batches of this shape (``taken_ids``: with ON CONFLICT). Parts
        the batch lacks are left out, so PostgreSQL does not plan them (it plans every call:
        see ``plan_cache_mode``)."""
        sql = self._built.get((shape, taken_ids))
        if sql is None:
            ctes, number = [self._head], 3
            for part, varying in zip(self._parts, shape, strict=True):
                if varying is None:
                    continue
                read: dict[str, str] = {}
                arrays, names = [], []
                for (name, kind), is_array in zip(part.columns, varying, strict=True):
                    number += 1
                    if is_array:
                        arrays.append(f"${number}::{kind}[]")
                        names.append(name)
                        read[name] = f"u.{name}"
                    else:
                        read[name] = f"${number}::{kind}"
                rows = f"unnest({', '.join(arrays)}) AS u({', '.join(names)})"
                conflict = self._on_conflict if taken_ids else ""
                ctes.append(part.sql(read.__getitem__, rows, conflict))
            sql = ", ".join(ctes) + "\n            SELECT count(*) FROM fence"
            self._built[shape, taken_ids] = sql
        return sql

    def arguments(
        self, rows: CollapsedBatch, epoch: int, unix: Callable[[int], int]
    ) -> tuple[Shape, list[object]]:
        """The batch's shape and the statement's arguments; the third, the generation, is
        None here (it is the store's as of the write)."""
        parts = self._columns(rows, unix)
        # The key column is always an array: the rows' count is its length.
        shape = tuple(
            None if columns is None else (True, *(varies(c) for c in columns[1:]))
            for columns in parts
        )
        if shape not in self._shapes:
            if len(self._shapes) < MAX_SHAPES:
                self._shapes.add(shape)
            else:
                # Every column an array: the statement of the parts alone, as before shapes.
                shape = tuple(None if c is None else (True,) * len(c) for c in parts)
        arguments: list[object] = [rows.max_task_id, epoch, None]
        for columns, varying in zip(parts, shape, strict=True):
            if columns is not None and varying is not None:
                arguments += (c if v else c[0] for c, v in zip(columns, varying, strict=True))
        return shape, arguments

    @staticmethod
    def _columns(
        rows: CollapsedBatch, unix: Callable[[int], int]
    ) -> tuple[Sequence[list[object]] | None, ...]:
        # In the order of each part's columns in _parts (the conformance kit's round trips
        # fail on any mismatch). Spelled out as comprehensions, not one extractor per column:
        # a call per value would cost about a millisecond per 1,000 tasks.
        def maybe(ns: int | None) -> int | None:
            return None if ns is None else unix(ns)

        new, changes, saved = rows.new_tasks, rows.changes, rows.saved_schedules
        ended, recorded = rows.ended_attempts, rows.occurrences
        return (
            [
                *new_task_columns(new, unix),
                [
                    "{" + ",".join(map(str, t.spec.after)) + "}" if t.spec.after else "{}"
                    for t in new
                ],
            ]
            if new
            else None,
            (
                [c.task_id for c in changes],
                [None if c.status is None else c.status.value for c in changes],
                [c.attempt for c in changes],
                [c.message for c in changes],
                [unix(c.updated_ns) for c in changes],
                [maybe(c.due_ns) for c in changes],
                [maybe(c.finished_ns) for c in changes],
                [c.output for c in changes],
                [c.cancel_requested for c in changes],
                *_lease_columns(changes),
                _objects(c.options for c in changes),
                _objects(maybe(c.started_ns) for c in changes),
            )
            if changes
            else None,
            (
                [r.spec.name for r in saved],
                [encode_schedule_spec(r.spec) for r in saved],
                [unix(r.next_ns) for r in saved],
                [r.paused for r in saved],
                [r.last_task_id for r in saved],
            )
            if saved
            else None,
            ([*rows.removed_schedules],) if rows.removed_schedules else None,
            ([*rows.paused_pools], [*rows.paused_pools.values()]) if rows.paused_pools else None,
            (
                [a.task_id for a in ended],
                [a.attempt for a in ended],
                [unix(a.started_ns) for a in ended],
                [unix(a.ended_ns) for a in ended],
                [a.message for a in ended],
            )
            if ended
            else None,
            ([*rows.outbox_taken],) if rows.outbox_taken else None,
            (
                [o.schedule for o in recorded],
                [unix(o.due_ns) for o in recorded],
                [unix(o.until_ns) for o in recorded],
                [o.outcome.value for o in recorded],
                _objects(o.task_id for o in recorded),
                [unix(o.at_ns) for o in recorded],
                [o.message for o in recorded],
            )
            if recorded
            else None,
        )


def _lease_columns(changes: Sequence[TaskChange]) -> tuple[list[object], list[object]]:
    """The changes' lease epochs and hashes (None where a change has no lease). Most batches
    carry no lease at all: their two columns of NULLs are bound as one value each."""
    leases = [c.lease for c in changes]
    if leases.count(None) == len(leases):
        return [None] * len(leases), [None] * len(leases)
    return (
        [None if lease is None else lease.epoch for lease in leases],
        [None if lease is None else lease.id_hash for lease in leases],
    )


def _objects(values: Iterable[object]) -> list[object]:
    """A column as the statement's arguments take it (a list of any values)."""
    return list(values)
