"""Hypothesis over the outbox helpers' inputs, as over every other entry point (issue 10's rules,
packages/cronoq/tests/test_fuzz_api.py), against the real server.

1. Any call of ``enqueue`` or ``enqueue_many`` (kinds, payloads and options of every type, NUL
   and lone surrogates, huge numbers, endless iterables for tags and requests, unknown options,
   naive datetimes and hostile time zones, bad schemas and codecs, wrong connection objects)
   either writes exactly one row per task (the ids it returns) or raises ``InvalidArgument``
   naming a bad argument and writes nothing: the outbox's row count is read on the same
   connection, in the same transaction, before and after. On asyncpg, psycopg and psycopg's
   async connection (SQLAlchemy and Django hand the helpers one of those).
2. Whatever the helpers accept, the ingest accepts, and makes the task ``submit`` makes: for
   random options (on pools the scheduler has), the helper accepts exactly when ``submit``
   does, and the task a written row becomes (its stored spec and its ``TaskInfo``) equals the
   one ``submit`` makes from the same arguments; no row is ever quarantined.

``CRONOQ_FUZZ_PROFILE`` sets the examples per test, as for test_fuzz_api.py: ``quick`` (the
default, 60) or ``fuzz``/``probe`` (600).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import math
import os
import time
import zoneinfo
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import psycopg
import pytest
from hostile_values import (
    BAD_CHARS,
    TEN_YEARS_S,
    _circular,
    _deep,
    bad_duration,
    bad_enum,
    bad_instant,
    bad_int,
    bad_tags,
    bad_text,
    endless,
    wrong_types,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pg_fault_helpers import config
from pg_harness import DSN, drop_schema, new_schema, require_postgres
from pg_outbox_cluster import WAIT_S, Runs
from pg_outbox_drivers import configure_django, sqlalchemy_url
from sqlalchemy import create_engine

from cronoq import (
    CronoqError,
    InvalidArgument,
    JsonCodec,
    MemoryStore,
    MissPolicy,
    Pool,
    RetryPolicy,
    Scheduler,
    TaskRequest,
    TraceContext,
)
from cronoq._validate import MAX_BATCH
from cronoq.errors import PayloadError
from cronoq_store_postgres import PgStore, enqueue, enqueue_many
from cronoq_store_postgres._schema import quote_ident

PROFILE = os.environ.get("CRONOQ_FUZZ_PROFILE", "quick")
FUZZ = settings(
    max_examples=60 if PROFILE == "quick" else 600,
    deadline=None,
    phases=[Phase.explicit, Phase.generate] if PROFILE == "probe" else list(Phase),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- bad values (those of test_fuzz_api.py, for the options the helpers take) -------------------


def bad_json_payloads() -> st.SearchStrategy[object]:
    """What JsonCodec cannot encode."""
    return st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.builds(lambda x: {"x": [x]}, st.sampled_from([math.nan, math.inf])),
        st.binary(min_size=1, max_size=8),
        st.builds(object),
        st.frozensets(st.integers(), min_size=1, max_size=3),
        st.complex_numbers(allow_nan=True),
        st.datetimes(),
        endless(),
        st.builds(lambda: {(1, 2): 3}),
        st.builds(_circular),
        st.builds(_deep),
    )


def bad_bytes_payloads() -> st.SearchStrategy[object]:
    """What is not bytes, without a codec (None is no payload: good)."""
    return st.one_of(
        st.text(max_size=5),
        st.integers(),
        st.floats(),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        st.builds(object),
        endless(),
        st.booleans(),
    )


def bad_schemas() -> st.SearchStrategy[object]:
    return st.one_of(
        st.just(""),
        st.tuples(st.text(max_size=5), BAD_CHARS, st.text(max_size=5)).map("".join),
        st.integers(64, 100).map(lambda n: "s" * n),
        st.just("\u00e9" * 32),  # 32 characters, 64 bytes
        wrong_types(none=True, strings=False),
    )


def bad_codecs() -> st.SearchStrategy[object]:
    return st.one_of(
        st.just(JsonCodec),  # the class, not an instance
        st.text(max_size=5),
        st.integers(),
        st.builds(object),
        st.just(RetryPolicy()),
    )


OPTION_NAMES = {
    "pool", "key", "tags", "name", "priority", "retry", "start_at", "miss_policy", "grace",
    "deadline", "timeout",
}  # fmt: skip


def unknown_names() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["after", "trace_context", "priorty", "delay", "queue", "payload_"]),
        st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True).filter(
            lambda n: n not in OPTION_NAMES | {"schema", "codec"}
        ),
    )


def later() -> st.SearchStrategy[object]:
    return st.sampled_from([timedelta(hours=1), datetime.now(UTC) + timedelta(hours=1)])


GOOD: dict[str, st.SearchStrategy[object]] = {
    "kind": st.sampled_from(["job", "other-kind", "\u00e9t\u00e9", "k" * 255]),
    "pool": st.sampled_from(["default", "other", "a pool the helper cannot know"]),
    "key": st.sampled_from([None, "a-key", "k" * 1024]),
    "tags": st.one_of(
        st.sampled_from([(), ["a"], ("a", "b"), ["t"] * 64]), st.builds(lambda: iter(["x"]))
    ),
    "name": st.sampled_from([None, "a name"]),
    "priority": st.sampled_from([0, -(2**31 - 1), 2**31 - 1, 7]),
    "retry": st.sampled_from([None, RetryPolicy.exponential(2), RetryPolicy(1, 0, 1.0, 0, 0.0)]),
    "start_at": later(),
    "miss_policy": st.sampled_from(["run_late", "skip", MissPolicy.SKIP]),
    "grace": st.sampled_from([0, 5, 60.0, timedelta(seconds=3)]),
    "deadline": st.sampled_from([None, timedelta(days=2)]),
    "timeout": st.sampled_from([None, 30, 0.5, timedelta(minutes=1)]),
}
BAD: dict[str, st.SearchStrategy[object]] = {
    "kind": bad_text(),
    "pool": bad_text(),
    "key": bad_text(1024, optional=True),
    "tags": bad_tags(),
    "name": bad_text(optional=True),
    "priority": bad_int(-(2**31 - 1), 2**31 - 1),
    "retry": wrong_types(none=False, strings=False),
    "start_at": bad_instant(),
    "miss_policy": bad_enum({"run_late", "skip"}),
    "grace": bad_duration(),
    "deadline": bad_instant(),
    "timeout": bad_duration(allow_zero=False, optional=True),
}

TRACE = TraceContext("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")

WORDS = {"tags": "tag", "requests": "request", "conn": "conn"}
"""The word an error names a bad argument by, where it is not the argument's own name."""


