"""Whether an existing file at the store's path is the store's to open.

Opening tightens the file's mode, switches it to WAL (which writes its header and creates
journal files) and migrates it: all of that must wait until the file is known to be a cronoq
database, or an empty one. Anything else is somebody else's (a directory, a text file, another
application's database: a typo in ``store.path``) and is refused having changed nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from pathlib import Path
from typing import NoReturn

from cronoq.errors import StoreFatal

__all__ = ["refuse_unless_ours"]

_HEADER = b"SQLite format 3\x00"
_OURS = "cronoq_schema_version"
_TRIES, _PAUSE = 10, 0.1


def refuse_unless_ours(path: str) -> None:
    """Return if the existing ``path`` is a cronoq database, an empty SQLite database or an
    empty file (one being created, by this store or another instance); otherwise raise
    ``StoreFatal`` saying what it is, having written nothing."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        _refuse(path, "it is a symbolic link to a file that does not exist")
    except OSError as exc:
        raise StoreFatal(f"cannot look at {path!r}: {exc.strerror}; nothing was changed") from exc
    if stat.S_ISDIR(found.st_mode):
        example = os.path.join(path, "cronoq.db")
        _refuse(path, f"it is a directory; give the path of a file, such as {example!r}")
    if not stat.S_ISREG(found.st_mode):
        _refuse(path, "it is not a regular file")
    if found.st_size == 0:
        return
    try:
        with open(path, "rb") as file:
            header = file.read(len(_HEADER))
    except OSError as exc:
        raise StoreFatal(f"cannot read {path!r}: {exc.strerror}; nothing was changed") from exc
    if header != _HEADER:
        _refuse(
            path,
            "it is not a SQLite database (its first bytes are not SQLite's header); if it was "
            "the store's, it is damaged: restore it from a backup",
        )
    tables = _tables(path)
    if tables and _OURS not in tables:
        listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        _refuse(path, f"it is another application's SQLite database (tables: {listed})")


def _refuse(path: str, why: str) -> NoReturn:
    raise StoreFatal(
        f"will not open {path!r} as the SQLite store's database: {why}. Nothing was changed; "
        "point the store at a new file or at a cronoq database"
    )


def _tables(path: str) -> set[str]:
    """The tables of the database at ``path``, read without writing anything, not even the
    read marks a reader leaves in a WAL's index (-shm).

    From the main file alone, ``immutable``: no lock, no journal file created. That misses
    tables still only in the WAL (a database that a running program, cronoq or not, has just
    created): those are read from a private copy of the two files. A checkpoint rewriting
    pages meanwhile can make a read fail, or the WAL vanish: it is tried again for a second.
    """
    uri = Path(os.path.abspath(path)).as_uri()
    error: BaseException | None = None
    for _ in range(_TRIES):
        try:
            tables = _read_tables(f"{uri}?immutable=1")
            if tables or _wal_size(path) == 0:
                return tables
            return _tables_of_a_copy(path)
        except (sqlite3.DatabaseError, FileNotFoundError) as exc:
            error = exc
            time.sleep(_PAUSE)
        except OSError as exc:  # the WAL cannot be read, or copied: what is in it is unknown
            raise StoreFatal(f"cannot read {path!r}-wal: {exc}; nothing was changed") from exc
    _refuse(path, f"its schema cannot be read ({error}): it is damaged or not SQLite's")


def _tables_of_a_copy(path: str) -> set[str]:
    with tempfile.TemporaryDirectory(prefix="cronoq-probe-") as private:
        copy = os.path.join(private, "copy.db")
        shutil.copyfile(path, copy)
        shutil.copyfile(f"{path}-wal", f"{copy}-wal")
        # WAL frames are checksummed: a copy torn by a write meanwhile reads as the
        # transactions before that write, never as a mix.
        return _read_tables(Path(copy).as_uri())


def _read_tables(uri: str) -> set[str]:
    with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {str(name) for (name,) in rows}


def _wal_size(path: str) -> int:
    try:
        return os.stat(f"{path}-wal").st_size
    except OSError:
        return 0
