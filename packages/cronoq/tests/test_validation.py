"""Every public entry point rejects bad input with a precise error and applies nothing."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

import pytest
from hostile_values import DayLongZone, HostileZone, NaiveZone, RaisingZone

from cronoq import (
    MAX_BATCH,
    BytesCodec,
    Codec,
    InvalidArgument,
    JsonCodec,
    MemoryStore,
    Pool,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    Status,
    TaskContext,
    TaskError,
    TaskRequest,
    preview,
)
from cronoq._engine import (
    AttemptFailed,
    AttemptReport,
    Engine,
    EngineConfig,
    PoolConfig,
    SubmitResult,
    SubmitTasks,
)
from cronoq._engine.state import seconds
from cronoq._ids import MAX_EPOCH, SEQUENCE_BITS, epoch_of
from cronoq._memory import MemoryCluster
from cronoq._model import NS_PER_S, MissPolicy, TaskSpec
from cronoq.errors import (
    DuplicateSchedule,
    InvalidCron,
    PayloadError,
    ScheduleNotFound,
    StoreFatal,
    TaskNotFound,
    UnknownDependency,
    UnknownPool,
    UnknownTimeZone,
)
from cronoq.store import TaskSubmitted, TaskUpdated, sanitize_message


async def noop(ctx: TaskContext, payload: Any) -> None:
    return None


@pytest.fixture
async def sched() -> AsyncIterator[Scheduler]:
    async with Scheduler([Pool("default", noop), Pool("slow", noop)]) as scheduler:
        yield scheduler


async def assert_nothing_applied(sched: Scheduler) -> None:
    assert await sched.list() == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kind": "a\x00b"}, InvalidArgument, "kind must not contain NUL"),
        ({"kind": ""}, InvalidArgument, "kind must not be empty"),
        ({"kind": 5}, InvalidArgument, "kind must be a str, got int"),
        ({"kind": "k" * 256}, InvalidArgument, "kind is 256 characters long; the limit is 255"),
        ({"key": "a\x00"}, InvalidArgument, "key must not contain NUL"),
        ({"tags": ["ok", "b\x00d"]}, InvalidArgument, "tag must not contain NUL"),
        ({"tags": "notalist"}, InvalidArgument, "tags must be a list or tuple of str"),
        ({"name": "x\x00"}, InvalidArgument, "name must not contain NUL"),
        ({"pool": "nope"}, InvalidArgument, "unknown pool 'nope'; configured: default, slow"),
        ({"priority": 1.5}, InvalidArgument, "priority must be an int, got float"),
        ({"priority": True}, InvalidArgument, "priority must be an int, got bool"),
        ({"timeout": -1}, InvalidArgument, "timeout must be > 0 seconds, got -1"),
        ({"timeout": 0}, InvalidArgument, "timeout must be > 0 seconds, got 0"),
        ({"timeout": float("nan")}, InvalidArgument, "timeout must be finite"),
        ({"timeout": 1e12}, InvalidArgument, "longer than ten years"),
        ({"grace": "soon"}, InvalidArgument, "grace must be seconds"),
        (
            {"start_at": datetime(2030, 1, 1)},
            InvalidArgument,
            "start_at must be timezone-aware",
        ),
        ({"start_at": 12.5}, InvalidArgument, "start_at must be a timezone-aware datetime"),
        (
            {"start_at": timedelta(hours=2), "deadline": timedelta(hours=1)},
            InvalidArgument,
            "deadline must be after start_at",
        ),
        ({"miss_policy": "later"}, InvalidArgument, "miss_policy must be one of 'run_late'"),
        ({"after": "12"}, InvalidArgument, "after must be a list of task ids"),
        ({"after": [0]}, InvalidArgument, "a dependency id must be between 1 and"),
        ({"retry": 3}, InvalidArgument, "retry must be a RetryPolicy, got int"),
        ({"payload": "text"}, PayloadError, "BytesCodec encodes bytes, got str"),
        ({"unknown_option": 1}, InvalidArgument, "unknown_option"),
    ],
)
async def test_submit_rejects_bad_input(
    sched: Scheduler, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    kind = kwargs.pop("kind", "job")
    with pytest.raises(error, match=re.escape(message)):
        await sched.submit(kind, **kwargs)
    await assert_nothing_applied(sched)


async def test_validation_errors_are_value_errors(sched: Scheduler) -> None:
    with pytest.raises(ValueError, match="NUL"):
        await sched.submit("a\x00")


async def test_submit_many_rejects_the_whole_batch(sched: Scheduler) -> None:
    good = TaskRequest("job")
    with pytest.raises(InvalidArgument, match="tag must not contain NUL"):
        await sched.submit_many([good, TaskRequest("job", tags=["\x00"]), good])
    above_high_water_mark = 2**62
    with pytest.raises(UnknownDependency, match=f"depends on task {2**62}, which was never"):
        await sched.submit_many([good, TaskRequest("job", after=[above_high_water_mark])])
    await assert_nothing_applied(sched)


async def test_submit_many_takes_an_iterable_of_requests(sched: Scheduler) -> None:
    with pytest.raises(InvalidArgument, match="iterable of TaskRequest, got int"):
        await sched.submit_many(5)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="expected a TaskRequest, got str"):
        await sched.submit_many(["job"])  # type: ignore[list-item]
    await assert_nothing_applied(sched)


async def test_payload_size_limit() -> None:
    async with Scheduler([Pool("default", noop)], max_payload_bytes=10) as sched:
        with pytest.raises(PayloadError, match="11 bytes encoded; the limit is 10"):
            await sched.submit("job", b"x" * 11)
        await assert_nothing_applied(sched)


async def test_json_codec_rejects_unencodable_payloads() -> None:
    async with Scheduler([Pool("default", noop)], codec=JsonCodec()) as sched:
        with pytest.raises(PayloadError, match="JsonCodec cannot encode"):
            await sched.submit("job", {"when": datetime.now})
        with pytest.raises(PayloadError, match="JsonCodec cannot encode"):
            await sched.submit("job", float("inf"))
        await assert_nothing_applied(sched)


async def test_user_codec_failures_become_payload_errors() -> None:
    class Broken(BytesCodec):
        def encode(self, value: Any) -> bytes:
            raise KeyError("no")

    async with Scheduler([Pool("default", noop)], codec=Broken()) as sched:
        with pytest.raises(PayloadError, match="Broken cannot encode the payload: KeyError"):
            await sched.submit("job", b"")


@pytest.mark.parametrize(
    ("cron", "timezone", "error", "message"),
    [
        ("61 * * * *", "UTC", InvalidCron, "61 \\* \\* \\* \\*"),
        ("* * *", "UTC", InvalidCron, "has 3 fields; expected 5"),
        ("0 0 30 2 *", "UTC", InvalidCron, "never"),
        ("* * * * *", "Mars/Olympus", UnknownTimeZone, "unknown time zone 'Mars/Olympus'"),
        ("* * * * *", "../etc/passwd", UnknownTimeZone, "unknown time zone"),
    ],
)
async def test_add_schedule_rejects_bad_cron_and_time_zones(
    sched: Scheduler, cron: str, timezone: str, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        await sched.add_schedule("s", cron, kind="job", timezone=timezone)
    assert await sched.list_schedules() == []


async def test_schedule_names_and_pools(sched: Scheduler) -> None:
    with pytest.raises(InvalidArgument, match="unknown pool 'gone'"):
        await sched.add_schedule("s", "* * * * *", kind="job", pool="gone")
    with pytest.raises(InvalidArgument, match="schedule name must not contain NUL"):
        await sched.add_schedule("s\x00", "* * * * *", kind="job")
    await sched.add_schedule("s", "* * * * *", kind="job")
    with pytest.raises(DuplicateSchedule, match="'s' already exists"):
        await sched.add_schedule("s", "0 * * * *", kind="job")
    replaced = await sched.add_schedule("s", "0 * * * *", kind="job", replace=True)
    assert replaced.cron == "0 * * * *"
    with pytest.raises(ScheduleNotFound, match="no schedule named 'x'"):
        await sched.pause_schedule("x")
    with pytest.raises(ScheduleNotFound):
        await sched.remove_schedule("x")


async def test_lookups_of_unknown_tasks(sched: Scheduler) -> None:
    with pytest.raises(TaskNotFound, match="no task 12345"):
        await sched.get(12345)
    with pytest.raises(TaskNotFound):
        await sched.cancel(12345)
    with pytest.raises(InvalidArgument, match="task_id must be an int"):
        await sched.get("1")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="status must be among"):
        await sched.list(status="done")


def test_retry_policy_validation() -> None:
    with pytest.raises(InvalidArgument, match=r"max_attempts must be 1\.\.1000, got 0"):
        RetryPolicy.exponential(0)
    with pytest.raises(InvalidArgument, match="initial <= max"):
        RetryPolicy.exponential(3, initial=10, maximum=1)
    with pytest.raises(InvalidArgument, match=r"jitter must be 0\.\.1"):
        RetryPolicy.exponential(3, jitter=2)
    with pytest.raises(InvalidArgument, match="initial must be finite"):
        RetryPolicy.exponential(3, initial=float("inf"))


def test_scheduler_construction_validation() -> None:
    with pytest.raises(InvalidArgument, match="at least one Pool"):
        Scheduler([])
    with pytest.raises(InvalidArgument, match="pools must be a list of Pool, got str"):
        Scheduler("default")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="pools must be Pool or RemotePool instances"):
        Scheduler(["default"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="pool names must be unique"):
        Scheduler([Pool("a", noop), Pool("a", noop)])
    with pytest.raises(InvalidArgument, match="concurrency must be between 1 and"):
        Pool("a", noop, concurrency=0)
    with pytest.raises(InvalidArgument, match="executor must be callable"):
        Pool("a", "noop")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="commit_timeout must be > 0"):
        Scheduler([Pool("a", noop)], commit_timeout=0)


def test_preview_lists_utc_instants() -> None:
    start = datetime.fromisoformat("2026-03-07T12:00:00+00:00")
    times = preview("30 2 * * *", "America/New_York", 3, after=start)
    # 02:30 on the 8th falls in the spring-forward gap: it fires at 03:00 EDT; then 02:30 EDT.
    assert [t.isoformat() for t in times] == [
        "2026-03-08T07:00:00+00:00",
        "2026-03-09T06:30:00+00:00",
        "2026-03-10T06:30:00+00:00",
    ]


# === issue 10, "Bad input": one test per item =============================================


async def test_list_status_must_be_a_status_or_an_iterable_of_them(sched: Scheduler) -> None:
    """Item 1: a non-iterable status is an InvalidArgument, not Python's TypeError."""
    task_id = await sched.submit("job", start_at=timedelta(hours=1))
    for bad in (5, 1.5, object(), None.__class__, [5], ["ready", 5]):
        with pytest.raises(InvalidArgument, match="status must be"):
            await sched.list(status=bad)  # type: ignore[arg-type]
    scheduled = await sched.list(status=[Status.SCHEDULED, "ready"])
    assert [t.task_id for t in scheduled] == [task_id]
    assert await sched.list(status="running") == []


