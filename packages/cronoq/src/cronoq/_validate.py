"""Input validation for the public API: every check, with a message that names the bad input.

Everything here runs before an input reaches the engine, so a rejected call changes nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from cronoq._codecs import Codec, encode_with
from cronoq._model import (
    DEFAULT_RETRY,
    NS_PER_S,
    CatchUpPolicy,
    MissPolicy,
    OverlapPolicy,
    RetryPolicy,
)
from cronoq.errors import InvalidArgument, PayloadError

MAX_NAME_LENGTH = 255
MAX_KEY_LENGTH = 1024
MAX_TAGS = 64
MAX_DEPENDENCIES = 1000
MAX_DURATION_NS = 10 * 366 * 24 * 3600 * NS_PER_S  # ten years: anything longer is a unit mistake
MAX_PRIORITY = 2**31 - 1
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024 * 1024

Duration = float | int | timedelta
Instant = datetime | timedelta


def text(value: object, what: str, *, max_length: int = MAX_NAME_LENGTH) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    if "\x00" in value:
        raise InvalidArgument(f"{what} must not contain NUL characters: {value!r}")
    if len(value) > max_length:
        raise InvalidArgument(f"{what} is {len(value)} characters long; the limit is {max_length}")
    return value


def optional_text(value: object, what: str, *, max_length: int = MAX_NAME_LENGTH) -> str | None:
    return None if value is None else text(value, what, max_length=max_length)


def tags(value: object) -> tuple[str, ...]:
    if value == () or value == []:
        return ()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgument(f"tags must be a list or tuple of str, got {type(value).__name__}")
    result = tuple(text(tag, "tag") for tag in value)
    if len(result) > MAX_TAGS:
        raise InvalidArgument(f"{len(result)} tags given; the limit is {MAX_TAGS}")
    return result


def integer(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be between {low} and {high}, got {value}")
    return value


def duration_ns(value: object, what: str, *, allow_zero: bool = True) -> int:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidArgument(
            f"{what} must be seconds (int or float) or a timedelta, got {type(value).__name__}"
        )
    if not math.isfinite(seconds):
        raise InvalidArgument(f"{what} must be finite, got {value!r}")
    ns = round(seconds * NS_PER_S)
    if ns < 0 or (ns == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{what} must be {bound} seconds, got {value!r}")
    if ns > MAX_DURATION_NS:
        raise InvalidArgument(f"{what} of {seconds:g}s is longer than ten years")
    return ns


def optional_duration_ns(value: object, what: str, *, allow_zero: bool = True) -> int | None:
    return None if value is None else duration_ns(value, what, allow_zero=allow_zero)


def instant_ns(value: object, what: str, now_ns: int) -> int:
    """An aware datetime, or a timedelta from now."""
    if isinstance(value, timedelta):
        return now_ns + duration_ns(value, what)
    if not isinstance(value, datetime):
        raise InvalidArgument(
            f"{what} must be a timezone-aware datetime or a timedelta from now, "
            f"got {type(value).__name__}"
        )
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(f"{what} must be timezone-aware, got naive {value.isoformat()}")
    ns = round(value.timestamp() * NS_PER_S)
    if abs(ns - now_ns) > MAX_DURATION_NS:
        raise InvalidArgument(f"{what} {value.isoformat()} is more than ten years from now")
    return ns


def optional_instant_ns(value: object, what: str, now_ns: int) -> int | None:
    return None if value is None else instant_ns(value, what, now_ns)


_Policy = TypeVar("_Policy", MissPolicy, OverlapPolicy, CatchUpPolicy)


def enum_value(value: object, kind: type[_Policy], what: str) -> _Policy:
    if isinstance(value, kind):
        return value
    try:
        if not isinstance(value, str):
            raise ValueError
        return kind(value)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise InvalidArgument(f"{what} must be one of {allowed}, got {value!r}") from None


def retry(value: object) -> RetryPolicy:
    if value is None:
        return DEFAULT_RETRY
    if not isinstance(value, RetryPolicy):
        raise InvalidArgument(f"retry must be a RetryPolicy, got {type(value).__name__}")
    return value


def payload(codec: Codec, value: Any, max_bytes: int) -> bytes:
    data = encode_with(codec, value, "payload")
    if len(data) > max_bytes:
        raise PayloadError(f"the payload is {len(data)} bytes encoded; the limit is {max_bytes}")
    return data


def dependencies(value: object) -> tuple[int, ...]:
    if value == () or value == []:
        return ()
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidArgument(f"after must be a list of task ids, got {type(value).__name__}")
    ids = tuple(value)
    if len(ids) > MAX_DEPENDENCIES:
        raise InvalidArgument(f"{len(ids)} dependencies given; the limit is {MAX_DEPENDENCIES}")
    for task_id in ids:
        integer(task_id, "a dependency id", 1, 2**63 - 1)
    return tuple(dict.fromkeys(ids))
