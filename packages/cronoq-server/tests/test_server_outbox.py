"""The outbox through real ``cronoq-server`` processes on PostgreSQL, with authentication on:
each outbox call through ``AsyncClient`` (status, the quarantine a page at a time, requeue,
discard), a row that waits in the figures and in /metrics, who may call what, the bounds of
every field of the four requests (hypothesis), a page that ends where the message limit does,
and a server without an outbox.

One server per module (its own schema) holds the rows; each test writes rows of its own and
awaits their quarantine in the server's log, and reads the figures as differences.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from outbox_rows import (
    correct_options,
    enqueue,
    logged_quarantine,
    schema_of_its_own,
    unknown_pool,
    wait_until,
)
from prometheus_client.parser import text_string_to_metric_families
from server_pg import PG_DSN
from server_process import ServerProcess, config_toml, running_server
from test_server_auth import identities_toml, metadata

from cronoq.errors import InvalidArgument, PermissionDenied, Unauthenticated
from cronoq.store import MAX_OUTBOX_PAGE
from cronoq_client import AsyncClient
from cronoq_client import protocol as wire
from cronoq_client.protocol import NoOutbox, pb, pb_grpc
from cronoq_server._config import NO_OUTBOX

pytestmark = pytest.mark.asyncio(loop_scope="module")

Code = grpc.StatusCode
TOKENS = {
    "admin": "admin-" + "a" * 40,
    "reader": "reader-" + "r" * 40,
    "submitter": "submitter-" + "s" * 40,
    "watcher": "watcher-" + "w" * 40,
}
IDENTITIES = {
    "admin": {"permissions": ["admin"]},
    "reader": {"permissions": ["read"]},
    "submitter": {"permissions": ["submit"]},
    "watcher": {"permissions": ["metrics"]},
}
AUTH = "[auth]\nreload_interval_s = 600\n" + identities_toml(IDENTITIES, TOKENS)
POOLS = '[[pools]]\nname = "default"\n[[pools]]\nname = "full"\nmax_live = 1\n'
LIMIT = 65536
"""The module server's max_message_bytes: a page of large rows ends early under it."""
TIMEOUT = 10.0


def _store(schema: str, extra: str = "") -> str:
    return (
        f'[store]\nkind = "postgres"\ndsn = "{PG_DSN}"\nschema = "{schema}"\n'
        f"outbox_poll_s = 0.1\n{extra}"
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def schema() -> AsyncIterator[str]:
    async with schema_of_its_own() as name:
        yield name


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    tmp_path_factory: pytest.TempPathFactory, schema: str
) -> AsyncIterator[ServerProcess]:
    tables = f"{AUTH}[limits]\nmax_message_bytes = {LIMIT}\n"
    config = config_toml(_store(schema), pools=POOLS, tables=tables)
    async with running_server(tmp_path_factory.mktemp("outbox"), config) as running:
        await running.leading()
        yield running


@pytest_asyncio.fixture(loop_scope="module")
async def admin(server: ServerProcess) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(server.target, token=TOKENS["admin"], timeout=TIMEOUT) as client:
        yield client


async def _quarantined(
    server: ServerProcess, schema: str, *rows: tuple[str, bytes, str]
) -> list[int]:
    """Write the rows, and return their ids once the leader quarantined each."""
    ids = await enqueue(schema, *rows)
    for row_id in ids:
        await logged_quarantine(server, row_id)
    return ids


def _scrape(server: ServerProcess, token: str) -> dict[str, float]:
    request = urllib.request.Request(
        f"{server.http}/metrics", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
        text = answer.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("cronoq_outbox_")
    }


# --- each call ------------------------------------------------------------------------------


