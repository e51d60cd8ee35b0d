"""Fuzz every public entry point with bad input (issue 10).

Each test drives one entry point with generated calls in which at least one argument is bad:
wrong types, huge ints (``10**400``), extreme floats (``1e300``, ``-0.0``, NaN, infinities),
booleans where numbers go, NUL and lone surrogates in strings, hostile ``tzinfo`` objects, and
endless or huge iterables (``itertools.count()``, ``itertools.repeat(...)``,
``range(1, 10**18)``). After every call it checks that

- the call raised the documented ``CronoqError`` subclass (the table below, as in docs/api.md);
- nothing was applied: the store committed nothing, ``list()`` and ``list_schedules()`` are
  unchanged;
- the scheduler still serves: a good submit and wait succeed.

What each entry point raises (as docs/api.md says):

- ``InvalidArgument``: ``Scheduler(...)``, ``Pool(...)``, ``RetryPolicy(...)``,
  ``RetryPolicy.exponential``, ``TaskError(...)``, ``MemoryStore(...)``, ``get_by_key``,
  ``list``, ``close(timeout=)``; ``submit`` and ``submit_many`` (also as ``UnknownPool``,
  ``UnknownDependency``, ``PayloadError``); ``add_schedule`` and ``preview`` (also as
  ``InvalidCron``, ``UnknownTimeZone``, ``UnknownPool``, ``PayloadError``).
- ``InvalidArgument``, or ``TaskNotFound`` for an id never issued: ``get``, ``wait``, ``cancel``,
  ``attempts``, ``dependants``.
- ``InvalidArgument``, or ``ScheduleNotFound``: ``pause_schedule``, ``resume_schedule``,
  ``remove_schedule``.
- ``PayloadError``: ``JsonCodec().encode`` and ``decode``.
- ``InvalidArgument``: ``CodecContext(...)``, ``EncryptedCodec(...)``; ``PayloadError`` for
  bad data, ``InvalidArgument`` for a context that is not a ``CodecContext``:
  ``EncryptedCodec.encode_for``, ``decode_for`` and ``decode`` (issue 29 item 3).
- ``InvalidArgument``, or ``UnknownPool`` for a pool never configured: ``attach``;
  ``InvalidArgument``, or ``StaleAttempt`` for a well-formed token of an attempt never leased:
  ``heartbeat``, ``report_success``, ``report_failure``; ``InvalidArgument``:
  ``remote_attempt_pool`` and ``WorkerLink.unsent`` (the remote pools' entry points, which a
  server calls for its workers).

One running Scheduler (MemoryStore, JsonCodec) serves every example of a test function, on an
event loop the test owns, so examples cost a few round trips each. The number of examples per
entry point comes from a Hypothesis profile chosen by ``CRONOQ_FUZZ_PROFILE``: ``quick`` (the
default run, 60), ``fuzz`` (``uv run nox -s fuzz``, 600), or ``probe`` (600, no shrinking: to
see quickly which entry points another build gets wrong). The module prints how many inputs it
checked, and in how long.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hostile_values import (
    BAD_CHARS,
    HUGE_INTS,
    bad_after,
    bad_duration,
    bad_enum,
    bad_ids,
    bad_instant,
    bad_int,
    bad_limits,
    bad_payloads,
    bad_tags,
    bad_text,
    endless,
    unknown_names,
    wrong_types,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from cronoq import (
    AttemptToken,
    CancelRequested,
    CodecContext,
    CronoqError,
    InvalidArgument,
    JsonCodec,
    Limit,
    MemoryStore,
    Pool,
    RemotePool,
    RetryPolicy,
    Scheduler,
    Status,
    TaskContext,
    TaskError,
    TaskRequest,
    preview,
)
from cronoq._memory import MemoryCluster
from cronoq.crypto import EncryptedCodec
from cronoq.errors import (
    PayloadError,
    ScheduleNotFound,
    StaleAttempt,
    TaskNotFound,
    UnknownPool,
)

# --- profiles ------------------------------------------------------------------------------

settings.register_profile(
    "quick",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "fuzz",
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# Stops at the first failing example, unshrunk: to check quickly that another build fails.
settings.register_profile(
    "probe",
    max_examples=600,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("CRONOQ_FUZZ_PROFILE", "quick")
# Used as a decorator, so that loading it changes no other module's Hypothesis settings.
FUZZ = settings.get_profile(PROFILE)

CHECKED: dict[str, int] = {}


@pytest.fixture(scope="module", autouse=True)
def report_inputs(request: pytest.FixtureRequest) -> Iterator[None]:
    started = time.perf_counter()
    yield
    elapsed = time.perf_counter() - started
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    line = (
        f"cronoq fuzz, profile {PROFILE!r}: {sum(CHECKED.values()):,} bad inputs checked "
        f"over {len(CHECKED)} entry points in {elapsed:.1f}s"
    )
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # shown even when the tests pass
            reporter.write_line("")
            reporter.write_line(line)


# --- the harness ---------------------------------------------------------------------------


async def echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


class Harness:
    """One started Scheduler on a loop of its own, shared by the examples of one test."""

    def __init__(self) -> None:
        self.runner = asyncio.Runner()
        self.store = MemoryStore(outbox=True)
        self.sched = Scheduler(
            [Pool("default", echo), Pool("other", echo, limits=("api",)), RemotePool("remote")],
            store=self.store,
            codec=JsonCodec(),
            max_payload_bytes=4096,
            limits=LIMITS,
        )
        self.runner.run(self._start())
        self.good = 0

    async def _start(self) -> None:
        await self.sched.start()
        # Something for a wrongly applied call to change: a live task and a paused schedule.
        self.live_task = await self.sched.submit("held", {"n": 0}, start_at=timedelta(hours=1))
        # An explicit payload, so that the harness also runs on builds without "no payload".
        await self.sched.add_schedule("nightly", "0 3 * * *", kind="job", payload={"n": 0})
        await self.sched.pause_schedule("nightly")

    def close(self) -> None:
        self.runner.run(self.sched.close(timeout=1))
        self.runner.close()

    async def _state(self) -> tuple[object, ...]:
        cluster: MemoryCluster = self.store._cluster
        return (
            cluster.commits,
            await self.sched.list(),
            await self.sched.list_schedules(),
            dict(cluster.outbox.rows),
            dict(cluster.outbox.quarantine),
        )

    def refuses(
        self,
        entry_point: str,
        call: Callable[[], object],
        expected: tuple[type[CronoqError], ...] = (InvalidArgument,),
    ) -> None:
        """``call`` (sync, or returning an awaitable) raises one of ``expected`` and changes
        nothing; the scheduler then still runs a task."""
        self.runner.run(self._refuses(call, expected))
        CHECKED[entry_point] = CHECKED.get(entry_point, 0) + 1

    async def _refuses(
        self, call: Callable[[], object], expected: tuple[type[CronoqError], ...]
    ) -> None:
        before = await self._state()
        try:
            async with asyncio.timeout(10):  # a call that blocks fails the example, not the run
                result = call()
                if inspect.isawaitable(result):
                    await result
        except expected:
            pass
        except CronoqError as exc:
            raise AssertionError(f"raised {type(exc).__name__}, expected {expected}") from exc
        else:
            raise AssertionError("bad input was accepted")
        assert await self._state() == before, "a refused call applied something"
        assert self.sched.running, self.sched.failure
        self.good += 1
        task_id = await self.sched.submit("job", {"n": self.good})
        info = await self.sched.wait(task_id, timeout=10)
        assert (info.status, info.output) == (Status.SUCCEEDED, {"n": self.good}), info


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    yield h
    h.close()


# --- composing calls -----------------------------------------------------------------------


@st.composite
def arguments(
    draw: st.DrawFn,
    good: dict[str, st.SearchStrategy[object]],
    bad: dict[str, st.SearchStrategy[object]],
) -> dict[str, object]:
    """Keyword arguments with one to three bad values; the others good or left out."""
    broken = draw(st.sets(st.sampled_from(sorted(bad)), min_size=1, max_size=3))
    args: dict[str, object] = {}
    for name in sorted(good.keys() | bad.keys()):
        if name in broken:
            args[name] = draw(bad[name])
        elif name in good and draw(st.booleans()):
            args[name] = draw(good[name])
    return args


def later() -> st.SearchStrategy[object]:
    return st.sampled_from([timedelta(hours=1), datetime.now(UTC) + timedelta(hours=1)])


LIMITS = [
    Limit("tenant", concurrency=5, per_key=True),
    Limit("api", rate=1000, per=1.0),
]
TASK_GOOD: dict[str, st.SearchStrategy[object]] = {
    "kind": st.sampled_from(["job", "other-kind", "\u00e9t\u00e9"]),
    "payload": st.sampled_from([None, {"n": 1}, [1, "two"], "text"]),
    "pool": st.sampled_from(["default", "other"]),
    "key": st.builds(lambda: f"key-{uuid.uuid4()}"),
    "tags": st.sampled_from([(), ["a"], ("a", "b")]),
    "name": st.sampled_from([None, "a name"]),
    "priority": st.integers(-10, 10),
    "retry": st.sampled_from([None, RetryPolicy.exponential(2)]),
    "start_at": later(),
    "miss_policy": st.sampled_from(["run_late", "skip"]),
    "grace": st.sampled_from([0, 5, 60.0, timedelta(seconds=3)]),
    "deadline": st.sampled_from([None, timedelta(days=2)]),
    "timeout": st.sampled_from([None, 30, timedelta(minutes=1)]),
    "after": st.sampled_from([(), []]),
    "limits": st.sampled_from(
        [None, {}, {"tenant": "acme"}, {"api": None}, {"tenant": "é", "api": None}]
    ),
}
TASK_BAD: dict[str, st.SearchStrategy[object]] = {
    "kind": bad_text(),
    "payload": bad_payloads(),
    "pool": st.one_of(bad_text(), unknown_names({"default", "other"})),
    "key": bad_text(1024, optional=True),
    "tags": bad_tags(),
    "name": bad_text(optional=True),
    "priority": bad_int(-(2**31 - 1), 2**31 - 1),
    "retry": wrong_types(none=False),
    "start_at": bad_instant(),
    "miss_policy": bad_enum({"run_late", "skip"}),
    "grace": bad_duration(),
    "deadline": bad_instant(),
    "timeout": bad_duration(allow_zero=False, optional=True),
    "after": bad_after(),
    "limits": bad_limits({"tenant"}, {"api"}),
}
TASK_FIELDS = set(TASK_GOOD)


# --- the entry points ----------------------------------------------------------------------


def test_fuzz_scheduler_constructor(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "store": st.builds(MemoryStore),
        "codec": st.sampled_from([None, JsonCodec()]),
        "commit_timeout": st.sampled_from([1, 30.0]),
        "retention": st.sampled_from([0, 3600]),
        "max_live_tasks": st.sampled_from([None, 10]),
        "max_payload_bytes": st.sampled_from([1, 1024]),
        "seed": st.sampled_from([None, 0, 7]),
        "limits": st.sampled_from([None, [], LIMITS]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "pools": st.one_of(
            st.just([]),
            st.text(max_size=5),
            st.just([Pool("a", echo), Pool("a", echo)]),
            st.lists(wrong_types(none=True), min_size=1, max_size=2),
            wrong_types(none=True, strings=False).filter(lambda v: not isinstance(v, list)),
        ),
        "store": st.one_of(wrong_types(none=False), st.builds(lambda: MemoryCluster(0))),
        "codec": st.one_of(
            wrong_types(none=False, strings=True), st.just(JsonCodec), st.just(json)
        ),
        "commit_timeout": bad_duration(allow_zero=False),
        "retention": bad_duration(),
        "max_live_tasks": bad_int(1, 1 << 40, optional=True),
        "max_payload_bytes": bad_int(1, 1 << 31),
        "limits": st.one_of(
            wrong_types(none=False).filter(lambda v: not isinstance(v, list)),
            st.lists(wrong_types(none=True), min_size=1, max_size=2),
            st.just([Limit("a", concurrency=1), Limit("a", rate=1, per=1)]),
            st.just([Limit("a", rate=1, per=timedelta(days=2))]),  # past any retention drawn
        ),
        "seed": st.one_of(
            st.sampled_from([10**400, -(10**400), 2**64 + 1, -(2**64) - 1]),
            st.floats(),
            st.text(max_size=3),
            st.booleans(),
            wrong_types(none=False, numbers=False, strings=False),
        ),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        pools = args.pop("pools", [Pool("default", echo)])
        harness.refuses("Scheduler()", lambda: Scheduler(pools, **args))

    check()


def test_fuzz_pool(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "name": st.just("p"),
        "executor": st.just(echo),
        "concurrency": st.integers(1, 100),
        "max_live": st.sampled_from([None, 5]),
        "limits": st.sampled_from([(), ["api"], ("api", "other")]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "name": bad_text(),
        "executor": wrong_types(none=True).filter(lambda v: not callable(v)),
        "concurrency": bad_int(1, 1_000_000),
        "max_live": bad_int(1, 1 << 40, optional=True),
        "limits": st.one_of(
            bad_tags(), st.just(["api", "api"]), st.integers(17, 30).map(lambda n: ["a"] * n)
        ),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        name = args.pop("name", "p")
        executor = args.pop("executor", echo)
        harness.refuses("Pool()", lambda: Pool(name, executor, **args))

    check()


def test_fuzz_limit(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "name": st.sampled_from(["tenant", "été"]),
        "concurrency": st.sampled_from([1, 10]),
        "rate": st.sampled_from([5]),
        "per": st.sampled_from([1, 0.5, timedelta(seconds=2)]),
        "burst": st.sampled_from([None, 1, 5]),
        "per_key": st.booleans(),
        "on_full": st.sampled_from(["queue", "reject", "keep_latest"]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "name": bad_text(),
        "concurrency": bad_int(1, 1_000_000, optional=True),
        "rate": bad_int(1, 1_000_000, optional=True),
        "per": bad_duration(allow_zero=False, optional=True),
        "burst": st.one_of(bad_int(1, 5, optional=True), st.just(6)),
        "per_key": st.one_of(st.integers(0, 1), st.text(max_size=3), st.none()),
        "on_full": bad_enum({"queue", "reject", "cancel_running", "keep_latest"}),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        # A rate without its window (or the reverse), or a burst without a rate, is refused
        # too; give both so that the drawn bad value is what is refused, most of the time.
        if "rate" in args and "per" not in args:
            args["per"] = 1.0
        name = args.pop("name", "tenant")
        harness.refuses("Limit()", lambda: Limit(name, **args))

    check()


def test_fuzz_list_limits(harness: Harness) -> None:
    @FUZZ
    @given(keys=bad_int(0, 1000))
    def check(keys: Any) -> None:
        harness.refuses("list_limits", lambda: harness.sched.list_limits(keys=keys))

    check()


def test_fuzz_submit(harness: Harness) -> None:
    bad = dict(TASK_BAD)
    # An option submit does not know: refused like a bad value, not with Python's TypeError.
    bad["unknown option"] = unknown_names(TASK_FIELDS)

    @FUZZ
    @given(args=arguments(TASK_GOOD, bad), value=st.integers())
    def check(args: dict[str, Any], value: int) -> None:
        if "unknown option" in args:
            args[str(args.pop("unknown option"))] = value
        kind = args.pop("kind", "job")
        harness.refuses("submit", lambda: harness.sched.submit(kind, **args))

    check()


def _request(fields: dict[str, Any]) -> TaskRequest:
    return TaskRequest(**{"kind": "job", **fields})


def test_fuzz_submit_many(harness: Harness) -> None:
    good_request = TaskRequest("job", {"n": 1})
    not_requests = st.one_of(
        wrong_types(none=True).filter(lambda v: not isinstance(v, list | frozenset | dict)),
        st.text(max_size=3),
        st.builds(lambda: itertools.repeat("job")),
        st.lists(st.one_of(st.just(good_request), wrong_types(none=True)), min_size=1).filter(
            lambda items: any(not isinstance(i, TaskRequest) for i in items)
        ),
    )
    # Endless good requests are refused after 100,000 of them (seconds each): rarely drawn.
    endless_requests = st.sampled_from(range(40)).flatmap(
        lambda i: st.builds(lambda: itertools.repeat(good_request)) if i == 39 else not_requests
    )
    requests_with_a_bad_one = st.tuples(
        st.integers(0, 3), arguments(TASK_GOOD, TASK_BAD), st.integers(0, 3)
    ).map(lambda t: [good_request] * t[0] + [_request(t[1])] + [good_request] * t[2])

    @FUZZ
    @given(requests=st.one_of(requests_with_a_bad_one, endless_requests))
    def check(requests: Any) -> None:
        harness.refuses("submit_many / TaskRequest", lambda: harness.sched.submit_many(requests))

    check()


def test_fuzz_get_wait_cancel(harness: Harness) -> None:
    # Ids of epoch 1 start above 2**40: none of these was issued. A malformed id is an
    # InvalidArgument, never a TaskNotFound: the error says which mistake it was.
    never_issued = st.integers(1, 2**40).map(lambda n: (n, TaskNotFound))
    malformed = bad_ids().map(lambda v: (v, InvalidArgument))

    @FUZZ
    @given(
        which=st.sampled_from(
            ["get", "wait", "cancel", "attempts", "dependants", "explain", "rerun"]
        ),
        case=st.one_of(malformed, never_issued),
    )
    def check_ids(which: str, case: tuple[Any, type[CronoqError]]) -> None:
        task_id, expected = case
        call = getattr(harness.sched, which)
        harness.refuses(which, lambda: call(task_id), (expected,))

    @FUZZ
    @given(timeout=bad_duration(optional=True))  # None: wait without a limit, which is good
    def check_wait_timeout(timeout: Any) -> None:
        task_id = harness.live_task
        harness.refuses("wait", lambda: harness.sched.wait(task_id, timeout=timeout))

    @FUZZ
    @given(reason=bad_text(4096))
    def check_cancel_reason(reason: Any) -> None:
        task_id = harness.live_task
        harness.refuses("cancel", lambda: harness.sched.cancel(task_id, reason))

    check_ids()
    check_wait_timeout()
    check_cancel_reason()


def test_fuzz_get_by_key(harness: Harness) -> None:
    @FUZZ
    @given(key=bad_text(1024))
    def check(key: Any) -> None:
        harness.refuses("get_by_key", lambda: harness.sched.get_by_key(key))

    check()


def test_fuzz_list(harness: Harness) -> None:
    statuses = {s.value for s in Status}
    good: dict[str, st.SearchStrategy[object]] = {
        "status": st.sampled_from([None, "ready", ["running", Status.FAILED]]),
        "pool": st.sampled_from([None, "default"]),
        "kind": st.sampled_from([None, "job"]),
        "tag": st.sampled_from([None, "a"]),
        "limit": st.sampled_from([None, 1, 100]),
        "after": st.sampled_from([None, 0, 5]),
        "before": st.sampled_from([None, 0, 2**63 - 1]),
        "newest_first": st.booleans(),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        # Not None (no filter) and not an empty collection (a filter that matches nothing).
        "status": st.one_of(
            bad_enum(statuses).filter(lambda v: v is not None and v not in ([], {}, frozenset())),
            st.lists(bad_enum(statuses).filter(lambda v: v is not None), min_size=1),
            st.builds(lambda: itertools.repeat("ready")),
        ),
        "pool": bad_text(optional=True),
        "kind": bad_text(optional=True),
        "tag": bad_text(optional=True),
        "limit": bad_int(1, 1 << 40, optional=True),
        "after": bad_int(0, 2**63 - 1, optional=True),
        "before": bad_int(0, 2**63 - 1, optional=True),
        "newest_first": st.one_of(st.none(), st.integers(0, 1), st.text(max_size=3)),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        harness.refuses("list", lambda: harness.sched.list(**args))

    check()


BAD_CRONS = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "* * *",
            "* * * * * * *",
            "61 * * * *",
            "* 24 * * *",
            "* * 32 * *",
            "* * * 13 *",
            "* * * * 8",
            "0 0 30 2 *",
            "@reboot",
            "@never",
            "a b c d e",
            "*/0 * * * *",
            "1-/2 * * * *",
            "H * * * *",
            "0 0 31 4 *",
            "5--6 * * * *",
        ]
    ),
    st.tuples(st.text("0123456789*/,-", max_size=4), BAD_CHARS).map(
        lambda t: f"{t[0]}{t[1]} * * * *"
    ),
    st.text("0123456789*/,-", min_size=1, max_size=6).map(lambda s: f"{s} ! * * *"),
    wrong_types(none=True, strings=False),
)
BAD_ZONES = st.one_of(
    st.sampled_from(
        [
            "",
            "Mars/Olympus",
            "../etc/passwd",
            "/etc/localtime",
            "localtime",
            "right/UTC",
            "UTC\x00",
            "\udcff",
            "America",
            "Europe/",
            "utc ",
        ]
    ),
    st.from_regex(r"[A-Za-z/_]{1,12}", fullmatch=True).map(lambda s: f"{s}!"),
    wrong_types(none=True, strings=False),
)


def test_fuzz_add_schedule(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "name": st.builds(lambda: f"s-{uuid.uuid4()}"),
        "cron": st.sampled_from(["* * * * *", "0 0 1 1 *", "*/5 * * * * *"]),
        "kind": st.just("job"),
        "payload": st.sampled_from([None, {"n": 1}]),
        "pool": st.sampled_from(["default", "other"]),
        "timezone": st.sampled_from(["UTC", "Europe/Paris"]),
        "tags": st.sampled_from([(), ["a"]]),
        "priority": st.integers(-5, 5),
        "retry": st.sampled_from([None, RetryPolicy.exponential(2)]),
        "timeout": st.sampled_from([None, 30]),
        "overlap": st.sampled_from(["skip", "allow"]),
        "catch_up": st.sampled_from(["coalesce", "skip"]),
        "grace": st.sampled_from([0, 60.0]),
        "replace": st.booleans(),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "name": bad_text(),
        "cron": BAD_CRONS,
        "kind": bad_text(),
        "payload": bad_payloads(),
        "pool": st.one_of(bad_text(), unknown_names({"default", "other"})),
        "timezone": BAD_ZONES,
        "tags": bad_tags(),
        "priority": bad_int(-(2**31 - 1), 2**31 - 1),
        "retry": wrong_types(none=False),
        "timeout": bad_duration(allow_zero=False, optional=True),
        "overlap": bad_enum({"skip", "allow"}),
        "catch_up": bad_enum({"coalesce", "skip"}),
        "grace": bad_duration(),
        "replace": wrong_types(none=True).filter(lambda v: not isinstance(v, bool)),
        "unknown option": unknown_names(set()),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        if "unknown option" in args:
            args[f"x_{args.pop('unknown option')}"] = 1
        name = args.pop("name", f"s-{uuid.uuid4()}")
        cron = args.pop("cron", "* * * * *")
        kind = args.pop("kind", "job")
        harness.refuses(
            "add_schedule", lambda: harness.sched.add_schedule(name, cron, kind=kind, **args)
        )

    check()


def test_fuzz_schedule_calls(harness: Harness) -> None:
    @FUZZ
    @given(
        which=st.sampled_from(["pause_schedule", "resume_schedule", "remove_schedule"]),
        case=st.one_of(
            bad_text().map(lambda v: (v, InvalidArgument)),
            unknown_names({"nightly"}).map(lambda v: (v, ScheduleNotFound)),
        ),
    )
    def check(which: str, case: tuple[Any, type[CronoqError]]) -> None:
        name, expected = case
        call = getattr(harness.sched, which)
        harness.refuses(which, lambda: call(name), (expected,))

    check()


def test_fuzz_occurrences_and_parent_outputs(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "name": st.just("nightly"),
        "before": st.sampled_from([None, datetime.now(UTC)]),
        "limit": st.sampled_from([1, 1000]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "name": bad_text(),
        "before": wrong_types(none=False).filter(lambda v: not isinstance(v, datetime)),
        "limit": bad_int(1, 1000),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        name = args.pop("name", "nightly")
        harness.refuses("occurrences", lambda: harness.sched.occurrences(name, **args))

    @FUZZ
    @given(name=unknown_names({"nightly"}))
    def check_unknown(name: str) -> None:
        harness.refuses("occurrences", lambda: harness.sched.occurrences(name), (ScheduleNotFound,))

    @FUZZ
    @given(after=bad_after().filter(lambda v: v != [2**62]))  # an unknown parent has no output
    def check_parent_outputs(after: Any) -> None:
        harness.refuses("parent_outputs", lambda: harness.sched.parent_outputs(after))

    check()
    check_unknown()
    check_parent_outputs()


def test_fuzz_preview(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "cron": st.sampled_from(["* * * * *", "0 0 29 2 *"]),
        "timezone": st.sampled_from(["UTC", "America/New_York"]),
        "n": st.integers(1, 20),
        "after": st.sampled_from([None, datetime(2030, 1, 1, tzinfo=UTC)]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "cron": BAD_CRONS,
        "timezone": BAD_ZONES,
        "n": bad_int(1, 10_000),
        "after": bad_instant(optional=True).filter(lambda v: v is not None),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        cron = args.pop("cron", "* * * * *")
        harness.refuses("preview", lambda: preview(cron, **args))

    check()


def test_fuzz_close_timeout(harness: Harness) -> None:
    @FUZZ
    @given(timeout=bad_duration())
    def check(timeout: Any) -> None:
        harness.refuses("close(timeout=)", lambda: harness.sched.close(timeout=timeout))

    check()


def test_fuzz_remote_pools(harness: Harness) -> None:
    """The calls a server makes for its remote workers: attach, heartbeat, the reports, the
    pool of an attempt, and a link's ``unsent``."""
    sched = harness.sched
    good_token = AttemptToken(1, harness.live_task, 1)  # well formed, never leased
    good_lease = bytes(16)
    bad_tokens = st.one_of(
        wrong_types(none=True),
        st.builds(AttemptToken, bad_int(1, 2**63 - 1), st.just(harness.live_task), st.just(1)),
        st.builds(AttemptToken, st.just(1), bad_ids(), st.just(1)),
        st.builds(AttemptToken, st.just(1), st.just(harness.live_task), bad_int(1, 2**31 - 1)),
    )
    bad_leases = st.one_of(
        wrong_types(none=True),
        st.binary(max_size=15),
        st.binary(min_size=17, max_size=64),
        st.text(min_size=16, max_size=16),
    )
    tokens = st.one_of(bad_tokens, st.just(good_token))
    leases = st.one_of(bad_leases, st.just(good_lease))

    def expected(token: object, lease: object) -> tuple[type[CronoqError], ...]:
        if token is good_token and lease is good_lease:
            return (StaleAttempt,)  # good input, an attempt nobody leased: changes nothing
        return (InvalidArgument,)

    @FUZZ
    @given(
        pools=st.one_of(
            st.just(["remote"]),
            st.just([]),
            st.just(["default"]),  # runs in this process
            endless(),
            st.lists(bad_text(255), min_size=1, max_size=2),
            wrong_types(none=True, strings=False),
        ),
        slots=st.one_of(st.just(1), bad_int(1, 100_000)),
        name=st.one_of(st.just(""), bad_text(255)),
        running=st.one_of(
            st.just(()),
            endless(),
            wrong_types(none=True, strings=False),
            st.lists(st.tuples(bad_tokens, st.just(good_lease)), min_size=1, max_size=2),
            st.lists(st.tuples(st.just(good_token), bad_leases), min_size=1, max_size=2),
        ),
    )
    def check_attach(pools: Any, slots: Any, name: Any, running: Any) -> None:
        if pools == ["remote"] and slots == 1 and running == () and name == "":
            return  # every argument good
        harness.refuses("attach", lambda: sched.attach(pools, slots, running=running, name=name))

    @FUZZ
    @given(name=bad_text(255).filter(lambda v: v != ""))  # "" is the default: no name
    def check_attach_name(name: Any) -> None:
        harness.refuses("attach", lambda: sched.attach(["remote"], 1, name=name))

    @FUZZ
    @given(pool=st.text(min_size=1, max_size=8).filter(lambda p: p.isalnum()))
    def check_attach_unknown_pool(pool: str) -> None:
        if pool in {"default", "other", "remote"}:
            return
        harness.refuses("attach", lambda: sched.attach([pool], 1), (UnknownPool,))

    @FUZZ
    @given(token=tokens, lease=leases)
    def check_heartbeat(token: Any, lease: Any) -> None:
        harness.refuses(
            "heartbeat", lambda: sched.heartbeat(token, lease_id=lease), expected(token, lease)
        )

    @FUZZ
    @given(
        token=tokens,
        lease=leases,
        output=st.one_of(
            st.none(),
            st.binary(max_size=8),
            st.binary(min_size=4097, max_size=4200),  # over the harness's payload limit
            wrong_types(none=False),
        ),
    )
    def check_report_success(token: Any, lease: Any, output: Any) -> None:
        good_output = output is None or (isinstance(output, bytes) and len(output) <= 4096)
        want = expected(token, lease) if good_output else (InvalidArgument,)
        harness.refuses(
            "report_success", lambda: sched.report_success(token, output, lease_id=lease), want
        )

    @FUZZ
    @given(
        token=tokens,
        lease=leases,
        message=st.one_of(st.just("failed"), bad_text(65_536)),
        retryable=st.one_of(st.just(True), wrong_types(none=True, numbers=False)),
        retry_after=st.one_of(st.none(), bad_duration(optional=True)),
        traceback=st.one_of(
            st.just(""),
            st.text(max_size=30),
            st.integers(65_537, 65_540).map(lambda n: "x" * n),
            wrong_types(none=True, strings=False),
        ),
    )
    def check_report_failure(
        token: Any, lease: Any, message: Any, retryable: Any, retry_after: Any, traceback: Any
    ) -> None:
        good = (
            message == "failed"
            and retryable is True
            and retry_after is None
            and isinstance(traceback, str)
        )
        want = expected(token, lease) if good else (InvalidArgument,)
        harness.refuses(
            "report_failure",
            lambda: sched.report_failure(
                token,
                message,
                lease_id=lease,
                retryable=retryable,
                retry_after=retry_after,
                traceback=traceback,
            ),
            want,
        )

    @FUZZ
    @given(token=bad_tokens, lease=leases)
    def check_remote_attempt_pool(token: Any, lease: Any) -> None:
        harness.refuses(
            "remote_attempt_pool", lambda: sched.remote_attempt_pool(token, lease_id=lease)
        )

    link = sched.attach(["remote"], 1)

    @FUZZ
    @given(event=wrong_types(none=True))
    def check_unsent(event: Any) -> None:
        harness.refuses("WorkerLink.unsent", lambda: link.unsent(event))

    check_attach()
    check_attach_name()
    check_attach_unknown_pool()
    check_heartbeat()
    check_report_success()
    check_report_failure()
    check_remote_attempt_pool()
    check_unsent()
    link.close()
    # A cancellation or attempt never leased to this link changes nothing either.
    link.unsent(CancelRequested(good_token, "never sent"))


