"""Cron schedules evaluated in an IANA time zone, mapped to UTC instants.

A ``CronSchedule`` pairs a cron expression with a time zone. Occurrences
are computed in the zone's local wall-clock time and then mapped to UTC
instants, expressed as Unix nanoseconds (``int``). The module is pure: it never
reads the clock and does no I/O beyond loading the zone's rules once.

Cron syntax
    Five fields ``minute hour day-of-month month day-of-week``, or six fields
    with *seconds first* (Quartz/Spring style): ``second minute hour
    day-of-month month day-of-week``. croniter parses and validates the
    expression; this module gives each field its meaning and finds the
    occurrences itself, so the rules below hold whatever croniter's own
    evaluation does. A field is a comma-separated list of:

    * ``*``; ``n``; a range ``a-b``; any of those with a step ``/s``. ``a/s``
      means ``a-max/s``. A range with equal ends is that one value (``5-5``
      and ``5-5/2`` are ``5``). A range whose start is after its end wraps
      around the end of the field (``FRI-MON``, hours ``22-2``) and a step
      counts on across the wrap (minutes ``50-10/15`` are 50 and 5).
    * Names: ``jan``-``dec`` and ``sun``-``sat``, any case, as values and
      range ends. Day-of-week runs 0-7, 0 and 7 both Sunday, so ``1/2`` is
      Mon, Wed, Fri and Sun (as in cronie).
    * Day-of-month only: ``L`` (the last day), ``a-L``, and ``nW`` (the
      weekday nearest day ``n`` inside its month; ``n`` past the month's end
      means its last day; alone in the field). Day-of-week only: ``d#k`` (the
      ``k``-th weekday ``d`` of the month, ``d`` may be a name range:
      ``mon-fri#1``) and ``Ld`` (the last weekday ``d`` of the month).
      ``?`` in either day field means ``*``.

    Day-of-month and day-of-week combine as in Vixie cron: when either field
    starts with ``*`` (or is ``?``) a day must match both, otherwise a day
    matches if *either* does. So ``0 0 1,15 * MON`` runs on the 1st, the 15th
    and every Monday, while ``0 0 */2 * MON`` runs on Mondays that fall on odd
    days. ``L``, ``W``, ``#`` and ``Ld`` take part in that rule like any value.
    The aliases ``@yearly``, ``@annually``, ``@monthly``, ``@weekly``,
    ``@daily``, ``@midnight`` and ``@hourly`` are accepted.

    Rejected: the seven-field (year) form; ``@reboot`` (a durable schedule has
    no notion of a boot); hashed and random fields (``H``, ``R``), whose
    expansion would differ between processes; and expressions that never match
    (``0 0 30 2 *``). The Gregorian calendar, weekdays included, repeats every
    400 years, so "no occurrence within 400 years" is exactly "never".

Daylight-saving semantics
    * Spring forward. A local time inside the gap does not exist. Its
      occurrence fires once, at the transition instant: the first instant after
      the gap (03:00 EDT in America/New_York on 2026-03-08). Every occurrence
      inside the same gap, and one at exactly the end of the gap, coalesce into
      that single firing: none is lost, none is doubled.
    * Fall back. A local time that occurs twice fires once, at its first
      occurrence. The repeated hour does not fire again, so an hourly job has a
      two-hour real gap around the repeated 01:00, and a job every 30 minutes
      runs 01:00 and 01:30 (first pass) then 02:00, 90 real minutes later.

    Both rules amount to one monotone map from wall time to instant: the first
    instant whose local wall clock reads at least that wall time. Hence
    ``next_after`` is monotone (``a <= b`` implies ``next_after(a) <=
    next_after(b)``) and its result is always strictly greater than its input.

Occurrences are whole seconds. An input with a sub-second part yields the first
whole matching second strictly after it. Inputs must lie in ``[0, 2**63 - 1]``
(the int64 nanosecond range) and so must results: an occurrence after
2262-04-11T23:47:16Z raises ``InvalidArgument`` instead of wrapping.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from cronoq._validate import MAX_CRON_LENGTH, MAX_TIME_ZONE_LENGTH, shown
from cronoq.errors import InvalidArgument, InvalidCron, UnknownTimeZone

__all__ = ["CronSchedule"]

_NS_PER_S: Final = 1_000_000_000
_MAX_NS: Final = 2**63 - 1
_PREVIEW_MAX: Final = 10_000
# One full Gregorian cycle: an expression matches somewhere iff it matches within
# any window this long, so this bound both detects "never" and can never cut off
# a real occurrence at run time.
_CYCLE_YEARS: Final = 400
_CHECK_FROM: Final = datetime(2000, 1, 1)
_EPOCH: Final = datetime(1970, 1, 1)
_ONE_SECOND: Final = timedelta(seconds=1)

# croniter splits on ASCII whitespace only; strip and count the same way so our
# field count agrees with its parse.
_ASCII_SPACE: Final = " \t\n\r\f\v"
_FIELD_RE: Final = re.compile(r"\S+", re.ASCII)
_HASHED_RE: Final = re.compile(r"^[hr](\(\d+-\d+\))?(/\d+)?$", re.IGNORECASE | re.ASCII)
# The special day forms, in the spellings croniter accepts (fields are lower-cased).
_NEAREST_RE: Final = re.compile(r"^(?:(\d+)w|w(\d+))$", re.ASCII)
_LAST_DOW_RE: Final = re.compile(r"^l(\d+)$", re.ASCII)
_NTH_DOW_RE: Final = re.compile(r"^([a-z0-9]+(?:-[a-z0-9]+)?)#(\d+)$", re.ASCII)

# Spelled out here rather than delegated, so the field-count check sees the expansion.
_ALIASES: Final[dict[str, str]] = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_MONTH_NAMES: Final = {
    name: number
    for number, name in enumerate(
        ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        start=1,
    )
}
_DAY_NAMES: Final = {
    name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
}


@dataclass(frozen=True, slots=True)
class _Unit:
    """One field's bounds; day-of-week runs to 7 (Sunday again), as in Vixie cron."""

    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_SECOND: Final = _Unit("second", 0, 59)
