"""Input validation for the public API: every check, with a message that names the bad input.

Everything here runs before an input reaches the engine, so a rejected call changes nothing.
Three rules hold throughout, because the fuzz suite (tests/test_fuzz_api.py) found each broken:

- Numbers are bounded before any arithmetic that could overflow: ``10**400`` seconds or ``1e300``
  must be an ``InvalidArgument``, never an ``OverflowError`` from ``float()`` or ``round()``.
- Iterables are consumed one item at a time against their limit, so ``itertools.count()`` or
  ``range(1, 10**18)`` stop at limit + 1 items instead of hanging or exhausting memory.
- Objects of the caller (a ``tzinfo``, say) are called once, and whatever they raise becomes an
  ``InvalidArgument`` naming the argument.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypeVar

from cronoq._codecs import Codec, CodecContext, encode_payload
from cronoq._model import (
    DEFAULT_RETRY,
    NS_PER_S,
    RetryPolicy,
    TraceContext,
)
from cronoq.errors import InvalidArgument, PayloadError

MAX_NAME_LENGTH = 255
MAX_KEY_LENGTH = 1024
MAX_TAGS = 64
MAX_DEPENDENCIES = 1000
MAX_BATCH = 100_000
"""Most tasks one ``submit_many`` call takes: one engine step and one store transaction."""
MAX_STATUSES = 64
"""Most items a ``list(status=[...])`` filter takes (there are eight statuses)."""
MAX_CRON_LENGTH = 1024
"""Characters of a cron expression. Parsing costs time in proportion to its length and runs
where the call is made (a server's event loop): 1,024 characters parse in about 6 ms, while
the longest expression a person writes is a few dozen."""
MAX_TIME_ZONE_LENGTH = 255
"""Characters of a time zone name (IANA names are at most about 30)."""
MAX_DURATION_NS = 10 * 366 * 24 * 3600 * NS_PER_S  # ten years: anything longer is a unit mistake
MAX_PRIORITY = 2**31 - 1
MAX_TASK_ID = 2**63 - 1
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

Duration = float | int | timedelta
Instant = datetime | timedelta

_EPOCH = datetime(1970, 1, 1)
_T = TypeVar("_T")


def shown(value: object) -> str:
    """A bounded repr of a number or string for an error message.

    A huge int is described, not converted: Python refuses to print ints of more than 4300
    digits (``ValueError``), and a message should not be a page of digits anyway.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def _check_unicode(value: str, what: str) -> None:
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters: {shown(value)}")
    if value.isascii():
        return  # no surrogate, and no copy made to find out
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate is not text: SQLite and PostgreSQL refuse it at commit time, which
        # would stop the scheduler instead of failing this one call.
        raise InvalidArgument(
            f"{what} must be valid Unicode, but has a lone surrogate {value[exc.start]!r} "
            f"at index {exc.start}: {shown(value)}"
        ) from None


def text(value: object, what: str, *, max_length: int = MAX_NAME_LENGTH) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    if len(value) > max_length:
        raise InvalidArgument(f"{what} is {len(value)} characters long; the limit is {max_length}")
    _check_unicode(value, what)
    return value


def optional_text(value: object, what: str, *, max_length: int = MAX_NAME_LENGTH) -> str | None:
    return None if value is None else text(value, what, max_length=max_length)


def _iterate(value: object, what: str, expected: str) -> Iterator[Any]:
    # str and bytes are iterable, but a tag list given as "a,b" is a mistake, not 3 tags.
    if isinstance(value, str | bytes | bytearray | memoryview) or not isinstance(value, Iterable):
        raise InvalidArgument(f"{what} must be {expected}, got {type(value).__name__}")
    try:
        return iter(value)
    except TypeError as exc:  # an __iter__ that returns a non-iterator
        raise InvalidArgument(f"{what} must be {expected}: iter() failed: {exc}") from None


def bounded(
    value: object, what: str, expected: str, limit: int, each: Callable[[Any], _T]
) -> list[_T]:
    """The items of an iterable, each checked by ``each``, at most ``limit`` of them.

    Items are taken one at a time, so an endless iterator is read ``limit + 1`` times, and
    a bad item stops the iteration at once.
    """
    items: list[_T] = []
    for item in _iterate(value, what, expected):
        if len(items) == limit:
            raise InvalidArgument(f"{what}: more than {limit} items given; the limit is {limit}")
        items.append(each(item))
    return items


def tags(value: object) -> tuple[str, ...]:
    if type(value) is tuple and not value:
        return ()  # the default, on the path of every submission
    return tuple(
        bounded(value, "tags", "a list or tuple of str", MAX_TAGS, lambda tag: text(tag, "tag"))
    )


def integer(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be between {low} and {high}, got {shown(value)}")
    return value


def duration_ns(
    value: object, what: str, *, allow_zero: bool = True, max_ns: int = MAX_DURATION_NS
) -> int:
    """Seconds (int or float) or a timedelta, as exact nanoseconds in ``[0, max_ns]``."""
    if isinstance(value, timedelta):
        # Exact integer arithmetic: total_seconds() is a float and loses nanoseconds.
        ns = (value.days * 86_400 + value.seconds) * NS_PER_S + value.microseconds * 1000
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(
            f"{what} must be seconds (int or float) or a timedelta, got {type(value).__name__}"
        )
    elif isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{what} must be finite, got {value!r}")
    elif value < 0:
        # Checked on the value itself: -1e-12 would round to 0 ns and pass as zero.
        ns = -1
    elif isinstance(value, int):
        # Clamped before scaling, so 10**400 costs nothing and still reads as too long.
        ns = min(value, max_ns // NS_PER_S + 1) * NS_PER_S
    else:
        # Clamped before scaling: round(1e300 * 1e9) is round(inf), an OverflowError.
        ns = round(min(value, max_ns / NS_PER_S + 1.0) * NS_PER_S)
    if ns < 0 or (ns == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{what} must be {bound} seconds, got {shown(value)}")
    if ns > max_ns:
        limit = "ten years" if max_ns == MAX_DURATION_NS else f"{max_ns // NS_PER_S} seconds"
        given = str(value) if isinstance(value, timedelta) else f"{shown(value)} seconds"
        raise InvalidArgument(f"{what} of {given} is longer than {limit}")
    return ns


def optional_duration_ns(value: object, what: str, *, allow_zero: bool = True) -> int | None:
    return None if value is None else duration_ns(value, what, allow_zero=allow_zero)


def _instant(value: datetime, what: str) -> tuple[int, datetime, timedelta]:
    """Unix ns of an aware datetime, its wall time and UTC offset; tzinfo called exactly once."""
    # The wall time, without the caller's tzinfo: isoformat() or timestamp() would call it again.
    wall = datetime(
        value.year, value.month, value.day, value.hour, value.minute, value.second,
        value.microsecond,
    )  # fmt: skip
    try:
        # Called once: a tzinfo may raise, return a non-timedelta, an offset of a day or more
        # (datetime raises TypeError or ValueError then), or a different answer each time.
        offset = value.utcoffset()
    except Exception as exc:
        raise InvalidArgument(
            f"{what} {wall.isoformat()}: its tzinfo ({type(value.tzinfo).__name__}) failed "
            f"in utcoffset(): {type(exc).__name__}"
        ) from exc
    if offset is None:
        raise InvalidArgument(f"{what} must be timezone-aware, got naive {wall.isoformat()}")
    delta = wall - _EPOCH - offset
    ns = (delta.days * 86_400 + delta.seconds) * NS_PER_S + delta.microseconds * 1000
    return ns, wall, offset


def unix_ns(value: object, what: str) -> int:
    """The instant of an aware datetime in Unix nanoseconds (any year), checked as the
    Scheduler checks its instants: for code that carries them elsewhere (the wire)."""
    if not isinstance(value, datetime):
        raise InvalidArgument(
            f"{what} must be a timezone-aware datetime, got {type(value).__name__}"
        )
    return _instant(value, what)[0]


def instant_ns(value: object, what: str, now_ns: int) -> int:
    """An aware datetime, or a timedelta from now, within ten years of now."""
    if isinstance(value, timedelta):
        return now_ns + duration_ns(value, what)
    if not isinstance(value, datetime):
        raise InvalidArgument(
            f"{what} must be a timezone-aware datetime or a timedelta from now, "
            f"got {type(value).__name__}"
        )
    ns, wall, offset = _instant(value, what)
    if abs(ns - now_ns) > MAX_DURATION_NS:
        raise InvalidArgument(
            f"{what} {wall.isoformat()} (UTC offset {offset}) is more than ten years from now"
        )
    return ns


def optional_instant_ns(value: object, what: str, now_ns: int) -> int | None:
    return None if value is None else instant_ns(value, what, now_ns)


_Policy = TypeVar("_Policy", bound=StrEnum)


def enum_value(value: object, kind: type[_Policy], what: str) -> _Policy:
    if isinstance(value, kind):
        return value
    if isinstance(value, str):
        try:
            return kind(value)
        except ValueError:
            pass
    allowed = ", ".join(repr(m.value) for m in kind)
    given = shown(value) if isinstance(value, str) else type(value).__name__
    raise InvalidArgument(f"{what} must be one of {allowed}, got {given}")


def retry(value: object) -> RetryPolicy:
    if value is None:
        return DEFAULT_RETRY
    if not isinstance(value, RetryPolicy):
        raise InvalidArgument(f"retry must be a RetryPolicy, got {type(value).__name__}")
    return value


def payload(codec: Codec, value: Any, max_bytes: int, context: CodecContext | None = None) -> bytes:
    data = encode_payload(codec, value, context)
    if len(data) > max_bytes:
        raise PayloadError(f"the payload is {len(data)} bytes encoded; the limit is {max_bytes}")
    return data


def _dependency(task_id: object) -> int:
    return integer(task_id, "a dependency id", 1, MAX_TASK_ID)


def dependencies(value: object) -> tuple[int, ...]:
    if type(value) is tuple and not value:
        return ()  # the default, on the path of every submission
    ids = bounded(value, "after", "a list of task ids", MAX_DEPENDENCIES, _dependency)
    return tuple(dict.fromkeys(ids))


def trace_context(value: object) -> TraceContext | None:
    if value is None or isinstance(value, TraceContext):
        return value  # a TraceContext checked its fields when it was made
    raise InvalidArgument(f"trace_context must be a TraceContext, got {type(value).__name__}")


def flag(value: object, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{what} must be a bool, got {type(value).__name__}")
    return value