@st.composite
def helper_calls(draw: st.DrawFn, bad_at_all: bool) -> tuple[str, dict[str, Any], set[str]]:
    """(helper, its arguments but ``conn``, the names of the bad ones: empty for a good call).

    A bad call has one to three bad arguments among the task's fields, the payload, unknown
    options, ``schema``, ``codec``, ``conn`` (marked, given by the harness) and, for
    ``enqueue_many``, the requests themselves or a request's ``after``/``trace_context``."""
    many = draw(st.booleans())
    codec = draw(st.sampled_from([None, JsonCodec()]))
    bad_payload = bad_json_payloads() if codec is not None else bad_bytes_payloads()
    good_payload = (
        st.sampled_from([None, {"n": 1}, [1, "two", None], "text", 1.5])
        if codec is not None
        else st.sampled_from([None, b"", b"\x00\xff", bytearray(b"ba"), memoryview(b"mv")])
    )
    candidates = ["payload", *sorted(BAD), "unknown", "schema", "codec", "conn"]
    if many:
        candidates += ["requests", "after", "trace_context"]
    broken: set[str] = (
        draw(st.sets(st.sampled_from(candidates), min_size=1, max_size=3)) if bad_at_all else set()
    )
    fields: dict[str, object] = {}
    for name in sorted(BAD):
        if name in broken:
            fields[name] = draw(BAD[name])
        elif draw(st.booleans()):
            fields[name] = draw(GOOD[name])
    fields.setdefault("kind", draw(GOOD["kind"]))
    fields["payload"] = draw(bad_payload if "payload" in broken else good_payload)
    names: set[str] = set(broken)
    args: dict[str, Any] = {}
    if "schema" in broken:
        args["schema"] = draw(bad_schemas())
    if "codec" in broken:
        args["codec"] = draw(bad_codecs())
    elif codec is not None:
        args["codec"] = codec
    if "conn" in broken:
        args["conn"] = True  # the harness gives a wrong connection object
    if not many:
        if "unknown" in broken:
            unknown = draw(unknown_names())
            fields[unknown] = draw(st.one_of(st.none(), st.integers(), st.text(max_size=3)))
            names.add(unknown)
        args.update(fields)
        return "enqueue", args, names
    # enqueue_many: some good requests around a bad one (or the requests themselves bad).
    if "unknown" in broken:
        names.discard("unknown")  # a TaskRequest takes no unknown field
    if "after" in broken:
        fields["after"] = draw(
            st.one_of(
                st.lists(st.integers(1, 2**40), min_size=1, max_size=3), endless(),
                st.integers(), st.none(), st.builds(object), st.text(min_size=1, max_size=3),
            )
        )  # fmt: skip
    if "trace_context" in broken:
        fields["trace_context"] = draw(st.one_of(st.just(TRACE), st.integers(), st.text()))
    request = TaskRequest(**fields)  # type: ignore[arg-type]
    good = [TaskRequest("job", None if codec else b"p") for _ in range(draw(st.integers(0, 2)))]
    if "requests" in broken:
        requests: object = draw(
            st.one_of(
                st.builds(itertools.count),
                st.builds(lambda: itertools.repeat(object())),
                st.integers(),
                st.none(),
                st.text(max_size=3),
                st.binary(max_size=3),
                st.builds(object),
                st.builds(lambda: [TaskRequest("ok"), "not a request"]),
                st.builds(lambda: [{"kind": "job"}]),
            )
        )
    else:
        requests = [*good, request, *good]
    args["requests"] = requests
    return "enqueue_many", args, names


