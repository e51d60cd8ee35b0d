"""Cron schedules evaluated in an IANA time zone, mapped to UTC instants.

A :class:`CronSchedule` pairs a cron expression with a time zone. Occurrences
are computed in the zone's local wall-clock time and then mapped to UTC
instants, expressed as Unix nanoseconds (``int``). The module is pure: it never
reads the clock and does no I/O beyond loading the zone's rules once.

Cron syntax
    Five fields ``minute hour day-of-month month day-of-week``, or six fields
    with *seconds first* (Quartz/Spring style): ``second minute hour
    day-of-month month day-of-week``. Everything croniter understands inside a
    field is accepted (lists, ranges, steps, names, ``L``, ``W``, ``#``, ``?``).
    When both day fields are restricted a day matches if *either* does (classic
    Vixie cron). The aliases ``@yearly``, ``@annually``, ``@monthly``,
    ``@weekly``, ``@daily``, ``@midnight`` and ``@hourly`` are accepted.

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
(the int64 nanosecond range) and so must results.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

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


@dataclass(frozen=True, slots=True)
class _Compiled:
    zone: ZoneInfo
    # Never iterated itself: each walk works on a shallow copy, so concurrent
    # callers (threads included) never share croniter's mutable cursor.
    template: croniter[datetime]


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
        object.__setattr__(self, "_compiled", _compile(expression, timezone))

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickle the two names only; the compiled form is rebuilt (and revalidated).
        return (type(self), (self.expression, self.timezone))

    @classmethod
    def parse(cls, expression: str, timezone: str = "UTC") -> CronSchedule:
        """Validate and build a schedule.

        Raises :class:`InvalidCron` or :class:`UnknownTimeZone` naming the bad input.
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
        after_s = after_ns // _NS_PER_S
        local = datetime.fromtimestamp(after_s, tz=zone)
        resume = local.replace(tzinfo=None)
        if local.fold:
            # after_ns is in the second pass of a repeated hour. Every wall time of
            # that hour fired (or will never fire) on the first pass, so resume at the
            # end of the repetition instead of skipping up to 3600 candidates. The
            # transition lies after this wall time's first pass and at or before now.
            offset_before = _offset_s(zone, resume, fold=0)
            offset_after = _utc_offset_s(local)
            transition = _transition(
                zone, after_s - (offset_before - offset_after), after_s, offset_before
            )
            # Wall times from transition + offset_before on exist once again.
            resume = _EPOCH + timedelta(seconds=transition + offset_before - 1)

        walker = copy.copy(self._compiled.template)
        walker.set_current(resume, force=True)
        last = after_ns
        while True:
            try:
                wall = walker.get_next(datetime)
            except CroniterBadDateError as exc:  # pragma: no cover - excluded by parse
                raise InvalidCron(
                    f"cron expression {self.expression!r} has no occurrence after {after_ns}"
                ) from exc
            instant_ns = _instant_s(zone, wall) * _NS_PER_S
            # Skipped: wall times that map to an instant already passed, which is how
            # gap coalescing and the repeated hour are kept from firing twice.
            if instant_ns <= last:
                continue
            if instant_ns > _MAX_NS:
                raise InvalidArgument(
                    f"next occurrence of {self.expression!r} after {after_ns} is beyond "
                    f"the int64 nanosecond range"
                )
            last = instant_ns
            yield instant_ns


@lru_cache(maxsize=1024)
def _compile(expression: str, timezone: str) -> _Compiled:
    template = _parse_expression(expression)
    return _Compiled(zone=_load_zone(timezone), template=template)


def _parse_expression(expression: str) -> croniter[datetime]:
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

    fields = _FIELD_RE.findall(text)
    if len(fields) not in (5, 6):
        raise InvalidCron(
            f"cron expression {expression!r} has {len(fields)} fields; expected 5 "
            f"(minute hour day-of-month month day-of-week) or 6 (second first)"
        )
    for item in (part for f in fields for part in f.split(",")):
        if _HASHED_RE.match(item):
            raise InvalidCron(
                f"cron expression {expression!r}: hashed/random field {item!r} is not supported"
            )

    try:
        template = croniter(
            text,
            _CHECK_FROM,
            ret_type=datetime,
            max_years_between_matches=_CYCLE_YEARS,
            second_at_beginning=len(fields) == 6,
        )
    # croniter signals most bad input with CroniterBadCronError (a ValueError), but
    # some malformed fields escape as other built-in errors.
    except (ValueError, TypeError, LookupError, ArithmeticError) as exc:
        raise InvalidCron(f"invalid cron expression {expression!r}: {exc}") from exc

    try:
        copy.copy(template).get_next(datetime)
    except CroniterBadDateError as exc:
        raise InvalidCron(
            f"cron expression {expression!r} never matches: no date in a "
            f"{_CYCLE_YEARS}-year Gregorian cycle satisfies it"
        ) from exc
    return template


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
