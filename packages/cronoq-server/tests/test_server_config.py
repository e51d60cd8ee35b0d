"""ServerConfig from TOML and the environment: precedence, defaults, and every invalid setting's
message (key, source, value, what is allowed)."""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from cronoq import Limit
from cronoq_server import (
    Address,
    ConfigError,
    MemoryStoreSettings,
    PoolSettings,
    PostgresStoreSettings,
    ServerConfig,
    SqliteStoreSettings,
    TlsSettings,
    load_config,
    mask_dsn,
    render_config,
)
from cronoq_server._config import has_outbox, remote_pools, task_limits
from cronoq_store_postgres import PgStoreConfig
from cronoq_store_sqlite import SqliteStoreConfig

DAY = 24 * 3600.0


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "server.toml"
    path.write_text(text)
    return path


def problems(path: Path | None = None, /, **environ: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ)
    assert str(caught.value) == "\n".join(str(issue) for issue in caught.value.issues)
    return [str(issue) for issue in caught.value.issues]


def only_problem(path: Path | None = None, /, **environ: str) -> str:
    (problem,) = problems(path, **environ)
    return problem


# --- defaults and precedence ----------------------------------------------------------------


def test_no_configuration_at_all_is_the_embedded_default() -> None:
    config = load_config(None, {})
    assert config == ServerConfig()
    assert config.store == SqliteStoreSettings("./cronoq.db", SqliteStoreConfig())
    assert config.pools == (PoolSettings("default", 1000, None, 30.0),)
    assert config.listen.grpc == Address("127.0.0.1", 50051)
    assert str(config.listen.http) == "127.0.0.1:8080"
    assert config.keep_finished_s == 7 * DAY
    assert config.store.options.keep_finished == 7 * DAY
    assert (config.retention_s, config.commit_timeout_s, config.drain_timeout_s) == (3600, 30, 30)
    assert config.limits.max_message_bytes == 4 * 1024 * 1024
    assert config.tls is None
    assert (config.logging.format, config.logging.level) == ("keyvalue", "info")
    assert set(config.origins.values()) == {"default"}