# --- part 1: refused or written, never half ---------------------------------------------------


class Harness:
    """A migrated schema and one connection of each driver, on a loop of the test's own."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.schema = new_schema()
        self.runner.run(self._open())
        self.checked = 0

    async def _open(self) -> None:
        await require_postgres()
        await PgStore.migrate(DSN, config(self.schema))
        self.asyncpg = await asyncpg.connect(DSN)
        self.pool = await asyncpg.create_pool(DSN, min_size=1, max_size=1)
        self.psycopg = psycopg.connect(DSN)
        self.psycopg_async = await psycopg.AsyncConnection.connect(DSN)
        self.count_sql = f"SELECT count(*) FROM {quote_ident(self.schema)}.cronoq_outbox"
        self.engine = create_engine(sqlalchemy_url("psycopg"))
        self.sqlalchemy = self.engine.connect()
        configure_django()
        from django.db import connection as django_connection

        # Objects that are not an open driver connection: what a caller may pass by mistake.
        self.wrong_connections: list[object] = [
            None,
            DSN,
            object(),
            self.pool,  # a pool: its statements would not be in the caller's transaction
            self.psycopg.cursor(),
            self.psycopg.pgconn,
            psycopg,
            asyncpg.Connection,  # the class
            {"conn": self.asyncpg},
            self.sqlalchemy,  # SQLAlchemy's Connection, not its driver connection
            self.engine,
            django_connection,  # Django's, not its driver connection (.connection)
        ]

    def close(self) -> None:
        async def close() -> None:
            await self.asyncpg.close()
            await self.pool.close()
            self.psycopg.close()
            await self.psycopg_async.close()
            self.sqlalchemy.close()
            self.engine.dispose()
            await drop_schema(self.schema)

        self.runner.run(close())
        self.runner.close()

    def call(self, driver: str, helper: str, args: dict[str, Any], broken: set[str]) -> None:
        """One call in a transaction of ``driver``'s connection, rolled back after; checked."""
        self.runner.run(asyncio.wait_for(self._call(driver, helper, args, broken), WAIT_S))
        self.checked += 1

    async def _call(self, driver: str, helper: str, args: dict[str, Any], broken: set[str]) -> None:
        if driver == "asyncpg":
            conn: Any = self.asyncpg
            transaction = conn.transaction()
            await transaction.start()

            async def count() -> int:
                return int(await conn.fetchval(self.count_sql))

            async def end() -> None:
                await transaction.rollback()
        elif driver == "psycopg":
            conn = self.psycopg

            async def count() -> int:
                return int(_one(conn.execute(self.count_sql).fetchone()))

            async def end() -> None:
                conn.rollback()
        else:
            conn = self.psycopg_async

            async def count() -> int:
                return int(_one(await (await conn.execute(self.count_sql)).fetchone()))

            async def end() -> None:
                await conn.rollback()

        try:
            await self._check(conn, count, helper, args, broken)
        finally:
            await end()

    async def _check(
        self,
        conn: Any,
        count: Callable[[], Awaitable[int]],
        helper: str,
        args: dict[str, Any],
        broken: set[str],
    ) -> None:
        args = dict(args)
        if args.pop("conn", False):
            conn = self.wrong_connections[self.checked % len(self.wrong_connections)]
        args.setdefault("schema", self.schema)
        before = await count()
        refused: InvalidArgument | None = None
        try:
            if helper == "enqueue":
                kind = args.pop("kind")
                payload = args.pop("payload")
                result = enqueue(conn, kind, payload, **args)
            else:
                requests = args.pop("requests")
                result = enqueue_many(conn, requests, **args)
            if inspect.isawaitable(result):
                result = await result
        except InvalidArgument as exc:
            refused = exc
        except CronoqError as exc:
            raise AssertionError(f"raised {type(exc).__name__}, not InvalidArgument") from exc
        if refused is not None:
            assert broken, f"a good call was refused: {refused}"
            message = str(refused).lower()
            words = {WORDS.get(name, name) for name in broken}
            # A codec's own error (JsonCodec's) is a PayloadError: its class names the payload.
            named = any(word in message for word in words)
            assert named or ("payload" in broken and isinstance(refused, PayloadError)), (
                f"the error names none of {sorted(broken)}: {message}"
            )
            assert await count() == before, "a refused call wrote rows"
            return
        assert not broken, f"bad arguments {sorted(broken)} were accepted: {args}"
        ids = [result] if helper == "enqueue" else result
        assert all(isinstance(i, int) for i in ids), ids
        assert await count() == before + len(ids) == before + len(set(ids))


