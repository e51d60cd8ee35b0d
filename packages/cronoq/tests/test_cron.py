"""Tests for cronoq._cron.

Expected instants are written by hand as UTC datetimes; the property tests check
the code against a brute-force oracle that walks UTC time step by step.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import pickle
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cronoq
from cronoq._cron import CronSchedule
from cronoq.errors import InvalidArgument, InvalidCron, UnknownTimeZone

NS = 1_000_000_000
NY = "America/New_York"
LONDON = "Europe/London"
LORD_HOWE = "Australia/Lord_Howe"


def ns(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> int:
    """Unix nanoseconds of a UTC wall time."""
    return int(datetime(year, month, day, hour, minute, second, tzinfo=UTC).timestamp()) * NS


def sched(expression: str, timezone: str = "UTC") -> CronSchedule:
    return CronSchedule.parse(expression, timezone)


# --- UTC basics ----------------------------------------------------------------------


def test_every_fifteen_minutes_utc() -> None:
    s = sched("*/15 * * * *")
    assert s.next_after(ns(2026, 1, 1, 0, 0)) == ns(2026, 1, 1, 0, 15)
    assert s.next_after(ns(2026, 1, 1, 0, 7)) == ns(2026, 1, 1, 0, 15)
    assert s.preview(ns(2026, 1, 1, 23, 40), 3) == [
        ns(2026, 1, 1, 23, 45),
        ns(2026, 1, 2, 0, 0),
        ns(2026, 1, 2, 0, 15),
    ]


def test_result_is_strictly_after_an_exact_occurrence() -> None:
    s = sched("0 9 * * *")
    assert s.next_after(ns(2026, 5, 4, 9, 0)) == ns(2026, 5, 5, 9, 0)
    assert s.next_after(ns(2026, 5, 4, 9, 0) - 1) == ns(2026, 5, 4, 9, 0)


def test_sub_second_inputs() -> None:
    s = sched("*/15 * * * *")
    assert s.next_after(ns(2026, 1, 1, 0, 0) + 1) == ns(2026, 1, 1, 0, 15)
    assert s.next_after(ns(2026, 1, 1, 0, 15) - 1) == ns(2026, 1, 1, 0, 15)
    assert s.next_after(ns(2026, 1, 1, 0, 15) + 999_999_999) == ns(2026, 1, 1, 0, 30)


def test_weekdays_and_names() -> None:
    # 2026-05-01 is a Friday.
    s = sched("30 8 * * mon-fri")
    assert s.preview(ns(2026, 5, 1, 9, 0), 2) == [ns(2026, 5, 4, 8, 30), ns(2026, 5, 5, 8, 30)]
    assert sched("0 12 1 jan,jul *").preview(ns(2026, 1, 2), 2) == [
        ns(2026, 7, 1, 12),
        ns(2027, 1, 1, 12),
    ]


def test_last_day_of_month() -> None:
    assert sched("0 0 L * *").preview(ns(2028, 1, 31, 12), 2) == [
        ns(2028, 2, 29),
        ns(2028, 3, 31),
    ]


def test_day_of_month_or_day_of_week() -> None:
    # Both day fields restricted: either matches (Vixie cron). Feb 30 never exists,
    # so only the Mondays of February fire; 2026-02-02 is a Monday.
    assert sched("0 0 30 2 1").preview(ns(2026, 1, 1), 2) == [ns(2026, 2, 2), ns(2026, 2, 9)]


# 2026-01-01 is a Thursday; its Mondays are the 5th, 12th, 19th and 26th.
@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # Neither field starts with "*": a day matches if either does.
        ("0 0 1,15 * MON", [ns(2026, 1, 5), ns(2026, 1, 12), ns(2026, 1, 15), ns(2026, 1, 19)]),
        ("0 0 1-31 * MON", [ns(2026, 1, 2), ns(2026, 1, 3), ns(2026, 1, 4), ns(2026, 1, 5)]),
        # One field starts with "*" (Vixie's DOM_STAR / DOW_STAR): a day must match both, so
        # */2 keeps the Mondays that fall on odd days.
        ("0 0 */2 * MON", [ns(2026, 1, 5), ns(2026, 1, 19), ns(2026, 2, 9), ns(2026, 2, 23)]),
        # The 15th on a Sunday, Tuesday, Thursday or Saturday (dow */2 = 0,2,4,6).
        ("0 0 15 * */2", [ns(2026, 1, 15), ns(2026, 2, 15), ns(2026, 3, 15), ns(2026, 8, 15)]),
        # "?" is unrestricted, like "*".
        ("0 0 ? * MON", [ns(2026, 1, 5), ns(2026, 1, 12), ns(2026, 1, 19), ns(2026, 1, 26)]),
        ("0 0 1 * ?", [ns(2026, 2, 1), ns(2026, 3, 1), ns(2026, 4, 1), ns(2026, 5, 1)]),
        # L, W and # take part in the rule like any other value: OR here...
        ("0 0 1 * FRI#2", [ns(2026, 1, 9), ns(2026, 2, 1), ns(2026, 2, 13), ns(2026, 3, 1)]),
        ("0 0 15W * MON", [ns(2026, 1, 5), ns(2026, 1, 12), ns(2026, 1, 15), ns(2026, 1, 19)]),
        ("0 0 L * L1", [ns(2026, 1, 26), ns(2026, 1, 31), ns(2026, 2, 23), ns(2026, 2, 28)]),
        # ...and AND here: the second Friday falling on the 1st, 11th, 21st or 31st, and the
        # last day of the month falling on a Sunday.
        ("0 0 */10 * 5#2", [ns(2026, 9, 11), ns(2026, 12, 11)]),
        ("0 0 L * */7", [ns(2026, 5, 31), ns(2027, 1, 31)]),
    ],
)
def test_day_fields_combine_as_in_vixie_cron(expression: str, expected: list[int]) -> None:
    assert sched(expression).preview(ns(2026, 1, 1), len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "after", "expected"),
    [
        # Daily at 21:13, not every hour.
        ("13 21-21 * * *", ns(2026, 1, 1), [ns(2026, 1, 1, 21, 13), ns(2026, 1, 2, 21, 13)]),
        # May only, not January.
        ("0 0 * 5-5 *", ns(2026, 1, 1), [ns(2026, 5, 1), ns(2026, 5, 2)]),
        ("0 0 1 MAR-mar *", ns(2026, 1, 1), [ns(2026, 3, 1), ns(2027, 3, 1)]),
        # Tuesdays only, not every day; 7-7 is Sunday.
        ("0 0 * * 2-2", ns(2026, 1, 1), [ns(2026, 1, 6), ns(2026, 1, 13)]),
        ("0 0 * * 7-7", ns(2026, 1, 1), [ns(2026, 1, 4), ns(2026, 1, 11)]),
        ("0-0 0 * * *", ns(2026, 1, 1, 0, 0, 1), [ns(2026, 1, 2), ns(2026, 1, 3)]),
        # A step over one value is that value.
        ("10-10/5 * * * *", ns(2026, 1, 1), [ns(2026, 1, 1, 0, 10), ns(2026, 1, 1, 1, 10)]),
        ("0 0 5-5/2 * *", ns(2026, 1, 1), [ns(2026, 1, 5), ns(2026, 2, 5)]),
        (
            "30-30 0 12 * * *",
            ns(2026, 1, 1),
            [ns(2026, 1, 1, 12, 0, 30), ns(2026, 1, 2, 12, 0, 30)],
        ),
    ],
)
def test_range_with_equal_ends_is_one_value(
    expression: str, after: int, expected: list[int]
) -> None:
    assert sched(expression).preview(after, len(expected)) == expected


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        # Day-of-week runs 0-7 as in cronie and Vixie cron, so 1/2 reaches 7, Sunday.
        ("0 0 * * 1/2", [ns(2026, 1, 2), ns(2026, 1, 4), ns(2026, 1, 5), ns(2026, 1, 7)]),
        ("0 0 * * 1-7/2", [ns(2026, 1, 2), ns(2026, 1, 4), ns(2026, 1, 5), ns(2026, 1, 7)]),
        ("0 0 * * sat/7", [ns(2026, 1, 3), ns(2026, 1, 10), ns(2026, 1, 17), ns(2026, 1, 24)]),
        # A plain weekday listed next to an nth one keeps its meaning: every Friday.
        ("0 0 * * 5,5#2", [ns(2026, 1, 2), ns(2026, 1, 9), ns(2026, 1, 16), ns(2026, 1, 23)]),
        # Wrapping ranges count on across the end of the field.
        ("0 0 * * FRI-MON", [ns(2026, 1, 2), ns(2026, 1, 3), ns(2026, 1, 4), ns(2026, 1, 5)]),
        (
            "0 22-1 * * *",
            [ns(2026, 1, 1, 1), ns(2026, 1, 1, 22), ns(2026, 1, 1, 23), ns(2026, 1, 2)],
        ),
        ("0 0 1 nov-feb *", [ns(2026, 2, 1), ns(2026, 11, 1), ns(2026, 12, 1), ns(2027, 1, 1)]),
        (
            "50-10/15 * * * *",
            [
                ns(2026, 1, 1, 0, 5),
                ns(2026, 1, 1, 0, 50),
                ns(2026, 1, 1, 1, 5),
                ns(2026, 1, 1, 1, 50),
            ],
        ),
    ],
)
def test_field_values(expression: str, expected: list[int]) -> None:
    assert sched(expression).preview(ns(2026, 1, 1), len(expected)) == expected


def test_nearest_weekday_stays_in_its_month() -> None:
    # 2026-08-01 is a Saturday: Monday the 3rd, not Friday July 31; 2026-11-01 is a Sunday.
    assert sched("0 0 1W * *").preview(ns(2026, 7, 15), 4) == [
        ns(2026, 8, 3),
        ns(2026, 9, 1),
        ns(2026, 10, 1),
        ns(2026, 11, 2),
    ]
    # 2026-05-31 is a Sunday: Friday the 29th, not Monday June 1. A day the month lacks
    # stands for its last day: June 30 (a Tuesday).
    assert sched("0 0 31W * *").preview(ns(2026, 5, 1), 2) == [ns(2026, 5, 29), ns(2026, 6, 30)]


def test_rare_expressions_are_found() -> None:
    assert sched("0 0 29 2 *").next_after(ns(2026, 1, 1)) == ns(2028, 2, 29)
    # The fifth Monday of February: Feb 29 on a Monday. 40 years apart across 2100.
    fifth_monday = sched("0 0 * 2 1#5")
    assert fifth_monday.next_after(ns(2026, 1, 1)) == ns(2044, 2, 29)
    assert fifth_monday.next_after(ns(2072, 3, 1)) == ns(2112, 2, 29)


@pytest.mark.parametrize(
    ("alias", "after", "expected"),
    [
        ("@hourly", ns(2026, 3, 1, 10, 5), ns(2026, 3, 1, 11)),
        ("@daily", ns(2026, 3, 1, 10), ns(2026, 3, 2)),
        ("@midnight", ns(2026, 3, 1, 10), ns(2026, 3, 2)),
        ("@weekly", ns(2026, 3, 2), ns(2026, 3, 8)),  # Sunday
        ("@monthly", ns(2026, 3, 1, 10), ns(2026, 4, 1)),
        ("@yearly", ns(2026, 3, 1), ns(2027, 1, 1)),
        ("@annually", ns(2026, 3, 1), ns(2027, 1, 1)),
        (" @HOURLY\t", ns(2026, 3, 1, 10, 5), ns(2026, 3, 1, 11)),
    ],
)
def test_aliases(alias: str, after: int, expected: int) -> None:
    assert sched(alias).next_after(after) == expected


def test_seconds_field_comes_first() -> None:
    s = sched("*/20 * * * * *")
    assert s.preview(ns(2026, 1, 1, 12, 0, 50), 3) == [
        ns(2026, 1, 1, 12, 1, 0),
        ns(2026, 1, 1, 12, 1, 20),
        ns(2026, 1, 1, 12, 1, 40),
    ]
    # second=30 minute=0 hour=12: not minute=30 as a trailing-seconds reading would give.
    assert sched("30 0 12 * * *").next_after(ns(2026, 1, 1)) == ns(2026, 1, 1, 12, 0, 30)


def test_seconds_field_sub_second_input() -> None:
    s = sched("* * * * * *")
    assert s.next_after(ns(2026, 1, 1, 12) + NS // 2) == ns(2026, 1, 1, 12, 0, 1)
    assert s.next_after(ns(2026, 1, 1, 12)) == ns(2026, 1, 1, 12, 0, 1)


def test_schedule_in_fixed_offset_zone() -> None:
    # Asia/Kolkata is UTC+05:30 all year.
    assert sched("0 9 * * *", "Asia/Kolkata").next_after(ns(2026, 6, 1)) == ns(2026, 6, 1, 3, 30)


def test_no_clock_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def clock() -> float:
        raise AssertionError("the clock was read")

    monkeypatch.setattr(time, "time", clock)
    # The croniter package re-exports a class named like its module, hiding the module.
    monkeypatch.setattr(importlib.import_module("croniter.croniter"), "time", clock)
    # An expression no other test parses, so nothing comes from the compile cache.
    s = sched("17 3 * * *", "Europe/Paris")
    assert s.next_after(ns(2026, 1, 1)) == ns(2026, 1, 1, 2, 17)  # 03:17 CET
    assert s.preview(ns(2026, 7, 1), 1) == [ns(2026, 7, 1, 1, 17)]  # 03:17 CEST


# --- value semantics -----------------------------------------------------------------


def test_value_semantics() -> None:
    a = CronSchedule.parse("0 * * * *", NY)
    b = CronSchedule("0 * * * *", NY)
    assert a == b
    assert hash(a) == hash(b)
    assert a != CronSchedule("0 * * * *")
    assert a.expression == "0 * * * *"
    assert a.timezone == NY
    assert CronSchedule("* * * * *").timezone == "UTC"
    assert repr(a) == "CronSchedule(expression='0 * * * *', timezone='America/New_York')"
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.expression = "1 * * * *"  # type: ignore[misc]


def test_pickle_round_trip() -> None:
    a = sched("*/5 * * * *", LONDON)
    b = pickle.loads(pickle.dumps(a))
    assert b == a
    assert b.next_after(ns(2026, 1, 1)) == ns(2026, 1, 1, 0, 5)


def test_replace_revalidates() -> None:
    a = sched("0 * * * *")
    with pytest.raises(UnknownTimeZone):
        dataclasses.replace(a, timezone="Not/AZone")
    with pytest.raises(InvalidCron):
        dataclasses.replace(a, expression="61 * * * *")


# --- validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (None, "cron expression must be a str, got NoneType"),
        (5, "cron expression must be a str, got int"),
        (b"* * * * *", "cron expression must be a str, got bytes"),
        ("", "cron expression '' is empty"),
        ("  \t ", "cron expression '  \\t ' is empty"),
        ("* * * * *\x00", "cron expression '* * * * *\\x00' contains a NUL character"),
        ("* * * *", "cron expression '* * * *' has 4 fields; expected 5"),
        ("0 0 0 1 1 * 2026", "cron expression '0 0 0 1 1 * 2026' has 7 fields"),
        (
            "0\u00a0* * * * *",
            "invalid cron expression '0\\xa0* * * * *': minute '0\\xa0*' is not accepted; use 0-59",
        ),
        (
            "61 * * * *",
            "invalid cron expression '61 * * * *': minute '61' is outside 0-59; use 0-59",
        ),
        ("* 24 * * *", "invalid cron expression '* 24 * * *': hour '24' is outside 0-23"),
        ("60 * * * * *", "invalid cron expression '60 * * * * *': second '60' is outside 0-59"),
        (
            "*/0 * * * *",
            "invalid cron expression '*/0 * * * *': minute '*/0' has step '0'; "
            "a step is a whole number from 1",
        ),
        (
            "* * * foo *",
            "invalid cron expression '* * * foo *': month 'foo' is not accepted; "
            "use 1-12 or jan-dec",
        ),
        (
            "0 0 * * mon#6",
            "invalid cron expression '0 0 * * mon#6': day-of-week 'mon#6' asks "
            "for week 6 of the month; k in d#k is 1-5",
        ),
        (
            "5-1/x * * * *",
            "invalid cron expression '5-1/x * * * *': minute '5-1/x' has step "
            "'x'; a step is a whole number from 1",
        ),
        # Day and month names are three letters (croniter said "[...] is not acceptable").
        (
            "0 8 * * monday",
            "invalid cron expression '0 8 * * monday': day-of-week 'monday' is "
            "not accepted; use 0-7 (0 and 7 are Sunday) or sun-sat, d#k (the k-th weekday d of "
            "the month, k 1-5) or Ld (the last weekday d)",
        ),
        ("0 8 * * Mon-Friday", "day-of-week 'Mon-Friday' is not accepted; use 0-7"),
        ("0 8 * January *", "month 'January' is not accepted; use 1-12 or jan-dec"),
        ("0 8 * * 8", "day-of-week '8' is outside 0-7; use 0-7 (0 and 7 are Sunday)"),
        ("0 8 * * L8", "day-of-week 'L8' has 8, outside 0-7; use 0-7"),
        ("0 8 * 13 *", "month '13' is outside 1-12; use 1-12 or jan-dec"),
        ("0 8 * * sun-", "day-of-week 'sun-' is not accepted"),
        (
            "0 8 32 * *",
            "day-of-month '32' is outside 1-31; use 1-31, L (the last day), a-L, "
            "or nW (the weekday nearest day n)",
        ),
        ("0 8 1W-3 * *", "day-of-month '1W-3' is not accepted; use 1-31, L"),
        ("0 8 ?/2 * *", "day-of-month '?/2' has a step after ?; ? means * and takes no step"),
        ("a b c d e", "invalid cron expression 'a b c d e': minute 'a' is not accepted; use 0-59"),
        ("0 x * * *", "invalid cron expression '0 x * * *': hour 'x' is not accepted; use 0-23"),
        # croniter lets these through (it does not check a range's low end); cronoq does not.
        ("* * 0-0 * *", "day-of-month '0-0' has 0, outside 1-31"),
        ("* * 2-0 * 1", "day-of-month '2-0' has 0, outside 1-31"),
        ("0 0 0 * 7-0 *", "month '7-0' has 0, outside 1-12"),
        ("0 0 30 2 *", "cron expression '0 0 30 2 *' never matches"),
        ("0 0 31 4,6,9,11 *", "cron expression '0 0 31 4,6,9,11 *' never matches"),
        ("0 0 0 31 2 *", "cron expression '0 0 0 31 2 *' never matches"),
        ("@reboot", "cron expression '@reboot' is not supported"),
        ("@REBOOT", "cron expression '@REBOOT' is not supported"),
        ("@fortnightly", "unknown cron alias '@fortnightly'; supported: @yearly"),
        ("H * * * *", "hashed/random field 'H' is not supported"),
        ("0 R * * *", "hashed/random field 'R' is not supported"),
        ("h/15 * * * *", "hashed/random field 'h/15' is not supported"),
        ("1,H(0-29) * * * *", "hashed/random field 'H(0-29)' is not supported"),
    ],
)
def test_invalid_expressions(expression: object, message: str) -> None:
    with pytest.raises(InvalidCron, match=re.escape(message)) as info:
        CronSchedule.parse(expression, "UTC")  # type: ignore[arg-type]
    assert isinstance(info.value, InvalidArgument)
    assert isinstance(info.value, ValueError)
    assert "is not acceptable" not in str(info.value)  # croniter's echo of the expression


def test_invalid_expression_checked_before_zone() -> None:
    with pytest.raises(InvalidCron):
        CronSchedule.parse("61 * * * *", "Not/AZone")


@pytest.mark.parametrize(
    "timezone",
    [
        "",
        "Not/AZone",
        "utc",
        "America",
        "America/",
        "../etc",
        "../../../../etc/passwd",
        "/etc/passwd",
        "America/New_York ",
        "America/New_York\x00",
        "localtime",
        "right/UTC",
        "zone.tab",
        "x" * 255,
    ],
)
def test_unknown_time_zones(timezone: str) -> None:
    with pytest.raises(UnknownTimeZone, match=re.escape(f"unknown time zone {timezone!r}")) as info:
        CronSchedule.parse("* * * * *", timezone)
    assert isinstance(info.value, InvalidArgument)
    assert isinstance(info.value, ValueError)


def test_time_zone_names_and_cron_expressions_are_bounded_before_parsing() -> None:
    with pytest.raises(UnknownTimeZone, match="5000 characters long; the limit is 255"):
        CronSchedule.parse("* * * * *", "x" * 5000)
    with pytest.raises(InvalidCron, match="1029 characters long; the limit is 1024"):
        CronSchedule.parse(" " * 1020 + "* * * * *")


@pytest.mark.parametrize("timezone", [None, 5, b"UTC"])
def test_non_str_time_zone(timezone: object) -> None:
    with pytest.raises(UnknownTimeZone, match=re.escape(f"unknown time zone {timezone!r}")):
        CronSchedule.parse("* * * * *", timezone)  # type: ignore[arg-type]


@pytest.mark.parametrize("after", [-1, 2**63, 1.5, True, "1", None])
def test_after_ns_validated(after: object) -> None:
    s = sched("* * * * *")
    with pytest.raises(InvalidArgument, match="after_ns must be"):
        s.next_after(after)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="after_ns must be"):
        s.preview(after, 1)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "message"),
    [
        (0, "n must be between 1 and 10000, got 0"),
        (-3, "n must be between 1 and 10000, got -3"),
        (10_001, "n must be between 1 and 10000, got 10001"),
        (True, "n must be an int, got bool"),
        (2.0, "n must be an int, got float"),
        ("3", "n must be an int, got str"),
    ],
)
def test_preview_n_validated(n: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        sched("* * * * *").preview(ns(2026, 1, 1), n)  # type: ignore[arg-type]


def test_preview_limits() -> None:
    s = sched("0 * * * *")
    assert s.preview(ns(2026, 1, 1), 1) == [ns(2026, 1, 1, 1)]
    many = s.preview(ns(2026, 1, 1), 10_000)
    assert len(many) == 10_000
    assert many[-1] == ns(2026, 1, 1) + 10_000 * 3600 * NS


def test_edges_of_int64_range() -> None:
    assert sched("* * * * *").next_after(0) == 60 * NS
    # int64 nanoseconds end at 2262-04-11T23:47:16.854775807Z.
    assert sched("0 0 1 4 *").next_after(ns(2262, 1, 1)) == ns(2262, 4, 1)
    beyond = re.escape("falls after 2262-04-11T23:47:16Z, the end of the int64 nanosecond range")
    with pytest.raises(InvalidArgument, match=beyond):
        sched("0 0 1 5 *").next_after(ns(2262, 1, 1))
    with pytest.raises(InvalidArgument, match=beyond):
        sched("* * * * *").next_after(2**63 - 1)
    # The last whole second of the range is still an occurrence.
    assert sched("16 47 23 11 4 *").next_after(ns(2262, 1, 1)) == ns(2262, 4, 11, 23, 47, 16)


def test_public_preview_limits() -> None:
    # cronoq.preview(after=...) accepts instants within ten years of now, like every instant
    # the API takes; its occurrences must end before 2262 like every engine time.
    now = datetime.now(UTC)
    nine_years = now + timedelta(days=9 * 365)
    assert cronoq.preview("0 0 1 1 *", n=1, after=nine_years)[0] > nine_years
    with pytest.raises(InvalidArgument, match="more than ten years from now"):
        cronoq.preview("0 0 1 1 *", after=now + timedelta(days=11 * 365))
    with pytest.raises(InvalidArgument, match="more than ten years from now"):
        cronoq.preview("0 0 1 1 *", after=now - timedelta(days=11 * 365))
    with pytest.raises(InvalidArgument, match=re.escape("falls after 2262-04-11T23:47:16Z")):
        cronoq.preview("0 0 1 1 *", n=300)


# --- DST: America/New_York -----------------------------------------------------------


def test_spring_forward_daily_in_gap_fires_at_transition() -> None:
    # 2026-03-08: 02:00 EST jumps to 03:00 EDT (07:00 UTC); 02:30 does not exist.
    s = sched("30 2 * * *", NY)
    assert s.preview(ns(2026, 3, 7, 12), 3) == [
        ns(2026, 3, 8, 7, 0),  # 03:00 EDT, the transition instant
        ns(2026, 3, 9, 6, 30),  # 02:30 EDT
        ns(2026, 3, 10, 6, 30),
    ]
    assert s.next_after(ns(2026, 3, 8, 7, 0)) == ns(2026, 3, 9, 6, 30)
    assert s.next_after(ns(2026, 3, 8, 7, 0) - 1) == ns(2026, 3, 8, 7, 0)


def test_spring_forward_quarter_hours_coalesce() -> None:
    s = sched("*/15 * * * *", NY)
    assert s.preview(ns(2026, 3, 8, 6, 40), 4) == [
        ns(2026, 3, 8, 6, 45),  # 01:45 EST
        ns(2026, 3, 8, 7, 0),  # 02:00..02:45 (absent) and 03:00 EDT: one run
        ns(2026, 3, 8, 7, 15),  # 03:15 EDT
        ns(2026, 3, 8, 7, 30),
    ]
    assert s.next_after(ns(2026, 3, 8, 7, 0)) == ns(2026, 3, 8, 7, 15)


def test_spring_forward_job_at_end_of_gap_fires_once() -> None:
    s = sched("0 2,3 * * *", NY)
    assert s.preview(ns(2026, 3, 8, 5), 3) == [
        ns(2026, 3, 8, 7),  # 02:00 (absent) and 03:00 EDT coalesce
        ns(2026, 3, 9, 6),  # 02:00 EDT
        ns(2026, 3, 9, 7),  # 03:00 EDT
    ]


def test_spring_forward_seconds_field() -> None:
    s = sched("*/20 59 1,2 * * *", NY)
    assert s.preview(ns(2026, 3, 8, 6, 59, 30), 3) == [
        ns(2026, 3, 8, 6, 59, 40),  # 01:59:40 EST
        ns(2026, 3, 8, 7, 0, 0),  # 02:59:00..02:59:40 absent: one run at 03:00 EDT
        ns(2026, 3, 9, 5, 59, 0),  # 01:59:00 EDT
    ]


def test_fall_back_daily_fires_once_at_first_pass() -> None:
    # 2026-11-01: 02:00 EDT falls back to 01:00 EST (06:00 UTC); 01:30 happens twice.
    s = sched("30 1 * * *", NY)
    assert s.preview(ns(2026, 10, 31, 12), 3) == [
        ns(2026, 11, 1, 5, 30),  # 01:30 EDT
        ns(2026, 11, 2, 6, 30),  # 01:30 EST the next day; not 06:30 UTC on Nov 1
        ns(2026, 11, 3, 6, 30),
    ]
    assert s.next_after(ns(2026, 11, 1, 5, 30)) == ns(2026, 11, 2, 6, 30)
    # From inside the second pass, before and after its 01:30 EST.
    assert s.next_after(ns(2026, 11, 1, 6, 10)) == ns(2026, 11, 2, 6, 30)
    assert s.next_after(ns(2026, 11, 1, 6, 45)) == ns(2026, 11, 2, 6, 30)


def test_fall_back_every_thirty_minutes() -> None:
    s = sched("*/30 * * * *", NY)
    assert s.preview(ns(2026, 11, 1, 4, 0), 6) == [
        ns(2026, 11, 1, 4, 30),  # 00:30 EDT
        ns(2026, 11, 1, 5, 0),  # 01:00 EDT
        ns(2026, 11, 1, 5, 30),  # 01:30 EDT
        ns(2026, 11, 1, 7, 0),  # 02:00 EST; the repeated 01:00 and 01:30 EST do not fire
        ns(2026, 11, 1, 7, 30),
        ns(2026, 11, 1, 8, 0),
    ]
    for after in (ns(2026, 11, 1, 5, 30), ns(2026, 11, 1, 6, 0), ns(2026, 11, 1, 6, 29, 59)):
        assert s.next_after(after) == ns(2026, 11, 1, 7, 0)
    assert s.next_after(ns(2026, 11, 1, 6, 59, 59) + 999_999_999) == ns(2026, 11, 1, 7, 0)


def test_fall_back_hourly_has_two_hour_gap() -> None:
    s = sched("0 * * * *", NY)
    assert s.preview(ns(2026, 11, 1, 4, 30), 3) == [
        ns(2026, 11, 1, 5),  # 01:00 EDT
        ns(2026, 11, 1, 7),  # 02:00 EST: two real hours later
        ns(2026, 11, 1, 8),
    ]


def test_fall_back_every_second_from_second_pass() -> None:
    s = sched("* * * * * *", NY)
    assert s.preview(ns(2026, 11, 1, 6, 10), 2) == [
        ns(2026, 11, 1, 7, 0, 0),
        ns(2026, 11, 1, 7, 0, 1),
    ]
    assert s.next_after(ns(2026, 11, 1, 5, 59, 59)) == ns(2026, 11, 1, 7, 0, 0)
    assert s.next_after(ns(2026, 11, 1, 5, 59, 58)) == ns(2026, 11, 1, 5, 59, 59)


# --- DST: Europe/London --------------------------------------------------------------


def test_london_spring_forward() -> None:
    # 2026-03-29: 01:00 GMT jumps to 02:00 BST (01:00 UTC).
    s = sched("30 1 * * *", LONDON)
    assert s.preview(ns(2026, 3, 28, 12), 3) == [
        ns(2026, 3, 29, 1, 0),  # 01:30 absent: fires at 02:00 BST
        ns(2026, 3, 30, 0, 30),  # 01:30 BST
        ns(2026, 3, 31, 0, 30),
    ]


def test_london_fall_back() -> None:
    # 2026-10-25: 02:00 BST falls back to 01:00 GMT (01:00 UTC).
    s = sched("30 1 * * *", LONDON)
    assert s.preview(ns(2026, 10, 24, 12), 3) == [
        ns(2026, 10, 25, 0, 30),  # 01:30 BST
        ns(2026, 10, 26, 1, 30),  # 01:30 GMT; not 01:30 UTC on the 25th
        ns(2026, 10, 27, 1, 30),
    ]
    hourly = sched("0 * * * *", LONDON)
    assert hourly.preview(ns(2026, 10, 24, 23, 30), 3) == [
        ns(2026, 10, 25, 0),  # 01:00 BST
        ns(2026, 10, 25, 2),  # 02:00 GMT
        ns(2026, 10, 25, 3),
    ]


# --- DST: a 30-minute shift ----------------------------------------------------------


def test_lord_howe_half_hour_shifts() -> None:
    # Australia/Lord_Howe is +10:30 standard and +11:00 in summer.
    # 2026-04-05: 02:00 +11 falls back to 01:30 +10:30 (2026-04-04 15:00 UTC).
    quarter = sched("*/15 * * * *", LORD_HOWE)
    assert quarter.preview(ns(2026, 4, 4, 14, 0), 5) == [
        ns(2026, 4, 4, 14, 15),  # 01:15 +11
        ns(2026, 4, 4, 14, 30),  # 01:30 +11
        ns(2026, 4, 4, 14, 45),  # 01:45 +11; the repeated 01:30 and 01:45 do not fire
        ns(2026, 4, 4, 15, 30),  # 02:00 +10:30
        ns(2026, 4, 4, 15, 45),
    ]
    # 2026-10-04: 02:00 +10:30 jumps to 02:30 +11 (2026-10-03 15:30 UTC).
    hourly = sched("0 * * * *", LORD_HOWE)
    assert hourly.preview(ns(2026, 10, 3, 14, 0), 4) == [
        ns(2026, 10, 3, 14, 30),  # 01:00 +10:30
        ns(2026, 10, 3, 15, 30),  # 02:00 absent: fires at 02:30 +11
        ns(2026, 10, 3, 16, 0),  # 03:00 +11
        ns(2026, 10, 3, 17, 0),
    ]


# --- properties ----------------------------------------------------------------------

ZONES = [
    "UTC",
    NY,
    LONDON,
    "Europe/Dublin",
    LORD_HOWE,
    "Pacific/Chatham",
    "Australia/Sydney",
    "Asia/Kolkata",
]

# Offset changes in 2026 of the zones above, as UTC instants.
TRANSITIONS = [
    ns(2026, 3, 8, 7),
    ns(2026, 11, 1, 6),
    ns(2026, 3, 29, 1),
    ns(2026, 10, 25, 1),
    ns(2026, 4, 4, 14),
    ns(2026, 4, 4, 15),
    ns(2026, 4, 4, 16),
    ns(2026, 9, 26, 14),
    ns(2026, 10, 3, 15, 30),
    ns(2026, 10, 3, 16),
]

instants = st.one_of(
    st.integers(min_value=ns(2025, 1, 1), max_value=ns(2028, 1, 1)),
    st.builds(
        lambda anchor, delta: anchor + delta,
        st.sampled_from(TRANSITIONS),
        st.integers(min_value=-3 * 3600 * NS, max_value=3 * 3600 * NS),
    ),
    st.builds(
        lambda anchor, delta_s: anchor + delta_s * NS,
        st.sampled_from(TRANSITIONS),
        st.integers(min_value=-7200, max_value=7200),
    ),
)


@dataclass(frozen=True)
class Spec:
    """A generated cron expression with its fields' allowed values spelled out."""

    expression: str
    seconds: frozenset[int] | None  # None: five-field form (second 0)
    minutes: frozenset[int]
    hours: frozenset[int]
    weekdays: frozenset[int]  # cron numbering, 0 = Sunday

    def matches(self, wall: datetime) -> bool:
        second_ok = wall.second in self.seconds if self.seconds is not None else wall.second == 0
        return (
            second_ok
            and wall.minute in self.minutes
            and wall.hour in self.hours
            and (wall.weekday() + 1) % 7 in self.weekdays
        )