HUGE = 10**400  # no float holds it: float(HUGE) raises OverflowError


async def test_huge_durations_are_invalid_arguments(sched: Scheduler) -> None:
    """Item 2: a duration too large for a float, or whose nanoseconds overflow one, is refused
    with InvalidArgument (no OverflowError), everywhere a duration is taken."""
    for value in (HUGE, 1e300, 10**12, -HUGE, -1e300):
        for option in ("grace", "timeout"):
            with pytest.raises(InvalidArgument, match=option):
                await sched.submit("job", **{option: value})
        with pytest.raises(InvalidArgument, match="grace"):
            await sched.add_schedule("s", "* * * * *", kind="job", grace=value)
        with pytest.raises(InvalidArgument, match="timeout"):
            await sched.wait(1, timeout=value)
        with pytest.raises(InvalidArgument, match="timeout"):
            await sched.close(timeout=value)
        with pytest.raises(InvalidArgument, match="retention"):
            Scheduler([Pool("default", noop)], retention=value)
        with pytest.raises(InvalidArgument, match="commit_timeout"):
            Scheduler([Pool("default", noop)], commit_timeout=value)
        with pytest.raises(InvalidArgument, match="initial"):
            RetryPolicy.exponential(initial=value)
        with pytest.raises(InvalidArgument, match="maximum"):
            RetryPolicy.exponential(maximum=value)
        with pytest.raises(InvalidArgument, match="retry_after"):
            TaskError("x", retry_after=value)
    with pytest.raises(InvalidArgument, match="start_at of 4000 days, 0:00:00 is longer"):
        await sched.submit("job", start_at=timedelta(days=4000))
    assert sched.running
    await assert_nothing_applied(sched)
    assert await sched.list_schedules() == []