def test_toml_sets_everything_and_env_wins(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        keep_finished_s = 172800
        retention_s = 600.5
        commit_timeout_s = 5
        drain_timeout_s = 0
        [store]
        kind = "sqlite"
        path = "{tmp_path / "x.db"}"
        full_sync = false
        lease_ttl_s = 20
        prune_batch = 10
        [listen]
        grpc = "0.0.0.0:0"
        http = "[::1]:9090"
        [auth]
        insecure = true
        [limits]
        max_message_bytes = 1048576
        [logging]
        format = "json"
        level = "debug"
        [[pools]]
        name = "emails"
        concurrency = 50
        max_live = 1000
        lease_s = 5
        [[pools]]
        name = "reports"
        """,
    )
    environ = {
        "CRONOQ_RETENTION_S": "60",
        "CRONOQ_STORE__LEASE_TTL_S": "12.5",
        "CRONOQ_STORE__FULL_SYNC": "TRUE",
        "CRONOQ_LISTEN__HTTP": "127.0.0.1:0",
        "CRONOQ_LOGGING__LEVEL": "WARNING",
        "OTHER": "ignored",
    }
    config = load_config(path, environ)
    assert config.keep_finished_s == 2 * DAY
    assert config.retention_s == 60.0
    assert config.commit_timeout_s == 5.0
    assert config.drain_timeout_s == 0.0
    assert config.store == SqliteStoreSettings(
        str(tmp_path / "x.db"),
        SqliteStoreConfig(full_sync=True, lease_ttl=12.5, prune_batch=10, keep_finished=2 * DAY),
    )
    assert config.listen.grpc == Address("0.0.0.0", 0)
    assert config.listen.http == Address("127.0.0.1", 0)
    assert config.limits.max_message_bytes == 1024 * 1024
    assert config.logging == dataclasses.replace(config.logging, format="json", level="warning")
    assert config.pools == (PoolSettings("emails", 50, 1000, 5.0), PoolSettings("reports"))
    assert config.origins["retention_s"] == "env CRONOQ_RETENTION_S"
    assert config.origins["keep_finished_s"] == str(path)
    assert config.origins["store.prune_batch"] == str(path)
    assert config.origins["store.lease_ttl_s"] == "env CRONOQ_STORE__LEASE_TTL_S"


def test_env_alone_configures_postgres() -> None:
    config = load_config(
        None,
        {
            "CRONOQ_STORE__KIND": "postgres",
            "CRONOQ_STORE__DSN": "postgresql://cronoq:s3cret@db:5432/jobs",
            "CRONOQ_STORE__SCHEMA": "tenant_a",
            "CRONOQ_STORE__SESSION_TIMEOUT_S": "4",
            "CRONOQ_STORE__POOL_SIZE": "8",
            "CRONOQ_KEEP_FINISHED_S": "86400",
        },
    )
    assert config.store == PostgresStoreSettings(
        "postgresql://cronoq:s3cret@db:5432/jobs",
        PgStoreConfig(schema="tenant_a", session_timeout=4.0, pool_size=8, keep_finished=DAY),
    )
    assert "s3cret" not in repr(config)


def test_the_outbox_is_ingested_unless_turned_off_from_the_file_or_the_environment(
    tmp_path: Path,
) -> None:
    """The outbox (docs/outbox.md) is a PostgreSQL store's: on by default, off with
    ``store.outbox = false``, polled every ``outbox_poll_s`` when no notification came."""
    pg = {"CRONOQ_STORE__KIND": "postgres", "CRONOQ_STORE__DSN": "postgresql://h/d"}
    default = load_config(None, pg)
    assert isinstance(default.store, PostgresStoreSettings)
    assert (default.store.options.outbox, default.store.options.outbox_poll) == (True, 1.0)
    assert has_outbox(default)
    path = write(tmp_path, "[store]\noutbox = false\noutbox_poll_s = 0.25\n")
    from_file = load_config(path, pg)
    assert isinstance(from_file.store, PostgresStoreSettings)
    assert (from_file.store.options.outbox, from_file.store.options.outbox_poll) == (False, 0.25)
    assert not has_outbox(from_file)
    assert from_file.origins["store.outbox"] == str(path)
    from_env = load_config(path, {**pg, "CRONOQ_STORE__OUTBOX": "true"})
    assert has_outbox(from_env) and from_env.origins["store.outbox"] == "env CRONOQ_STORE__OUTBOX"
    rendered = render_config(from_env)
    assert "outbox = true  # env CRONOQ_STORE__OUTBOX" in rendered
    assert f"outbox_poll_s = 0.25  # {path}" in rendered
    # Only PostgreSQL's store has one.
    assert not has_outbox(load_config(None, {}))
    sqlite_keys = (
        "busy_timeout_s, full_sync, journal_size_limit, kind, lease_renew_s, lease_ttl_s, "
        "lock_poll_s, path, prune_batch, prune_interval_s"
    )
    assert problems(path) == [
        f"store.{key} (from {path}): applies to store.kind = 'postgres', and store.kind = "
        f"'sqlite' (from default); the keys of that kind are: {sqlite_keys}"
        for key in ("outbox = false", "outbox_poll_s = 0.25")
    ]


def test_memory_store_gets_keep_finished() -> None:
    config = load_config(None, {"CRONOQ_STORE__KIND": "memory", "CRONOQ_KEEP_FINISHED_S": "7200"})
    assert config.store == MemoryStoreSettings(7200.0)


def test_every_setting_of_the_store_configs_has_a_key(tmp_path: Path) -> None:
    """A field a store adds to its config is configurable at once, named after the field."""
    for kind, cls, extra in (
        ("sqlite", SqliteStoreConfig, ""),
        ("postgres", PgStoreConfig, 'dsn = "postgresql://h/d"\n'),
    ):
        text = ""
        expected: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "keep_finished":
                continue
            default = getattr(cls(), f.name)
            key = f"{f.name}_s" if isinstance(default, float) else f.name
            value = (not default) if isinstance(default, bool) else default * 2
            if f.name in ("lease_renew", "keepalive"):
                value = default  # doubling would break the rule that it is the shorter one
            if isinstance(default, str):
                value = default + "_x"
            if f.name == "migrate":
                value = "never"  # a choice: the other one
            text += f"{key} = {value!r}\n".replace("True", "true").replace("False", "false")
            expected[f.name] = value
        path = write(tmp_path, f'[store]\nkind = "{kind}"\n{extra}{text}'.replace("'", '"'))
        config = load_config(path, {})
        assert isinstance(config.store, SqliteStoreSettings | PostgresStoreSettings)
        assert config.store.options == cls(**expected, keep_finished=7 * DAY)


def test_pools_from_env_replace_the_file_s_pools(tmp_path: Path) -> None:
    path = write(tmp_path, '[[pools]]\nname = "a"\n[[pools]]\nname = "b"\n')
    config = load_config(
        path,
        {"CRONOQ_POOLS": '[{"name": "c", "concurrency": 7, "max_live": null, "lease_s": 2.5}]'},
    )
    assert config.pools == (PoolSettings("c", 7, None, 2.5),)
    assert config.origins["pools"] == "env CRONOQ_POOLS"


def test_unrelated_cronoq_variables_are_ignored_and_listed() -> None:
    """Kubernetes defines CRONOQ_PORT and such for a service called cronoq."""
    config = load_config(
        None,
        {"CRONOQ_PORT": "tcp://10.0.0.1:50051", "CRONOQ_SERVICE_HOST": "10.0.0.1", "CRONOQX": "1"},
    )
    assert config == ServerConfig()
    assert config.ignored_env == ("CRONOQ_PORT", "CRONOQ_SERVICE_HOST")


def test_tls_both_files(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("cert")
    (tmp_path / "k.pem").write_text("key")
    config = load_config(
        None,
        {"CRONOQ_TLS__CERT": str(tmp_path / "c.pem"), "CRONOQ_TLS__KEY": str(tmp_path / "k.pem")},
    )
    assert config.tls == TlsSettings(str(tmp_path / "c.pem"), str(tmp_path / "k.pem"))


def test_the_effective_configuration_reloads_as_itself(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("cert")
    environ = {
        "CRONOQ_STORE__KIND": "postgres",
        "CRONOQ_STORE__DSN": "postgresql://cronoq@db/jobs",
        "CRONOQ_STORE__LOCK_POLL_S": "0.25",
        "CRONOQ_POOLS": '[{"name": "a", "max_live": 5}, {"name": "b\\"q"}]',
        "CRONOQ_TLS__CERT": str(tmp_path / "c.pem"),
        "CRONOQ_TLS__KEY": str(tmp_path / "c.pem"),
        "CRONOQ_LISTEN__GRPC": "[::]:50051",
        "CRONOQ_AUTH__INSECURE": "true",
    }
    config = load_config(None, environ)
    rendered = render_config(config)
    assert "# env CRONOQ_STORE__LOCK_POLL_S" in rendered
    assert load_config(write(tmp_path, rendered), {}) == config


def test_the_rendered_dsn_is_masked() -> None:
    config = load_config(
        None,
        {
            "CRONOQ_STORE__KIND": "postgres",
            "CRONOQ_STORE__DSN": "postgresql://u:pw1@h/d?sslmode=require&password=pw2",
        },
    )
    rendered = render_config(config)
    assert "pw1" not in rendered and "pw2" not in rendered
    assert 'dsn = "postgresql://u:***@h/d?sslmode=require&password=***"' in rendered


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("postgresql://u:p@h/d", "postgresql://u:***@h/d"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("postgres://u:p:q@h1:5432,h2:5433/d", "postgres://u:***@h1:5432,h2:5433/d"),
        ("postgresql://h/d?password=x&user=u", "postgresql://h/d?password=***&user=u"),
        ("postgresql://u:p@[::1]:99999999/d", "postgresql://u:***@[::1]:99999999/d"),
    ],
)
def test_mask_dsn(dsn: str, masked: str) -> None:
    assert mask_dsn(dsn) == masked


# --- invalid settings -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        (
            "CRONOQ_KEEP_FINISHED_S", "7d",
            "keep_finished_s = '7d' (from env CRONOQ_KEEP_FINISHED_S): must be a number of "
            "seconds > 0 and at most 316224000 (ten years)",
        ),
        (
            "CRONOQ_RETENTION_S", "0",
            "retention_s = '0' (from env CRONOQ_RETENTION_S): must be a number of seconds > 0 "
            "and at most 316224000 (ten years)",
        ),
        (
            "CRONOQ_COMMIT_TIMEOUT_S", "nan",
            "commit_timeout_s = 'nan' (from env CRONOQ_COMMIT_TIMEOUT_S): must be a number of "
            "seconds > 0 and at most 316224000 (ten years)",
        ),
        (
            "CRONOQ_DRAIN_TIMEOUT_S", "-1",
            "drain_timeout_s = '-1' (from env CRONOQ_DRAIN_TIMEOUT_S): must be a number of "
            "seconds >= 0 and at most 316224000 (ten years)",
        ),
        (
            "CRONOQ_DRAIN_TIMEOUT_S", "1e999",
            "drain_timeout_s = '1e999' (from env CRONOQ_DRAIN_TIMEOUT_S): must be a number of "
            "seconds >= 0 and at most 316224000 (ten years)",
        ),
        (
            "CRONOQ_STORE__KIND", "mysql",
            "store.kind = 'mysql' (from env CRONOQ_STORE__KIND): must be one of 'memory', "
            "'sqlite', 'postgres'",
        ),
        (
            "CRONOQ_STORE__PATH", "",
            "store.path = '' (from env CRONOQ_STORE__PATH): must be a non-empty string without "
            "NUL characters",
        ),
        (
            "CRONOQ_STORE__PATH", ":memory:",
            "store.path = ':memory:' (from env CRONOQ_STORE__PATH): must be a file path; for a "
            "store in memory set store.kind = 'memory'",
        ),
        (
            "CRONOQ_STORE__PATH", "/nonexistent-dir/cronoq.db",
            "store.path = '/nonexistent-dir/cronoq.db' (from env CRONOQ_STORE__PATH): must be in "
            "an existing directory, and /nonexistent-dir is none",
        ),
        (
            "CRONOQ_STORE__PATH", "/",
            "store.path = '/' (from env CRONOQ_STORE__PATH): is a directory; it must name the "
            "database file",
        ),
        (
            "CRONOQ_STORE__FULL_SYNC", "yes",
            "store.full_sync = 'yes' (from env CRONOQ_STORE__FULL_SYNC): must be true or false",
        ),
        (
            "CRONOQ_STORE__LOCK_POLL_S", "0.5s",
            "store.lock_poll_s = '0.5s' (from env CRONOQ_STORE__LOCK_POLL_S): must be a number of "
            "seconds > 0 and at most 316224000 (ten years)",
        ),
        (
            "CRONOQ_STORE__PRUNE_BATCH", "1.5",
            "store.prune_batch = '1.5' (from env CRONOQ_STORE__PRUNE_BATCH): must be an integer "
            "from 1 to 9223372036854775807",
        ),
        (
            "CRONOQ_STORE__JOURNAL_SIZE_LIMIT", " 10",
            "store.journal_size_limit = ' 10' (from env CRONOQ_STORE__JOURNAL_SIZE_LIMIT): must be "
            "an integer from 1 to 9223372036854775807",
        ),
        (
            "CRONOQ_STORE__LEASE_RENEW_S", "10",
            "store.lease_renew_s and store.lease_ttl_s (from env CRONOQ_STORE__LEASE_RENEW_S, "
            "default): lease_renew (10.0s) must be shorter than lease_ttl (10.0s), or the lease "
            "expires between renewals",
        ),
        (
            "CRONOQ_LISTEN__GRPC", "50051",
            "listen.grpc = '50051' (from env CRONOQ_LISTEN__GRPC): must be HOST:PORT with a port "
            "from 0 (any free port) to 65535, e.g. 0.0.0.0:8080",
        ),
        (
            "CRONOQ_LISTEN__HTTP", "localhost:65536",
            "listen.http = 'localhost:65536' (from env CRONOQ_LISTEN__HTTP): must be HOST:PORT "
            "with a port from 0 (any free port) to 65535, e.g. 0.0.0.0:8080",
        ),
        (
            "CRONOQ_LISTEN__HTTP", "127.0.0.1:50051",
            "listen.http = '127.0.0.1:50051' (from env CRONOQ_LISTEN__HTTP): must differ from "
            "listen.grpc (from default): the two servers cannot share a port",
        ),
        (
            "CRONOQ_LIMITS__MAX_MESSAGE_BYTES", "4MiB",
            "limits.max_message_bytes = '4MiB' (from env CRONOQ_LIMITS__MAX_MESSAGE_BYTES): must "
            "be an integer from 1024 to 2147483647",
        ),
        (
            "CRONOQ_LIMITS__MAX_MESSAGE_BYTES", "2147483648",
            "limits.max_message_bytes = '2147483648' (from env CRONOQ_LIMITS__MAX_MESSAGE_BYTES): "
            "must be an integer from 1024 to 2147483647",
        ),
        (
            "CRONOQ_LOGGING__FORMAT", "text",
            "logging.format = 'text' (from env CRONOQ_LOGGING__FORMAT): must be one of "
            "'keyvalue', 'json'",
        ),
        (
            "CRONOQ_RUNTIME__EVENT_LOOP", "trio",
            "runtime.event_loop = 'trio' (from env CRONOQ_RUNTIME__EVENT_LOOP): must be one of "
            "'auto', 'uvloop', 'asyncio'",
        ),
        (
            "CRONOQ_LOGGING__LEVEL", "verbose",
            "logging.level = 'verbose' (from env CRONOQ_LOGGING__LEVEL): must be one of 'debug', "
            "'info', 'warning', 'error', 'critical'",
        ),
        (
            "CRONOQ_STORE__DNS", "postgresql://h/d",
            "store.dns = 'postgresql://h/d' (from env CRONOQ_STORE__DNS): unknown key; the keys "
            "of [store] are: busy_timeout_s, command_timeout_s, dsn, full_sync, "
            "journal_size_limit, keepalive_s, kind, lease_renew_s, lease_ttl_s, lock_poll_s, "
            "lock_timeout_s, migrate, outbox, outbox_poll_s, path, pool_size, prune_batch, "
            "prune_interval_s, schema, session_timeout_s",
        ),
        (
            "CRONOQ_STORE", "sqlite",
            "store = 'sqlite' (from env CRONOQ_STORE): is a table: set its keys as "
            "CRONOQ_STORE__KEY",
        ),
        (
            "CRONOQ_LISTEN__GRPC__PORT", "1",
            "listen.grpc.port = '1' (from env CRONOQ_LISTEN__GRPC__PORT): unknown key; the keys "
            "of [listen] are: grpc, http",
        ),
        (
            "CRONOQ_SERVER__PORT", "1",
            "server.port = '1' (from env CRONOQ_SERVER__PORT): unknown key; the top-level keys "
            "are: commit_timeout_s, drain_timeout_s, keep_finished_s, pools, retention_s, "
            "task_limits; the sections: auth, limits, listen, logging, runtime, store, tls, "
            "tracing",
        ),
        (
            "CRONOQ_POOLS__0__NAME", "a",
            "pools = 'a' (from env CRONOQ_POOLS__0__NAME): pools come from the environment only "
            'as one JSON list in CRONOQ_POOLS, e.g. [{"name": "default", "concurrency": 100}]',
        ),
        (
            "CRONOQ_POOLS", "[{name: 'a'}]",
            "pools = \"[{name: 'a'}]\" (from env CRONOQ_POOLS): is not valid JSON: Expecting "
            "property name enclosed in double quotes: line 1 column 3 (char 2)",
        ),
        (
            "CRONOQ_POOLS", '{"name": "a"}',
            "pools = '{\"name\": \"a\"}' (from env CRONOQ_POOLS): must be a JSON list of objects, "
            'e.g. [{"name": "default"}]',
        ),
        ("CRONOQ_POOLS", "[]", "pools = '[]' (from env CRONOQ_POOLS): must list at least one pool"),
        (
            "CRONOQ_POOLS", '[{"concurrency": 1}]',
            "pools[0].name (from env CRONOQ_POOLS): is required: every pool has one",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "a", "size": 1}]',
            "pools[0].size = 1 (from env CRONOQ_POOLS): unknown key; the keys of a pool are: "
            "concurrency, lease_s, limits, max_live, name",
        ),
        (
            "CRONOQ_POOLS", '[{"name": ""}]',
            "pools[0].name = '' (from env CRONOQ_POOLS): must be a non-empty string without NUL "
            "characters",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "a\\u0000"}]',
            "pools[0].name = 'a\\x00' (from env CRONOQ_POOLS): must be a non-empty string without "
            "NUL characters",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "\\ud800"}]',
            "pools[0].name = '\\ud800' (from env CRONOQ_POOLS): must be valid Unicode (it has a "
            "lone surrogate)",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "' + "p" * 256 + '"}]',
            "pools[0].name = '" + "p" * 59 + "... (258 characters) (from env CRONOQ_POOLS): must "
            "be at most 255 characters",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "a"}, {"name": "a"}]',
            "pools[1].name = 'a' (from env CRONOQ_POOLS): must be unique, and pools[0] has it too",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "a", "concurrency": true}]',
            "pools[0].concurrency = true (from env CRONOQ_POOLS): must be an integer from 1 to "
            "1000000",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "a", "concurrency": 1000001}]',
            "pools[0].concurrency = 1000001 (from env CRONOQ_POOLS): must be an integer from 1 to "
            "1000000",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "a", "max_live": 0}]',
            "pools[0].max_live = 0 (from env CRONOQ_POOLS): must be an integer from 1 to "
            "1099511627776",
        ),
        (
            "CRONOQ_POOLS", '[{"name": "a", "lease_s": "30"}]',
            "pools[0].lease_s = '30' (from env CRONOQ_POOLS): must be a number of seconds > 0 and "
            "at most 316224000 (ten years)",
        ),
    ],
)  # fmt: skip
def test_each_invalid_setting_from_env(name: str, value: str, expected: str) -> None:
    assert only_problem(**{name: value}) == expected


def test_retention_longer_than_keep_finished(tmp_path: Path) -> None:
    path = write(tmp_path, "keep_finished_s = 60\n")
    assert only_problem(path, CRONOQ_RETENTION_S="120") == (
        f"keep_finished_s = 60.0 (from {path}): must be at least retention_s = 120.0 (from env "
        "CRONOQ_RETENTION_S): recovery relies on finished tasks of the retention window still "
        "being in the store"
    )


def test_postgres_settings() -> None:
    pg = {"CRONOQ_STORE__KIND": "postgres"}
    assert only_problem(**pg) == (
        "store.dsn (not set): is required with store.kind = 'postgres': set dsn in [store], or "
        "CRONOQ_STORE__DSN, to postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
    )
    pg["CRONOQ_STORE__DSN"] = "mysql://root:hunter2@h/d"
    assert only_problem(**pg) == (
        "store.dsn = 'mysql://root:***@h/d' (from env CRONOQ_STORE__DSN): must be a URI "
        "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
    )
    pg["CRONOQ_STORE__DSN"] = "postgresql://root:hunter2@h:port/d"
    assert only_problem(**pg) == (
        "store.dsn = 'postgresql://root:***@h:port/d' (from env CRONOQ_STORE__DSN): is not a "
        "valid URI (Port could not be cast to integer value as 'port')"
    )
    pg["CRONOQ_STORE__DSN"] = "postgresql://h/d"
    assert only_problem(**pg, CRONOQ_STORE__KEEPALIVE_S="10") == (
        "store.keepalive_s and store.session_timeout_s (from env CRONOQ_STORE__KEEPALIVE_S, "
        "default): keepalive (10.0s) must be shorter than session_timeout (10.0s)"
    )
    assert only_problem(**pg, CRONOQ_STORE__SCHEMA="s" * 64) == (
        f"store.schema = '{'s' * 64}' (from env CRONOQ_STORE__SCHEMA): schema "
        f"'{'s' * 64}' is longer than PostgreSQL's 63 bytes"
    )
    assert only_problem(**pg, CRONOQ_STORE__MIGRATE="sometimes") == (
        "store.migrate = 'sometimes' (from env CRONOQ_STORE__MIGRATE): migrate must be 'auto' "
        "or 'never', got 'sometimes'"
    )
    assert only_problem(**pg, CRONOQ_STORE__OUTBOX="yes") == (
        "store.outbox = 'yes' (from env CRONOQ_STORE__OUTBOX): must be true or false"
    )
    assert only_problem(**pg, CRONOQ_STORE__OUTBOX_POLL_S="0") == (
        "store.outbox_poll_s = '0' (from env CRONOQ_STORE__OUTBOX_POLL_S): must be a number of "
        "seconds > 0 and at most 316224000 (ten years)"
    )
    assert only_problem(**pg, CRONOQ_STORE__PATH="x.db") == (
        "store.path = 'x.db' (from env CRONOQ_STORE__PATH): applies to store.kind = 'sqlite', "
        "and store.kind = 'postgres' (from env CRONOQ_STORE__KIND); the keys of that kind are: "
        "command_timeout_s, dsn, keepalive_s, kind, lock_poll_s, lock_timeout_s, migrate, "
        "outbox, outbox_poll_s, pool_size, prune_batch, prune_interval_s, schema, "
        "session_timeout_s"
    )


def test_store_keys_of_another_kind(tmp_path: Path) -> None:
    path = write(tmp_path, '[store]\nkind = "memory"\nlock_poll_s = 1\n')
    assert only_problem(path) == (
        f"store.lock_poll_s = 1 (from {path}): applies to store.kind = 'sqlite' or 'postgres', "
        f"and store.kind = 'memory' (from {path}); the keys of that kind are: kind"
    )


def test_toml_types_are_strict(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        retention_s = "60"
        commit_timeout_s = true
        drain_timeout_s = inf
        [store]
        full_sync = 1
        prune_batch = 2.0
        [listen]
        grpc = 50051
        [logging]
        level = 20
        """,
    )
    source = f"(from {path})"
    seconds = "must be a number of seconds"
    assert problems(path) == [
        f"retention_s = '60' {source}: {seconds} > 0 and at most 316224000 (ten years)",
        f"commit_timeout_s = true {source}: {seconds} > 0 and at most 316224000 (ten years)",
        f"drain_timeout_s = inf {source}: {seconds} >= 0 and at most 316224000 (ten years)",
        f"store.full_sync = 1 {source}: must be true or false",
        f"store.prune_batch = 2.0 {source}: must be an integer from 1 to 9223372036854775807",
        f"listen.grpc = 50051 {source}: must be a non-empty string without NUL characters",
        f"logging.level = 20 {source}: must be one of 'debug', 'info', 'warning', 'error', "
        "'critical'",
    ]


