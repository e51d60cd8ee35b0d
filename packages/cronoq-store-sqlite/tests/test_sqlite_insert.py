"""The multi-row insert of new tasks writes exactly the rows a plain per-row insert writes.

The reference is the statement the store used before: one ``INSERT`` per row through
``executemany``, every column bound per row. Both run on fresh files of the store's schema.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronoq.store import NEW_TASK_COLUMNS
from cronoq_store_sqlite._insert import CHUNKS, MAX_SHAPES, NewTaskInsert
from cronoq_store_sqlite._schema import migrate

_NAMES = (
    "id, pool, kind, key, payload, options, status, attempt, message, submitted_ns, "
    "updated_ns, due_ns, finished_ns, output, cancel_requested, lease_epoch, lease_hash, "
    "started_ns"
)
_REFERENCE = (
    f"INSERT INTO cronoq_tasks ({_NAMES}) VALUES ({', '.join('?' * len(NEW_TASK_COLUMNS))}) "
    "ON CONFLICT (id) DO NOTHING"
)

_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "pool": st.sampled_from(["default", "other", "ü"]),
    "kind": st.text(min_size=1, max_size=5),
    "key": st.none() | st.text(max_size=5),
    "payload": st.binary(max_size=8),
    "options": st.sampled_from(["{}", '{"priority":3}']),
    "status": st.sampled_from(["ready", "waiting", "scheduled", "succeeded"]),
    "attempt": st.integers(0, 3),
    "message": st.text(max_size=5),
    "submitted": st.integers(0, 2**62),
    "updated": st.integers(0, 2**62),
    "due": st.none() | st.integers(0, 2**62),
    "finished": st.none() | st.integers(0, 2**62),
    "output": st.none() | st.binary(max_size=4),
    "cancel": st.booleans(),
    "lease_epoch": st.none() | st.integers(1, 2**23),
    "lease_hash": st.none() | st.binary(min_size=32, max_size=32),
    "started": st.none() | st.integers(0, 2**62),
}


@st.composite
def batches(draw: st.DrawFn) -> list[list[object]]:
    """Columns as ``new_task_columns`` gives them: unique ids (rows may come in any order);
    each other column holds one value for every row, or values drawn per row."""
    # Around each chunk size, so that every chunk and every remainder is taken.
    size = draw(st.sampled_from([0, 1, 2, 3, 5, 17, 63, 64, 65, 255, 256, 257, 341, 600]))
    ids = draw(st.permutations(range(1, size + 1)))
    columns: list[list[object]] = [list(ids)]
    for name in NEW_TASK_COLUMNS[1:]:
        values = _VALUES[name]
        if draw(st.booleans()):
            columns.append([draw(values)] * size)
        else:
            columns.append(draw(st.lists(values, min_size=size, max_size=size)))
    return columns


@contextlib.contextmanager
def database(path: Path) -> Iterator[sqlite3.Connection]:
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        migrate(conn)
        yield conn
    finally:
        conn.close()


def rows(conn: sqlite3.Connection) -> list[tuple[object, ...]]:
    return conn.execute(f"SELECT {_NAMES} FROM cronoq_tasks ORDER BY id").fetchall()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=batches(), again=st.booleans(), variables=st.sampled_from([None, 999, 300, 18]))
def test_the_insert_writes_the_rows_a_per_row_insert_writes(
    tmp_path: Path, batch: list[list[object]], again: bool, variables: int | None
) -> None:
    insert = NewTaskInsert()
    with database(tmp_path / "new.db") as new, database(tmp_path / "reference.db") as reference:
        if variables is not None:  # an older SQLite's default (999), or a build's own limit
            new.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, variables)
        with warnings.catch_warnings():
            # CPython 3.12.0 to 3.12.3 warn when numbered placeholders (?1) are bound from a
            # sequence: the insert must not use them.
            warnings.simplefilter("error")
            insert.run(new, batch)
        if again:  # a batch retried after an unknown outcome: the rows are already there
            insert.run(new, batch)
        reference.executemany(_REFERENCE, list(zip(*batch, strict=True)))
        assert rows(new) == rows(reference)
        assert len(rows(new)) == len(batch[0])


def test_shapes_beyond_the_limit_bind_every_column_per_row(tmp_path: Path) -> None:
    # Each batch varies another pair of columns; past MAX_SHAPES they all take one shape.
    insert = NewTaskInsert()
    size = CHUNKS[0] + 1
    pairs = list(itertools.combinations(range(1, len(NEW_TASK_COLUMNS)), 2))[: MAX_SHAPES + 4]
    with database(tmp_path / "new.db") as new, database(tmp_path / "reference.db") as reference:
        for number, varying in enumerate(pairs):
            first = 1 + number * size
            batch: list[list[object]] = [list(range(first, first + size))]
            for column in range(1, len(NEW_TASK_COLUMNS)):
                one, other = _TWO[NEW_TASK_COLUMNS[column]]
                batch.append(
                    [one if column not in varying or row % 2 else other for row in range(size)]
                )
            insert.run(new, batch)
            reference.executemany(_REFERENCE, list(zip(*batch, strict=True)))
        assert rows(new) == rows(reference)
    assert len(insert._shapes) == MAX_SHAPES
    assert (True,) * len(NEW_TASK_COLUMNS) in {shape for shape, _ in insert._sql}


_TWO: dict[str, tuple[object, object]] = {
    "pool": ("a", "b"),
    "kind": ("a", "b"),
    "key": (None, "k"),
    "payload": (b"", b"p"),
    "options": ("{}", '{"priority":1}'),
    "status": ("ready", "waiting"),
    "attempt": (0, 1),
    "message": ("", "m"),
    "submitted": (1, 2),
    "updated": (1, 2),
    "due": (None, 2),
    "finished": (None, 2),
    "output": (None, b"o"),
    "cancel": (False, True),
    "lease_epoch": (None, 3),
    "lease_hash": (None, b"h" * 32),
    "started": (None, 2),
}
