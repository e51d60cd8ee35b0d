"""The two roles of docs/stores/postgres.md, as real PostgreSQL roles with exactly the
privileges listed there (issue 24, item 6): the owner creates and upgrades the schema
(``PgStore.migrate``, i.e. ``cronoq-server migrate``); the replicas' role only reads and
writes, and runs a scheduler on an up-to-date schema, with ``migrate`` "auto" or "never".

Each test makes its two roles (names from its own schema) and drops them, and the schema,
after it."""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.parse
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio
from pg_fault_helpers import config, query, scheduler
from pg_harness import DSN

from cronoq import Status
from cronoq.errors import StoreFatal
from cronoq_store_postgres import SCHEMA_VERSION, PgStore, SchemaMigration
from cronoq_store_postgres._schema import quote_ident

# What docs/stores/postgres.md grants the replicas' role, table by table.
REPLICA_GRANTS = (
    "GRANT USAGE ON SCHEMA {s} TO {r}",
    "GRANT SELECT ON {s}.cronoq_schema_version TO {r}",
    "GRANT SELECT, UPDATE ON {s}.cronoq_leader TO {r}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.cronoq_tasks, {s}.cronoq_schedules TO {r}",
    "GRANT SELECT, INSERT, UPDATE ON {s}.cronoq_pools TO {r}",
    "GRANT SELECT, INSERT, DELETE ON {s}.cronoq_attempts TO {r}",
    "GRANT SELECT, INSERT, DELETE ON {s}.cronoq_occurrences TO {r}",
    "GRANT SELECT, INSERT, DELETE ON {s}.cronoq_outbox TO {r}",
    "GRANT SELECT, INSERT, UPDATE, DELETE ON {s}.cronoq_outbox_quarantine TO {r}",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Roles:
    schema: str
    owner_dsn: str
    replica_dsn: str
    replica: str


def dsn_as(role: str) -> str:
    parts = urllib.parse.urlsplit(DSN)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@pytest_asyncio.fixture
async def roles(schema: str) -> AsyncIterator[Roles]:
    """An owner role whose schema a DBA created for it (no right to create anything in the
    database), and a replicas' role with no privilege yet."""
    owner, replica = f"{schema}_owner", f"{schema}_replica"
    s = quote_ident(schema)
    await query(f"CREATE ROLE {quote_ident(owner)} LOGIN")
    await query(f"CREATE ROLE {quote_ident(replica)} LOGIN")
    try:
        await query(f"CREATE SCHEMA {s} AUTHORIZATION {quote_ident(owner)}")
        try:
            await query("SELECT 1", dsn=dsn_as(replica))
        except (asyncpg.InvalidAuthorizationSpecificationError, asyncpg.InvalidPasswordError):
            pytest.skip(f"{DSN} does not let a new role in without a password (trust)")
        yield Roles(schema, dsn_as(owner), dsn_as(replica), replica)
    finally:
        await query(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        for role in (replica, owner):
            await query(f"DROP OWNED BY {quote_ident(role)}")
            await query(f"DROP ROLE {quote_ident(role)}")


async def grant_replica(roles: Roles, grants: tuple[str, ...] = REPLICA_GRANTS) -> None:
    for grant in grants:
        await query(grant.format(s=quote_ident(roles.schema), r=quote_ident(roles.replica)))


async def runs_a_task(store: PgStore) -> None:
    sched = scheduler(store)
    try:
        async with sched:
            task_id = await sched.submit("job", b"payload", key="k")
            assert (await sched.wait(task_id, timeout=10)).status is Status.SUCCEEDED
            assert (await sched.get_by_key("k")) is not None
            # The outbox, read, deleted from and quarantined into with the replica's grants.
            s = quote_ident(store.config.schema)
            await query(f"""SELECT {s}.cronoq_enqueue('job', 'x', '{{"key": "from-outbox"}}'),
                {s}.cronoq_enqueue('job', 'x', '{{"pool": "nope"}}')""")
            async with asyncio.timeout(10):
                while (stats := await sched.outbox_stats()).depth:  # noqa: ASYNC110 (no event)
                    await asyncio.sleep(0.01)
            assert stats.quarantined == 1
            ingested = await sched.get_by_key("from-outbox")
            assert ingested is not None
            assert (await sched.wait(ingested.task_id, timeout=10)).status is Status.SUCCEEDED
            assert await store.prune(2**62) == 2, "pruning deletes the finished tasks"
            # The occurrence ledger, written, read and pruned with the replica's grants.
            await sched.add_schedule("tick", "* * * * * *", kind="job")
            async with asyncio.timeout(10):
                while not await sched.occurrences("tick"):  # noqa: ASYNC110 (no event)
                    await asyncio.sleep(0.01)
            await sched.remove_schedule("tick")
            await store.prune(2**62)
            assert await store.get_occurrences("tick", None, 10) == []
    finally:
        await store.close()


@pytest.mark.parametrize("migrate", ["auto", "never"])
async def test_a_read_write_role_serves_an_up_to_date_schema(roles: Roles, migrate: str) -> None:
    assert await PgStore.migrate(roles.owner_dsn, config(roles.schema)) == SchemaMigration(
        roles.schema, 0, SCHEMA_VERSION
    )
    await grant_replica(roles)
    store = await PgStore.connect(roles.replica_dsn, config(roles.schema, migrate=migrate))
    await runs_a_task(store)


async def test_a_role_without_the_outbox_grants_serves_on_and_says_which_to_give(
    roles: Roles, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica upgraded to schema 6 without the outbox's grants: the leader stops ingesting
    before a commit that deletes rows is refused (which would stop the whole scheduler), says
    in one line what to grant, and serves on."""
    await PgStore.migrate(roles.owner_dsn, config(roles.schema))
    await grant_replica(roles, REPLICA_GRANTS[:-2])
    await grant_replica(roles, ("GRANT SELECT ON {s}.cronoq_outbox TO {r}",))
    s = quote_ident(roles.schema)
    await query(f"SELECT {s}.cronoq_enqueue('job', 'x')")
    store = await PgStore.connect(roles.replica_dsn, config(roles.schema, migrate="never"))
    try:
        async with scheduler(store) as sched:
            assert sched._ingesting is not None
            await asyncio.wait_for(asyncio.shield(sched._ingesting), 10)  # the ingest ended
            task_id = await sched.submit("job", b"after")
            assert (await sched.wait(task_id, timeout=10)).status is Status.SUCCEEDED
    finally:
        await store.close()
    [stopped] = [
        r.getMessage() for r in caplog.records if "outbox ingest stopped" in r.getMessage()
    ]
    assert "grant it SELECT, INSERT, DELETE on cronoq_outbox and SELECT, INSERT, UPDATE" in stopped
    assert "\n" not in stopped


async def test_migrate_again_changes_nothing_and_says_so(roles: Roles) -> None:
    await PgStore.migrate(roles.owner_dsn, config(roles.schema))
    again = await PgStore.migrate(roles.owner_dsn, config(roles.schema, migrate="never"))
    assert again == SchemaMigration(roles.schema, SCHEMA_VERSION, SCHEMA_VERSION)


async def test_never_refuses_a_missing_schema_in_one_line_saying_what_to_run(
    roles: Roles,
) -> None:
    await grant_replica(roles, REPLICA_GRANTS[:1])  # USAGE on the schema: it has no tables
    with pytest.raises(StoreFatal) as raised:
        await PgStore.connect(roles.replica_dsn, config(roles.schema, migrate="never"))
    assert str(raised.value) == (
        f"the schema {roles.schema!r} holds no cronoq tables, this build needs version "
        f"{SCHEMA_VERSION}, and the store's migrate setting is 'never': run `cronoq-server "
        "migrate` (PgStore.migrate) as the role that owns the schema, then start again"
    )


async def test_an_older_schema_is_refused_by_never_and_by_auto_without_the_owners_rights(
    roles: Roles,
) -> None:
    await PgStore.migrate(roles.owner_dsn, config(roles.schema))
    await grant_replica(roles)
    older = SCHEMA_VERSION - 1
    await query(f"UPDATE {quote_ident(roles.schema)}.cronoq_schema_version SET version = {older}")
    with pytest.raises(StoreFatal) as never:
        await PgStore.connect(roles.replica_dsn, config(roles.schema, migrate="never"))
    assert f"{roles.schema!r} is at version {older}, this build needs version" in str(never.value)
    with pytest.raises(StoreFatal) as auto:
        await PgStore.connect(roles.replica_dsn, config(roles.schema, migrate="auto"))
    message = str(auto.value)
    assert "InsufficientPrivilegeError" in message and "cronoq-server migrate" in message, message
    assert "\n" not in message
