"""Hostile values for fuzzing entry points: wrong types, huge ints (``10**400``), extreme
floats, booleans where numbers go, NUL and lone surrogates, hostile ``tzinfo`` objects, endless
or huge iterables. Shared by the fuzz tests of the public API (``test_fuzz_api.py``) and of the
outbox helpers (cronoq-store-postgres's ``test_outbox_helpers_fuzz.py``)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta, timezone, tzinfo

from hypothesis import strategies as st

TEN_YEARS_S = 10 * 366 * 24 * 3600
HUGE_INTS = st.sampled_from([10**400, -(10**400), 2**63, -(2**63) - 1, 2**64, 2**1000])
EXTREME_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e300, -1e-300])


class HostileZone(tzinfo):
    def dst(self, dt: datetime | None) -> None:
        return None

    def tzname(self, dt: datetime | None) -> None:
        return None


class RaisingZone(HostileZone):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        raise RuntimeError("hostile")

    def __repr__(self) -> str:
        return "RaisingZone()"


class WrongTypeZone(HostileZone):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return 3600  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "WrongTypeZone()"


class DayLongZone(HostileZone):
    def utcoffset(self, dt: datetime | None) -> timedelta:
        return timedelta(days=2)

    def __repr__(self) -> str:
        return "DayLongZone()"


class NaiveZone(HostileZone):
    def utcoffset(self, dt: datetime | None) -> None:
        return None

    def __repr__(self) -> str:
        return "NaiveZone()"


HOSTILE_ZONES = st.sampled_from([RaisingZone(), WrongTypeZone(), DayLongZone(), NaiveZone()])


def endless() -> st.SearchStrategy[object]:
    """Endless or huge iterables, fresh for every example (an iterator is used up)."""
    return st.one_of(
        st.builds(itertools.count),
        st.builds(itertools.count, st.integers(1, 10)),
        st.builds(lambda: itertools.repeat("t")),
        st.builds(lambda: itertools.repeat(1)),
        st.builds(lambda: range(1, 10**18)),
        st.builds(lambda: range(10**400)),
        st.builds(lambda: itertools.cycle(["a", "b"])),
    )


def wrong_types(
    *, none: bool, numbers: bool = True, strings: bool = True
) -> st.SearchStrategy[object]:
    """Values of types no parameter of this kind takes."""
    options: list[st.SearchStrategy[object]] = [
        st.builds(object),
        st.binary(max_size=8),
        st.lists(st.integers(), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
        st.frozensets(st.integers(), max_size=2),
        st.complex_numbers(allow_nan=True),
        endless(),
        st.datetimes(),
        st.builds(lambda: object),  # a class
    ]
    if none:
        options.append(st.none())
    if numbers:
        options += [st.booleans(), st.integers(), st.floats(), HUGE_INTS, EXTREME_FLOATS]
    if strings:
        options.append(st.text(max_size=5))
    return st.one_of(options)


BAD_CHARS = st.sampled_from(["\x00", "\udcff", "\ud800", "\udfff", "\x00\udc80"])


def bad_strings(max_length: int) -> st.SearchStrategy[str]:
    """Strings no name, key, tag or kind may be: empty, NUL, lone surrogates, too long."""
    return st.one_of(
        st.just(""),
        st.tuples(st.text(max_size=5), BAD_CHARS, st.text(max_size=5)).map("".join),
        st.integers(max_length + 1, max_length + 50).map(lambda n: "k" * n),
    )


def bad_text(max_length: int = 255, *, optional: bool = False) -> st.SearchStrategy[object]:
    return st.one_of(bad_strings(max_length), wrong_types(none=not optional, strings=False))


def bad_int(low: int, high: int, *, optional: bool = False) -> st.SearchStrategy[object]:
    return st.one_of(
        st.integers(max_value=low - 1),
        st.integers(min_value=high + 1),
        HUGE_INTS,
        st.booleans(),
        st.floats(),
        st.text(max_size=3),
        wrong_types(none=not optional, numbers=False, strings=False),
    )


def bad_duration(*, allow_zero: bool = True, optional: bool = False) -> st.SearchStrategy[object]:
    options: list[st.SearchStrategy[object]] = [
        EXTREME_FLOATS,
        HUGE_INTS.filter(lambda n: n > TEN_YEARS_S or n < 0),
        st.integers(max_value=-1),
        st.integers(min_value=TEN_YEARS_S + 1),
        st.floats(max_value=-1e-9, allow_infinity=True),
        st.floats(min_value=TEN_YEARS_S + 1.0),
        st.timedeltas(max_value=timedelta(microseconds=-1)),
        st.timedeltas(min_value=timedelta(days=3661)),
        st.booleans(),
        st.text(max_size=3),
        wrong_types(none=not optional, numbers=False, strings=False),
    ]
    if not allow_zero:
        options.append(st.sampled_from([0, 0.0, -0.0, timedelta(0), 1e-10]))
    return st.one_of(options)


def bad_instant(*, optional: bool = True) -> st.SearchStrategy[object]:
    return st.one_of(
        st.datetimes(),  # naive
        st.datetimes(max_value=datetime(2000, 1, 1), timezones=st.just(UTC)),  # > 10 years ago
        st.datetimes(min_value=datetime(2060, 1, 1), timezones=st.just(UTC)),
        st.just(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=23)))),
        st.just(datetime.max.replace(tzinfo=timezone(timedelta(hours=-23)))),
        st.builds(lambda zone: datetime(2030, 1, 1, tzinfo=zone), HOSTILE_ZONES),
        bad_duration(optional=optional),
        st.integers(),
        st.floats(),
    )


def bad_ids() -> st.SearchStrategy[object]:
    return st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=2**63),
        HUGE_INTS,
        st.booleans(),
        st.floats(),
        st.text(max_size=3),
        wrong_types(none=True, numbers=False, strings=False),
    )


def bad_after() -> st.SearchStrategy[object]:
    return st.one_of(
        endless(),
        st.text(max_size=3),
        st.binary(max_size=3),
        st.integers(),
        st.floats(),
        st.none(),
        st.builds(object),
        st.lists(bad_ids(), min_size=1, max_size=3),
        st.just([2**62]),  # well formed, but never issued: UnknownDependency
        st.builds(lambda: list(range(1, 1002))),
    )


def bad_tags() -> st.SearchStrategy[object]:
    return st.one_of(
        endless(),
        st.text(max_size=5),
        st.binary(max_size=3),
        st.integers(),
        st.none(),
        st.builds(object),
        st.lists(st.one_of(bad_text(), st.just("ok")), min_size=1, max_size=4).filter(
            lambda tags: tags != ["ok"] * len(tags)
        ),
        st.integers(65, 80).map(lambda n: ["t"] * n),
    )


def _circular() -> list[object]:
    value: list[object] = []
    value.append(value)
    return value


def _deep() -> list[object]:
    value: list[object] = []
    for _ in range(100_000):
        value = [value]
    return value


def bad_payloads() -> st.SearchStrategy[object]:
    """What JsonCodec cannot encode, or what is over the harness's 4096-byte limit."""
    return st.one_of(
        st.sampled_from([math.nan, math.inf, -math.inf]),
        st.builds(lambda x: {"x": [x]}, st.sampled_from([math.nan, math.inf])),
        st.binary(max_size=8),
        st.builds(object),
        st.frozensets(st.integers(), min_size=1, max_size=3),
        st.complex_numbers(allow_nan=True),
        st.datetimes(),
        endless(),
        st.builds(lambda: {(1, 2): 3}),
        st.builds(_circular),
        st.builds(_deep),
        st.integers(4100, 6000).map(lambda n: "x" * n),
    )


