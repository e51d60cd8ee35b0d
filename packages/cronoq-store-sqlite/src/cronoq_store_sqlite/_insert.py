"""The insert of a batch's new tasks: multi-row statements in which a column whose values are
all equal (the pool, the status, a NULL key) is bound once for every row.

``executemany`` binds each of the 18 columns of each row from Python, which costs more than
SQLite's own insert. The statement here reads the columns bound once from a one-row subquery
(``u``) and the others from a ``VALUES`` list (``v``), all with plain ``?`` placeholders.
For 1,024 new tasks on this file's schema (two runs, 256 rows a statement, bare ``sqlite3``):
``executemany`` 4.31 and 6.28 ms, this form 1.52 and 2.04 ms, every column bound per row in
multi-row VALUES 3.25 and 4.98 ms. Numbered placeholders (``?1``) shared by the rows were
quicker still (1.13 and 1.65 ms), but CPython 3.12.0 to 3.12.3 (Ubuntu 24.04's 3.12.3 among
them) warn when they are bound from a sequence (DeprecationWarning, cpython gh-117995, fixed in
3.12.4), which fails a program run with warnings as errors; from a mapping they cost as much as
binding every column.

A statement depends on which columns vary (the batch's shape) and on its row count; the
rows go in chunks of ``CHUNKS`` rows, so each shape needs at most five statements, which
SQLite's statement cache (``STATEMENT_CACHE_SIZE``) keeps prepared. A chunk never binds more
variables than the connection allows (SQLite before 3.32 allowed 999 by default, and a build
may set its own limit): a wide shape takes the smaller chunks.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Sequence

from cronoq.store import NEW_TASK_COLUMNS, varies

__all__ = ["STATEMENT_CACHE_SIZE", "NewTaskInsert"]

_COLUMN_NAMES = {
    "id": "id",
    "pool": "pool",
    "kind": "kind",
    "key": "key",
    "payload": "payload",
    "options": "options",
    "status": "status",
    "attempt": "attempt",
    "message": "message",
    "submitted": "submitted_ns",
    "updated": "updated_ns",
    "due": "due_ns",
    "finished": "finished_ns",
    "output": "output",
    "cancel": "cancel_requested",
    "lease_epoch": "lease_epoch",
    "lease_hash": "lease_hash",
    "started": "started_ns",
}
_INTO = (
    "INSERT INTO cronoq_tasks ("
    + ", ".join(_COLUMN_NAMES[name] for name in NEW_TASK_COLUMNS)
    + ") "
)

CHUNKS = (256, 64, 16, 4, 1)
"""Rows per statement, largest first: a batch of 1,000 takes ten statements."""
MAX_SHAPES = 16
"""Shapes with columns bound once, per connection; a batch of another shape binds every
column per row. A statement of 256 rows takes about half a megabyte of SQLite's memory."""
STATEMENT_CACHE_SIZE = (MAX_SHAPES + 1) * len(CHUNKS) + 32
"""The connection's prepared statements: every insert, and the store's other statements."""

Shape = tuple[bool, ...]
"""Per column of NEW_TASK_COLUMNS: whether its values vary within the batch."""


class NewTaskInsert:
    """Builds and runs the insert statements of one connection (they stay prepared on it)."""

    def __init__(self) -> None:
        self._sql: dict[tuple[Shape, int], str] = {}
        self._shapes: set[Shape] = set()

    def run(self, conn: sqlite3.Connection, columns: Sequence[list[object]]) -> None:
        """Insert the rows of ``columns`` (as ``new_task_columns`` gives them); an id already
        taken keeps its row (a batch retried after an unknown outcome is applied once)."""
        if not columns[0]:
            return
        # The id is always bound per row: so every statement has a VALUES list to read rows from.
        shape: Shape = (True, *(varies(c) for c in columns[1:]))
        if shape not in self._shapes:
            if len(self._shapes) < MAX_SHAPES:
                self._shapes.add(shape)
            else:
                shape = (True,) * len(columns)
        once = [c[0] for c, per_row in zip(columns, shape, strict=True) if not per_row]
        per_row = [c for c, varying in zip(columns, shape, strict=True) if varying]
        variables = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        total, done = len(columns[0]), 0
        for size in CHUNKS:
            # One row always fits: SQLite allows at least 999 variables unless a build or a
            # caller lowered the limit below one row's 18 columns.
            if size > 1 and len(once) + size * len(per_row) > variables:
                continue
            while total - done >= size:
                rows = zip(*(c[done : done + size] for c in per_row), strict=True)
                conn.execute(self._statement(shape, size), [*once, *itertools.chain(*rows)])
                done += size

    def _statement(self, shape: Shape, size: int) -> str:
        sql = self._sql.get((shape, size))
        if sql is None:
            sql = self._sql[shape, size] = _build(shape, size)
        return sql


def _build(shape: Shape, size: int) -> str:
    """The columns bound once, in order, as the one row of ``u``; then each row's others, in
    order, as the rows of ``v`` (SQLite names them column1, column2, ...)."""
    values, once, per_row = [], [], 0
    for number, varying in enumerate(shape, 1):
        if varying:
            per_row += 1
            values.append(f"v.column{per_row}")
        else:
            once.append(f"? AS c{number}")
            values.append(f"u.c{number}")
    row = f"({', '.join('?' * per_row)})"
    rows = f"(VALUES {', '.join([row] * size)}) AS v"
    source = f"(SELECT {', '.join(once)}) AS u, {rows}" if once else rows
    # WHERE true: without a WHERE, SQLite would read ON CONFLICT as the join's ON.
    return f"{_INTO}SELECT {', '.join(values)} FROM {source} WHERE true ON CONFLICT (id) DO NOTHING"
