"""``cronoq-server serve`` at its edges, as real processes: a port another server holds, a store
that fails for good, a forced stop, and HTTP clients that hang up (issue 24, items 1, 3, 5)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from server_cluster import http_get
from server_pg import PG_DSN, pg_connect
from server_process import config_toml, parse_line, running_server

from cronoq import TaskContext
from cronoq_client import AsyncClient, Worker
from cronoq_server import Address, ConfigError, load_config
from cronoq_server._ports import PortBusy, check_alone
from cronoq_store_postgres import PgStore, PgStoreConfig

EXIT_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class Exited:
    code: int
    lines: list[str]

    def level(self, level: str) -> list[str]:
        return [line for line in self.lines if parse_line(line).get("level") == level]


async def serve_until_exit(directory: Path, config: str) -> Exited:
    """Run ``serve`` with this configuration, which must make it exit by itself."""
    path = directory / f"server-{os.urandom(4).hex()}.toml"
    path.write_text(config)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cronoq_server",
        "serve",
        "--config",
        str(path),
        cwd=directory,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(EXIT_TIMEOUT_S):
            _, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Exited(process.returncode, err.decode().splitlines())


def sqlite(path: Path) -> str:
    return f'[store]\nkind = "sqlite"\npath = "{path}"\n'


# --- ports (item 1; busy ports of item 5) ---------------------------------------------------


async def test_a_server_refuses_the_grpc_port_of_a_server_with_another_database(
    tmp_path: Path,
) -> None:
    """Regression: SO_REUSEPORT let a second server, on another database, share the port, and
    the kernel split the connections between two schedulers."""
    async with running_server(tmp_path, config_toml(sqlite(tmp_path / "a.db"))) as first:
        await first.leading()
        second = config_toml(sqlite(tmp_path / "b.db")).replace(
            'grpc = "127.0.0.1:0"', f'grpc = "127.0.0.1:{first.grpc_port}"'
        )
        exited = await serve_until_exit(tmp_path, second)
        assert exited.code == 3, exited.lines
        (line,) = exited.level("error")
        message = parse_line(line)["msg"]
        assert f"listen.grpc = 127.0.0.1:{first.grpc_port}" in message
        assert f"by process {first.process.pid} (" in message
        assert not any("Traceback" in raw for raw in exited.lines)
        assert not (tmp_path / "b.db").exists()  # refused before it opened its store
        # The first server still serves, alone on its port.
        assert await http_get(f"{first.http}/readyz") == (200, {"ready": True, "reason": "leading"})


async def test_a_busy_http_port_is_one_line_and_exit_3(tmp_path: Path) -> None:
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        config = config_toml("").replace('http = "127.0.0.1:0"', f'http = "127.0.0.1:{port}"')
        exited = await serve_until_exit(tmp_path, config)
    finally:
        holder.close()
    assert exited.code == 3, exited.lines
    (line,) = exited.level("error")
    message = parse_line(line)["msg"]
    assert message.startswith(f"listen.http = 127.0.0.1:{port}: the port is already in use by")
    assert f"process {os.getpid()} (" in message  # this test's process holds it
    assert not any("Traceback" in raw for raw in exited.lines)


# --- permanent store errors (item 5) --------------------------------------------------------


OPENING = "opening the store"


@pytest.fixture(
    params=["damaged_sqlite", "unknown_postgres_role", "postgres_role_without_privileges"]
)
async def broken_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[str, str, str]]:
    """A ``[store]`` section that fails for good, a word of the error it gives, and when: a
    role without privileges opens the store (it may read the schema's version) and fails
    as it starts to lead."""
    if request.param == "damaged_sqlite":
        path = tmp_path / "damaged.db"
        path.write_bytes(b"this is not a SQLite database, whatever its name says" * 100)
        yield sqlite(path), "not a SQLite database", OPENING
        return
    conn = await pg_connect()  # skips (or fails, if required) without PostgreSQL
    await conn.close()
    if request.param == "unknown_postgres_role":
        role = f"cronoq_no_such_role_{os.urandom(4).hex()}"
        yield f'[store]\nkind = "postgres"\ndsn = "{_dsn_as(role)}"\n', role, OPENING
        return
    async with _role_without_privileges() as (schema, role):
        store = f'[store]\nkind = "postgres"\ndsn = "{_dsn_as(role)}"\nschema = "{schema}"\n'
        yield store, "permission denied for table cronoq_leader", "starting to lead"


def _dsn_as(role: str) -> str:
    dsn = PG_DSN.replace("postgres@", f"{role}@", 1)
    assert role in dsn, "CRONOQ_TEST_PG_DSN must name its user as postgres@ for this test"
    return dsn


@contextlib.asynccontextmanager
async def _role_without_privileges() -> AsyncIterator[tuple[str, str]]:
    """An up-to-date schema, and a role that may log in, use the schema and read its version
    (so that it is not taken for a schema without tables), but has none of the privileges on
    the other tables that docs/stores/postgres.md grants the replicas' role."""
    schema = f"cronoq_test_{uuid.uuid4().hex[:12]}"
    role = f"{schema}_reader"
    conn = await pg_connect()
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        await PgStore.migrate(PG_DSN, PgStoreConfig(schema=schema))
        await conn.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
        await conn.execute(f'GRANT SELECT ON "{schema}".cronoq_schema_version TO "{role}"')
        yield schema, role
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')
        await conn.close()


async def test_a_store_that_fails_for_good_is_said_once_shown_by_readyz_then_exit_1(
    tmp_path: Path, broken_store: tuple[str, str, str]
) -> None:
    """Regression: a wrong role or a damaged file was retried for ever, a warning 1.5 times a
    second, /readyz saying "standby" and the process never exiting."""
    store, word, when = broken_store
    # Four attempts: 0.5 + 1 + 2 seconds between them, in which /readyz is asked.
    config = config_toml(store, tables="[runtime]\nstore_fatal_attempts = 4\n")
    async with running_server(tmp_path, config) as server:
        error = await server.wait_line(lambda line: line.get("level") == "error", "an error")
        assert error["msg"].startswith(f"the store failed while {when}")
        assert word in error["msg"] and "store_fatal_attempts" in error["msg"]
        status, body = await http_get(f"{server.http}/readyz")
        assert (status, body["ready"], body["reason"]) == (503, False, "store_failed")
        assert word in body["cause"]
        code = await server.wait_exit(EXIT_TIMEOUT_S)
        assert code == 1, server.raw[-10:]
        errors = [line for line in server.lines if line.get("level") == "error"]
        assert errors == [error], "said once, with what to do"
        assert not [line for line in server.lines if line.get("level") == "warning"]
        assert server.events("stopped", exit_code="1")


def test_store_fatal_attempts_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"store_fatal_attempts = '0' .* from 1 to 1000"):
        load_config(environ={"CRONOQ_RUNTIME__STORE_FATAL_ATTEMPTS": "0"})
    assert load_config(environ={}).runtime.store_fatal_attempts == 5


