"""The outbox's ingest, on the MemoryStore's outbox (its PostgreSQL twin is tested in
cronoq-store-postgres and cronoq-server): rows become tasks exactly once, through failed
commits and failovers; bad rows are quarantined with their reason and block nothing; the
options a helper writes are read back as submit would have made them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq import (
    CodecContext,
    InvalidArgument,
    JsonCodec,
    MemoryStore,
    Pool,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    TaskInfo,
)
from cronoq._memory_outbox import MemoryOutbox
from cronoq._outbox import MAX_QUARANTINE_REASON, QUARANTINE_PAYLOAD_HEAD
from cronoq.crypto import EncryptedCodec
from cronoq.errors import PayloadError, Unavailable
from cronoq.store import (
    OutboxRow,
    OutboxStats,
    QuarantinedRow,
    decode_outbox_options,
    encode_outbox_options,
)

WAIT_S = 10.0


class Ran:
    """A pool's function that records each payload it ran, and wakes whoever waits for a
    count of them."""

    def __init__(self) -> None:
        self.payloads: list[Any] = []
        self._changed = asyncio.Event()

    async def __call__(self, ctx: TaskContext, payload: Any) -> Any:
        self.payloads.append(payload)
        self._changed.set()
        return payload

    async def until(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.payloads) < count:
                self._changed.clear()
                await self._changed.wait()


def _outbox(store: MemoryStore) -> MemoryOutbox:
    assert store.outbox is not None
    return store.outbox


async def _drained(sched: Scheduler) -> OutboxStats:
    """The outbox's figures once no row waits (the ingest loop is awaited through them)."""
    async with asyncio.timeout(WAIT_S):
        while (stats := await sched.outbox_stats()).depth:  # noqa: ASYNC110 (a read, no event)
            await asyncio.sleep(0.01)
    return stats


async def test_rows_become_tasks_and_a_held_key_takes_its_row_without_a_new_task() -> None:
    store = MemoryStore(outbox=True)
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=store) as sched:
        _outbox(store).put_many(
            [("k", b"a", {}), ("k", b"b", {"key": "once"}), ("k", b"c", {"key": "once"})]
        )
        await ran.until(2)
        stats = await _drained(sched)
        tasks = await sched.list()
        async with asyncio.timeout(WAIT_S):  # counted once each submission has answered
            while sched.metrics().outbox_ingested < 3:  # noqa: ASYNC110 (a counter, no event)
                await asyncio.sleep(0.01)
        metrics = sched.metrics()
    assert sorted(ran.payloads) == [b"a", b"b"]
    assert len(tasks) == 2
    assert stats == OutboxStats(0, None, 0)
    assert (metrics.outbox_ingested, metrics.outbox_quarantined) == (3, 0)


BAD_ROWS = {
    '{"pool": "nope"}': "UnknownPool: unknown pool 'nope'",
    "not json": "options are not JSON",
    "[1, 2]": "options must be a JSON object, got list",
    '{"after": [1]}': "unknown option 'after'",
    '{"priority": 1e400}': "priority",
    '{"priority": 99999999999999999999}': "priority must be",
    '{"start_at": "2030-01-01T00:00:00"}': "start_at has no UTC offset",
    '{"retry": {"tries": 3}}': "unknown retry field 'tries'",
    '{"retry": {"max_attempts": 0}}': "max_attempts must be 1..",
    '{"timeout": "5s"}': "timeout must be a number of seconds",
    '{"tags": "a,b"}': "tags",
    '{"key": "k\\u0000"}': "key",
    '{"start_at": "2030-01-01T00:00:00Z", "deadline": "2029-01-01T00:00:00Z"}': (
        "deadline must be after start_at"
    ),
    '{"miss_policy": "later"}': "miss_policy",
    '{"grace": NaN}': "NaN is not a number JSON allows",
}


async def test_bad_rows_are_quarantined_with_their_reason_and_block_no_row_behind_them() -> None:
    store = MemoryStore(outbox=True)
    ran = Ran()
    outbox = _outbox(store)
    async with Scheduler(
        [Pool("default", ran)], store=store, codec=JsonCodec(), max_payload_bytes=64
    ) as sched:
        bad = {outbox.put_raw("k", b"{}", options): why for options, why in BAD_ROWS.items()}
        bad[outbox.put_raw("k", b"{not json", "{}")] = "JsonCodec cannot decode 9 bytes"
        bad[outbox.put_raw("k", b'"' + b"x" * 100 + b'"', "{}")] = "over the limit of 64"
        bad[outbox.put_raw("", b"{}", "{}")] = "kind"
        outbox.put_raw("k", b'{"good": true}', '{"priority": 5}')
        await ran.until(1)
        stats = await _drained(sched)
        quarantined = await sched.outbox_quarantine(limit=1000)
        metrics = sched.metrics()
    assert ran.payloads == [{"good": True}]
    assert [row.row_id for row in quarantined] == sorted(bad)
    for row in quarantined:
        assert bad[row.row_id] in row.reason, (row.options, row.reason)
    assert (stats.depth, stats.quarantined) == (0, len(bad))
    assert metrics.outbox_quarantined == len(bad)