async def test_status_quarantine_requeue_and_discard_through_the_client(
    server: ServerProcess, schema: str, admin: AsyncClient
) -> None:
    before = await admin.outbox_status()
    ids = await _quarantined(
        server,
        schema,
        unknown_pool("fixable", b'{"n": 1}'),
        unknown_pool("stubborn"),
        unknown_pool("dropped"),
    )
    status = await admin.outbox_status()
    assert (status.depth, status.oldest_enqueued_at, status.oldest_age) == (0, None, None)
    assert status.quarantined == before.quarantined + 3
    assert status.quarantined_by_leader == before.quarantined_by_leader + 3

    # A page at a time: ids above `after`, in id order.
    first = await admin.outbox_quarantine(after=ids[0] - 1, limit=2)
    assert [row.row_id for row in first] == ids[:2]
    rest = await admin.outbox_quarantine(after=first[-1].row_id)
    assert [row.row_id for row in rest] == ids[2:]
    row = first[0]
    assert (row.kind, row.payload_size, row.payload_head) == ("fixable", 8, b'{"n": 1}')
    assert row.options == '{"pool": "nope"}'
    assert row.reason == "UnknownPool: unknown pool 'nope'; configured: default, full"
    now = datetime.now(UTC)
    assert now - timedelta(seconds=30) < row.enqueued_at <= row.quarantined_at <= now

    # Corrected by SQL and requeued: the leader ingests it into a task, with its payload.
    await correct_options(schema, ids[0], '{"key": "outbox-fixed"}')
    assert await admin.requeue_outbox([ids[0]]) == 1
    assert await admin.requeue_outbox([ids[0]]) == 0  # no longer in the quarantine

    async def ingested() -> bool:
        return await admin.get_by_key("outbox-fixed") is not None

    await wait_until(ingested, "the requeued row's task")
    task = await admin.get_by_key("outbox-fixed")
    assert task is not None and (task.kind, task.payload) == ("fixable", b'{"n": 1}')
    assert (await admin.outbox_status()).ingested_by_leader >= before.ingested_by_leader + 1
    # Requeued unchanged, a row is quarantined again, with the same id and reason.
    assert await admin.requeue_outbox([ids[1]]) == 1
    again = await logged_quarantine(server, ids[1], times=2)
    assert again == "UnknownPool: unknown pool 'nope'; configured: default, full"

    # Discarded for good: gone from the listing; an id repeated or unknown counts none.
    assert await admin.discard_outbox([ids[2], ids[2], 2**62]) == 1
    assert await admin.discard_outbox([ids[2]]) == 0
    left = await admin.outbox_quarantine(after=ids[0] - 1)
    assert [row.row_id for row in left] == [ids[1]]
    assert await admin.discard_outbox(ids) == 1
    assert (await admin.outbox_status()).quarantined == before.quarantined


async def test_a_row_that_waits_shows_in_the_status_and_in_metrics(
    server: ServerProcess, schema: str, admin: AsyncClient
) -> None:
    """Pool ``full`` admits one live task: while it holds one, a row for it waits in the
    outbox (the ingest retries it), and its depth and age show; then it is ingested."""
    counted = _scrape(server, TOKENS["watcher"])
    blocker = await admin.submit("blocker", b"", pool="full")
    try:
        [row_id] = await enqueue(schema, ("waits", b"", '{"pool": "full"}'))

        await server.wait_line(
            lambda line: (
                line.get("msg", "").startswith("outbox ingest waits")
                and "exceed its max_live=1" in line["msg"]
            ),
            "the ingest waiting for room in pool full",
        )
        status = await admin.outbox_status()
        assert status.depth == 1
        assert status.oldest_enqueued_at is not None and status.oldest_age is not None
        assert timedelta(0) < status.oldest_age < timedelta(seconds=30)
        assert status.oldest_enqueued_at <= datetime.now(UTC)
        # /metrics: the leader's last read, once a second.
        await wait_until(
            lambda: _scrape(server, TOKENS["watcher"])["cronoq_outbox_depth"] == 1,
            "cronoq_outbox_depth",
        )
        scraped = _scrape(server, TOKENS["watcher"])
        assert scraped["cronoq_outbox_oldest_age_seconds"] > 0
        assert "cronoq_outbox_quarantined_rows" in scraped
    finally:
        await admin.cancel(blocker)

    async def ingested() -> bool:
        return (await admin.outbox_status()).depth == 0

    await wait_until(ingested, f"row {row_id} ingested once the pool had room")
    await wait_until(
        lambda: _scrape(server, TOKENS["watcher"])["cronoq_outbox_depth"] == 0,
        "cronoq_outbox_depth back to 0",
    )
    scraped = _scrape(server, TOKENS["watcher"])
    assert scraped["cronoq_outbox_oldest_age_seconds"] == 0
    assert scraped["cronoq_outbox_ingested_total"] == counted["cronoq_outbox_ingested_total"] + 1
    assert scraped["cronoq_outbox_quarantined_total"] >= counted["cronoq_outbox_quarantined_total"]


