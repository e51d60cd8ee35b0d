"""The database file and its journals: modes, pragmas, and read-only locations."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import sqlite_files_workload
from sqlite_harness import FAST
from sqlite_mounts import MountFailed, is_root, remount_read_only, tmpfs

from cronoq.errors import StoreFatal
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig
from cronoq_store_sqlite._schema import check_features, migrate

JOURNALS = ("", "-wal", "-shm")

unix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are a Unix matter")


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which SQLite on its own creates 0644 files."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The usual umask, or none at all: under either, a plain ``sqlite3`` creates 0644 files."""
    value: int = request.param
    old = os.umask(value)
    try:
        yield value
    finally:
        os.umask(old)


def modes(db: Path) -> dict[str, int]:
    """The permission bits of the database and of each of its journal files that exists."""
    found = {}
    for suffix in JOURNALS:
        with contextlib.suppress(FileNotFoundError):
            found[suffix] = stat.S_IMODE(os.stat(f"{db}{suffix}").st_mode)
    return found


def make_by_hand(db: Path) -> sqlite3.Connection:
    """A cronoq database written by plain sqlite3 (as a restore from a backup would make it),
    with a table of its own; the connection stays open so that its -wal and -shm files stay
    on disk. (Another application's database, without cronoq's tables, is refused.)"""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    migrate(conn)
    conn.execute("CREATE TABLE mine (x INTEGER)")
    conn.execute("INSERT INTO mine VALUES (42)")
    return conn


# --- modes ------------------------------------------------------------------------------------


@unix_only
@pytest.mark.usefixtures("umask_022")
async def test_new_database_and_its_journals_are_0600(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    store = await SqliteStore.open(db, FAST)
    try:
        await store.acquire_leadership()  # a write: the journals are in use
        assert modes(db) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
    finally:
        await store.close()


@unix_only
@pytest.mark.usefixtures("umask_022")
@pytest.mark.parametrize("journals", [True, False], ids=["with-0644-journals", "db-only"])
async def test_existing_0644_database_and_journals_become_0600(
    tmp_path: Path, journals: bool
) -> None:
    db = tmp_path / "old.db"
    hand = make_by_hand(db)
    try:
        if not journals:
            hand.close()  # the last connection to close removes -wal and -shm
        before = {"": 0o644, "-wal": 0o644, "-shm": 0o644} if journals else {"": 0o644}
        assert modes(db) == before, "the premise: sqlite3 under umask 022 creates 0644 files"
        store = await SqliteStore.open(db, FAST)
        try:
            await store.acquire_leadership()
            assert modes(db) == {"": 0o600, "-wal": 0o600, "-shm": 0o600}
            with contextlib.closing(sqlite3.connect(db)) as check:
                assert check.execute("SELECT x FROM mine").fetchall() == [(42,)]
        finally:
            await store.close()
    finally:
        hand.close()


def every_mode(directory: Path) -> dict[str, int]:
    """The permission bits of every file in ``directory``, whatever its name."""
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}


@unix_only
@pytest.mark.parametrize("umask", [0o022, 0o000], indirect=True, ids=["umask-022", "umask-000"])
async def test_every_file_of_the_store_is_0600_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    directory = tmp_path / "db"
    directory.mkdir()
    db = directory / "cronoq.db"
    seen: dict[str, dict[str, int]] = {}

    async def check(stage: str) -> None:
        seen[stage] = every_mode(directory)

    await sqlite_files_workload.run(db, check)
    seen["closed"] = every_mode(directory)
    in_use = {"cronoq.db": 0o600, "cronoq.db-wal": 0o600, "cronoq.db-shm": 0o600}
    # The last connection to close checkpoints and removes the journals.
    assert seen == {
        "new file, opened": in_use,
        "new file, used": in_use,
        "existing file, opened": in_use,
        "existing file, used": in_use,
        "closed": {"cronoq.db": 0o600},
    }


_TRACED_OPEN = re.compile(r'\b(?:openat\(\w+, |open\(|creat\()"([^"]+)", ([A-Z_|]+)(?:, (0\d+))?')


