"""A full disk: commits are Unavailable, callers get SchedulerError, and freeing space resumes."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from sqlite_mounts import MountFailed, is_root, tmpfs

from cronoq import Pool, Scheduler, SchedulerError, Status, TaskContext
from cronoq.errors import Unavailable
from cronoq.store import Mutation
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig

# A lease far longer than the full spell, so the leader keeps it while its renewals fail too.
CONFIG = SqliteStoreConfig(lock_poll=0.05, lease_renew=0.5, lease_ttl=5.0, busy_timeout=0.2)
COMMIT_TIMEOUT = 0.5


async def echo(ctx: TaskContext, payload: bytes) -> bytes:
    return payload


def fill(path: Path) -> int:
    """Write a ballast file until the file system is full; return its size."""
    written = 0
    with path.open("wb", buffering=0) as ballast:
        for chunk in (1 << 16, 1 << 12, 1 << 9):
            try:
                while True:
                    written += ballast.write(b"\xff" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return written


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, unmounted afterwards whatever happens."""
    if not is_root():
        pytest.skip("needs root to mount a small tmpfs to fill")
    with contextlib.ExitStack() as stack:
        try:
            directory = stack.enter_context(tmpfs(tmp_path / "small", "4m"))
        except MountFailed as exc:
            pytest.skip(f"running as root but cannot mount a tmpfs: {exc}")
        yield directory


async def test_full_disk_makes_commits_unavailable_and_freeing_space_resumes_losing_nothing(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = small_disk
    db = directory / "cronoq.db"
    ballast = directory / "ballast"
    store = await SqliteStore.open(db, CONFIG)
    # Record what each commit of the store ended with (None: it went in).
    outcomes: list[BaseException | None] = []
    commit = store.commit

    async def recording_commit(epoch: int, batch: Sequence[Mutation]) -> None:
        try:
            await commit(epoch, batch)
        except BaseException as exc:
            outcomes.append(exc)
            raise
        outcomes.append(None)

    monkeypatch.setattr(store, "commit", recording_commit)
    acked: list[int] = []
    try:
        async with Scheduler(
            [Pool("default", echo)], store=store, commit_timeout=COMMIT_TIMEOUT
        ) as scheduler:
            acked += [await scheduler.submit("before", b"%d" % i) for i in range(20)]

            assert fill(ballast) > 0
            outcomes.clear()
            refused: SchedulerError | None = None
            async with asyncio.timeout(30):
                # A commit may still fit in the last free page: go on until one does not.
                for i in range(100):
                    try:
                        acked.append(await scheduler.submit("full", b"f%d" % i))
                    except SchedulerError as exc:
                        refused = exc
                        break
            assert refused is not None, "the disk is full, yet every submission went in"
            assert "SQLITE_FULL" in str(refused), str(refused)
            # Errors the commits raised (the driver's commit_timeout cancelling one is not).
            failed = [o for o in outcomes if isinstance(o, Exception)]
            assert failed, f"no commit failed while the disk was full: {outcomes}"
            assert all(isinstance(o, Unavailable) and "SQLITE_FULL" in str(o) for o in failed), (
                failed
            )
            assert scheduler.running, scheduler.failure

            ballast.unlink()
            async with asyncio.timeout(30):
                while True:  # each refusal comes after a failed rebuild and its backoff
                    assert scheduler.running, scheduler.failure
                    try:
                        acked.append(await scheduler.submit("after", b"a"))
                        break
                    except SchedulerError:
                        continue
            acked += [await scheduler.submit("after", b"a%d" % i) for i in range(10)]
            assert scheduler.running and scheduler.failure is None
            async with asyncio.timeout(30):
                for task_id in acked:
                    info = await scheduler.wait(task_id)
                    assert info.status is Status.SUCCEEDED, info
    finally:
        await store.close()

    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA quick_check").fetchall() == [("ok",)]
        stored = {task_id for (task_id,) in conn.execute("SELECT id FROM cronoq_tasks")}
    assert set(acked) <= stored, f"acknowledged but lost: {sorted(set(acked) - stored)}"