# --- who may call what ----------------------------------------------------------------------


async def test_a_reader_sees_the_outbox_and_only_an_admin_changes_it(
    server: ServerProcess, schema: str
) -> None:
    [row_id] = await _quarantined(server, schema, unknown_pool("guarded"))
    async with AsyncClient(server.target, token=TOKENS["reader"], timeout=TIMEOUT) as reader:
        assert (await reader.outbox_status()).quarantined >= 1
        assert row_id in [row.row_id for row in await reader.outbox_quarantine(after=row_id - 1)]
        for call in (reader.requeue_outbox, reader.discard_outbox):
            with pytest.raises(PermissionDenied) as refused:
                await call([row_id])
            assert str(refused.value) == "identity 'reader' lacks the permission 'admin'"
            assert refused.value.permission == "admin"
        # Refused, nothing changed: the row is still quarantined.
        (still,) = await reader.outbox_quarantine(after=row_id - 1, limit=1)
        assert still.row_id == row_id
    async with AsyncClient(server.target, token=TOKENS["submitter"], timeout=TIMEOUT) as other:
        with pytest.raises(
            PermissionDenied, match=r"^identity 'submitter' lacks the permission 'read'$"
        ):
            await other.outbox_status()
        with pytest.raises(
            PermissionDenied, match=r"^identity 'submitter' lacks the permission 'read'$"
        ):
            await other.outbox_quarantine()
    async with AsyncClient(server.target, timeout=TIMEOUT) as nobody:  # no token
        with pytest.raises(Unauthenticated):
            await nobody.outbox_status()
    async with AsyncClient(server.target, token=TOKENS["admin"], timeout=TIMEOUT) as admin:
        assert await admin.discard_outbox([row_id]) == 1


# --- bounds ---------------------------------------------------------------------------------

_MAX_ID = 2**63 - 1
_UNUSED_IDS = st.integers(2**50, _MAX_ID)
"""Valid row ids no row of this module reaches: a requeue or discard of them changes nothing."""
_BAD_IDS = st.integers(-(2**63), 0)
_HYPOTHESIS = settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None
)


@st.composite
def _row_ids(draw: st.DrawFn) -> list[int]:
    """Lists around the bound of 1,000 ids, of valid ids and sometimes a bad one."""
    count = draw(
        st.sampled_from([0, 1, 2, 7, MAX_OUTBOX_PAGE - 1, MAX_OUTBOX_PAGE]) | st.just(1001)
    )
    ids = [draw(_UNUSED_IDS)] * count
    if draw(st.booleans()) and ids:
        ids[draw(st.integers(0, len(ids) - 1))] = draw(_BAD_IDS)
    return ids


def _answer(call: Any, request: Message) -> grpc.Call | None:
    """The failed call, or None if it was answered."""
    try:
        call(request, metadata=metadata(TOKENS["admin"]), timeout=TIMEOUT)
    except grpc.RpcError as err:
        if isinstance(err, grpc.Call):
            return err
        raise
    return None


async def test_every_field_of_the_outbox_requests_is_bounded(server: ServerProcess) -> None:
    """``after`` 0 to 2^63 - 1, ``limit`` 1 to 1,000 (absent: 100), 1,000 row ids of 1 to
    2^63 - 1: inside, answered; outside, INVALID_ARGUMENT with the bound in one line, and
    nothing changed."""

    def fuzz() -> None:
        with grpc.insecure_channel(server.target) as channel:
            stub = pb_grpc.SchedulerServiceStub(channel)

            @_HYPOTHESIS
            @given(
                after=st.integers(-(2**63), _MAX_ID),
                limit=st.none() | st.integers(-(2**63), _MAX_ID) | st.integers(-2, 1002),
            )
            def listing(after: int, limit: int | None) -> None:
                request = pb.ListOutboxQuarantineRequest(after=after)
                if limit is not None:
                    request.limit = limit
                err = _answer(stub.ListOutboxQuarantine, request)
                inside = after >= 0 and (limit is None or 1 <= limit <= MAX_OUTBOX_PAGE)
                if inside:
                    assert err is None, (after, limit, err)
                    return
                assert err is not None and err.code() is Code.INVALID_ARGUMENT, (after, limit)
                expected = "after must be between" if after < 0 else "limit must be between"
                assert (err.details() or "").startswith(expected), err.details()

            @_HYPOTHESIS
            @given(ids=_row_ids(), discard=st.booleans())
            def changing(ids: list[int], discard: bool) -> None:
                call = stub.DiscardOutbox if discard else stub.RequeueOutbox
                kind = pb.DiscardOutboxRequest if discard else pb.RequeueOutboxRequest
                err = _answer(call, kind(row_ids=ids))
                if len(ids) <= MAX_OUTBOX_PAGE and all(i > 0 for i in ids):
                    assert err is None, (len(ids), err)
                    return
                assert err is not None and err.code() is Code.INVALID_ARGUMENT
                details = err.details() or ""
                # The ids are checked in order: the first fault found is the one told.
                bad = next((at for at, row_id in enumerate(ids) if row_id <= 0), len(ids))
                if bad < MAX_OUTBOX_PAGE:
                    assert details.startswith("outbox row id must be between 1 and"), details
                else:
                    assert details == "row_ids: more than 1000 items given; the limit is 1000"
                assert "\n" not in details

            listing()
            changing()

    before = await _status(server)
    await asyncio.to_thread(fuzz)
    assert await _status(server) == before