_MINUTE: Final = _Unit("minute", 0, 59)
_HOUR: Final = _Unit("hour", 0, 23)
_DOM: Final = _Unit("day-of-month", 1, 31)
_MONTH: Final = _Unit("month", 1, 12, _MONTH_NAMES)
_DOW: Final = _Unit("day-of-week", 0, 7, _DAY_NAMES)


@dataclass(frozen=True, slots=True)
class _Fields:
    """What an expression matches, as cronoq reads it (module docstring)."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    # Matching days of a month, indexed by (length - 28) * 7 + weekday of the 1st
    # (0 = Sunday). Whether a day matches depends only on those two facts, so 28
    # precomputed rows answer every month of every year.
    month_days: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True)
class _Compiled:
    zone: ZoneInfo
    fields: _Fields


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """A validated cron expression in a time zone; see the module docstring."""

    expression: str
    timezone: str = "UTC"
    _compiled: _Compiled = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Validating here, not only in parse(), means no invalid instance can exist.
        expression: object = self.expression
        timezone: object = self.timezone
        if not isinstance(expression, str):
            raise InvalidCron(
                f"cron expression must be a str, got {type(expression).__name__}: {expression!r}"
            )
        if not isinstance(timezone, str):
            raise UnknownTimeZone(
                f"unknown time zone {timezone!r}: expected an IANA name (str), "
                f"got {type(timezone).__name__}"
            )
        # Bounded before parsing: the parse takes time in proportion to the length.
        if len(expression) > MAX_CRON_LENGTH:
            raise InvalidCron(
                f"cron expression is {len(expression)} characters long; the limit is "
                f"{MAX_CRON_LENGTH}: {shown(expression)}"
            )
        if len(timezone) > MAX_TIME_ZONE_LENGTH:
            raise UnknownTimeZone(
                f"time zone name is {len(timezone)} characters long; the limit is "
                f"{MAX_TIME_ZONE_LENGTH}: {shown(timezone)}"
            )
        object.__setattr__(self, "_compiled", _compile(expression, timezone))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle the two names only; the compiled form is rebuilt (and revalidated).
        return (type(self), (self.expression, self.timezone))

    @classmethod
    def parse(cls, expression: str, timezone: str = "UTC") -> CronSchedule:
        """Validate and build a schedule.

        Raises ``InvalidCron`` or ``UnknownTimeZone`` naming the bad input.
        """
        return cls(expression, timezone)

    def next_after(self, after_ns: int) -> int:
        """Return the first occurrence strictly after ``after_ns`` (Unix ns)."""
        return next(self._occurrences(_check_ns(after_ns)))

    def preview(self, after_ns: int, n: int) -> list[int]:
        """Return the next ``n`` occurrences (1 <= n <= 10,000) after ``after_ns``."""
        start = _check_ns(after_ns)
        if isinstance(n, bool) or not isinstance(n, int):
            raise InvalidArgument(f"n must be an int, got {type(n).__name__}: {n!r}")
        if not 1 <= n <= _PREVIEW_MAX:
            raise InvalidArgument(f"n must be between 1 and {_PREVIEW_MAX}, got {n}")
        occurrences = self._occurrences(start)
        return [next(occurrences) for _ in range(n)]

    def _occurrences(self, after_ns: int) -> Iterator[int]:
        zone = self._compiled.zone
        fields = self._compiled.fields
        after_s = after_ns // _NS_PER_S
        local = datetime.fromtimestamp(after_s, tz=zone)
        wall = local.replace(tzinfo=None)
        if local.fold:
            # after_ns is in the second pass of a repeated hour. Every wall time of
            # that hour fired (or will never fire) on the first pass, so resume at the
            # end of the repetition instead of skipping up to 3600 candidates. The
            # transition lies after this wall time's first pass and at or before now.
            offset_before = _offset_s(zone, wall, fold=0)
            offset_after = _utc_offset_s(local)
            transition = _transition(
                zone, after_s - (offset_before - offset_after), after_s, offset_before
            )
            # Wall times from transition + offset_before on exist once again.
            wall = _EPOCH + timedelta(seconds=transition + offset_before - 1)

        last = after_ns
        while True:
            found = _next_wall(fields, wall)
            if found is None:  # pragma: no cover - excluded by parse
                raise InvalidCron(
                    f"cron expression {self.expression!r} has no occurrence after {after_ns}"
                )
            wall = found
            instant_ns = _instant_s(zone, wall) * _NS_PER_S
            # Skipped: wall times that map to an instant already passed, which is how
            # gap coalescing and the repeated hour are kept from firing twice.
            if instant_ns <= last:
                continue
            if instant_ns > _MAX_NS:
                raise InvalidArgument(
                    f"the next occurrence of {self.expression!r} after {after_ns} falls after "
                    f"2262-04-11T23:47:16Z, the end of the int64 nanosecond range"
                )
            last = instant_ns
            yield instant_ns


@lru_cache(maxsize=1024)
def _compile(expression: str, timezone: str) -> _Compiled:
    fields = _parse_expression(expression)
    return _Compiled(zone=_load_zone(timezone), fields=fields)


# Separately cached: one expression is often used in several zones.
@lru_cache(maxsize=1024)
def _parse_expression(expression: str) -> _Fields:
    if "\x00" in expression:
        raise InvalidCron(f"cron expression {expression!r} contains a NUL character")
    text = expression.strip(_ASCII_SPACE)
    if not text:
        raise InvalidCron(f"cron expression {expression!r} is empty")
    if text.startswith("@"):
        alias = text.lower()
        if alias == "@reboot":
            raise InvalidCron(
                f"cron expression {expression!r} is not supported: "
                f"a durable schedule has no notion of a reboot"
            )
        if alias not in _ALIASES:
            raise InvalidCron(
                f"unknown cron alias {expression!r}; supported: {', '.join(_ALIASES)}"
            )
        text = _ALIASES[alias]

    words = _FIELD_RE.findall(text)
    if len(words) not in (5, 6):
        raise InvalidCron(
            f"cron expression {expression!r} has {len(words)} fields; expected 5 "
            f"(minute hour day-of-month month day-of-week) or 6 (second first)"
        )
    for item in (part for f in words for part in f.split(",")):
        if _HASHED_RE.match(item):
            raise InvalidCron(
                f"cron expression {expression!r}: hashed/random field {item!r} is not supported"
            )

    # croniter's own expansion is not used: it widens equal ranges to the whole
    # field, ORs the day fields even when one starts with "*", and loses a plain
    # weekday listed next to an nth one. cronoq reads the fields itself.
    lowered = [word.lower() for word in words]

    # croniter is the parser: what it rejects is invalid. Its message only echoes the
    # expression ("[0 8 * * monday] is not acceptable"): cronoq's reading of the fields
    # names the element and what its field accepts.
    try:
        croniter(text, _CHECK_FROM, ret_type=datetime, second_at_beginning=len(words) == 6)
    # croniter signals most bad input with CroniterBadCronError (a ValueError), but
    # some malformed fields escape as other built-in errors.
    except (ValueError, TypeError, LookupError, ArithmeticError) as exc:
        try:
            _read_fields(lowered)
        except _Unreadable as bad:
            raise InvalidCron(_unreadable(expression, bad)) from exc
        except (ValueError, TypeError, LookupError, ArithmeticError):
            pass
        said = _CRONITER_ECHO.sub("", str(exc)).lstrip(" ,.:") or "not a cron expression"
        raise InvalidCron(f"invalid cron expression {expression!r}: {said}") from exc

    try:
        fields = _read_fields(lowered)
    # croniter accepts a few things no field means: it does not check the low end of a
    # range, so day-of-month "0-0" and month "7-0" reach here.
    except _Unreadable as exc:
        raise InvalidCron(_unreadable(expression, exc)) from None

    if _next_wall(fields, _CHECK_FROM) is None:
        raise InvalidCron(
            f"cron expression {expression!r} never matches: no date in a "
            f"{_CYCLE_YEARS}-year Gregorian cycle satisfies it"
        )
    return fields


def _read_fields(lowered: list[str]) -> _Fields:
    second, rest = (lowered[0], lowered[1:]) if len(lowered) == 6 else ("0", lowered)
    minute, hour, dom, month, dow = rest
    return _Fields(
        seconds=tuple(sorted(_expand(second, _SECOND))),
        minutes=tuple(sorted(_expand(minute, _MINUTE))),
        hours=tuple(sorted(_expand(hour, _HOUR))),
        months=frozenset(_expand(month, _MONTH)),
        month_days=_month_table(dom, dow),
    )


_CRONITER_ECHO: Final = re.compile(r"^\[[^\]]*\] is not acceptable")
"""The start of croniter's messages: the expression again, which says nothing more."""

