"""The insert of a batch's new tasks: multi-row statements in which a column whose values are
all equal (the pool, the status, a NULL key) is bound once for every row.

``executemany`` binds each of the 15 columns of each row from Python, which costs more than
SQLite's own insert: for 1,000 new tasks, 4.3 ms against 1.4 ms for one statement binding
the pool, kind, status ... once and only the id and payload per row (measured in one run,
on this file's schema). A statement depends on which columns vary (the batch's shape) and on
its row count; the rows go in chunks of :data:`CHUNKS` rows, so each shape needs at most five
statements, which SQLite's statement cache (``STATEMENT_CACHE_SIZE``) keeps prepared. A chunk
never binds more variables than the connection allows (SQLite before 3.32 allowed 999 by
default, and a build may set its own limit): a wide shape takes the smaller chunks.
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
}
_INTO = (
    "INSERT INTO cronoq_tasks ("
    + ", ".join(_COLUMN_NAMES[name] for name in NEW_TASK_COLUMNS)
    + ") VALUES "
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
        shape: Shape = tuple(varies(c) for c in columns)
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
            # caller lowered the limit below one row's 15 columns.
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
    """``?1`` ... ``?k``: the columns bound once; then each row's varying columns in turn."""
    once = len(shape) - sum(shape)
    width = sum(shape)
    rows = []
    for row in range(size):
        values, bound_once, varying = [], 0, 0
        for per_row in shape:
            if per_row:
                varying += 1
                values.append(f"?{once + row * width + varying}")
            else:
                bound_once += 1
                values.append(f"?{bound_once}")
        rows.append(f"({', '.join(values)})")
    return _INTO + ", ".join(rows) + " ON CONFLICT (id) DO NOTHING"