def _one(row: tuple[Any, ...] | None) -> Any:
    assert row is not None
    return row[0]


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg", "psycopg-async"])
@pytest.mark.parametrize("bad", [True, False], ids=["bad", "good"])
def test_a_helper_call_writes_a_row_per_task_or_refuses_and_writes_nothing(
    harness: Harness, driver: str, bad: bool
) -> None:
    @FUZZ
    @given(call=helper_calls(bad))
    def check(call: tuple[str, dict[str, Any], set[str]]) -> None:
        helper, args, broken = call
        harness.call(driver, helper, args, broken)

    check()


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg", "psycopg-async"])
def test_endless_good_requests_are_refused_after_max_batch(harness: Harness, driver: str) -> None:
    """An endless iterable of good requests is read MAX_BATCH + 1 times, then refused (one
    more request than the limit, not memory without end)."""
    taken = 0

    def requests() -> Iterator[TaskRequest]:
        nonlocal taken
        for _ in itertools.count():
            taken += 1
            yield TaskRequest("job", b"p")

    harness.call(driver, "enqueue_many", {"requests": requests()}, {"requests"})
    assert taken == MAX_BATCH + 1


@pytest.mark.parametrize("codec", [None, JsonCodec()])
def test_a_payload_over_the_limit_is_refused(harness: Harness, codec: JsonCodec | None) -> None:
    payload: object = b"x" * (16 * 1024 * 1024 + 1)
    if codec is not None:
        payload = "x" * (16 * 1024 * 1024)  # 2 bytes of quotes over
    harness.call(
        "asyncpg", "enqueue", {"kind": "job", "payload": payload, "codec": codec}, {"payload"}
    )


