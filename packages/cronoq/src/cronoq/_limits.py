"""Limits: named bounds on running attempts and on attempt starts, shared by every task that
names them, optionally one bound per key (a tenant, a customer, an API account). The engine
enforces them (``_engine/limits.py``); this module holds the values a user writes and reads.
See docs/limits.md for the semantics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from cronoq import _validate as check
from cronoq._model import NS_PER_S
from cronoq.errors import InvalidArgument, UnknownLimit

__all__ = [
    "MAX_LIMITS",
    "MAX_LIMITS_PER_TASK",
    "Limit",
    "LimitInfo",
    "LimitKeyInfo",
    "LimitKeys",
    "OnFull",
    "limit_keys",
]

MAX_LIMITS = 1000
"""Most limits one scheduler configures."""
MAX_LIMITS_PER_TASK = 16
"""Most limits one task names (its pool's included)."""
MAX_RATE = 1_000_000
"""Most starts a rate limit allows in one window."""

LimitKeys = tuple[tuple[str, str | None], ...]
"""The limits a task takes, each with its key (None for a limit that is not per key), sorted
by name: how ``TaskSpec.limits`` keeps them."""


class OnFull(StrEnum):
    """What a submission does when a limit it names has no room."""

    QUEUE = "queue"
    """The task waits until the limit lets it start."""
    REJECT = "reject"
    """The submission fails with ``LimitFull``; nothing is applied."""
    CANCEL_RUNNING = "cancel_running"
    """The oldest running attempt of that key is cancelled; the new task starts once it ended."""
    KEEP_LATEST = "keep_latest"
    """Tasks of that key waiting to start are cancelled in favour of the new one (debounce)."""


@dataclass(frozen=True, slots=True)
class Limit:
    """A limit tasks name (``submit(..., limits={"tenant": "acme"})``) or a pool applies
    (``Pool(..., limits=("stripe",))``). A task starts only when its pool and every limit it
    takes allow it.

    ``concurrency``: at most this many running attempts (a stopped attempt counts until it
    really ended, as a pool's slots do). ``rate`` starts per ``per`` seconds: at most ``rate``
    attempt starts in any window of ``per`` seconds; ``burst`` (default: ``rate``) how many of
    them may start back to back, the rest spaced ``per / rate`` apart. ``per_key``: the bound
    holds for each key separately, and each task names its key."""

    name: str
    concurrency: int | None = None
    rate: int | None = None
    per: float | timedelta | None = None
    """Seconds (or a ``timedelta``), kept as float seconds."""
    burst: int | None = None
    per_key: bool = False
    on_full: OnFull | str = OnFull.QUEUE

    def __post_init__(self) -> None:
        check.text(self.name, "limit name")
        what = f"limit {self.name!r}"
        if self.concurrency is not None:
            check.integer(self.concurrency, f"{what} concurrency", 1, 1_000_000)
        if (self.rate is None) != (self.per is None):
            raise InvalidArgument(f"{what}: rate and per go together (starts per seconds)")
        if self.rate is not None:
            check.integer(self.rate, f"{what} rate", 1, MAX_RATE)
            window = check.duration_ns(self.per, f"{what} per", allow_zero=False)
            object.__setattr__(self, "per", window / NS_PER_S)
        if self.burst is not None:
            if self.rate is None:
                raise InvalidArgument(f"{what}: burst needs a rate")
            check.integer(self.burst, f"{what} burst", 1, self.rate)
        if self.concurrency is None and self.rate is None:
            raise InvalidArgument(f"{what} bounds nothing: give it a concurrency, a rate, or both")
        check.flag(self.per_key, f"{what} per_key")
        object.__setattr__(
            self, "on_full", check.enum_value(self.on_full, OnFull, f"{what} on_full")
        )
        if self.on_full is OnFull.CANCEL_RUNNING and self.concurrency is None:
            raise InvalidArgument(f"{what}: on_full='cancel_running' needs a concurrency")

    @property
    def per_ns(self) -> int | None:
        return None if self.per is None else check.duration_ns(self.per, "per", allow_zero=False)

    def describe(self) -> str:
        """The bound in a few words: ``2 running, 100 starts per 1s, per key``."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"{self.concurrency} running")
        if self.rate is not None:
            burst = "" if self.burst is None else f" (burst {self.burst})"
            parts.append(f"{self.rate} starts per {self.per:g}s{burst}")
        if self.per_key:
            parts.append("per key")
        return ", ".join(parts)


def check_limits(value: object) -> tuple[Limit, ...]:
    """A scheduler's limits: ``Limit`` values with distinct names, at most ``MAX_LIMITS``."""
    if value is None:
        return ()
    limits = check.bounded(value, "limits", "a list of Limit", MAX_LIMITS, _limit)
    names = [limit.name for limit in limits]
    if len(set(names)) != len(names):
        raise InvalidArgument(f"limit names must be unique, got {sorted(names)[:20]}")
    return tuple(limits)


def _limit(value: object) -> Limit:
    if not isinstance(value, Limit):
        raise InvalidArgument(f"limits must be Limit instances, got {type(value).__name__}")
    return value


def pool_limits(value: object, pool: str) -> tuple[str, ...]:
    """The names of the limits a pool applies (checked against the scheduler's later)."""
    if type(value) is tuple and not value:
        return ()
    names = check.bounded(
        value, f"pool {pool!r} limits", "a list of limit names", MAX_LIMITS_PER_TASK,
        lambda name: check.text(name, f"pool {pool!r} limit name"),
    )  # fmt: skip
    if len(set(names)) != len(names):
        raise InvalidArgument(f"pool {pool!r} names a limit twice: {names}")
    return tuple(names)


def limit_keys(
    value: object, configured: Mapping[str, Limit], pool_names: Sequence[str] = ()
) -> LimitKeys:
    """The limits a task takes with their keys, checked: ``value`` maps a configured limit's
    name to its key (a str for a per-key limit, None for another); the limits its pool applies
    (``pool_names``) are added, each without a key (none of them is per key). Sorted by name."""
    if value is None or (type(value) is dict and not value):
        return tuple((name, None) for name in sorted(pool_names))
    if type(value) is dict and len(value) == 1 and not pool_names:
        # One limit, as a tenant's task names its tenant: no list, dict or sort made.
        ((name, key),) = value.items()
        limit = configured.get(name) if type(name) is str else None
        if limit is not None:
            return ((name, _key(limit, key)),)
    if type(value) is dict:
        if len(value) > MAX_LIMITS_PER_TASK:
            raise InvalidArgument(
                f"limits: more than {MAX_LIMITS_PER_TASK} items given; "
                f"the limit is {MAX_LIMITS_PER_TASK}"
            )
        items = list(value.items())  # a plain dict: its size is known, its items are plain
    elif isinstance(value, Mapping):
        # Anything else is read one name at a time against the bound: it may be endless.
        names = check.bounded(
            value, "limits", "a mapping of limit name to key", MAX_LIMITS_PER_TASK, lambda n: n
        )
        try:
            items = [(name, value[name]) for name in names]
        except Exception as exc:  # the caller's mapping: whatever it raises is its input's fault
            raise InvalidArgument(f"limits: reading the mapping failed: {exc!r:.200}") from None
    else:
        raise InvalidArgument(
            f"limits must be a mapping of limit name to key, got {type(value).__name__}"
        )
    keys: dict[str, str | None] = {}
    for name, key in items:
        limit = configured.get(name) if type(name) is str else None
        if limit is None:
            limit = configured[_configured(name, configured)]  # raises the precise error
        keys[limit.name] = _key(limit, key)
    for name in pool_names:
        keys.setdefault(name, None)
    if len(keys) > MAX_LIMITS_PER_TASK:
        raise InvalidArgument(
            f"a task takes at most {MAX_LIMITS_PER_TASK} limits (its pool's included), "
            f"got {len(keys)}"
        )
    return tuple(sorted(keys.items()))


def _configured(name: object, configured: Mapping[str, Limit]) -> str:
    name = check.text(name, "limit name")
    if name not in configured:
        shown = ", ".join(sorted(configured)[:20]) or "none"
        raise UnknownLimit(f"unknown limit {name!r}; configured: {shown}")
    return name


def _key(limit: Limit, key: object) -> str | None:
    if limit.per_key:
        if key is None:
            raise InvalidArgument(f"limit {limit.name!r} is per key: the task must name its key")
        return check.text(key, f"limit {limit.name!r} key", max_length=check.MAX_KEY_LENGTH)
    if key is not None:
        raise InvalidArgument(f"limit {limit.name!r} is not per key: its key must be None")
    return None


@dataclass(frozen=True, slots=True)
class LimitKeyInfo:
    """One key of a per-key limit (or the one bound of another: ``key`` None), now."""

    key: str | None
    running: int
    """Attempts holding it, stopped ones that have not ended included."""
    starts: int
    """Attempt starts inside the current rate window (0 without a rate)."""
    waiting: int
    """Ready tasks that name it and have not started."""


@dataclass(frozen=True, slots=True)
class LimitInfo:
    """A limit and its use (``Scheduler.list_limits``): totals over its keys, and the busiest
    keys (at most the ``keys`` the call asked for, the most running and waiting first)."""

    limit: Limit
    keys_in_use: int
    running: int
    starts: int
    waiting: int
    keys: tuple[LimitKeyInfo, ...]
