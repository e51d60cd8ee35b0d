"""A private PostgreSQL cluster for tests that stop and start the server.

``initdb`` into a fresh directory under the system temp dir, ``pg_ctl start`` on a free port of
127.0.0.1 with ``synchronous_commit=on``; ``stop()`` and ``start()`` it at will; ``destroy()``
stops it (immediately, if it still runs) and removes the directory. Run as root, every server
command runs as the ``postgres`` user (``runuser``), which owns the directory (made where that
user can enter it: ``pg_server_user``); as anyone else, as that user. The binaries come from
``CRONOQ_TEST_PG_BIN`` (default: PostgreSQL 15's).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path

from pg_server_user import SERVER_USER, as_server_user, server_directory

__all__ = ["PG_BIN", "PrivateCluster", "private_cluster_unavailable"]

PG_BIN = Path(os.environ.get("CRONOQ_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def private_cluster_unavailable() -> str | None:
    """Why a private cluster cannot be made here, or None if it can."""
    for tool in ("initdb", "pg_ctl"):
        if not (PG_BIN / tool).is_file():
            return f"{PG_BIN / tool} not found (set CRONOQ_TEST_PG_BIN)"
    if as_server_user() and shutil.which("runuser") is None:
        return "running as root without runuser to drop to the postgres user"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PrivateCluster:
    def __init__(self, root: Path, port: int) -> None:
        self.root = root
        self.data = root / "data"
        self.port = port
        self.running = False

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @classmethod
    async def create(cls) -> PrivateCluster:
        root = server_directory("cronoq-pg-")
        cluster = cls(root, _free_port())
        try:
            await cluster._run(
                "initdb", "-D", str(cluster.data), "-U", "postgres", "-A", "trust",
                "--no-sync", "-E", "UTF8", "--locale=C",
            )  # fmt: skip
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return cluster

    async def _run(self, tool: str, *args: str) -> str:
        command = [str(PG_BIN / tool), *args]
        if as_server_user():
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.root,
        )
        output, _ = await process.communicate()
        text = output.decode(errors="replace")
        if process.returncode != 0:
            log = self.root / "server.log"
            server_log = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {text}\n{server_log}")
        return text

    async def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c synchronous_commit=on "
            "-c max_connections=40 -c shared_buffers=16MB"
        )
        await self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-o", options, "-w", "-t", "30", "start",
        )  # fmt: skip
        self.running = True

    async def stop(self, mode: str = "fast") -> None:
        await self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")
        self.running = False

    async def destroy(self) -> None:
        """Stop the server at once if it may run (even half-started), and remove it all."""
        try:
            if self.running or (self.data / "postmaster.pid").exists():
                await self.stop("immediate")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