def test_unknown_keys_in_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        keep_finished = 1
        [store]
        lock_poll = 0.5
        [store.sqlite]
        path = "x"
        [tls]
        certificate = "x"
        [[pools]]
        name = "a"
        concurency = 3
        """,
    )
    assert problems(path) == [
        f"keep_finished = 1 (from {path}): unknown key; the top-level keys are: "
        "commit_timeout_s, drain_timeout_s, keep_finished_s, pools, retention_s, task_limits; "
        "the sections: auth, limits, listen, logging, runtime, store, tls, tracing",
        f"store.lock_poll = 0.5 (from {path}): unknown key; the keys of [store] are: "
        "busy_timeout_s, command_timeout_s, dsn, full_sync, journal_size_limit, keepalive_s, "
        "kind, lease_renew_s, lease_ttl_s, lock_poll_s, lock_timeout_s, migrate, outbox, "
        "outbox_poll_s, path, pool_size, prune_batch, prune_interval_s, schema, session_timeout_s",
        f"store.sqlite = {{'path': 'x'}} (from {path}): unknown key; the keys of [store] are: "
        "busy_timeout_s, command_timeout_s, dsn, full_sync, journal_size_limit, keepalive_s, "
        "kind, lease_renew_s, lease_ttl_s, lock_poll_s, lock_timeout_s, migrate, outbox, "
        "outbox_poll_s, path, pool_size, prune_batch, prune_interval_s, schema, session_timeout_s",
        f"tls.certificate = 'x' (from {path}): unknown key; the keys of [tls] are: cert, "
        "client_ca, key, require_client_auth",
        f"pools[0].concurency = 3 (from {path}): unknown key; the keys of a pool are: "
        "concurrency, lease_s, limits, max_live, name",
    ]


def test_sections_and_pools_of_the_wrong_shape(tmp_path: Path) -> None:
    path = write(tmp_path, 'store = "sqlite"\npools = ["a"]\n')
    assert problems(path) == [
        f"store = 'sqlite' (from {path}): must be a table: [store]",
        f"pools = ['a'] (from {path}): must be an array of tables: [[pools]] with name = ...",
    ]
    path = write(tmp_path, "pools = []\n")
    assert only_problem(path) == f"pools = [] (from {path}): must list at least one pool"


def test_the_file_itself(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    assert only_problem(missing) == (
        f"--config (from {missing}): cannot read the file: No such file or directory"
    )
    broken = write(tmp_path, "[store\nkind = 1\n")
    message = only_problem(broken)
    assert message.startswith(f"--config (from {broken}): is not valid TOML: ")
    assert "line 1" in message
    assert (
        only_problem(tmp_path)
        == f"--config (from {tmp_path}): cannot read the file: Is a directory"
    )


def test_tls_both_or_neither(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    assert only_problem(CRONOQ_TLS__CERT=str(cert)) == (
        "tls.key (not set): is required because tls.cert is set (from env CRONOQ_TLS__CERT): set "
        "both tls.cert and tls.key, or neither"
    )
    assert only_problem(CRONOQ_TLS__CERT="/nonexistent.pem", CRONOQ_TLS__KEY=str(cert)) == (
        "tls.cert = '/nonexistent.pem' (from env CRONOQ_TLS__CERT): must be a readable file: "
        "No such file or directory"
    )
    path = write(tmp_path, f'[tls]\nkey = "{cert}"\n')
    assert only_problem(path) == (
        f"tls.cert (not set): is required because tls.key is set (from {path}): set both "
        "tls.cert and tls.key, or neither"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_tls_files_must_be_readable(tmp_path: Path) -> None:
    key = tmp_path / "key.pem"
    key.write_text("x")
    key.chmod(0)
    assert problems(CRONOQ_TLS__CERT=str(key), CRONOQ_TLS__KEY=str(key))[0] == (
        f"tls.cert = '{key}' (from env CRONOQ_TLS__CERT): must be a readable file: "
        "Permission denied"
    )


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "retention_s = -1\n[listen]\ngrpc = 'x'\n")
    found = problems(path, CRONOQ_STORE__KIND="nope", CRONOQ_LOGGING__FORMAT="xml")
    assert [line.split(" ", 1)[0] for line in found] == [
        "retention_s",
        "store.kind",
        "listen.grpc",
        "logging.format",
    ]


def test_the_default_configuration_rendered() -> None:
    assert tomllib.loads(render_config(load_config(None, {}))) == {
        "keep_finished_s": 604800.0,
        "retention_s": 3600.0,
        "commit_timeout_s": 30.0,
        "drain_timeout_s": 30.0,
        "store": {
            "kind": "sqlite",
            "path": "./cronoq.db",
            "full_sync": True,
            "lock_poll_s": 0.5,
            "lease_renew_s": 2.0,
            "lease_ttl_s": 10.0,
            "busy_timeout_s": 5.0,
            "prune_interval_s": 60.0,
            "prune_batch": 500,
            "journal_size_limit": 64 * 1024 * 1024,
        },
        "listen": {"grpc": "127.0.0.1:50051", "http": "127.0.0.1:8080"},
        "limits": {"max_message_bytes": 4194304},
        "auth": {"insecure": False, "open_metrics": False, "reload_interval_s": 10.0},
        "logging": {"format": "keyvalue", "level": "info"},
        "runtime": {"event_loop": "auto", "store_fatal_attempts": 5},
        "tracing": {"enabled": False},
        "pools": [{"name": "default", "concurrency": 1000, "lease_s": 30.0}],
    }


# --- task limits (docs/limits.md) -----------------------------------------------------------


def test_task_limits_and_pool_limits_from_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        [[pools]]
        name = "payments"
        limits = ["stripe"]
        [[task_limits]]
        name = "tenant"
        concurrency = 2
        per_key = true
        [[task_limits]]
        name = "stripe"
        rate = 100
        per_s = 1
        burst = 10
        on_full = "reject"
        """,
    )
    config = load_config(path, {})
    assert config.pools[0].limits == ("stripe",)
    assert task_limits(config) == [
        Limit("tenant", concurrency=2, per_key=True),
        Limit("stripe", rate=100, per=1.0, burst=10, on_full="reject"),
    ]
    assert remote_pools(config)[0].limits == ("stripe",)
    # The rendered configuration reloads as itself, limits included.
    assert load_config(write(tmp_path, render_config(config)), {}) == config