async def test_an_extreme_retry_policy_does_not_stop_the_scheduler() -> None:
    """Item 3: multiplier ** attempt overflowing a float capped to max_ns, not a dead driver."""
    policy = RetryPolicy(max_attempts=200, initial_ns=0, multiplier=100.0, max_ns=0, jitter=0.0)
    assert policy.delay_ns(200, 0.5) == 0
    capped = RetryPolicy(max_attempts=1000, initial_ns=1, multiplier=100, max_ns=10 * NS_PER_S)
    assert capped.delay_ns(1000, 0.5) == 10 * NS_PER_S
    assert capped.delay_ns(1000, 0.0) == 9 * NS_PER_S  # jitter 0.1 still applies to the cap

    async def failing(ctx: TaskContext, payload: Any) -> None:
        raise TaskError(f"attempt {ctx.attempt} fails")

    async with Scheduler([Pool("default", failing), Pool("ok", noop)]) as sched:
        info = await sched.wait(await sched.submit("job", retry=policy), timeout=30)
        assert info.status is Status.FAILED
        assert info.attempt == 200
        assert info.message == "attempt 200 failed: attempt 200 fails; no attempts left"
        assert sched.running, sched.failure
        ok = await sched.wait(await sched.submit("job", pool="ok"), timeout=5)
        assert ok.status is Status.SUCCEEDED


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_attempts": True}, "max_attempts must be an int, got bool"),
        ({"initial_ns": True}, "initial_ns must be an int, got bool"),
        ({"max_ns": True}, "max_ns must be an int, got bool"),
        ({"multiplier": True}, "multiplier must be 1..100, got bool"),
        ({"jitter": True}, "jitter must be 0..1, got bool"),
        ({"jitter": False}, "jitter must be 0..1, got bool"),
        ({"multiplier": float("nan")}, "multiplier must be 1..100, got nan"),
        ({"max_attempts": HUGE}, "max_attempts must be 1..1000, got an int of 1329 bits"),
        ({"max_ns": HUGE}, "max_ns=an int of 1329 bits"),
    ],
)
def test_retry_policy_refuses_booleans_and_extremes(fields: dict[str, Any], message: str) -> None:
    """Item 3: bool is an int subclass, but RetryPolicy(jitter=True) is a mistake."""
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        RetryPolicy(**fields)


