"""A private PgBouncer in front of the test server, for the pooler tests (``test_pg_poolers.py``).

Its config and auth file live in a fresh temp dir; it listens on a free port of 127.0.0.1 and
forwards every database to the server of ``DSN`` (which must trust the user: the auth file
holds the user with no password, ``auth_type = trust``). PgBouncer refuses to run as root: run
as root, it runs as the ``postgres`` user, who owns the dir (made where that user can enter
it: ``pg_server_user``). The binary is
``CRONOQ_TEST_PGBOUNCER`` (default: ``pgbouncer`` on PATH, or Debian's /usr/sbin/pgbouncer).
When it is missing the tests skip, unless ``CRONOQ_REQUIRE_POSTGRES=1`` (CI), which fails them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from pg_proxy import upstream_of
from pg_server_user import SERVER_USER, as_server_user, server_directory

__all__ = ["PgBouncer", "pgbouncer_binary"]


def pgbouncer_binary() -> str:
    """The PgBouncer binary; skips (or fails, with CRONOQ_REQUIRE_POSTGRES=1) when missing."""
    binary = os.environ.get("CRONOQ_TEST_PGBOUNCER") or shutil.which(
        "pgbouncer", path=f"{os.environ.get('PATH', '')}:/usr/sbin"
    )
    if binary is None or not Path(binary).is_file():
        reason = "pgbouncer not found (apt-get install pgbouncer, or set CRONOQ_TEST_PGBOUNCER)"
        if os.environ.get("CRONOQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return binary


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _prepare(root: Path, user: str, ini: str) -> None:
    """The config and the auth file, owned by the user PgBouncer runs as."""
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(ini)
    if as_server_user():
        for path in (root / "users.txt", root / "pgbouncer.ini"):
            shutil.chown(path, user=SERVER_USER)


class PgBouncer:
    def __init__(self, root: Path, port: int, dsn: str) -> None:
        self.root = root
        self.port = port
        self._dsn = dsn
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self.log: list[str] = []
        """What PgBouncer wrote so far, a line each."""

    def dsn(self) -> str:
        """The test DSN, through this PgBouncer."""
        parts = urlsplit(self._dsn)
        user = parts.username or SERVER_USER
        return urlunsplit(
            (parts.scheme, f"{user}@127.0.0.1:{self.port}", parts.path, "sslmode=disable", "")
        )

    @classmethod
    async def start(
        cls, dsn: str, pool_mode: str, ignore_startup_parameters: list[str]
    ) -> PgBouncer:
        binary = pgbouncer_binary()
        upstream = upstream_of(dsn)
        if upstream is None:
            pytest.skip(f"PgBouncer needs a TCP DSN to forward to, not {dsn}")
        host, port = upstream
        user = urlsplit(dsn).username or SERVER_USER
        root = server_directory("cronoq-pgbouncer-")
        bouncer = cls(root, _free_port(), dsn)
        _prepare(
            root,
            user,
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {bouncer.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {root / 'users.txt'}\n"
            f"pool_mode = {pool_mode}\n"
            f"ignore_startup_parameters = {','.join(ignore_startup_parameters)}\n",
        )
        identity = {"user": SERVER_USER, "group": SERVER_USER} if as_server_user() else {}
        try:
            bouncer._process = await asyncio.create_subprocess_exec(
                binary,
                str(root / "pgbouncer.ini"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                cwd=root,
                **identity,  # type: ignore[arg-type]
            )
            up = asyncio.get_running_loop().create_future()
            bouncer._reader = asyncio.ensure_future(bouncer._read_log(up))
            async with asyncio.timeout(10.0):
                await up
        except BaseException:
            await bouncer.stop()
            raise
        return bouncer

    async def _read_log(self, up: asyncio.Future[None]) -> None:
        """Keep the pipe drained; resolve ``up`` once PgBouncer says it listens."""
        assert self._process is not None and self._process.stdout is not None
        async for raw in self._process.stdout:
            line = raw.decode(errors="replace").rstrip()
            self.log.append(line)
            if "process up" in line and not up.done():
                up.set_result(None)
        if not up.done():
            up.set_exception(RuntimeError("pgbouncer exited: " + " | ".join(self.log[-10:])))

    async def stop(self) -> None:
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            await process.wait()
        if self._reader is not None:
            await self._reader
        shutil.rmtree(self.root, ignore_errors=True)