_ACCEPTED: Final[dict[str, str]] = {
    "second": "use 0-59",
    "minute": "use 0-59",
    "hour": "use 0-23",
    "day-of-month": "use 1-31, L (the last day), a-L, or nW (the weekday nearest day n)",
    "month": "use 1-12 or jan-dec",
    "day-of-week": (
        "use 0-7 (0 and 7 are Sunday) or sun-sat, d#k (the k-th weekday d of the month, "
        "k 1-5) or Ld (the last weekday d)"
    ),
}
"""What each field accepts, besides ``*``, ranges ``a-b``, lists ``a,b`` and steps ``/n``."""


class _Unreadable(Exception):
    """An element of a field that means nothing to cronoq (``reason``), and what to do
    instead (``advice``; None: what the field accepts)."""

    def __init__(
        self,
        item: str,
        unit: _Unit,
        reason: str = "is not accepted",
        advice: str | None = None,
    ) -> None:
        super().__init__(item)
        self.item = item
        self.unit = unit
        self.reason = reason
        self.advice = _ACCEPTED[unit.name] if advice is None else advice


def _unreadable(expression: str, exc: _Unreadable) -> str:
    """The message for a bad element, spelled as the expression spells it (fields are read
    lower-cased)."""
    found = re.search(re.escape(exc.item), expression, re.IGNORECASE)
    item = exc.item if found is None else found.group()
    return (
        f"invalid cron expression {expression!r}: {exc.unit.name} {item!r} {exc.reason}; "
        f"{exc.advice}"
    )