@pytest.mark.parametrize(
    ("keep_finished", "message"),
    [
        ("a", "keep_finished must be seconds"),
        ("\u00e9t\u00e9", "keep_finished must be seconds"),
        (float("inf"), "keep_finished must be finite"),
        (float("nan"), "keep_finished must be finite"),
        (-5.0, "keep_finished must be >= 0 seconds, got -5.0"),
        (HUGE, "keep_finished of an int of 1329 bits seconds is longer than ten years"),
        (True, "keep_finished must be seconds"),
        ([1], "keep_finished must be seconds"),
    ],
)
def test_memory_store_checks_keep_finished(keep_finished: object, message: str) -> None:
    """Item 4: keep_finished is a duration like any other, checked before it is used."""
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        MemoryStore(keep_finished=keep_finished)  # type: ignore[arg-type]


def test_memory_store_takes_keep_finished_as_seconds_or_timedelta() -> None:
    week = 7 * 24 * 3600 * NS_PER_S
    assert MemoryStore(keep_finished=timedelta(days=7))._cluster.keep_finished_ns == week
    assert MemoryStore(keep_finished=0)._cluster.keep_finished_ns == 0
    assert MemoryStore(keep_finished=0.5)._cluster.keep_finished_ns == NS_PER_S // 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"store": "x"}, "store must implement cronoq.store.Store, got str (missing: acquire"),
        ({"store": MemoryCluster(0)}, "store must implement cronoq.store.Store, got Memory"),
        ({"seed": [1]}, "seed must be an int, got list"),
        ({"seed": 1.5}, "seed must be an int, got float"),
        ({"seed": True}, "seed must be an int, got bool"),
        ({"seed": HUGE}, "seed must be between"),
        ({"codec": "json"}, "codec must have encode(value) -> bytes and decode(bytes), got str"),
        ({"codec": JsonCodec}, "codec must have encode"),  # the class, not an instance
    ],
)
def test_scheduler_checks_store_seed_and_codec_when_built(
    options: dict[str, Any], message: str
) -> None:
    """Item 5: refused by the constructor, not by start() with AttributeError or TypeError."""
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        Scheduler([Pool("default", noop)], **options)


class PoisonCodec:
    """Text codec whose decode raises a plain KeyError for the value "poison"."""

    def encode(self, value: Any) -> bytes:
        assert isinstance(value, str)
        return value.encode()

    def decode(self, data: bytes) -> str:
        if data == b"poison":
            raise KeyError("poisoned")
        return data.decode()


async def echo(ctx: TaskContext, payload: Any) -> Any:
    return payload


async def test_a_codec_whose_decode_raises_gives_payload_error_for_that_task_only() -> None:
    """Item 6: the codec's own exception becomes PayloadError naming the task; the task stays
    readable through list(), and every other task and the scheduler carry on."""

    async def returns_poison(ctx: TaskContext, payload: Any) -> str:
        return "poison"

    pools = [Pool("default", echo), Pool("poisoner", returns_poison)]
    async with Scheduler(pools, codec=PoisonCodec()) as sched:
        bad_payload = await sched.submit("job", "poison")
        expected = rf"task {bad_payload} \(failed: attempt 1 failed \(not retryable\): payload"
        with pytest.raises(PayloadError, match=expected) as caught:
            await sched.wait(bad_payload, timeout=5)
        assert "cannot decode the payload (6 bytes): KeyError('poisoned')" in str(caught.value)
        assert isinstance(caught.value.__cause__, PayloadError)
        for _ in range(2):  # not once: each call about this task says so
            with pytest.raises(PayloadError, match=f"task {bad_payload} "):
                await sched.get(bad_payload)
        bad_output = await sched.submit("job", "fine", pool="poisoner")
        with pytest.raises(PayloadError, match="cannot decode the output"):
            await sched.wait(bad_output, timeout=5)
        listed = {t.task_id: t.status for t in await sched.list()}
        assert listed == {bad_payload: Status.FAILED, bad_output: Status.SUCCEEDED}
        good = await sched.wait(await sched.submit("job", "fine"), timeout=5)
        assert (good.status, good.payload, good.output) == (Status.SUCCEEDED, "fine", "fine")
        assert (await sched.get(good.task_id)).output == "fine"


class Counted:
    """An endless iterator that counts how many items were taken from it."""

    def __init__(self, item: object) -> None:
        self.item = item
        self.taken = 0

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        self.taken += 1
        return self.item


async def test_endless_and_huge_iterables_are_refused_while_iterating(sched: Scheduler) -> None:
    """Item 7: each limit stops the iteration at limit + 1 items; nothing is materialised."""
    parent = await sched.submit("job")
    with pytest.raises(InvalidArgument, match="after: more than 1000 items given"):
        await sched.submit("job", after=itertools.count(1))
    with pytest.raises(InvalidArgument, match="after: more than 1000 items given"):
        await sched.submit("job", after=range(1, 10**18))
    with pytest.raises(InvalidArgument, match="tags: more than 64 items given"):
        await sched.submit("job", tags=itertools.repeat("t"))
    with pytest.raises(InvalidArgument, match="submit_many requests: more than 100000 items"):
        await sched.submit_many(itertools.repeat(TaskRequest("job")))
    with pytest.raises(InvalidArgument, match="status: more than 64 items given"):
        await sched.list(status=itertools.repeat("ready"))
    tags = Counted("t")
    with pytest.raises(InvalidArgument, match="more than 64"):
        await sched.submit("job", tags=tags)
    assert tags.taken == 65
    requests = Counted(TaskRequest("job"))
    with pytest.raises(InvalidArgument, match="more than 100000"):
        await sched.submit_many(requests)
    assert requests.taken == 100_001
    # A bad item stops the iteration at once.
    bad_after = Counted(0)
    with pytest.raises(InvalidArgument, match="a dependency id must be between 1 and"):
        await sched.submit("job", after=bad_after)
    assert bad_after.taken == 1
    assert [t.task_id for t in await sched.list()] == [parent]


