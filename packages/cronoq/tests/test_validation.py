"""Every public entry point rejects bad input with a precise error and applies nothing."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from cronoq import (
    BytesCodec,
    InvalidArgument,
    JsonCodec,
    Pool,
    RetryPolicy,
    Scheduler,
    TaskContext,
    TaskRequest,
    preview,
)
from cronoq.errors import (
    DuplicateSchedule,
    InvalidCron,
    PayloadError,
    ScheduleNotFound,
    TaskNotFound,
    UnknownDependency,
    UnknownTimeZone,
)


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
    with pytest.raises(InvalidArgument, match="pools must be Pool instances"):
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