@unix_only
@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
async def test_no_file_is_ever_created_readable_by_others_even_for_an_instant(
    tmp_path: Path, umask: int
) -> None:
    # Some files live only for a moment (the rollback journal of the switch to WAL), so the
    # modes on disk afterwards cannot show them: trace every file creation of a process that
    # runs the store's whole workload.
    directory = tmp_path / "db"
    directory.mkdir()
    db = directory / "cronoq.db"
    trace = tmp_path / "trace.txt"
    argv = ["strace", "-f", "-qq", "-e", "trace=open,openat,creat", "-o", str(trace)]
    argv += [sys.executable, str(Path(sqlite_files_workload.__file__)), str(db), f"{umask:o}"]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0 and "ptrace" in done.stderr:
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr[-3000:]
    created: dict[str, list[tuple[str, int]]] = {}
    for match in _TRACED_OPEN.finditer(trace.read_text()):
        path, flags, mode = match.groups()
        if Path(path).parent == directory and ("O_CREAT" in flags or "creat(" in match[0]):
            created.setdefault(Path(path).name, []).append((flags, int(mode or "0", 8)))
    # The test saw what it claims to check: the database, both WAL files and the journal.
    names = {"cronoq.db", "cronoq.db-journal", "cronoq.db-wal", "cronoq.db-shm"}
    assert set(created) == names, created
    # The database is created by the store itself, exclusively and owner-only; SQLite's own
    # opens of it (mode 0644 & ~umask, were it to create it) come after, on an existing file.
    first_flags, first_mode = created.pop("cronoq.db")[0]
    assert "O_EXCL" in first_flags and first_mode == 0o600, (first_flags, oct(first_mode))
    readable = {
        name: [oct(mode) for _, mode in opens if mode & 0o077] for name, opens in created.items()
    }
    assert all(not modes for modes in readable.values()), f"created readable by others: {readable}"
    assert every_mode(directory) == {"cronoq.db": 0o600}


# --- pragmas ----------------------------------------------------------------------------------


async def test_synchronous_follows_full_sync_on_each_stores_own_connection(
    tmp_path: Path,
) -> None:
    # Two stores on one file with different settings: ``synchronous`` belongs to a connection,
    # so each store's connection must carry its own (FULL = 2, NORMAL = 1).
    db = tmp_path / "sync.db"
    synced = await SqliteStore.open(db, replace(FAST, full_sync=True))
    unsynced = await SqliteStore.open(db, replace(FAST, full_sync=False))
    try:
        # Both connections of each: the lease one writes the epoch, which must be durable too.
        for store, wanted in ((synced, 2), (unsynced, 1)):
            for connection in (store._conn, store._lease_conn):
                for name, value in (("synchronous", wanted), ("journal_mode", "wal")):
                    assert await connection.run(_pragma(name)) == [(value,)]
    finally:
        await unsynced.close()
        await synced.close()
    # WAL is a property of the file: another program sees it too.
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchall() == [("wal",)]


# --- opening at once ---------------------------------------------------------------------------


ROUNDS, AT_ONCE = 150, 4


async def test_stores_opened_at_once_on_a_new_file_all_open(tmp_path: Path) -> None:
    # Processes that start together race to switch a new file to WAL and migrate it. With the
    # production busy_timeout (5 s) none may fail: contention is waited out, never surfaced.
    # Unfixed, about 4 opens in 100 fail; the 150 rounds take 1 to 3 s.
    config = SqliteStoreConfig()
    failures: list[str] = []
    for round_ in range(ROUNDS):
        db = tmp_path / f"race-{round_}.db"
        opened = await asyncio.gather(
            *(SqliteStore.open(db, config) for _ in range(AT_ONCE)), return_exceptions=True
        )
        for outcome in opened:
            if isinstance(outcome, SqliteStore):
                await outcome.close()
            else:
                failures.append(f"round {round_}: {outcome!r}")
    assert failures == [], (
        f"{len(failures)} of {ROUNDS * AT_ONCE} opens failed, first: {failures[0]}"
    )


# --- read-only locations ----------------------------------------------------------------------