# --- a forced stop (item 5) -----------------------------------------------------------------


async def test_a_second_signal_stops_at_once_and_exits_128_plus_its_number(
    tmp_path: Path,
) -> None:
    """Regression: the forced stop exited 0, like a clean drain."""
    started = asyncio.Event()

    async def hold(ctx: TaskContext, payload: bytes) -> bytes:
        started.set()
        await asyncio.Event().wait()  # runs until the worker is stopped
        return payload

    async with running_server(tmp_path, config_toml("")) as server:
        await server.leading()
        worker = asyncio.ensure_future(Worker(server.target, {"default": hold}, slots=1).run())
        try:
            async with AsyncClient(server.target) as client:
                await client.submit("hold", b"x")
            async with asyncio.timeout(10):
                await started.wait()
            server.signal(signal.SIGTERM)
            await server.wait_for("draining")  # the drain would wait for the attempt
            server.signal(signal.SIGINT)
            assert await server.wait_exit(EXIT_TIMEOUT_S) == 128 + signal.SIGINT
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
        assert server.events("shutdown_forced", signal="SIGINT")
        assert server.events("stopped", exit_code=str(128 + signal.SIGINT))


async def test_a_drain_exits_0(tmp_path: Path) -> None:
    async with running_server(tmp_path, config_toml("")) as server:
        await server.leading()
        server.signal(signal.SIGTERM)
        assert await server.wait_exit(EXIT_TIMEOUT_S) == 0
        assert server.events("stopped", exit_code="0")


# --- HTTP clients that hang up (item 3) -----------------------------------------------------


def probe_and_reset(port: int, count: int) -> None:
    """Probe ``/healthz``, and reset the connection as soon as the answer starts to arrive."""
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            conn.recv(1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


async def test_clients_that_hang_up_log_no_error(tmp_path: Path) -> None:
    """Regression: on uvloop, a probe that hung up as its answer left made the server log an
    ERROR with a traceback (OSError ENOTCONN closing the connection)."""
    async with running_server(tmp_path, config_toml("")) as server:
        assert server.events("listening", event_loop="uvloop")
        # Several at once: the server then answers while others hang up, as probes of
        # several kubelets and a Prometheus do.
        threads = [
            threading.Thread(target=probe_and_reset, args=(server.http_port, 150)) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            await asyncio.to_thread(thread.join)
        assert await http_get(f"{server.http}/healthz") == (200, {"status": "alive"})
        server.signal(signal.SIGTERM)
        assert await server.wait_exit(EXIT_TIMEOUT_S) == 0
    problems = [line for line in server.raw if parse_line(line).get("level") != "info"]
    assert problems == [], "\n".join(problems[:5])


def test_a_listener_of_another_process_is_found_on_overlapping_addresses_only() -> None:
    script = (
        "import socket, sys\n"
        "s = socket.create_server(('0.0.0.0', 0))\n"
        "print(s.getsockname()[1], flush=True)\n"
        "sys.stdin.read()\n"  # holds the port until the test closes its stdin
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        assert holder.stdin is not None and holder.stdout is not None
        port = int(holder.stdout.readline())
        for host in ("127.0.0.1", "localhost", "0.0.0.0", "::"):  # an IPv4 wildcard holds them
            with pytest.raises(PortBusy, match=f"in use by process {holder.pid} \\("):
                check_alone("listen.grpc", Address(host, port), bound=False)
        check_alone("listen.grpc", Address("::1", port), bound=False)  # IPv6 only: free
        holder.stdin.close()  # the holder exits, and Popen's exit waits for it
    check_alone("listen.grpc", Address("127.0.0.1", port), bound=False)  # gone: free again
