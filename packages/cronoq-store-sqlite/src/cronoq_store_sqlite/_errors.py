"""How SQLite errors map onto the store's three error kinds."""

from __future__ import annotations

import sqlite3

from cronoq.errors import StoreError, StoreFatal, Unavailable

# Contention and a full disk leave the file intact and pass: the scheduler retries. Every
# extended code of these counts (SQLITE_BUSY_SNAPSHOT, SQLITE_LOCKED_SHAREDCACHE, ...).
# SQLITE_PROTOCOL is a lost race for the WAL's locks that SQLite already retried many times.
# An I/O error may mean a failed fsync whose data is gone; retrying as if nothing happened
# would acknowledge what is not on disk, so it is fatal, as are corruption, a read-only or
# unreachable file, a refused permission and every error this table does not know.
_TRANSIENT = ("SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_FULL", "SQLITE_PROTOCOL")

# What the operator can do about a fatal error, by the prefix of its code.
_ADVICE = (
    (("SQLITE_CORRUPT", "SQLITE_NOTADB"), "the file is damaged: restore it from a backup"),
    (
        ("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_AUTH"),
        "this process must be able to write the file and create files in its directory",
    ),
    (("SQLITE_IOERR",), "reading or writing the file failed: check the disk"),
)


def classify(exc: sqlite3.Error, doing: str, path: str | None = None) -> StoreError:
    """``Unavailable`` for what passes, ``StoreFatal`` for the rest; the message names the
    file, the operation, SQLite's words and code, and for a fatal error what to do."""
    name = getattr(exc, "sqlite_errorname", None) or type(exc).__name__
    where = f" on {path!r}" if path is not None else ""
    message = f"SQLite failed{where} while {doing}: {exc} ({name})"
    if name.startswith(_TRANSIENT):
        return Unavailable(message)
    for prefixes, advice in _ADVICE:
        if name.startswith(prefixes):
            return StoreFatal(f"{message}; {advice}")
    return StoreFatal(message)
