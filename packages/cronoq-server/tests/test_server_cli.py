"""``cronoq-server check-config`` and ``migrate`` as real processes, on a real SQLite file and a
real PostgreSQL schema of their own."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import re
import signal
import socket
import sqlite3
import stat
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from server_pg import PG_DSN, pg_schema, pg_tables

from cronoq_server._cli import SERVE_GC_THRESHOLDS, event_loop_factory, tune_collector
from cronoq_store_postgres import SCHEMA_VERSION as PG_SCHEMA_VERSION

__all__ = ["pg_schema"]  # a fixture: used by name
COMMAND = str(Path(sys.executable).parent / "cronoq-server")
TABLES = {"cronoq_leader", "cronoq_schedules", "cronoq_schema_version", "cronoq_tasks"}


@dataclass(frozen=True, slots=True)
class Result:
    code: int
    out: str
    err: str


async def cronoq_server(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 30.0
) -> Result:
    # The harness's own CRONOQ_ variables stay out: each test says what the server sees.
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    process = await asyncio.create_subprocess_exec(
        COMMAND,
        *args,
        cwd=cwd,
        env={**base, **(env or {})},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(timeout):
        out, err = await process.communicate()
    assert process.returncode is not None
    return Result(process.returncode, out.decode(), err.decode())


def sqlite_tables(path: Path) -> set[str]:
    # closing(): a Connection's own context manager ends the transaction, not the connection.
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {name for (name,) in rows}


# --- check-config ---------------------------------------------------------------------------


async def test_check_config_without_configuration_prints_the_default(tmp_path: Path) -> None:
    result = await cronoq_server("check-config", cwd=tmp_path)
    assert (result.code, result.err) == (0, "")
    effective = tomllib.loads(result.out)
    assert effective["store"]["kind"] == "sqlite"
    assert effective["store"]["path"] == "./cronoq.db"
    assert effective["pools"] == [{"name": "default", "concurrency": 1000, "lease_s": 30.0}]
    assert effective["listen"] == {"grpc": "127.0.0.1:50051", "http": "127.0.0.1:8080"}
    assert not (tmp_path / "cronoq.db").exists(), "checking must not create the store"


async def test_check_config_masks_the_dsn_and_names_sources(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text('[store]\nkind = "postgres"\ndsn = "postgresql://app:filepw@db/x"\n')
    result = await cronoq_server(
        "check-config",
        "--config",
        str(config),
        cwd=tmp_path,
        env={
            "CRONOQ_STORE__DSN": "postgresql://app:envpw@db/jobs?password=querypw",
            "CRONOQ_PORT": "tcp://10.0.0.1:50051",
        },
    )
    assert result.code == 0, result.err
    assert "filepw" not in result.out + result.err and "envpw" not in result.out + result.err
    assert "querypw" not in result.out + result.err
    assert (
        'dsn = "postgresql://app:***@db/jobs?password=***"  # env CRONOQ_STORE__DSN' in result.out
    )
    assert f'kind = "postgres"  # {config}' in result.out
    assert result.err == "cronoq-server: note: CRONOQ_PORT is not a setting, ignored\n"


async def test_check_config_lists_every_problem_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text("retention_s = 0\n[store]\nlease_ttl = 3\n")
    result = await cronoq_server(
        "check-config",
        "--config",
        str(config),
        cwd=tmp_path,
        env={"CRONOQ_STORE__KIND": "postgres", "CRONOQ_STORE__DSN": "mysql://u:pw@h/d"},
    )
    assert (result.code, result.out) == (2, "")
    assert result.err.splitlines() == [
        "cronoq-server: invalid configuration (3 problems):",
        f"  store.lease_ttl = 3 (from {config}): unknown key; the keys of [store] are: "
        "busy_timeout_s, command_timeout_s, dsn, full_sync, journal_size_limit, keepalive_s, "
        "kind, lease_renew_s, lease_ttl_s, lock_poll_s, lock_timeout_s, migrate, outbox, "
        "outbox_poll_s, path, pool_size, prune_batch, prune_interval_s, schema, "
        "session_timeout_s",
        f"  retention_s = 0 (from {config}): must be a number of seconds > 0 and at most "
        "316224000 (ten years)",
        "  store.dsn = 'mysql://u:***@h/d' (from env CRONOQ_STORE__DSN): must be a URI "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
    ]


async def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert (await cronoq_server(cwd=tmp_path)).code == 2
    assert (await cronoq_server("frobnicate", cwd=tmp_path)).code == 2
    result = await cronoq_server("--help", cwd=tmp_path)
    assert result.code == 0
    assert "check-config" in result.out and "migrate" in result.out and "serve" in result.out


# --- serve ----------------------------------------------------------------------------------


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    raw = await reader.read(-1)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


async def test_serve_without_configuration_leads_and_stops_on_sigterm(tmp_path: Path) -> None:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    process = await asyncio.create_subprocess_exec(
        COMMAND,
        "serve",
        cwd=tmp_path,
        env={**base, "CRONOQ_LISTEN__GRPC": "127.0.0.1:0", "CRONOQ_LISTEN__HTTP": "127.0.0.1:0"},
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stderr is not None
    try:
        lines: list[str] = []
        async with asyncio.timeout(20):
            # Ready once the leader's gRPC server alone holds the port (logged after the swap).
            while not any('msg="serving" role=leading' in line for line in lines):
                lines.append((await process.stderr.readline()).decode())
                assert lines[-1], f"serve exited: {lines}"
        (listening,) = (line for line in lines if 'msg="listening"' in line)
        found = re.search(r"http_port=(\d+)", listening)
        assert found is not None, listening
        port = int(found[1])
        async with asyncio.timeout(10):
            assert await http_get(port, "/healthz") == (200, b'{"status":"alive"}')
            status, body = await http_get(port, "/readyz")
            assert (status, json.loads(body)) == (200, {"ready": True, "reason": "leading"})
            status, body = await http_get(port, "/metrics")
        assert status == 200
        assert re.search(rb"^cronoq_leader 1\.0$", body, re.MULTILINE)
        assert (tmp_path / "cronoq.db").is_file()
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            rest = (await process.stderr.read()).decode()
            assert await process.wait() == 0
        assert 'msg="draining"' in rest and 'msg="stopped"' in rest
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# --- migrate: SQLite ------------------------------------------------------------------------


async def test_migrate_without_configuration_creates_cronoq_db(tmp_path: Path) -> None:
    result = await cronoq_server("migrate", cwd=tmp_path)
    assert result.code == 0, result.err
    assert result.out == "cronoq-server migrate: the sqlite store's schema is up to date\n"
    database = tmp_path / "cronoq.db"
    assert sqlite_tables(database) >= TABLES
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    again = await cronoq_server("migrate", cwd=tmp_path)
    assert again.code == 0, again.err


async def test_migrate_sqlite_at_a_configured_path(tmp_path: Path) -> None:
    database = tmp_path / "data" / "jobs.db"
    database.parent.mkdir()
    config = tmp_path / "server.toml"
    config.write_text(f'[store]\nkind = "sqlite"\npath = "{database}"\nfull_sync = false\n')
    result = await cronoq_server("migrate", "--config", str(config), cwd=tmp_path)
    assert result.code == 0, result.err
    assert sqlite_tables(database) >= TABLES
    assert not (tmp_path / "cronoq.db").exists()


async def test_migrate_refuses_an_invalid_configuration(tmp_path: Path) -> None:
    result = await cronoq_server(
        "migrate", cwd=tmp_path, env={"CRONOQ_STORE__PATH": str(tmp_path / "no" / "x.db")}
    )
    assert result.code == 2
    assert result.err.splitlines()[1] == (
        f"  store.path = '{tmp_path}/no/x.db' (from env CRONOQ_STORE__PATH): must be in an "
        f"existing directory, and {tmp_path}/no is none"
    )


async def test_migrate_a_file_that_is_not_a_database_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "cronoq.db").write_bytes(b"this is not a database" * 100)
    result = await cronoq_server("migrate", cwd=tmp_path)
    assert result.code == 1
    assert result.out == ""
    (line,) = result.err.splitlines()
    assert line.startswith("cronoq-server migrate: ")
    assert "not a SQLite database" in line


async def test_migrate_memory_has_nothing_to_do(tmp_path: Path) -> None:
    result = await cronoq_server("migrate", cwd=tmp_path, env={"CRONOQ_STORE__KIND": "memory"})
    assert (result.code, result.err) == (0, "")
    assert not (tmp_path / "cronoq.db").exists()


# --- migrate: PostgreSQL --------------------------------------------------------------------


async def test_migrate_postgres_creates_the_schema(tmp_path: Path, pg_schema: str) -> None:
    env = {
        "CRONOQ_STORE__KIND": "postgres",
        "CRONOQ_STORE__DSN": PG_DSN,
        "CRONOQ_STORE__SCHEMA": pg_schema,
        "CRONOQ_STORE__SESSION_TIMEOUT_S": "5",
    }
    assert await pg_tables(pg_schema) == set()
    result = await cronoq_server("migrate", cwd=tmp_path, env=env)
    assert result.code == 0, result.err
    assert result.out == (
        f"cronoq-server migrate: the schema {pg_schema!r} was migrated from version 0 to "
        f"{PG_SCHEMA_VERSION}\n"
    )
    assert await pg_tables(pg_schema) >= TABLES
    again = await cronoq_server("migrate", cwd=tmp_path, env=env)
    assert again.code == 0, again.err
    assert again.out == (
        f"cronoq-server migrate: the schema {pg_schema!r} is up to date ({PG_SCHEMA_VERSION})\n"
    )


async def test_migrate_postgres_migrates_though_serve_is_told_never_to(
    tmp_path: Path, pg_schema: str
) -> None:
    """store.migrate = "never" is for the replicas (`serve`); `migrate` is the step that does."""
    config = tmp_path / "server.toml"
    config.write_text(
        f'[store]\nkind = "postgres"\ndsn = "{PG_DSN}"\nschema = "{pg_schema}"\nmigrate = "never"\n'
    )
    result = await cronoq_server("migrate", "--config", str(config), cwd=tmp_path)
    assert result.code == 0, result.err
    assert await pg_tables(pg_schema) >= TABLES


async def test_migrate_postgres_through_a_config_file(tmp_path: Path, pg_schema: str) -> None:
    config = tmp_path / "server.toml"
    config.write_text(
        f'[store]\nkind = "postgres"\ndsn = "{PG_DSN}"\nschema = "{pg_schema}"\npool_size = 1\n'
    )
    result = await cronoq_server("migrate", "--config", str(config), cwd=tmp_path)
    assert result.code == 0, result.err
    assert await pg_tables(pg_schema) >= TABLES


async def test_migrate_unreachable_postgres_fails_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on, once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = await cronoq_server(
        "migrate",
        cwd=tmp_path,
        env={
            "CRONOQ_STORE__KIND": "postgres",
            "CRONOQ_STORE__DSN": f"postgresql://app:hunter2@127.0.0.1:{port}/x",
            "CRONOQ_STORE__SESSION_TIMEOUT_S": "2",
        },
    )
    assert result.code == 1
    (line,) = result.err.splitlines()
    assert line.startswith("cronoq-server migrate: Unavailable: ")
    assert "hunter2" not in line


def test_serve_raises_the_collectors_thresholds() -> None:
    before = gc.get_threshold()
    try:
        tune_collector()
        assert gc.get_threshold() == SERVE_GC_THRESHOLDS
        assert SERVE_GC_THRESHOLDS[0] > before[0]  # fewer young collections than the default
    finally:
        gc.set_threshold(*before)


def test_serve_runs_on_uvloop_unless_told_otherwise() -> None:
    import uvloop  # a dependency of cronoq-server on this platform

    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop_factory("asyncio") is None


async def test_version(tmp_path: Path) -> None:
    result = await cronoq_server("--version", cwd=tmp_path)
    assert result.code == 0, result.err
    expected = (
        f"cronoq-server {metadata.version('cronoq-server')} "
        f"(cronoq {metadata.version('cronoq')}, cronoq-client {metadata.version('cronoq-client')})"
    )
    assert result.out.strip() == expected