@pytest.mark.parametrize(
    ("retry_after", "message"),
    [
        ("5", "retry_after must be seconds (int or float), a timedelta or None, got str"),
        (True, "retry_after must be seconds (int or float), a timedelta or None, got bool"),
        (float("inf"), "retry_after must be 0..316224000 seconds, got inf"),
        (float("nan"), "retry_after must be 0..316224000 seconds, got nan"),
        (1e12, "retry_after must be 0..316224000 seconds, got 1000000000000.0"),
        (-1, "retry_after must be 0..316224000 seconds, got -1"),
        (HUGE, "retry_after must be 0..316224000 seconds, got an int of 1329 bits"),
    ],
)
def test_task_error_checks_retry_after(retry_after: object, message: str) -> None:
    """Item 8: retry_after is seconds within ten years, refused with InvalidArgument."""
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        TaskError("x", retry_after=retry_after)  # type: ignore[arg-type]


def test_task_error_keeps_a_good_retry_after() -> None:
    error = TaskError("x", retry_after=1.5)
    assert (error.retry_after, error.retry_after_ns) == (1.5, 1_500_000_000)
    assert TaskError("x").retry_after_ns is None
    assert TaskError("x", retry_after=timedelta(minutes=2)).retry_after_ns == 120 * NS_PER_S
    with pytest.raises(InvalidArgument, match="retryable must be a bool, got str"):
        TaskError("x", retryable="no")  # type: ignore[arg-type]


async def test_an_infinite_retry_after_fails_the_attempt_instead_of_hanging_it() -> None:
    """Item 8: TaskError(retry_after=inf) raised in a function fails that attempt with a clear
    message; before, the task stayed running forever with its pool slot taken."""

    async def rate_limited(ctx: TaskContext, payload: Any) -> None:
        raise TaskError("rate limited", retry_after=float("inf"))

    async with Scheduler([Pool("default", rate_limited, concurrency=1)]) as sched:
        task_id = await sched.submit("job", retry=RetryPolicy.exponential(1))
        info = await sched.wait(task_id, timeout=5)
        assert info.status is Status.FAILED
        assert "InvalidArgument: retry_after must be 0..316224000 seconds, got inf" in info.message


SURROGATE = "\udcff"  # a lone surrogate: not encodable as UTF-8, refused by SQLite and PG


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kind": f"a{SURROGATE}"}, "kind must be valid Unicode, but has a lone surrogate"),
        ({"key": SURROGATE}, "key must be valid Unicode"),
        ({"tags": ["ok", f"t{SURROGATE}"]}, "tag must be valid Unicode"),
        ({"name": f"n{SURROGATE}x"}, "name must be valid Unicode, but has a lone surrogate "),
        ({"pool": SURROGATE}, "pool must be valid Unicode"),
    ],
)
async def test_lone_surrogates_are_refused_like_nul(
    sched: Scheduler, options: dict[str, Any], message: str
) -> None:
    """Item 9: refused at the API, so a store never sees a string it cannot encode."""
    kind = options.pop("kind", "job")
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        await sched.submit(kind, **options)
    await assert_nothing_applied(sched)


async def test_lone_surrogates_are_refused_by_every_entry_point(sched: Scheduler) -> None:
    """Item 9: the schedule calls, lookups, cancel reasons and Pool names too."""
    with pytest.raises(InvalidArgument, match="schedule name must be valid Unicode"):
        await sched.add_schedule(SURROGATE, "* * * * *", kind="job")
    with pytest.raises(InvalidArgument, match="kind must be valid Unicode"):
        await sched.add_schedule("s", "* * * * *", kind=SURROGATE)
    with pytest.raises(InvalidArgument, match="tag must be valid Unicode"):
        await sched.add_schedule("s", "* * * * *", kind="job", tags=[SURROGATE])
    with pytest.raises(InvalidArgument, match="schedule name must be valid Unicode"):
        await sched.pause_schedule(SURROGATE)
    with pytest.raises(InvalidArgument, match="key must be valid Unicode"):
        await sched.get_by_key(SURROGATE)
    with pytest.raises(InvalidArgument, match="reason must be valid Unicode"):
        await sched.cancel(await sched.submit("job", start_at=timedelta(hours=1)), SURROGATE)
    with pytest.raises(InvalidArgument, match="tag must be valid Unicode"):
        await sched.list(tag=SURROGATE)
    with pytest.raises(InvalidArgument, match="pool name must be valid Unicode"):
        Pool(SURROGATE, noop)
    assert await sched.list_schedules() == []
    assert [t.status for t in await sched.list()] == [Status.SCHEDULED]


class StringZone(HostileZone):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return "+01:00"  # type: ignore[return-value]