def test_task_limits_from_env_replace_the_file_s() -> None:
    config = load_config(
        None,
        {
            "CRONOQ_TASK_LIMITS": '[{"name": "t", "concurrency": 1, "per_key": true}]',
            "CRONOQ_POOLS": '[{"name": "default"}]',
        },
    )
    assert task_limits(config) == [Limit("t", concurrency=1, per_key=True)]
    assert only_problem(CRONOQ_TASK_LIMITS__NAME="t") == (
        "task_limits = 't' (from env CRONOQ_TASK_LIMITS__NAME): task_limits come from the "
        "environment only as one JSON list in CRONOQ_TASK_LIMITS, e.g. "
        '[{"name": "tenant", "concurrency": 2, "per_key": true}]'
    )


def test_invalid_task_limits_are_each_named(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        retention_s = 60
        [[pools]]
        name = "default"
        limits = ["tenant"]
        [[task_limits]]
        name = "tenant"
        concurrency = 2
        per_key = true
        [[task_limits]]
        name = "x"
        burst = 2
        on_full = "drop"
        [[task_limits]]
        name = "y"
        rate = 3
        colour = 1
        [[task_limits]]
        name = "z"
        rate = 3
        per_s = 120
        [[task_limits]]
        name = "tenant"
        concurrency = 0
        """,
    )
    assert problems(path) == [
        f"task_limits[1].on_full = 'drop' (from {path}): must be one of 'queue', 'reject', "
        "'cancel_running', 'keep_latest'",
        f"task_limits[2].colour = 1 (from {path}): unknown key; the keys of a task limit are: "
        "burst, concurrency, name, on_full, per_key, per_s, rate",
        f"task_limits[2] (from {path}): limit 'y': rate and per_s go together (starts per seconds)",
        f"task_limits[3].per_s = 120.0 (from {path}): must be at most retention_s = 60.0 (from "
        f"{path}): a new leader recounts a window's starts from the tasks it recovers",
        f"task_limits[4].concurrency = 0 (from {path}): must be an integer from 1 to 1000000",
        f"task_limits[4].name = 'tenant' (from {path}): must be unique, and task_limits[0] has "
        "it too",
        f"pools[0].limits = ['tenant'] (from {path}): names 'tenant', which is per key: a "
        "pool's limits hold for all its tasks together; a per-key limit is named by each "
        "submission, with its key",
    ]


def test_a_pool_names_only_configured_limits(tmp_path: Path) -> None:
    path = write(tmp_path, '[[pools]]\nname = "default"\nlimits = ["nope", "nope"]\n')
    assert only_problem(path) == (
        f"pools[0].limits = ['nope', 'nope'] (from {path}): must be a list of at most 16 "
        'distinct task limit names, e.g. limits = ["stripe"]'
    )
    path = write(tmp_path, '[[pools]]\nname = "default"\nlimits = ["nope"]\n')
    assert only_problem(path) == (
        f"pools[0].limits = ['nope'] (from {path}): names 'nope', which is no [[task_limits]] "
        "entry (configured: none)"
    )