FieldStrategy = st.SearchStrategy[tuple[str, frozenset[int]]]


def _field(lo: int, hi: int, *, wildcard: bool = True) -> FieldStrategy:
    """A field's text with the set of values it allows."""
    every = frozenset(range(lo, hi + 1))
    options: list[FieldStrategy] = [
        st.integers(min_value=2, max_value=hi - lo).map(
            lambda k: (f"*/{k}", frozenset(range(lo, hi + 1, k)))
        ),
        st.frozensets(st.integers(min_value=lo, max_value=hi), min_size=1, max_size=4).map(
            lambda values: (",".join(map(str, sorted(values))), values)
        ),
    ]
    if wildcard:
        options.append(st.just(("*", every)))
    return st.one_of(*options)


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    minute_text, minutes = draw(_field(0, 59))
    if draw(st.booleans()):
        second_text, seconds = draw(_field(0, 59))
        # Keep occurrences within the hour so the per-second oracle stays cheap.
        return Spec(
            f"{second_text} {minute_text} * * * *",
            seconds,
            minutes,
            frozenset(range(24)),
            frozenset(range(7)),
        )
    hour_text, hours = draw(_field(0, 23))
    weekday_text, weekdays = draw(
        st.one_of(st.just(("*", frozenset(range(7)))), _field(0, 6, wildcard=False))
    )
    return Spec(f"{minute_text} {hour_text} * * {weekday_text}", None, minutes, hours, weekdays)