class DriftingZone(HostileZone):
    """A different offset at each call: cronoq asks once, so the task gets one of them."""

    def __init__(self) -> None:
        self.calls = 0

    def utcoffset(self, dt: datetime | None) -> timedelta:
        self.calls += 1
        return timedelta(hours=self.calls)


@pytest.mark.parametrize("option", ["start_at", "deadline"])
@pytest.mark.parametrize(
    ("zone", "message"),
    [
        (RaisingZone(), "its tzinfo (RaisingZone) failed in utcoffset(): RuntimeError"),
        (StringZone(), "its tzinfo (StringZone) failed in utcoffset(): TypeError"),
        (DayLongZone(), "its tzinfo (DayLongZone) failed in utcoffset(): ValueError"),
        (NaiveZone(), "must be timezone-aware, got naive 2031-01-01T00:00:00"),
    ],
)
async def test_a_hostile_tzinfo_gives_invalid_argument(
    sched: Scheduler, option: str, zone: tzinfo, message: str
) -> None:
    """Item 10: whatever utcoffset() does becomes an InvalidArgument naming the argument."""
    with pytest.raises(InvalidArgument, match=re.escape(f"{option} ")) as caught:
        await sched.submit("job", **{option: datetime(2031, 1, 1, tzinfo=zone)})
    assert message in str(caught.value)
    await assert_nothing_applied(sched)


async def test_a_tzinfo_is_asked_for_its_offset_once(sched: Scheduler) -> None:
    zone = DriftingZone()
    start = datetime.now(UTC).replace(tzinfo=None) + timedelta(days=1)
    task_id = await sched.submit("job", start_at=start.replace(tzinfo=zone))
    assert zone.calls == 1
    info = await sched.get(task_id)
    assert info.status is Status.SCHEDULED
    assert zone.calls == 1


async def test_add_schedule_refuses_unknown_options_like_submit(sched: Scheduler) -> None:
    """Item 11: InvalidArgument naming the option, as submit does, not Python's TypeError."""
    with pytest.raises(InvalidArgument, match="add_schedule got unknown options: paylod, zone"):
        await sched.add_schedule("s", "* * * * *", kind="job", paylod=b"x", zone="UTC")
    with pytest.raises(InvalidArgument, match="unexpected keyword argument 'paylod'"):
        await sched.submit("job", paylod=b"x")
    assert await sched.list_schedules() == []


async def test_an_unknown_pool_raises_unknown_pool(sched: Scheduler) -> None:
    """Item 11: the documented UnknownPool, from every call that names a pool."""
    message = "unknown pool 'gone'; configured: default, slow"
    with pytest.raises(UnknownPool, match=message):
        await sched.submit("job", pool="gone")
    with pytest.raises(UnknownPool, match=message):
        await sched.submit_many([TaskRequest("job"), TaskRequest("job", pool="gone")])
    with pytest.raises(UnknownPool, match=message):
        await sched.add_schedule("s", "* * * * *", kind="job", pool="gone")
    await assert_nothing_applied(sched)
    assert await sched.list_schedules() == []


class Utf8Codec:
    """A user codec that only knows str: it would fail on None and on b""."""

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise TypeError(f"not a str: {value!r}")
        return value.encode()

    def decode(self, data: bytes) -> str:
        if not data:
            raise ValueError("empty")
        return data.decode()


@pytest.mark.parametrize("codec", [BytesCodec(), JsonCodec(), Utf8Codec()], ids=type)
async def test_the_default_payload_is_no_payload_for_every_codec(codec: Codec) -> None:
    """Item 12: submit("kind") and a schedule without a payload work with every codec, and the
    function receives None."""
    seen: list[object] = []

    async def record(ctx: TaskContext, payload: Any) -> None:
        seen.append(payload)

    async with Scheduler([Pool("default", record)], codec=codec) as sched:
        info = await sched.wait(await sched.submit("job"), timeout=5)
        assert (info.status, info.payload) == (Status.SUCCEEDED, None), info.message
        explicit = await sched.wait(await sched.submit("job", None), timeout=5)
        assert (explicit.status, explicit.payload) == (Status.SUCCEEDED, None)
        many = await sched.submit_many([TaskRequest("job")])
        assert (await sched.wait(many[0], timeout=5)).payload is None
        schedule = await sched.add_schedule("s", "0 0 1 1 *", kind="job")
        assert schedule.kind == "job"
    assert seen == [None, None, None]


# === issue 10, "Smaller things" ============================================================


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (618_112_000, "0.62s"),
        (50_000_000, "0.05s"),
        (1_234_567, "0.0012s"),
        (999_000_000, "1s"),
        (NS_PER_S, "1s"),
        (1_500_000_000, "1.5s"),
        (9_960_000_000, "10s"),
        (42 * NS_PER_S, "42s"),
        (59_600_000_000, "1m"),
        (90 * NS_PER_S, "1m30s"),
        (3599 * NS_PER_S, "59m59s"),
        (3_599_700_000_000, "1h"),
        (3661 * NS_PER_S, "1h1m"),
        (7500 * NS_PER_S, "2h5m"),
        (86_399 * NS_PER_S, "1d"),
        (90_000 * NS_PER_S, "1d1h"),
        (3 * 86_400 * NS_PER_S + 4 * 3600 * NS_PER_S, "3d4h"),
    ],
)
def test_durations_in_messages_are_rounded_for_people(ns: int, text: str) -> None:
    assert seconds(ns) == text


