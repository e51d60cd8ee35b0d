"""The helpers that run a server as the ``postgres`` OS user (the private cluster, PgBouncer),
under a TMPDIR that user cannot enter (issue 24, item 8; pytest's own base directory is such
one, mode 0700): the server runs in a directory it can enter, or the test fails in one line."""

from __future__ import annotations

import tempfile
from pathlib import Path

import asyncpg
import pytest
from pg_bouncer import PgBouncer
from pg_harness import DSN, require_postgres
from pg_private_cluster import PrivateCluster, private_cluster_unavailable
from pg_server_user import SERVER_USER, as_server_user, server_directory, unreachable

pytestmark = pytest.mark.skipif(
    not as_server_user(), reason="only as root do the servers run as the postgres user"
)


@pytest.fixture
def closed_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)  # made here: its mode is this test's to choose
    assert unreachable(closed, SERVER_USER) is not None, "the premise: postgres cannot enter"
    monkeypatch.setattr(tempfile, "tempdir", str(closed))
    return closed


async def test_a_private_cluster_runs_though_tmpdir_is_closed_to_its_user(
    closed_tmpdir: Path,
) -> None:
    reason = private_cluster_unavailable()
    if reason is not None:
        pytest.skip(reason)
    cluster = await PrivateCluster.create()
    try:
        assert closed_tmpdir not in cluster.root.parents
        await cluster.start()
        conn = await asyncpg.connect(cluster.dsn, timeout=10)
        await conn.close()
    finally:
        await cluster.destroy()


async def test_pgbouncer_runs_though_tmpdir_is_closed_to_its_user(closed_tmpdir: Path) -> None:
    await require_postgres()
    bouncer = await PgBouncer.start(DSN, "session", [])
    try:
        assert closed_tmpdir not in bouncer.root.parents
        conn = await asyncpg.connect(bouncer.dsn(), timeout=10, statement_cache_size=0)
        await conn.close()
    finally:
        await bouncer.stop()


def test_no_directory_the_user_can_enter_fails_the_test_in_one_line(closed_tmpdir: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as failed:
        server_directory("cronoq-test-", bases=[str(closed_tmpdir)])
    message = str(failed.value)
    assert "\n" not in message, message
    assert message.startswith(f"no directory to run a server as the {SERVER_USER} user in: ")
    assert f"does not let {SERVER_USER} enter it" in message
    assert message.endswith("(set TMPDIR to a directory it can enter)")
    assert list(closed_tmpdir.iterdir()) == [], "nothing was made where the user cannot enter"