async def test_a_batch_that_fails_midway_keeps_its_rows_and_they_become_tasks_once() -> None:
    store = MemoryStore(outbox=True)
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=store, commit_timeout=5) as sched:
        store.fail_next_commit_midway()
        _outbox(store).put_many([("k", str(i).encode(), {}) for i in range(50)])
        await ran.until(50)
        await _drained(sched)
        tasks = await sched.list(limit=1000)
    assert Counter(ran.payloads) == Counter(str(i).encode() for i in range(50))
    assert len(tasks) == 50


async def test_rows_wait_out_a_store_outage_and_then_become_tasks_once() -> None:
    store = MemoryStore(outbox=True)
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=store, commit_timeout=5) as sched:
        await sched.submit("before", b"")
        await ran.until(1)
        store.set_available(False)
        _outbox(store).put_many([("k", str(i).encode(), {}) for i in range(20)])
        await asyncio.sleep(0.2)  # the outage lasts a while: nothing to await but its end
        store.set_available(True)
        await ran.until(21)
        await _drained(sched)
    assert Counter(ran.payloads[1:]) == Counter(str(i).encode() for i in range(20))


async def test_a_standby_ingests_what_a_crashed_leader_left_and_nothing_twice() -> None:
    first = MemoryStore(outbox=True)
    second = first.connect_another()
    ran = Ran()
    rows: list[tuple[str, bytes, dict[str, Any]]] = [
        ("k", str(i).encode(), {}) for i in range(3000)
    ]
    leader = Scheduler([Pool("default", ran)], store=first)
    await leader.start()
    standby = Scheduler([Pool("default", ran)], store=second)
    taking_over = asyncio.ensure_future(standby.start())
    try:
        _outbox(first).put_many(rows)
        await ran.until(1)  # the leader is ingesting
        first.simulate_crash()
        leader.abort()
        await asyncio.wait_for(taking_over, WAIT_S)
        await _drained(standby)
        tasks = await standby.list(limit=10_000)
    finally:
        await leader.close()
        await standby.close()
    made = Counter(t.kind for t in tasks)
    assert made == {"k": len(rows)}, made


class _ForgetfulSource:
    """A source outside the store's database (not transactional) whose first deletion fails
    after its tasks committed: its rows are read and submitted again."""

    transactional = False

    def __init__(self, inner: MemoryOutbox, epoch: int) -> None:
        self.inner = inner
        self.epoch = epoch
        """Its own store's: the scheduler's epoch means nothing to another database."""
        self.failed = False

    async def read(self, epoch: int, limit: int) -> Sequence[OutboxRow]:
        return await self.inner.read(self.epoch, limit)

    async def take(self, epoch: int, row_ids: Sequence[int]) -> None:
        if not self.failed:
            self.failed = True
            raise Unavailable("the outbox's database went away after the commit")
        await self.inner.take(self.epoch, row_ids)

    async def quarantine(self, epoch: int, rows: Sequence[tuple[int, str]]) -> None:
        await self.inner.quarantine(self.epoch, rows)

    async def wait(self) -> None:
        await self.inner.wait()

    async def stats(self) -> OutboxStats:
        return await self.inner.stats()

    async def quarantined(self, after: int, limit: int) -> Sequence[QuarantinedRow]:
        return await self.inner.quarantined(after, limit)

    async def requeue(self, row_ids: Sequence[int]) -> int:
        return await self.inner.requeue(row_ids)

    async def discard(self, row_ids: Sequence[int]) -> int:
        return await self.inner.discard(row_ids)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_source_in_another_database_is_deduplicated_by_keys_derived_from_its_rows() -> None:
    store = MemoryStore(outbox=True)
    source = _ForgetfulSource(_outbox(store), (await store.acquire_leadership()).epoch)
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=MemoryStore(), outbox=source) as sched:
        _outbox(store).put_many([("k", b"a", {}), ("k", b"b", {"key": "mine"})])
        await ran.until(2)
        await _drained(sched)
        keys = sorted([str((await sched.get(t.task_id)).key) for t in await sched.list()])
    assert source.failed
    assert sorted(ran.payloads) == [b"a", b"b"]
    assert keys[0] == "mine" and keys[1].startswith("outbox:1:"), keys