@dataclass
class Location:
    directory: Path
    seal: Callable[[], None]
    """Make the directory read-only for this process."""
    errno: int
    """What writing there then fails with."""

    @property
    def why(self) -> str:
        return os.strerror(self.errno)


@contextlib.contextmanager
def sealable_location(directory: Path) -> Iterator[Location]:
    """A directory that can be made read-only: a tmpfs remounted ``ro`` when root (root ignores
    permissions), a directory chmod 0500 otherwise."""
    if is_root():
        try:
            with tmpfs(directory, "1m") as mounted:
                yield Location(mounted, lambda: remount_read_only(mounted), errno.EROFS)
        except MountFailed as exc:
            pytest.skip(f"running as root but cannot mount a tmpfs: {exc}")
        return
    directory.mkdir()
    try:
        yield Location(directory, lambda: directory.chmod(0o500), errno.EACCES)
    finally:
        directory.chmod(0o700)


def seal(location: Location) -> None:
    location.seal()
    try:
        (location.directory / "probe").touch(exist_ok=False)
    except OSError as exc:
        refused = exc.errno
    else:
        pytest.skip("cannot make a directory read-only here (write access despite mode 0500)")
    assert refused == location.errno, os.strerror(refused or 0)


async def make_with_store(db: Path) -> None:
    store = await SqliteStore.open(db, FAST)
    await store.acquire_leadership()
    await store.close()


async def open_and_close(db: Path) -> None:
    store = await SqliteStore.open(db, FAST)
    await store.close()


def make_0644_by_hand(db: Path) -> None:
    old = os.umask(0o022)
    try:
        make_by_hand(db).close()
    finally:
        os.umask(old)
    assert modes(db) == {"": 0o644}


@unix_only
@pytest.mark.parametrize(
    "existing",
    ["none", "cronoq-0600", "hand-made-0644"],
    ids=["new-file", "existing-0600-database", "existing-0644-database"],
)
async def test_read_only_location_fails_with_a_store_fatal_naming_path_and_cause(
    tmp_path: Path, existing: str
) -> None:
    with sealable_location(tmp_path / "ro") as location:
        db = location.directory / "cronoq.db"
        if existing == "cronoq-0600":
            await make_with_store(db)
        elif existing == "hand-made-0644":
            make_0644_by_hand(db)
        seal(location)
        # A raw OSError or sqlite3.Error from deep inside would escape pytest.raises: the
        # caller must get the store's fatal error, saying which file and why.
        with pytest.raises(StoreFatal) as raised:
            await open_and_close(db)
        message = str(raised.value)
        assert str(db) in message, message
        # The cause, in the OS's words or SQLite's (SQLITE_READONLY_DIRECTORY says it too);
        # SQLite's bare "unable to open database file" does not say why.
        says_why = location.why in message or re.search("read-?only", message, re.IGNORECASE)
        assert says_why, f"{message!r} does not say {location.why!r}"


def _pragma(name: str) -> Callable[[sqlite3.Connection], list[Any]]:
    return lambda db: db.execute(f"PRAGMA {name}").fetchall()


def test_a_sqlite_older_than_upserts_or_without_json_is_refused_saying_why() -> None:
    class Old(sqlite3.Connection):
        """A real connection that reports an older library, or lacks json_valid."""

        version = "3.23.1"
        json = True

        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "SELECT sqlite_version()":
                return super().execute("SELECT ?", (self.version,))
            if "json_valid" in sql and not self.json:
                return super().execute("SELECT no_such_function()")
            return super().execute(sql, *args)

    with contextlib.closing(sqlite3.connect(":memory:", factory=Old)) as conn:
        with pytest.raises(StoreFatal, match=r"SQLite is 3\.23\.1; .* needs 3\.24\.0 or newer"):
            check_features(conn)
        for version in ("3.23.99", "3", "x"):
            Old.version = version
            with pytest.raises(StoreFatal, match=r"needs 3\.24\.0 or newer"):
                check_features(conn)
        for version in ("3.24", "3.24.0", "3.40.0", "3.45.1.2"):
            Old.version = version
            check_features(conn)  # the real library answers json_valid
        Old.json = False
        with pytest.raises(StoreFatal, match="lacks the JSON functions"):
            check_features(conn)