def _value(token: str, unit: _Unit, item: str) -> int:
    if token.isdigit() and token.isascii():
        number = int(token)
    elif unit.names is not None and token in unit.names:
        number = unit.names[token]
    else:
        raise _Unreadable(item, unit)
    if not unit.low <= number <= unit.high:
        said = "is" if item == token else f"has {number},"
        raise _Unreadable(item, unit, f"{said} outside {unit.low}-{unit.high}")
    return number


def _expand(item_list: str, unit: _Unit) -> set[int]:
    """The values of a field of plain elements (``*``, ``n``, ``a-b``, steps), as a set."""
    values: set[int] = set()
    for item in item_list.split(","):
        values |= _plain(item, unit)
    return values


def _plain(item: str, unit: _Unit) -> set[int]:
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not (step_text.isdigit() and step_text.isascii()) or int(step_text) == 0:
            raise _Unreadable(
                item, unit, f"has step {step_text!r}", "a step is a whole number from 1"
            )
        step = int(step_text)
    if base in ("*", "?"):
        if base == "?" and slash:
            raise _Unreadable(item, unit, "has a step after ?", "? means * and takes no step")
        low, high = unit.low, unit.high
    elif "-" in base:
        low_text, high_text = base.split("-", 1)
        low = _value(low_text, unit, item)
        # "a-L" in day-of-month runs to the last day; days a month lacks never match.
        high = 31 if unit is _DOM and high_text == "l" else _value(high_text, unit, item)
    else:
        low = _value(base, unit, item)
        high = unit.high if slash else low
    return _sequence(low, high, step, unit)