async def test_requeued_rows_become_tasks_once_their_pool_exists_and_discarded_rows_go() -> None:
    store = MemoryStore(outbox=True)
    outbox = _outbox(store)
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=store) as sched:
        ids = outbox.put_many([("mail", b"1", {"pool": "mail"}), ("mail", b"2", {"pool": "mail"})])
        await _drained(sched)
        assert [r.row_id for r in await sched.outbox_quarantine()] == ids
    async with Scheduler(
        [Pool("default", ran), Pool("mail", ran)], store=store.connect_another()
    ) as sched:
        assert await sched.discard_outbox([ids[1], 999]) == 1
        assert await sched.requeue_outbox(ids) == 1
        await ran.until(1)
        stats = await _drained(sched)
    assert ran.payloads == [b"1"]
    assert (stats.depth, stats.quarantined) == (0, 0)


async def test_a_scheduler_without_an_outbox_says_how_to_get_one() -> None:
    async with Scheduler([Pool("default", Ran())]) as sched:
        for call in (
            sched.outbox_stats(),
            sched.outbox_quarantine(),
            sched.requeue_outbox([1]),
            sched.discard_outbox([1]),
        ):
            with pytest.raises(InvalidArgument, match=r"has no outbox.*docs/outbox\.md"):
                await call
        assert sched.metrics().outbox_depth is None


def test_a_scheduler_refuses_an_outbox_that_is_not_one() -> None:
    with pytest.raises(InvalidArgument, match="outbox must implement"):
        Scheduler([Pool("default", Ran())], outbox=object())  # type: ignore[arg-type]


# --- the options' JSON form ----------------------------------------------------------------

OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "pool": st.sampled_from(["default", "other"]),
        "key": st.text(min_size=1, max_size=20).filter(lambda k: "\x00" not in k),
        "tags": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True),
        "name": st.sampled_from(["a name", "n"]),
        "priority": st.integers(-(2**31 - 1), 2**31 - 1),
        "retry": st.builds(
            RetryPolicy.exponential,
            st.integers(1, 10),
            initial=st.sampled_from([0.5, 1.0, 2.0]),
            jitter=st.sampled_from([0.0, 0.1]),
        ),
        "start_at": st.sampled_from(
            [timedelta(minutes=5), datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)]
        ),
        "deadline": st.sampled_from([datetime(2032, 1, 1, tzinfo=UTC), timedelta(days=2000)]),
        "timeout": st.sampled_from([0.5, 30, timedelta(minutes=2)]),
        "miss_policy": st.sampled_from(["run_late", "skip"]),
        "grace": st.sampled_from([0, 1.5, timedelta(seconds=90)]),
    },
)
_NOW = 1_800_000_000_000_000_000


@settings(max_examples=200, deadline=None)
@given(options=OPTIONS)
def test_options_written_to_a_row_make_the_spec_submit_would_make(options: dict[str, Any]) -> None:
    """What a helper writes, read back at ingest, is what ``submit`` makes of the same options
    (times to the microsecond: the row's JSON holds ISO 8601 times)."""
    sched = Scheduler([Pool("default", Ran()), Pool("other", Ran())])
    direct = sched.task_spec(_NOW, "k", None, **options).spec
    row = OutboxRow(1, "k", b"", encode_outbox_options(options, _NOW), _NOW)
    ingested = sched._outbox_spec(_NOW, row)

    def to_micros(ns: int | None) -> int | None:
        return None if ns is None else ns // 1000

    assert ingested.start_at_ns is None or ingested.start_at_ns % 1000 == 0
    assert to_micros(ingested.start_at_ns) == to_micros(direct.start_at_ns)
    assert to_micros(ingested.deadline_ns) == to_micros(direct.deadline_ns)
    same = ("pool", "kind", "payload", "key", "tags", "name", "priority", "retry",
            "miss_policy", "grace_ns", "timeout_ns", "after")  # fmt: skip
    for field in same:
        assert getattr(ingested, field) == getattr(direct, field), field


def test_decoding_refuses_what_is_not_an_options_object() -> None:
    with pytest.raises(InvalidArgument, match="longer than"):
        decode_outbox_options("{" + " " * 70_000 + "}")
    with pytest.raises(InvalidArgument, match="not JSON"):
        decode_outbox_options("[" * 60_000)
    assert decode_outbox_options('{"pool": null, "key": "k"}') == {"key": "k"}


