"""Open a SQLite store as a process that file permissions apply to, and say what happened.

Run as ``python sqlite_unprivileged.py DB``. Root ignores file permissions, so as root the
script first drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from its capability bounding set
and runs itself again: it stays root (the interpreter under /root stays readable) but is
refused what the modes refuse. It prints one JSON object:

    {"skip": reason}                               the capabilities could not be dropped
    {"denied": bool,                               writing the file or its directory is refused
     "store": [type, message],                     what ``SqliteStore.open`` raised
     "sqlite": [kind, code, message]}              SQLite's own error for a write, classified
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import sqlite3
import sys
import tempfile

from cronoq_store_sqlite import SqliteStore
from cronoq_store_sqlite._errors import classify

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
_DROPPED = "CRONOQ_TEST_DAC_DROPPED"


def drop_root_privileges() -> None:
    if os.geteuid() != 0 or os.environ.get(_DROPPED) == "1":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            print(json.dumps({"skip": f"prctl: {os.strerror(ctypes.get_errno())}"}))
            sys.exit(0)
    os.environ[_DROPPED] = "1"
    # The bounding set limits the capabilities of what is executed next: this script again.
    os.execv(sys.executable, [sys.executable, *sys.argv])


def denied(db: str) -> bool:
    """Whether this process is refused writing the file, or creating one beside it."""
    try:
        with open(db, "r+b"):
            pass
        with tempfile.TemporaryFile(dir=os.path.dirname(db)):
            pass
    except PermissionError:
        return True
    return False


async def open_store(db: str) -> list[str]:
    try:
        store = await SqliteStore.open(db)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    await store.close()
    return ["opened", ""]


def sqlite_write(db: str) -> list[str]:
    try:
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("UPDATE cronoq_leader SET epoch = epoch")
            conn.execute("COMMIT")
        finally:
            conn.close()
    except sqlite3.Error as exc:
        code = getattr(exc, "sqlite_errorname", type(exc).__name__)
        return [type(classify(exc, "writing", db)).__name__, code, str(exc)]
    return ["written", "", ""]


def main(db: str) -> None:
    drop_root_privileges()
    report = {
        "denied": denied(db),
        "store": asyncio.run(open_store(db)),
        "sqlite": sqlite_write(db),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