# --- part 2: what the helpers write, the ingest makes into submit's task ---------------------

TZ_NAMES = ["Europe/Paris", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
NINE_YEARS = timedelta(days=9 * 366)


def texts(max_size: int) -> st.SearchStrategy[str]:
    return st.text(
        st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
        min_size=1,
        max_size=max_size,
    )


def instants() -> st.SearchStrategy[object]:
    """Aware datetimes within nine years of now (fixed offsets and real zones), and delays."""
    now = datetime.now(UTC).replace(tzinfo=None)
    zones = st.one_of(
        st.builds(timezone, st.timedeltas(timedelta(hours=-23, minutes=-59), timedelta(hours=23))),
        st.sampled_from([zoneinfo.ZoneInfo(name) for name in TZ_NAMES]),
        st.just(UTC),
    )
    return st.one_of(
        st.datetimes(now - NINE_YEARS, now + NINE_YEARS, timezones=zones),
        st.timedeltas(timedelta(0), NINE_YEARS),
    )


def durations(*, allow_zero: bool) -> st.SearchStrategy[object]:
    low = 0.0 if allow_zero else 1e-9
    return st.one_of(
        st.integers(0 if allow_zero else 1, TEN_YEARS_S),
        st.floats(low, float(TEN_YEARS_S) - 1.0, allow_nan=False),
        st.timedeltas(
            timedelta(0) if allow_zero else timedelta(microseconds=1), timedelta(days=3660)
        ),
    )


def json_values() -> st.SearchStrategy[object]:
    return st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**70), 2**70)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=10),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
        max_leaves=8,
    )


VALID: dict[str, st.SearchStrategy[object]] = {
    "pool": st.sampled_from(["default", "other"]),
    "key": texts(1024),
    "tags": st.lists(texts(255), max_size=64).map(tuple) | st.lists(texts(20), max_size=5),
    "name": texts(255),
    "priority": st.integers(-(2**31 - 1), 2**31 - 1),
    "retry": st.builds(
        RetryPolicy,
        st.integers(1, 100),
        st.integers(0, 10**12),
        st.floats(1.0, 100.0),
        st.integers(10**12, 10**15),
        st.floats(0.0, 1.0),
    ),
    "start_at": instants(),
    "miss_policy": st.sampled_from([*MissPolicy, *(p.value for p in MissPolicy)]),
    "grace": durations(allow_zero=True),
    "deadline": instants(),
    "timeout": durations(allow_zero=False),
}
"""Options ``submit`` takes on a scheduler with pools default and other, or nearly: a deadline
may come before its start (both refuse), and None where submit's default is not None."""


@st.composite
def submissions(draw: st.DrawFn) -> tuple[str, Any, dict[str, Any]]:
    options: dict[str, Any] = {}
    for name in sorted(VALID):
        if draw(st.booleans()):
            # Now and then None: submit's default where that is None, a refusal elsewhere.
            options[name] = None if draw(st.integers(0, 9)) == 0 else draw(VALID[name])
    kind = draw(texts(240))
    payload = draw(json_values())
    return kind, payload, options