async def test_retry_messages_round_the_backoff() -> None:
    seen = asyncio.Event()

    async def fails_once(ctx: TaskContext, payload: Any) -> None:
        if ctx.attempt == 1:
            raise TaskError("flaky", retry_after=0.618112)
        seen.set()

    async with Scheduler([Pool("default", fails_once)]) as sched:
        task_id = await sched.submit("job")
        info = await sched.wait(task_id, timeout=5)
    assert info.status is Status.SUCCEEDED
    engine_policy = RetryPolicy(initial_ns=618_112_000, jitter=0.0)
    engine = Engine(EngineConfig([PoolConfig("default", 1)], seed=0), epoch=1)
    reply_to = object()
    spec = TaskSpec(pool="default", kind="job", payload=b"", retry=engine_policy)
    started = engine.step(T0, [SubmitTasks([spec], reply_to)])
    [dispatch] = started.dispatches
    failed = engine.step(T0 + 1, [AttemptReport(dispatch.token, AttemptFailed("flaky"))])
    [update] = [m for m in failed.mutations if isinstance(m, TaskUpdated)]
    assert update.message == "attempt 1 failed: flaky; retrying in 0.62s"


async def test_replace_keeps_an_operators_pause(sched: Scheduler) -> None:
    await sched.add_schedule("s", "* * * * * *", kind="job")
    assert (await sched.pause_schedule("s")).paused
    replaced = await sched.add_schedule("s", "*/2 * * * * *", kind="job", replace=True)
    assert (replaced.paused, replaced.cron) == (True, "*/2 * * * * *")
    [listed] = await sched.list_schedules()
    assert listed.paused
    resumed = await sched.resume_schedule("s")
    assert (resumed.paused, resumed.cron) == (False, "*/2 * * * * *")
    fresh = await sched.add_schedule("t", "* * * * *", kind="job", replace=True)
    assert not fresh.paused


T0 = 1_700_000_000 * NS_PER_S


def _submit(engine: Engine, count: int) -> list[SubmitResult] | BaseException:
    reply_to = object()
    specs = [TaskSpec(pool="default", kind="job", payload=b"") for _ in range(count)]
    result = engine.step(T0, [SubmitTasks(specs, reply_to)])
    [value] = [value for to, value in result.replies if to is reply_to]
    created = [m.task_id for m in result.mutations if isinstance(m, TaskSubmitted)]
    if isinstance(value, BaseException):
        assert created == [], "a refused batch created nothing"
        return value
    assert isinstance(value, list)
    assert [r.task_id for r in value] == created
    return value


def test_the_id_counter_stops_at_the_end_of_its_epoch() -> None:
    """Ids carry their epoch above SEQUENCE_BITS: a leader that used up its range refuses
    submissions (all or nothing) instead of issuing ids of the next epoch."""
    config = EngineConfig([PoolConfig("default", 10)])
    epoch = 3
    last = ((epoch + 1) << SEQUENCE_BITS) - 1
    engine = Engine(config, epoch, high_water_mark=last - 2)  # a rebuild: 2 ids left
    refused = _submit(engine, 3)
    assert isinstance(refused, SchedulerError)
    assert refused.applied is False, "nothing was applied: the caller may retry as it is"
    assert str(refused) == (
        f"epoch 3 has issued every task id of its range (up to {last}); "
        "restart the scheduler so that it leads under a new epoch"
    )
    accepted = _submit(engine, 2)
    assert isinstance(accepted, list)
    assert [r.task_id for r in accepted] == [last - 1, last]
    assert epoch_of(last) == epoch
    assert isinstance(_submit(engine, 1), SchedulerError)
    assert engine.high_water_mark == last
    # The last epoch's range ends at the largest 63-bit id.
    final = Engine(config, MAX_EPOCH, high_water_mark=2**63 - 2)
    issued = _submit(final, 1)
    assert isinstance(issued, list)
    assert [r.task_id for r in issued] == [2**63 - 1]
    assert isinstance(_submit(final, 1), SchedulerError)


def test_a_high_water_mark_of_a_later_epoch_is_fatal() -> None:
    config = EngineConfig([PoolConfig("default", 10)])
    with pytest.raises(StoreFatal, match="belongs to epoch 4, after this leader's epoch 3"):
        Engine(config, 3, high_water_mark=4 << SEQUENCE_BITS | 5)


def test_stores_keep_nul_and_lone_surrogates_of_messages_as_replacement_characters() -> None:
    assert sanitize_message("a\x00b") == "a\ufffdb"
    assert sanitize_message("no such file: \udcff.txt") == "no such file: \ufffd.txt"
    assert sanitize_message("\ud83d\ude00 \U0001f600 \u00e9") == "\ufffd\ufffd \U0001f600 \u00e9"
    assert sanitize_message("plain") == "plain"


