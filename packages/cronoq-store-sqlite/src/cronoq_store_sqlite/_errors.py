"""How SQLite errors map onto the store's three error kinds."""

from __future__ import annotations

import sqlite3

from cronoq.errors import StoreError, StoreFatal, Unavailable

# Contention and a full disk leave the file intact and pass: the scheduler retries. An I/O
# error may mean a failed fsync whose data is gone; retrying as if nothing happened would
# acknowledge what is not on disk, so it is fatal, as is corruption.
_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL")


def classify(exc: sqlite3.Error, doing: str) -> StoreError:
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    message = f"SQLite failed while {doing}: {exc} ({name})"
    if name.startswith(_TRANSIENT):
        return Unavailable(message)
    return StoreFatal(message)