def test_fuzz_retry_policy(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "max_attempts": st.integers(1, 1000),
        "initial_ns": st.just(1_000_000),
        "multiplier": st.sampled_from([1, 2.0, 100]),
        "max_ns": st.just(10**9),
        "jitter": st.sampled_from([0, 0.5, 1.0]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "max_attempts": bad_int(1, 1000),
        # Bad whatever max_ns is: a good max_ns may be left out, and its default is 300 s.
        "initial_ns": bad_int(0, 10 * 366 * 24 * 3600 * 10**9),
        "multiplier": st.one_of(
            st.floats().filter(lambda m: not 1 <= m <= 100),
            st.integers(max_value=0),
            HUGE_INTS,
            st.booleans(),
            wrong_types(none=True, numbers=False),
        ),
        "max_ns": bad_int(10**6, 10 * 366 * 24 * 3600 * 10**9),
        "jitter": st.one_of(
            st.floats().filter(lambda j: not 0 <= j <= 1),
            st.integers(min_value=2),
            HUGE_INTS,
            st.booleans(),
            wrong_types(none=True, numbers=False),
        ),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        harness.refuses("RetryPolicy()", lambda: RetryPolicy(**args))

    check()


def test_fuzz_retry_policy_exponential(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "max_attempts": st.integers(1, 1000),
        "initial": st.sampled_from([0, 0.5, 1]),
        "multiplier": st.sampled_from([1, 3.0]),
        "maximum": st.sampled_from([60, 3600.0]),
        "jitter": st.sampled_from([0, 0.25]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "max_attempts": bad_int(1, 1000),
        "initial": bad_duration(),
        "multiplier": st.one_of(
            st.floats().filter(lambda m: not 1 <= m <= 100),
            HUGE_INTS,
            st.booleans(),
            wrong_types(none=True, numbers=False),
        ),
        "maximum": bad_duration(),
        "jitter": st.one_of(
            st.floats().filter(lambda j: not 0 <= j <= 1),
            HUGE_INTS,
            st.booleans(),
            wrong_types(none=True, numbers=False),
        ),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        max_attempts = args.pop("max_attempts", 3)
        harness.refuses(
            "RetryPolicy.exponential", lambda: RetryPolicy.exponential(max_attempts, **args)
        )

    check()


def test_fuzz_task_error(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "message": st.text(max_size=10),
        "retryable": st.booleans(),
        "retry_after": st.sampled_from([None, 0, 1.5, 3600, timedelta(minutes=1)]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "message": wrong_types(none=True, strings=False),
        "retryable": wrong_types(none=True).filter(lambda v: not isinstance(v, bool)),
        "retry_after": bad_duration(optional=True),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        message = args.pop("message", "failed")
        harness.refuses("TaskError()", lambda: TaskError(message, **args))

    check()


def test_fuzz_memory_store(harness: Harness) -> None:
    @FUZZ
    @given(keep_finished=bad_duration())
    def check(keep_finished: Any) -> None:
        harness.refuses("MemoryStore()", lambda: MemoryStore(keep_finished=keep_finished))

    check()


OUTBOX_GOOD = {name: v for name, v in TASK_GOOD.items() if name not in ("after", "payload")}
OUTBOX_BAD = {
    **{name: v for name, v in TASK_BAD.items() if name not in ("after", "payload", "pool")},
    # An unknown pool is not refused here: only the scheduler knows its pools (decided at
    # ingest, where such a row is quarantined).
    "pool": bad_text(),
    "payload": wrong_types(none=False).filter(
        lambda v: not isinstance(v, bytes | bytearray | memoryview)
    ),
}


def test_fuzz_outbox_put(harness: Harness) -> None:
    """MemoryOutbox.put, whose options are checked by encode_outbox_options: the checks of the
    PostgreSQL helpers (enqueue, enqueue_many) too."""
    outbox = harness.store.outbox
    assert outbox is not None
    bad = dict(OUTBOX_BAD)
    bad["unknown option"] = unknown_names(set(OUTBOX_GOOD) - {"kind"})

    @FUZZ
    @given(args=arguments(OUTBOX_GOOD, bad), value=st.integers())
    def check(args: dict[str, Any], value: int) -> None:
        if "unknown option" in args:
            args[str(args.pop("unknown option"))] = value
        kind = args.pop("kind", "job")
        payload = args.pop("payload", b"{}")
        harness.refuses("MemoryOutbox.put", lambda: outbox.put(kind, payload, **args))

    check()


def test_fuzz_outbox_calls(harness: Harness) -> None:
    ids = st.one_of(
        # Not an iterable of ids (a str or bytes is refused, not read as characters).
        st.one_of(st.builds(object), st.none(), st.integers(), st.floats(), st.text(max_size=3),
                  st.binary(max_size=3)),
        st.lists(bad_ids(), min_size=1, max_size=3),  # one bad id among them
        st.builds(lambda: itertools.count(1)),  # good ids without end: refused after 1,000
    )  # fmt: skip

    @FUZZ
    @given(
        after=st.one_of(bad_int(0, 2**63 - 1), st.integers(0, 10)),
        limit=st.one_of(bad_int(1, 1000), st.integers(1, 10)),
        row_ids=ids,
    )
    def check(after: Any, limit: Any, row_ids: Any) -> None:
        sched = harness.sched
        if not (type(after) is int and after >= 0 and type(limit) is int and 1 <= limit <= 1000):
            harness.refuses(
                "outbox_quarantine", lambda: sched.outbox_quarantine(after=after, limit=limit)
            )
        harness.refuses("requeue_outbox", lambda: sched.requeue_outbox(row_ids))
        harness.refuses("discard_outbox", lambda: sched.discard_outbox(row_ids))

    check()


def test_fuzz_json_codec(harness: Harness) -> None:
    codec = JsonCodec()
    not_json = st.one_of(
        st.binary(max_size=20).map(lambda b: b"\xff" + b),
        st.binary(max_size=20).map(lambda b: b"{" + b),
        st.just(b""),
        st.just(b"[" * 100_000),
        st.just(b"NaN!"),
        wrong_types(none=True, strings=False).filter(lambda v: not isinstance(v, bytes)),
    )

    @FUZZ
    @given(value=bad_payloads().filter(lambda v: not isinstance(v, str)), data=not_json)
    def check(value: Any, data: Any) -> None:
        harness.refuses("JsonCodec.encode", lambda: codec.encode(value), (PayloadError,))
        harness.refuses("JsonCodec.decode", lambda: codec.decode(data), (PayloadError,))

    check()


def _context_text(*, optional: bool = False) -> st.SearchStrategy[object]:
    """What no kind, pool or key of a CodecContext may be (it sets no length limit: the task's
    were checked when it was submitted)."""
    return st.one_of(
        st.just(""),
        st.tuples(st.text(max_size=5), BAD_CHARS, st.text(max_size=5)).map("".join),
        wrong_types(none=not optional, strings=False),
    )


def test_fuzz_codec_context(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "kind": st.sampled_from(["job", "\u00e9t\u00e9", "k" * 300]),
        "pool": st.sampled_from(["default", "other"]),
        "key": st.sampled_from([None, "order-17"]),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "role": st.one_of(
            st.sampled_from(["Payload", "outputs", "", "payload\x00", "\udcff"]),
            wrong_types(none=True, strings=False),
        ),
        "kind": _context_text(),
        "pool": _context_text(),
        "key": _context_text(optional=True),
        "task_id": st.one_of(st.integers(), HUGE_INTS, wrong_types(none=False)),  # a payload's
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        role, kind, pool = (
            args.pop("role", "payload"),
            args.pop("kind", "job"),
            args.pop("pool", "p"),
        )
        harness.refuses("CodecContext()", lambda: CodecContext(role, kind, pool, **args))

    @FUZZ
    @given(task_id=bad_int(1, 2**63 - 1))
    def output(task_id: Any) -> None:
        harness.refuses(
            "CodecContext(output)", lambda: CodecContext("output", "job", "p", None, task_id)
        )

    check()
    output()


KEY = bytes(range(32))


def _hashable(value: object) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def test_fuzz_encrypted_codec_constructor(harness: Harness) -> None:
    good: dict[str, st.SearchStrategy[object]] = {
        "inner": st.sampled_from([None, JsonCodec()]),
        "accept_unbound": st.booleans(),
    }
    bad: dict[str, st.SearchStrategy[object]] = {
        "keys": st.one_of(
            st.just({}),
            # Key ids a dict can hold (a list cannot be one).
            st.builds(
                dict,
                st.lists(
                    st.tuples(bad_text().filter(_hashable), st.just(KEY)), min_size=1, max_size=2
                ),
            ),
            st.builds(
                lambda k: {"k": k}, st.one_of(st.binary(max_size=40), wrong_types(none=True))
            ),
            wrong_types(none=True).filter(lambda v: not isinstance(v, dict)),
        ),
        "current": st.one_of(
            st.text(max_size=5).filter(lambda t: t != "k"), wrong_types(none=True)
        ),
        "inner": st.one_of(
            st.just(JsonCodec), st.just(json), wrong_types(none=False, strings=True)
        ),
        "accept_unbound": wrong_types(none=True).filter(lambda v: not isinstance(v, bool)),
    }

    @FUZZ
    @given(args=arguments(good, bad))
    def check(args: dict[str, Any]) -> None:
        keys, current = args.pop("keys", {"k": KEY}), args.pop("current", "k")
        harness.refuses("EncryptedCodec()", lambda: EncryptedCodec(keys, current, **args))

    check()


def test_fuzz_encrypted_codec_decoding(harness: Harness) -> None:
    codec = EncryptedCodec({"k": KEY}, "k", JsonCodec(), accept_unbound=False)
    context = CodecContext("payload", "job", "default")
    sealed = codec.encode_for({"n": 1}, context)
    unbound = codec.encode({"n": 1})
    not_ours = st.one_of(
        st.binary(max_size=60),
        st.binary(max_size=60).map(lambda b: b"CQE2" + b),
        st.binary(max_size=60).map(lambda b: b"CQE1" + b),
        st.builds(
            lambda i, x: sealed[:i] + bytes([sealed[i] ^ x]) + sealed[i + 1 :],
            st.integers(0, len(sealed) - 1),
            st.integers(1, 255),
        ),
        st.integers(0, len(sealed) - 1).map(lambda i: sealed[:i]),
        st.just(unbound),  # bound to no context: decode_for refuses it
        st.just(codec.encode_for({"n": 1}, CodecContext("payload", "job", "other"))),
        wrong_types(none=True, strings=True).filter(lambda v: not isinstance(v, bytes)),
    )
    not_contexts = st.one_of(
        wrong_types(none=True, strings=True),
        st.just(("payload", "job", "default")),
    )

    @FUZZ
    @given(data=not_ours, bad_context=not_contexts, value=bad_payloads())
    def check(data: Any, bad_context: Any, value: Any) -> None:
        harness.refuses(
            "EncryptedCodec.decode_for", lambda: codec.decode_for(data, context), (PayloadError,)
        )
        decoded = sealed if data == unbound else data  # decode() refuses a task's value
        harness.refuses("EncryptedCodec.decode", lambda: codec.decode(decoded), (PayloadError,))
        harness.refuses(
            "EncryptedCodec.decode_for(context)", lambda: codec.decode_for(sealed, bad_context)
        )
        harness.refuses(
            "EncryptedCodec.encode_for(context)", lambda: codec.encode_for({"n": 1}, bad_context)
        )
        if not (isinstance(value, str) and len(value) > 4000):  # no limit here: only the API's
            harness.refuses(
                "EncryptedCodec.encode_for",
                lambda: codec.encode_for(value, context),
                (PayloadError,),
            )

    check()


def test_the_fuzz_harness_notices_what_it_should() -> None:
    """The checks can fail: an accepted input, an applied change and a wrong error class."""
    h = Harness()
    try:
        with pytest.raises(AssertionError, match="bad input was accepted"):
            h.refuses("probe", lambda: h.sched.list())

        async def applies_then_fails() -> None:
            await h.sched.submit("job", {"n": 1})
            raise InvalidArgument("after the fact")

        with pytest.raises(AssertionError, match="a refused call applied something"):
            h.refuses("probe", applies_then_fails)
        with pytest.raises(AssertionError, match="raised TaskNotFound"):
            h.refuses("probe", lambda: h.sched.get(12345))
        with pytest.raises(TypeError):
            h.refuses("probe", lambda: Pool())  # type: ignore[call-arg]
        h.refuses("probe", lambda: h.sched.get(12345), (TaskNotFound,))
    finally:
        h.close()
        CHECKED.pop("probe", None)
