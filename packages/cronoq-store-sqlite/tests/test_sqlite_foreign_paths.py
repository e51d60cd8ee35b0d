"""Opening the store at a path that is not its database (issue 24, item 10): refused with a
StoreFatal that says what is there, having changed nothing (the kit's
test_a_path_the_store_does_not_own_is_refused_and_left_as_it_was checks the "nothing");
what is the store's (an empty file, a cronoq database however far its creation got) opens."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlite_harness import FAST

from cronoq.errors import StoreFatal
from cronoq_store_sqlite import SqliteStore


def a_directory(path: Path) -> None:
    path.mkdir()


def a_text_file(path: Path) -> None:
    path.write_text("shopping: milk\n")


def another_apps_database(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (a_directory, "it is a directory; give the path of a file, such as '{path}/cronoq.db'"),
        (
            a_text_file,
            "it is not a SQLite database (its first bytes are not SQLite's header); if it was "
            "the store's, it is damaged: restore it from a backup",
        ),
        (another_apps_database, "it is another application's SQLite database (tables: notes)"),
    ],
    ids=["directory", "text-file", "other-application"],
)
async def test_a_path_that_is_not_the_stores_is_refused_saying_what_it_is(
    tmp_path: Path, make: Callable[[Path], None], says: str
) -> None:
    path = tmp_path / "target"
    make(path)
    with pytest.raises(StoreFatal) as raised:
        await SqliteStore.open(path, FAST)
    assert str(raised.value) == (
        f"will not open {str(path)!r} as the SQLite store's database: "
        f"{says.format(path=path)}. Nothing was changed; point the store at a new file or at "
        "a cronoq database"
    )


async def test_an_empty_file_is_taken_as_a_new_database(tmp_path: Path) -> None:
    """What a store leaves when it dies between creating the file and writing it, or what
    another instance starting at the same moment has just created."""
    path = tmp_path / "cronoq.db"
    path.touch()
    store = await SqliteStore.open(path, FAST)
    try:
        await store.acquire_leadership()
    finally:
        await store.close()


async def test_a_cronoq_database_whose_tables_are_still_only_in_its_wal_opens(
    tmp_path: Path,
) -> None:
    """A second instance starting while the first has just created the database: the main
    file holds no table yet (nothing was checkpointed), its WAL holds cronoq's."""
    path = tmp_path / "cronoq.db"
    first = await SqliteStore.open(path, FAST)
    try:
        immutable = f"{path.as_uri()}?immutable=1"
        with contextlib.closing(sqlite3.connect(immutable, uri=True)) as main_only:
            tables = main_only.execute("SELECT name FROM sqlite_master").fetchall()
        assert tables == [], "the premise: the first instance's tables are only in its WAL"
        second = await SqliteStore.open(path, FAST)
        await second.close()
    finally:
        await first.close()