async def test_a_lone_surrogate_in_a_failure_message_does_not_reach_the_store() -> None:
    """Item 9, the other way in: an exception message (from a file name, say) is not input the
    API can refuse; SQLite then refused the commit and the scheduler stopped."""

    async def fails(ctx: TaskContext, payload: Any) -> None:
        raise RuntimeError("no such file: \udcff.txt")

    store = MemoryStore()
    async with Scheduler([Pool("default", fails)], store=store) as sched:
        task_id = await sched.submit("job", retry=RetryPolicy.exponential(1))
        assert (await sched.wait(task_id, timeout=5)).status is Status.FAILED
        record = await store.get_task(task_id)
        assert record is not None
        expected = "attempt 1 failed: RuntimeError: no such file: \ufffd.txt; no attempts left"
        assert record.message.startswith(expected + "\nTraceback (most recent call last):\n")
        # Its last line repeats the message, sanitized too.
        assert record.message.endswith("\nRuntimeError: no such file: \ufffd.txt")
        assert sched.running


async def test_every_request_field_reaches_its_spec_field(sched: Scheduler) -> None:
    """The spec is built positionally (it runs for every task): each field lands in its own.
    Every value here differs from its default and from the others of its type."""
    [parent] = await sched.submit_many([TaskRequest("parent")])
    now = 1_700_000_000 * NS_PER_S
    request = TaskRequest(
        kind="the-kind",
        payload=b"the-payload",
        pool="slow",
        key="the-key",
        tags=("the-tag",),
        name="the-name",
        priority=7,
        retry=RetryPolicy(max_attempts=5),
        start_at=timedelta(seconds=10),
        miss_policy="skip",
        grace=5,
        deadline=timedelta(seconds=20),
        timeout=3,
        after=[parent],
    )
    assert sched._spec(request, now) == TaskSpec(
        pool="slow",
        kind="the-kind",
        payload=b"the-payload",
        key="the-key",
        tags=("the-tag",),
        name="the-name",
        priority=7,
        retry=RetryPolicy(max_attempts=5),
        start_at_ns=now + 10 * NS_PER_S,
        miss_policy=MissPolicy.SKIP,
        grace_ns=5 * NS_PER_S,
        deadline_ns=now + 20 * NS_PER_S,
        timeout_ns=3 * NS_PER_S,
        after=(parent,),
        schedule=None,
    )


async def test_payload_specs_keep_every_field_of_the_template_but_the_payload(
    sched: Scheduler,
) -> None:
    """The compact SubmitMany's path: the common fields checked once, each payload alone."""
    now = 1_700_000_000 * NS_PER_S
    template = sched.task_spec(
        now, "the-kind", b"first", "slow", None, ("the-tag",), "the-name", 7,
        RetryPolicy(max_attempts=5), timedelta(seconds=10), "skip", 5, timedelta(seconds=20), 3,
    )  # fmt: skip
    specs = [task.spec for task in sched.payload_specs(template, [b"second", None])]
    first = template.spec
    assert specs == [replace(first, payload=b"second"), replace(first, payload=b"")]
    with pytest.raises(PayloadError, match="BytesCodec encodes bytes, got str"):
        sched.payload_specs(template, [b"ok", "text"])


async def test_only_tasks_this_scheduler_checked_pass_submit_specs(sched: Scheduler) -> None:
    """submit_specs skips the checks of a submission: it takes nothing but what this
    scheduler's task_spec and payload_specs made, and applies nothing otherwise."""
    now = 1_700_000_000 * NS_PER_S
    checked = sched.task_spec(now, "job", b"ok")
    other = Scheduler([Pool("default", noop)])
    foreign = other.task_spec(now, "job", b"ok")
    unchecked = replace(checked.spec, kind="\x00", pool="nowhere")
    for given in ([unchecked], [checked, foreign], (checked,), [checked] * (MAX_BATCH + 1)):
        with pytest.raises(InvalidArgument):
            await sched.submit_specs(given)  # type: ignore[arg-type]
    for bad in (unchecked, foreign):
        with pytest.raises(InvalidArgument):
            sched.payload_specs(bad, [b"x"])  # type: ignore[arg-type]
    await assert_nothing_applied(sched)
    assert len(await sched.submit_specs([checked])) == 1


@pytest.mark.parametrize("bad_at", [0, 1, 2])
async def test_a_list_of_requests_is_refused_as_any_iterable_is(
    sched: Scheduler, bad_at: int
) -> None:
    """A list takes a shorter path through submit_many than other iterables: the same answer."""
    requests = [TaskRequest("job"), TaskRequest("job", tags=["\x00"]), TaskRequest("job", pool="x")]
    requests[bad_at] = TaskRequest("job", priority=True)
    errors = []
    for given in (requests, iter(requests), tuple(requests)):
        with pytest.raises(InvalidArgument) as caught:
            await sched.submit_many(given)
        errors.append(str(caught.value))
    assert len(set(errors)) == 1, errors
    await assert_nothing_applied(sched)


async def test_a_list_beyond_the_batch_limit_is_refused_as_any_iterable_is(
    sched: Scheduler,
) -> None:
    assert MAX_BATCH == 100_000  # as docs/api.md says
    requests = [TaskRequest("job")] * (MAX_BATCH + 1)
    with pytest.raises(InvalidArgument, match="submit_many requests: more than 100000 items"):
        await sched.submit_many(requests)
    await assert_nothing_applied(sched)
