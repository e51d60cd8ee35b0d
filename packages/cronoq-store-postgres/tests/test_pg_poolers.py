"""A pooler in front of PostgreSQL is refused, every time, with a StoreFatal naming it and the
fix (issue 12); a plain TCP proxy and a Unix socket are not.

Each test starts a private PgBouncer (``pg_bouncer.py``) in front of the test server, in one
of the ways people configure it: transaction pooling told to ignore the session settings the
store sends at startup (with one client, PgBouncer hands every transaction the same server
session, so stability alone does not give it away); transaction pooling that rejects them;
and session pooling.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from pg_bouncer import PgBouncer
from pg_fault_helpers import config, lock_holders
from pg_harness import DSN, drop_schema, new_schema, require_postgres
from pg_proxy import PgProxy, upstream_of

from cronoq.errors import StoreFatal
from cronoq.store import TimeBase
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_postgres._leader import LockSession, lock_session_settings
from cronoq_store_postgres._schema import lock_key

HOUR_NS = 3600 * 1_000_000_000
# What a user lists in ignore_startup_parameters to make the store connect through PgBouncer:
# every setting it sends at startup that PgBouncer does not know.
STORE_PARAMETERS = sorted(
    {*lock_session_settings(PgStoreConfig()), "lock_timeout", "plan_cache_mode"}
)
HINT = "Point the store's DSN at PostgreSQL itself"

StartBouncer = Callable[[str, list[str]], Awaitable[PgBouncer]]


@pytest_asyncio.fixture
async def schema() -> AsyncIterator[str]:
    await require_postgres()
    name = new_schema()
    try:
        yield name
    finally:
        await drop_schema(name)


@pytest_asyncio.fixture
async def bouncer() -> AsyncIterator[StartBouncer]:
    started: list[PgBouncer] = []

    async def start(pool_mode: str, ignore: list[str]) -> PgBouncer:
        started.append(await PgBouncer.start(DSN, pool_mode, ignore))
        return started[-1]

    try:
        yield start
    finally:
        for one in started:
            await one.stop()


def lock_session(dsn: str, cfg: PgStoreConfig) -> LockSession:
    """The store's lock session alone, as it would run if the store's pool were direct."""
    return LockSession(dsn, cfg, lock_key("leader", cfg.schema))


async def assert_no_lock_left_and_a_direct_instance_leads(schema: str, cfg: PgStoreConfig) -> None:
    """The refusal stranded no advisory lock on a pooled server session: a store connected
    directly leads at once (the failover the issue saw blocked for as long as PgBouncer ran)."""
    assert await lock_holders(schema) == []
    direct = await PgStore.connect(DSN, cfg)
    try:
        async with asyncio.timeout(cfg.lock_poll + 2.0):
            lease = await direct.acquire_leadership()
        await direct.recover(lease.epoch, TimeBase(), HOUR_NS)
    finally:
        await direct.close()


async def test_transaction_pooler_that_ignores_the_settings_is_refused(
    schema: str, bouncer: StartBouncer
) -> None:
    """The issue's first configuration: a Scheduler on such a store used to lead. The pool's
    first connection gives PgBouncer away, so connect() refuses."""
    pgbouncer = await bouncer("transaction", STORE_PARAMETERS)
    with pytest.raises(StoreFatal) as refused:
        await PgStore.connect(pgbouncer.dsn(), config(schema))
    message = str(refused.value)
    assert "a connection of the store's pool does not reach PostgreSQL directly" in message
    assert "the connection was opened for server process" in message  # PgBouncer's own pid
    assert "lock_timeout is '0' (from default), not the '200' asked for" in message
    assert "pooler" in message and HINT in message
    await assert_no_lock_left_and_a_direct_instance_leads(schema, config(schema))


async def test_lock_session_through_a_transaction_pooler_is_refused_before_it_locks(
    schema: str, bouncer: StartBouncer
) -> None:
    """The lock session checks itself too, before it takes the lock: taken through PgBouncer,
    the lock would stay on a pooled server session whatever the store did next."""
    pgbouncer = await bouncer("transaction", STORE_PARAMETERS)
    cfg = config(schema)
    with pytest.raises(StoreFatal) as refused:
        await lock_session(pgbouncer.dsn(), cfg).acquire()
    message = str(refused.value)
    assert "the advisory lock session does not reach PostgreSQL directly" in message
    assert "the connection was opened for server process" in message
    timeout_ms = round(cfg.session_timeout * 1000)
    assert f"idle_session_timeout is '0' (from default), not the '{timeout_ms}'" in message
    assert f"tcp_user_timeout is '0' (from default), not the '{timeout_ms}'" in message
    assert HINT in message
    await assert_no_lock_left_and_a_direct_instance_leads(schema, cfg)


async def test_transaction_pooler_that_rejects_the_settings_is_fatal_not_unavailable(
    schema: str, bouncer: StartBouncer
) -> None:
    """The issue's third configuration: PgBouncer answers the startup parameters with a
    connection error, which used to be Unavailable (retried forever); no retry fixes it."""
    pgbouncer = await bouncer("transaction", [])
    with pytest.raises(StoreFatal) as refused:
        await PgStore.connect(pgbouncer.dsn(), config(schema))
    message = str(refused.value)
    assert "unsupported startup parameter" in message
    assert "connecting" in message and HINT in message

    with pytest.raises(StoreFatal) as refused:
        await lock_session(pgbouncer.dsn(), config(schema)).acquire()
    message = str(refused.value)
    assert "unsupported startup parameter" in message
    assert "opening the advisory lock session" in message and HINT in message
    await assert_no_lock_left_and_a_direct_instance_leads(schema, config(schema))


async def test_session_pooler_is_refused_too(schema: str, bouncer: StartBouncer) -> None:
    """Session pooling would keep the lock with its client, but PgBouncer drops the settings
    that free a frozen leader's lock, and from the client it cannot be told from transaction
    pooling (both answer with a server process of PgBouncer's invention): refused, with the
    same hint (docs/stores/postgres.md)."""
    pgbouncer = await bouncer("session", STORE_PARAMETERS)
    cfg = config(schema)
    with pytest.raises(StoreFatal) as refused:
        await PgStore.connect(pgbouncer.dsn(), cfg)
    assert "the connection was opened for server process" in str(refused.value)
    assert HINT in str(refused.value)
    with pytest.raises(StoreFatal) as refused:
        await lock_session(pgbouncer.dsn(), cfg).acquire()
    message = str(refused.value)
    assert "the advisory lock session does not reach PostgreSQL directly" in message
    assert "idle_session_timeout is '0' (from default)" in message
    await assert_no_lock_left_and_a_direct_instance_leads(schema, cfg)


async def test_a_plain_tcp_proxy_and_a_unix_socket_are_accepted(schema: str) -> None:
    """What passes the server's session through untouched leads: a TCP proxy (which also
    forwards the server's BackendKeyData), and a Unix socket, on which the TCP settings read
    0 although the server took them."""
    upstream = upstream_of(DSN)
    if upstream is None:
        pytest.skip(f"the proxy needs a TCP DSN, not {DSN}")
    socket_dir = os.environ.get("CRONOQ_TEST_PG_SOCKET_DIR", "/var/run/postgresql")
    if not (Path(socket_dir) / f".s.PGSQL.{upstream[1]}").exists():
        pytest.skip(f"no PostgreSQL socket in {socket_dir} (set CRONOQ_TEST_PG_SOCKET_DIR)")
    proxy = await PgProxy(upstream).start()
    dbname = DSN.rsplit("/", 1)[-1].split("?")[0]
    unix_dsn = f"postgresql://postgres@/{dbname}?host={socket_dir}&port={upstream[1]}"
    try:
        for dsn in (proxy.dsn(DSN), unix_dsn):
            cfg = config(schema)
            store = await PgStore.connect(dsn, cfg)
            try:
                lease = await store.acquire_leadership()
                await store.recover(lease.epoch, TimeBase(), HOUR_NS)
                [holder] = await lock_holders(schema)
                assert holder["application_name"] == "cronoq-leader-lock"
            finally:
                await store.close()
    finally:
        await proxy.close()