def _sequence(low: int, high: int, step: int, unit: _Unit) -> set[int]:
    if unit is _DOW:
        if low > high:
            # Only a wrapping range reads 7 as the Sunday it names; 5-7 stays plain.
            low, high = low % 7, high % 7
        span_low, span = 0, 7
    else:
        span_low, span = unit.low, unit.high - unit.low + 1
    if low <= high:
        values = set(range(low, high + 1, step))
    else:
        # A wrapping range: count on from low across the field's end to high.
        length = (high - low) % span
        values = {span_low + (low - span_low + k) % span for k in range(0, length + 1, step)}
    return {v % 7 for v in values} if unit is _DOW else values


@dataclass(frozen=True, slots=True)
class _DayRule:
    dom_days: frozenset[int]
    dom_last: bool
    dom_nearest: frozenset[int]
    dow_days: frozenset[int]
    dow_nth: frozenset[tuple[int, int]]
    dow_last: frozenset[int]
    # Vixie cron: both day fields must match when either starts with "*".
    both: bool

    def days(self, length: int, first_weekday: int) -> tuple[int, ...]:
        """The matching days of a month of ``length`` days whose 1st is ``first_weekday``."""
        dom = {d for d in self.dom_days if d <= length}
        if self.dom_last:
            dom.add(length)
        dom |= {_nearest_weekday(n, length, first_weekday) for n in self.dom_nearest}
        dow: set[int] = set()
        for weekday in self.dow_days:
            dow.update(range(_first_day(weekday, first_weekday), length + 1, 7))
        for weekday, k in self.dow_nth:
            nth = _first_day(weekday, first_weekday) + 7 * (k - 1)
            if nth <= length:
                dow.add(nth)
        for weekday in self.dow_last:
            first = _first_day(weekday, first_weekday)
            dow.add(first + 7 * ((length - first) // 7))
        return tuple(sorted(dom & dow if self.both else dom | dow))


def _first_day(weekday: int, first_weekday: int) -> int:
    """The first day of a month whose 1st is ``first_weekday`` that falls on ``weekday``."""
    return 1 + (weekday - first_weekday) % 7


def _nearest_weekday(target: int, length: int, first_weekday: int) -> int:
    """The weekday (Mon-Fri) nearest day ``target``, inside a month of ``length`` days."""
    target = min(target, length)
    weekday = (first_weekday + target - 1) % 7  # 0 = Sunday
    if weekday == 6:  # Saturday: the Friday before, or Monday if that leaves the month
        return target - 1 if target > 1 else target + 2
    if weekday == 0:  # Sunday: the Monday after, or Friday if that leaves the month
        return target + 1 if target < length else target - 2
    return target


def _day_rule(dom: str, dow: str) -> _DayRule:
    dom_days: set[int] = set()
    dom_last = False
    dom_nearest: set[int] = set()
    for item in dom.split(","):
        nearest = _NEAREST_RE.match(item)
        if item == "l":
            dom_last = True
        elif nearest:
            dom_nearest.add(_value(nearest.group(1) or nearest.group(2), _DOM, item))
        else:
            dom_days |= _plain(item, _DOM)
    dow_days: set[int] = set()
    dow_nth: set[tuple[int, int]] = set()
    dow_last: set[int] = set()
    for item in dow.split(","):
        last = _LAST_DOW_RE.match(item)
        nth = _NTH_DOW_RE.match(item)
        if last:
            dow_last.add(_value(last.group(1), _DOW, item) % 7)
        elif nth:
            k = int(nth.group(2))
            if not 1 <= k <= 5:
                raise _Unreadable(item, _DOW, f"asks for week {k} of the month", "k in d#k is 1-5")
            dow_nth |= {(d, k) for d in _plain(nth.group(1), _DOW)}
        else:
            dow_days |= _plain(item, _DOW)
    return _DayRule(
        dom_days=frozenset(dom_days),
        dom_last=dom_last,
        dom_nearest=frozenset(dom_nearest),
        dow_days=frozenset(dow_days),
        dow_nth=frozenset(dow_nth),
        dow_last=frozenset(dow_last),
        both=dom.startswith(("*", "?")) or dow.startswith(("*", "?")),
    )


def _month_table(dom: str, dow: str) -> tuple[tuple[int, ...], ...]:
    rule = _day_rule(dom, dow)
    return tuple(
        rule.days(length, first_weekday) for length in range(28, 32) for first_weekday in range(7)
    )


def _first_time(
    fields: _Fields, hour: int, minute: int, second: int
) -> tuple[int, int, int] | None:
    """The first (hour, minute, second) of a matching day at or after the one given."""
    hours, minutes, seconds = fields.hours, fields.minutes, fields.seconds
    for h in hours[bisect_left(hours, hour) :]:
        same_hour = h == hour
        for m in minutes[bisect_left(minutes, minute if same_hour else 0) :]:
            floor = second if same_hour and m == minute else 0
            i = bisect_left(seconds, floor)
            if i < len(seconds):
                return (h, m, seconds[i])
    return None


def _next_wall(fields: _Fields, after: datetime) -> datetime | None:
    """The first matching wall time strictly after ``after`` (whole seconds).

    ``None`` when nothing matches within a Gregorian cycle, which means never.
    """
    start = after.replace(microsecond=0) + _ONE_SECOND
    year, month, day = start.year, start.month, start.day
    clock: tuple[int, int, int] = (start.hour, start.minute, start.second)
    for _ in range(_CYCLE_YEARS * 12 + 1):
        if month in fields.months:
            first_weekday, length = calendar.monthrange(year, month)  # 0 = Monday
            days = fields.month_days[(length - 28) * 7 + (first_weekday + 1) % 7]
            for d in days[bisect_left(days, day) :]:
                found = _first_time(fields, *(clock if d == day else (0, 0, 0)))
                if found is not None:
                    return datetime(year, month, d, found[0], found[1], found[2])
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
        day, clock = 1, (0, 0, 0)
    return None


def _load_zone(name: str) -> ZoneInfo:
    # "localtime" names whatever the host is set to and "right/" zones count leap
    # seconds; neither means the same thing on every machine that loads the schedule.
    if not name or "\x00" in name or name == "localtime" or name.startswith("right/"):
        raise UnknownTimeZone(f"unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    # OSError covers directories ("America") and unreadable paths; ValueError covers
    # keys escaping TZPATH ("../etc") and files that are not TZif data.
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise UnknownTimeZone(f"unknown time zone {name!r}") from exc


def _check_ns(value: int) -> int:
    checked: object = value
    if isinstance(checked, bool) or not isinstance(checked, int):
        raise InvalidArgument(
            f"after_ns must be an int of Unix nanoseconds, got {type(checked).__name__}: "
            f"{checked!r}"
        )
    if not 0 <= checked <= _MAX_NS:
        raise InvalidArgument(f"after_ns must be in [0, 2**63 - 1], got {checked}")
    return checked


def _utc_offset_s(aware: datetime) -> int:
    offset = aware.utcoffset()
    assert offset is not None  # every ZoneInfo-aware datetime has an offset
    return offset // _ONE_SECOND


def _offset_s(zone: ZoneInfo, wall: datetime, fold: int) -> int:
    return _utc_offset_s(wall.replace(tzinfo=zone, fold=fold))


def _wall_seconds(wall: datetime) -> int:
    """Seconds of a naive wall time since the epoch, as if it were UTC."""
    delta = wall - _EPOCH
    return delta.days * 86_400 + delta.seconds


def _instant_s(zone: ZoneInfo, wall: datetime) -> int:
    """Map a local wall time to the UTC second at which it fires."""
    # Per PEP 495 fold=0 applies the offset in force before a transition, fold=1 the
    # one after, for repeated and non-existent times alike.
    offset_before = _offset_s(zone, wall, fold=0)
    offset_after = _offset_s(zone, wall, fold=1)
    base = _wall_seconds(wall)
    if offset_after <= offset_before:
        # Unique, or repeated (offset went down): the first occurrence is fold=0.
        return base - offset_before
    # The offset went up, so the wall time is in a gap. The transition lies in
    # (base - offset_after, base - offset_before]: reading the wall time with the
    # later offset gives an instant before the change, with the earlier one after it.
    return _transition(zone, base - offset_after, base - offset_before, offset_before)


def _transition(zone: ZoneInfo, lo: int, hi: int, before: int) -> int:
    """Return the first second in (lo, hi] whose UTC offset is no longer ``before``."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _utc_offset_s(datetime.fromtimestamp(mid, tz=zone)) != before:
            hi = mid
        else:
            lo = mid
    return hi