def bad_enum(values: set[str]) -> st.SearchStrategy[object]:
    return st.one_of(
        st.text(max_size=8).filter(lambda v: v not in values),
        bad_strings(20),
        wrong_types(none=True, strings=False),
    )


def unknown_names(known: set[str]) -> st.SearchStrategy[str]:
    return st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True).filter(lambda n: n not in known)


class EndlessMapping(Mapping[str, None]):
    """A mapping that claims few entries and never ends when iterated."""

    def __getitem__(self, name: str) -> None:
        return None

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[str]:
        return (f"limit-{n}" for n in itertools.count())


def bad_limits(per_key: set[str], not_per_key: set[str]) -> st.SearchStrategy[object]:
    """What a task's ``limits`` may not be, given the scheduler's limits: not a mapping, an
    unknown or malformed name, a per-key limit without a key (or a bad one), a key for a limit
    that is not per key, too many, endless."""
    known = per_key | not_per_key
    return st.one_of(
        wrong_types(none=False).filter(lambda v: not isinstance(v, dict)),
        st.just(["api"]),
        st.builds(EndlessMapping),
        st.builds(lambda name: {name: None}, unknown_names(known)),
        st.builds(lambda name: {name: "k"}, bad_text()),
        st.sampled_from(sorted(per_key)).map(lambda name: {name: None}),
        st.tuples(st.sampled_from(sorted(per_key)), bad_text(1024)).map(lambda p: {p[0]: p[1]}),
        st.tuples(st.sampled_from(sorted(not_per_key)), st.text(min_size=1, max_size=3)).map(
            lambda p: {p[0]: p[1]}
        ),
        st.integers(17, 40).map(lambda n: {f"limit-{i}": None for i in range(n)}),
    )