async def test_a_task_from_a_row_reads_as_a_submitted_one() -> None:
    store = MemoryStore(outbox=True)
    ran = Ran()
    async with Scheduler([Pool("default", ran)], store=store) as sched:
        _outbox(store).put("k", b"x", key="order-17", tags=["mail"], name="confirmation")
        await ran.until(1)
        task = await sched.get_by_key("order-17")
        assert task is not None
        done: TaskInfo = await sched.wait(task.task_id, timeout=WAIT_S)
    assert (done.status, done.name, tuple(done.tags)) == (
        Status.SUCCEEDED,
        "confirmation",
        ("mail",),
    )


async def test_a_quarantine_listing_is_bounded_whatever_a_row_holds() -> None:
    """A row written by SQL may hold a payload of any size and a long codec error: a listing
    holds the payload's head, its size, and a reason cut to ``MAX_QUARANTINE_REASON``."""
    store = MemoryStore(outbox=True)

    class Loud(JsonCodec):
        def decode(self, data: bytes) -> Any:
            raise ValueError("x" * 10_000)

    async with Scheduler([Pool("default", Ran())], store=store, codec=Loud()) as sched:
        _outbox(store).put_raw("k", b"y" * 100_000, "{}")
        await _drained(sched)
        [row] = await sched.outbox_quarantine()
    assert (len(row.payload), row.payload_size) == (QUARANTINE_PAYLOAD_HEAD, 100_000)
    assert len(row.reason) == MAX_QUARANTINE_REASON and row.reason.endswith("...")


async def test_a_full_pool_keeps_its_rows_waiting_and_not_the_other_pools_rows() -> None:
    """``max_live`` refuses the full pool's rows, which wait in the outbox and become tasks
    once it has room, while the other pool's rows behind them are ingested at once."""
    store = MemoryStore(outbox=True)
    release = asyncio.Event()
    ran = Ran()

    async def held(ctx: TaskContext, payload: Any) -> Any:
        await release.wait()
        return await ran(ctx, payload)

    pools = [Pool("full", held, concurrency=1, max_live=1), Pool("other", ran)]
    async with Scheduler(pools, store=store, commit_timeout=5) as sched:
        await sched.submit("first", b"a0", pool="full")
        _outbox(store).put_many(
            [("k", b"a1", {"pool": "full"}), ("k", b"a2", {"pool": "full"}),
             ("k", b"b1", {"pool": "other"})]
        )  # fmt: skip
        await ran.until(1)
        assert ran.payloads == [b"b1"]
        assert (await sched.outbox_stats()).depth == 2
        release.set()
        await ran.until(4)
        await _drained(sched)
    assert sorted(ran.payloads) == [b"a0", b"a1", b"a2", b"b1"]


async def test_a_reason_is_stored_clean_whatever_the_codec_raised() -> None:
    store = MemoryStore(outbox=True)

    class Hostile(JsonCodec):
        def decode(self, data: bytes) -> Any:
            raise PayloadError("nul \x00 and a lone \udcff surrogate")

    async with Scheduler([Pool("default", Ran())], store=store, codec=Hostile()) as sched:
        _outbox(store).put_raw("k", b"{}", "{}")
        await _drained(sched)
        [row] = await sched.outbox_quarantine()
    assert "nul \ufffd and a lone \ufffd surrogate" in row.reason, row.reason
    row.reason.encode("utf-8")  # storable as UTF-8


async def test_a_keyless_row_from_another_database_is_quarantined_under_a_binding_codec() -> None:
    """Its derived key would change the context its payload was encoded for."""
    store = MemoryStore(outbox=True)
    source = _ForgetfulSource(_outbox(store), (await store.acquire_leadership()).epoch)
    source.failed = True  # deletions succeed
    ran = Ran()
    codec = EncryptedCodec({"k1": bytes(32)}, "k1", JsonCodec())
    async with Scheduler([Pool("default", ran)], outbox=source, codec=codec) as sched:
        context = CodecContext("payload", "k", "default", "mine")
        _outbox(store).put("k", codec.encode_for({"n": 1}, context), key="mine")
        keyless = CodecContext("payload", "k", "default", None)
        _outbox(store).put("k", codec.encode_for({"n": 2}, keyless))
        await ran.until(1)
        await _drained(sched)
        [row] = await sched.outbox_quarantine()
    assert ran.payloads == [{"n": 1}]
    assert "give the row a key of its own" in row.reason


async def test_another_stores_transactional_outbox_is_refused_a_foreign_attribute_ignored() -> None:
    other = MemoryStore(outbox=True)
    with pytest.raises(InvalidArgument, match="must be the scheduler's own store's"):
        Scheduler([Pool("default", Ran())], outbox=other.outbox)
    store = MemoryStore()
    setattr(store, "outbox", "a third party's attribute, not an outbox")  # noqa: B010
    async with Scheduler([Pool("default", Ran())], store=store) as sched:
        with pytest.raises(InvalidArgument, match="has no outbox"):
            await sched.outbox_stats()