def _offset(zone: ZoneInfo, second: int) -> timedelta:
    offset = datetime.fromtimestamp(second, tz=zone).utcoffset()
    assert offset is not None
    return offset


def _wall(second: int) -> datetime:
    return datetime(1970, 1, 1) + timedelta(seconds=second)


def oracle_next(spec: Spec, timezone: str, after_ns: int) -> int:
    """Walk UTC time step by step and apply the documented DST rules directly."""
    zone = ZoneInfo(timezone)
    step = 1 if spec.seconds is not None else 60
    second = after_ns // NS + 1
    second = -(-second // step) * step  # every zone used has whole-minute offsets
    for _ in range(9 * 24 * 3600 // step):
        before = _offset(zone, second - 1)
        now = _offset(zone, second)
        local = datetime.fromtimestamp(second, tz=zone)
        if now > before:
            # `second` ends a gap: it fires if its own wall time or any absent one does.
            start = second + int(before.total_seconds())
            end = second + int(now.total_seconds())
            if any(spec.matches(_wall(w)) for w in range(start, end + 1, step)):
                return second * NS
        elif local.fold == 0 and spec.matches(local.replace(tzinfo=None)):
            return second * NS
        second += step
    raise AssertionError("oracle found no occurrence")  # pragma: no cover


def _is_transition(timezone: str, instant_ns: int) -> bool:
    zone = ZoneInfo(timezone)
    second = instant_ns // NS
    return _offset(zone, second - 1) != _offset(zone, second)


@settings(max_examples=300, deadline=None)
@given(spec=specs(), timezone=st.sampled_from(ZONES), after=instants)
def test_next_after_matches_oracle(spec: Spec, timezone: str, after: int) -> None:
    s = CronSchedule.parse(spec.expression, timezone)
    first, second = s.preview(after, 2)
    assert s.next_after(after) == first
    assert first == oracle_next(spec, timezone, after)
    assert second == oracle_next(spec, timezone, first)


@settings(max_examples=200, deadline=None)
@given(
    spec=specs(),
    timezone=st.sampled_from(ZONES),
    after=instants,
    n=st.integers(min_value=1, max_value=40),
)
def test_preview_properties(spec: Spec, timezone: str, after: int, n: int) -> None:
    s = CronSchedule.parse(spec.expression, timezone)
    values = s.preview(after, n)
    assert len(values) == n
    assert values[0] > after
    assert all(a < b for a, b in itertools.pairwise(values))
    zone = ZoneInfo(timezone)
    for value in values:
        assert value % NS == 0
        local = datetime.fromtimestamp(value // NS, tz=zone)
        assert spec.matches(local.replace(tzinfo=None)) or _is_transition(timezone, value)
    # Each value is exactly what next_after gives from the one before.
    assert [s.next_after(v) for v in [after, *values[:-1]]] == values


@settings(max_examples=300, deadline=None)
@given(spec=specs(), timezone=st.sampled_from(ZONES), a=instants, b=instants)
def test_next_after_is_monotone(spec: Spec, timezone: str, a: int, b: int) -> None:
    a, b = min(a, b), max(a, b)
    s = CronSchedule.parse(spec.expression, timezone)
    next_a, next_b = s.next_after(a), s.next_after(b)
    assert next_a > a
    assert next_b > b
    assert next_a <= next_b
    if next_a > b:
        # Nothing fires in (a, b] then, so both searches must land on the same run.
        assert next_a == next_b