class Twins:
    """A Scheduler ingesting a PostgreSQL schema's outbox, and one on a MemoryStore with the
    same pools and codec, to which the same arguments are submitted."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.schema = new_schema()
        self.runs = Runs()
        self.examples = 0
        self.accepted = 0
        self.runner.run(self._open())

    async def _open(self) -> None:
        await require_postgres()
        pools = [Pool("default", self.runs.run), Pool("other", self.runs.run)]
        self.store = await PgStore.connect(DSN, config(self.schema))
        self.pg = Scheduler(pools, store=self.store, codec=JsonCodec())
        self.memory_store = MemoryStore()
        self.memory = Scheduler(pools, store=self.memory_store, codec=JsonCodec())
        await self.pg.start()
        await self.memory.start()
        self.conn = await asyncpg.connect(DSN)

    def close(self) -> None:
        async def close() -> None:
            await self.conn.close()
            await self.pg.close(timeout=1)
            await self.memory.close(timeout=1)
            await self.store.close()
            await drop_schema(self.schema)

        self.runner.run(close())
        self.runner.close()

    def check(self, kind: str, payload: Any, options: dict[str, Any], many: bool) -> None:
        self.runner.run(asyncio.wait_for(self._check(kind, payload, options, many), WAIT_S))

    async def _check(self, kind: str, payload: Any, options: dict[str, Any], many: bool) -> None:
        self.examples += 1
        n = self.examples
        kind = f"{kind}#{n}"  # its own kind, to find its task by
        if isinstance(options.get("key"), str):
            options["key"] = f"{options['key'][:1000]}#{n}"  # keys of earlier examples hold
        # submit's answer: a task, or a refusal.
        submit_started = time.time_ns()
        try:
            if many:
                [ref_id] = await self.memory.submit_many([TaskRequest(kind, payload, **options)])
            else:
                ref_id = await self.memory.submit(kind, payload, **options)
        except InvalidArgument as exc:
            refused: InvalidArgument | None = exc
        else:
            refused = None
        submit_window = (submit_started, time.time_ns())
        # The helper's, in a transaction with a marker after it.
        marker = f"marker {n}"
        helper_started = time.time_ns()
        helper_refused: InvalidArgument | None = None
        try:
            async with self.conn.transaction():
                if many:
                    request = TaskRequest(kind, payload, **options)
                    await enqueue_many(self.conn, [request], schema=self.schema, codec=JsonCodec())
                else:
                    await enqueue(
                        self.conn, kind, payload, schema=self.schema, codec=JsonCodec(), **options
                    )
                await enqueue(self.conn, "marker", marker, schema=self.schema, codec=JsonCodec())
        except InvalidArgument as exc:
            helper_refused = exc
        if helper_refused is not None:
            assert refused is not None, f"the helper refused what submit takes: {helper_refused}"
            return
        helper_window = (helper_started, time.time_ns())
        assert refused is None, f"the helper took what submit refuses: {refused}"
        self.accepted += 1
        await self.runs.ran("marker", marker)
        quarantined = await self.pg.outbox_quarantine()
        assert quarantined == [], f"the ingest quarantined what the helper wrote: {quarantined}"

        [summary] = await self.pg.list(kind=kind)
        got = await self.store.get_task(summary.task_id)
        want = await self.memory_store.get_task(ref_id)
        assert got is not None and want is not None
        # Delays count from each call's own clock: compare them within its window.
        spec, ref = got.spec, want.spec
        for field in ("start_at", "deadline"):
            value = options.get(field)
            if isinstance(value, timedelta):
                delay = round(value / timedelta(microseconds=1)) * 1000
                got_ns, want_ns = getattr(spec, f"{field}_ns"), getattr(ref, f"{field}_ns")
                # The helper writes microseconds: its instant is floored to one.
                assert helper_window[0] + delay - 1000 < got_ns <= helper_window[1] + delay
                assert submit_window[0] + delay <= want_ns <= submit_window[1] + delay
                spec = dataclasses.replace(spec, **{f"{field}_ns": want_ns})
        assert spec == ref
        info, ref_info = await self.pg.get(summary.task_id), await self.memory.get(ref_id)
        for field in ("pool", "kind", "key", "tags", "name", "priority", "payload", "after"):
            assert getattr(info, field) == getattr(ref_info, field), field


@pytest.fixture(scope="module")
def twins() -> Iterator[Twins]:
    t = Twins()
    yield t
    t.close()


def test_the_ingest_makes_of_a_helpers_row_the_task_submit_makes(twins: Twins) -> None:
    @FUZZ
    @given(submission=submissions(), many=st.booleans())
    def check(submission: tuple[str, Any, dict[str, Any]], many: bool) -> None:
        kind, payload, options = submission
        twins.check(kind, payload, options, many)

    check()
    # Most examples are accepted (a deadline before its start, or a None submit refuses, is
    # the exception): the comparison ran.
    assert twins.accepted >= twins.examples // 2, (twins.accepted, twins.examples)