async def _status(server: ServerProcess) -> tuple[int, int]:
    async with AsyncClient(server.target, token=TOKENS["reader"], timeout=TIMEOUT) as reader:
        status = await reader.outbox_status()
    return status.depth, status.quarantined


async def test_a_page_of_large_rows_ends_where_the_message_limit_does(
    server: ServerProcess, schema: str, admin: AsyncClient
) -> None:
    """Each row of 5 KB options and payload is cut on the wire (4 KiB of options, 1 KiB of
    payload): a page of 30 ends early under the module's 64 KiB limit, and the client follows
    it."""
    options = json.dumps({"pool": "nope", "name": "é" * 4000})
    ids = await _quarantined(server, schema, *[("large", bytes(5000), options)] * 30)
    async with grpc.aio.insecure_channel(server.target) as channel:
        page = await pb_grpc.SchedulerServiceStub(channel).ListOutboxQuarantine(
            pb.ListOutboxQuarantineRequest(after=ids[0] - 1, limit=30),
            metadata=metadata(TOKENS["admin"]),
        )
    assert 1 < len(page.rows) < 30 and page.ByteSize() <= LIMIT
    assert page.next_after == page.rows[-1].row_id
    row = page.rows[0]
    assert (row.payload_size, len(row.payload_head)) == (5000, wire.OUTBOX_PAYLOAD_HEAD_BYTES)
    assert len(row.options.encode()) <= wire.OUTBOX_TEXT_BYTES and row.options.endswith("...")
    followed = await admin.outbox_quarantine(after=ids[0] - 1, limit=30)
    assert [r.row_id for r in followed] == ids
    assert await admin.discard_outbox(ids) == 30


# --- a server without an outbox -------------------------------------------------------------


async def test_a_server_without_an_outbox_says_how_to_have_one(tmp_path: Path) -> None:
    """``store.outbox = false`` from the environment: each call is FAILED_PRECONDITION
    NO_OUTBOX (``NoOutbox``, an InvalidArgument, in the client), and /metrics has no outbox
    series."""
    async with schema_of_its_own() as schema:
        config = config_toml(_store(schema), tables=AUTH)
        environ = {"CRONOQ_STORE__OUTBOX": "false"}
        async with (
            running_server(tmp_path, config, environ) as off,
            AsyncClient(off.target, token=TOKENS["admin"], timeout=TIMEOUT) as admin,
        ):
            await off.leading()
            calls = (
                admin.outbox_status(),
                admin.outbox_quarantine(),
                admin.requeue_outbox([1]),
                admin.discard_outbox([1]),
            )
            for call in calls:
                with pytest.raises(NoOutbox) as refused:
                    await call
                assert str(refused.value) == NO_OUTBOX
                assert isinstance(refused.value, InvalidArgument)
            async with grpc.aio.insecure_channel(off.target) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as raw:
                    await pb_grpc.SchedulerServiceStub(channel).OutboxStatus(
                        pb.OutboxStatusRequest(), metadata=metadata(TOKENS["reader"])
                    )
            assert raw.value.code() is Code.FAILED_PRECONDITION
            info = wire.error_info(raw.value)
            assert info is not None and info.reason == "NO_OUTBOX"
            assert _scrape(off, TOKENS["watcher"]) == {}
