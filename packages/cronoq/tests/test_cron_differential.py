"""Differential test: cronoq's reading of cron expressions against cronsim's.

cronsim (a test-only dependency) is an independent evaluator that follows Vixie/Debian cron,
seconds field included. Hypothesis generates expressions with every field form cronoq accepts,
and both evaluators list the next occurrences after random instants in UTC and in fixed-offset
zones, where cronoq's own DST policy plays no part.

cronsim spells a few things differently and lacks a few of cronoq's forms. Each such case is
rewritten for cronsim by one named function below, each matching an entry of "Differences from
other cron implementations" in docs/concepts.md; nothing is skipped. `nW`, which cronsim lacks
altogether, is evaluated by cronsim's search with a day-of-month test written here from the
documented rule (`CronSimNearest`).
"""

from __future__ import annotations

import calendar
import os
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import given, note, settings
from hypothesis import strategies as st

from cronoq._cron import CronSchedule
from cronoq.errors import InvalidCron

NS = 1_000_000_000
OCCURRENCES = 5
# A few seconds in the default run; set CRONOQ_CRON_DIFFERENTIAL_EXAMPLES for a longer hunt.
EXAMPLES = int(os.environ.get("CRONOQ_CRON_DIFFERENTIAL_EXAMPLES", "2000"))
# Fixed offsets only (no DST): UTC, UTC+5, UTC-11 and UTC+14, the largest offset there is.
ZONES = ["UTC", "Etc/GMT-5", "Etc/GMT+11", "Etc/GMT-14"]
FIRST = int(datetime(2000, 1, 1).timestamp())
LAST = int(datetime(2060, 1, 1).timestamp())

MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]


@dataclass(frozen=True)
class Unit:
    low: int
    high: int
    names: tuple[str, ...] = ()  # names[i] spells low + i
    wrap_high: int | None = None  # where a wrapping range turns round, if not at high

    @property
    def cycle(self) -> list[int]:
        """The values a wrapping range counts through, in order."""
        return list(range(self.low, (self.wrap_high or self.high) + 1))


SECOND = Unit(0, 59)
MINUTE = Unit(0, 59)
HOUR = Unit(0, 23)
DOM = Unit(1, 31)
MONTH = Unit(1, 12, tuple(MONTHS))
DOW = Unit(0, 7, tuple(DAYS), wrap_high=6)  # 7 is Sunday again: a week has seven days


@dataclass(frozen=True)
class Field:
    cronoq: str  # as written for cronoq
    cronsim: str  # the same meaning, spelled for cronsim
    nearest: int | None = None  # day-of-month `nW`, which cronsim lacks


# --- the rewrites for cronsim, one per documented difference ---------------------------------


def question_mark_for_cronsim() -> str:
    """`?` in a day field means `*` (docs: "`?` is `*`"); cronsim has no `?`."""
    return "*"


def equal_range_for_cronsim(unit: Unit, a: int, step: int | None) -> str:
    """`a-a` and `a-a/s` are the single value a (docs: "ranges with equal ends").

    cronsim reads `a-a/s` as `a/s`, from a up to the field's end.
    """
    return str(a % 7 if unit is DOW else a)


def wrapping_range_for_cronsim(unit: Unit, a: int, b: int, step: int | None) -> str:
    """`a-b` with a > b wraps around the field's end (docs: "wrapping ranges").

    cronsim rejects such a range: list its values instead, counting the step across the wrap.
    """
    cycle = unit.cycle
    start, end = cycle.index(a % 7 if unit is DOW else a), cycle.index(b % 7 if unit is DOW else b)
    count = (end - start) % len(cycle)
    return ",".join(str(cycle[(start + k) % len(cycle)]) for k in range(0, count + 1, step or 1))


def last_weekday_for_cronsim(day: int) -> str:
    """cronoq writes the last weekday d of the month `Ld` (croniter's spelling), cronsim `dL`."""
    return f"{day}L"


def nth_of_range_for_cronsim(days: list[int], k: int) -> str:
    """`mon-fri#2` applies `#2` to each day of the range; cronsim takes one day per `#`."""
    return ",".join(f"{d}#{k}" for d in days)


def last_day_range_for_cronsim(a: int, step: int | None) -> str:
    """`a-L` runs to the month's last day; cronsim has no `L` in a range: `a-31` is the same."""
    return f"{a}-31" + (f"/{step}" if step else "")


def nearest_weekday(year: int, month: int, target: int) -> date:
    """Day-of-month `nW` (docs): the weekday nearest day n, never leaving the month; an n past
    the month's end stands for its last day."""
    last = calendar.monthrange(year, month)[1]
    day = date(year, month, min(target, last))
    if day.weekday() == 5:  # Saturday
        return day - timedelta(days=1) if day.day > 1 else day + timedelta(days=2)
    if day.weekday() == 6:  # Sunday
        return day + timedelta(days=1) if day.day < last else day - timedelta(days=2)
    return day


class CronSimNearest(CronSim):
    """cronsim's search with day-of-month `nW`, which cronsim lacks, read as documented.

    cronsim is given a placeholder day-of-month (`1`: restricted, like `nW`, so cronsim's
    AND/OR choice is unchanged) and this class answers the day-of-month question itself.
    """

    def __init__(self, expr: str, dt: datetime, target: int) -> None:
        super().__init__(expr, dt)
        self.target = target

    def match_dom(self, d: date) -> bool:
        return d == nearest_weekday(d.year, d.month, self.target)


# --- generated expressions -------------------------------------------------------------------


class Choices:
    """Successive choices read out of one integer (mixed-radix digits, least significant first)."""

    def __init__(self, number: int) -> None:
        self.number = number

    def pick(self, count: int) -> int:
        self.number, choice = divmod(self.number, count)
        return choice

    def between(self, low: int, high: int) -> int:
        return low + self.pick(high - low + 1)

    def step(self, unit: Unit) -> int:
        return self.between(1, unit.high - unit.low + 3)

    def maybe_step(self, unit: Unit) -> int | None:
        return self.step(unit) if self.pick(2) else None


def spell(unit: Unit, value: int, style: int) -> str:
    """A value as a number, zero-padded, or (where the field has names) a name in some case."""
    if style == 4:
        return f"{value:02d}"
    if style == 0 or value - unit.low >= len(unit.names):
        return str(value)
    name = unit.names[value - unit.low]
    return [name, name.upper(), name.capitalize()][style - 1]


def plain_element(c: Choices, unit: Unit) -> tuple[str, str]:
    """`*`, `*/s`, `n`, `n/s`, `a-b`, `a-b/s` (plain, equal and wrapping ranges)."""
    kind = c.pick(6)
    if kind == 0:
        return "*", "*"
    if kind == 1:
        text = f"*/{c.step(unit)}"
        return text, text
    a = c.between(unit.low, unit.high)
    if kind == 2:
        return spell(unit, a, c.pick(5)), str(a)
    if kind == 3:
        start_step = c.step(unit)
        return f"{spell(unit, a, c.pick(5))}/{start_step}", f"{a}/{start_step}"
    b = c.between(unit.low, unit.high)
    step = c.maybe_step(unit)
    suffix = f"/{step}" if step else ""
    text = f"{spell(unit, a, c.pick(5))}-{spell(unit, b, c.pick(5))}{suffix}"
    if unit is DOW and a > b:
        a, b = a % 7, b % 7  # 7 in a wrapping day range is the Sunday it names
    if a == b:
        return text, equal_range_for_cronsim(unit, a, step)
    if a > b:
        return text, wrapping_range_for_cronsim(unit, a, b, step)
    return text, f"{a}-{b}{suffix}"


def join(items: list[tuple[str, str]]) -> Field:
    return Field(",".join(c for c, _ in items), ",".join(s for _, s in items))


def plain_field(c: Choices, unit: Unit) -> Field:
    return join([plain_element(c, unit) for _ in range(c.between(1, 3))])


def dom_field(c: Choices) -> Field:
    kind = c.pick(5)
    if kind <= 1:
        return plain_field(c, DOM)
    if kind == 2:
        plain = plain_field(c, DOM)
        if c.pick(2):
            return Field(f"{plain.cronoq},L", f"{plain.cronsim},L")
        a, step = c.between(1, 31), c.maybe_step(DOM)
        text = f"{a}-L" + (f"/{step}" if step else "")
        return Field(
            f"{plain.cronoq},{text}", f"{plain.cronsim},{last_day_range_for_cronsim(a, step)}"
        )
    if kind == 3:
        return Field("?", question_mark_for_cronsim())
    target = c.between(1, 31)
    return Field([f"{target}W", f"W{target}", f"{target}w"][c.pick(3)], "1", nearest=target)


def special_dow_element(c: Choices) -> tuple[str, str]:
    """`d#k` (d a day or a range of day names) or `Ld`."""
    kind = c.pick(3)
    day = c.between(0, 7)
    if kind == 0:
        return f"L{day}", last_weekday_for_cronsim(day)
    k = c.between(1, 5)
    if kind == 1:
        return f"{spell(DOW, day, c.pick(5))}#{k}", f"{day}#{k}"
    a, b = day % 7, c.between(0, 6)
    # croniter takes a range before `#` only spelled with names.
    text = f"{DAYS[a]}-{DAYS[b]}#{k}"
    days = (
        [int(v) for v in wrapping_range_for_cronsim(DOW, a, b, None).split(",")]
        if a > b
        else list(range(a, b + 1))
    )
    return text, nth_of_range_for_cronsim(days, k)


def dow_field(c: Choices) -> Field:
    kind = c.pick(5)
    if kind <= 1:
        return plain_field(c, DOW)
    if kind == 2:
        # croniter refuses plain days beside `#` or `L` ones, except a day those name already.
        items = [special_dow_element(c) for _ in range(c.between(1, 3))]
        if c.pick(3) == 0:
            day = int(items[0][1].split(",")[0].rstrip("L").split("#")[0])
            items.append((spell(DOW, day, c.pick(5)), str(day)))
        return join(items)
    return Field("?", question_mark_for_cronsim())


@dataclass(frozen=True)
class Expression:
    fields: tuple[Field, ...]

    @property
    def cronoq(self) -> str:
        return " ".join(f.cronoq for f in self.fields)

    def cronsim(self, after: datetime) -> CronSim:
        text = " ".join(f.cronsim for f in self.fields)
        nearest = self.fields[-3].nearest
        return CronSim(text, after) if nearest is None else CronSimNearest(text, after, nearest)


@dataclass(frozen=True)
class Case:
    expression: Expression
    zone: str
    after_ns: int


def read_case(number: int) -> Case:
    c = Choices(number)
    zone = ZONES[c.pick(len(ZONES))]
    # Instants on whole minutes and whole seconds as well, where "strictly after" bites.
    after_s = c.between(FIRST, LAST)
    after_ns = [after_s // 60 * 60 * NS, after_s * NS, after_s * NS + c.between(1, NS - 1)][
        c.pick(3)
    ]
    seconds = [plain_field(c, SECOND)] if c.pick(2) else []
    rest = [plain_field(c, MINUTE), plain_field(c, HOUR), dom_field(c)]
    rest += [plain_field(c, MONTH), dow_field(c)]
    return Case(Expression(tuple(seconds + rest)), zone, after_ns)


# A case is read out of one integer: a hypothesis draw costs more than evaluating a case, so
# one draw per case is what lets the test run thousands of cases in a few seconds. Shrinking
# the integer towards 0 still shrinks the case: choice 0 is always the simplest form (`*`, one
# element, UTC), and the digits read last are the fields read last.
cases = st.integers(min_value=0, max_value=2**1024).map(read_case)


def cronsim_occurrences(expression: Expression, zone: str, after_ns: int, n: int) -> list[int]:
    # Occurrences are whole seconds, so "after after_ns" is "after its whole second".
    it = expression.cronsim(datetime.fromtimestamp(after_ns // NS, tz=ZoneInfo(zone)))
    return [int(next(it).timestamp()) * NS for _ in range(n)]


def never_per_cronsim(expression: Expression) -> bool:
    """cronsim's own verdict that nothing ever matches (it looks 50 years ahead)."""
    try:
        it = expression.cronsim(datetime(2000, 1, 1, tzinfo=ZoneInfo("UTC")))
    except CronSimError:
        return True
    return next(it, None) is None


@settings(max_examples=EXAMPLES, deadline=None)
@given(case=cases)
def test_cronoq_agrees_with_cronsim(case: Case) -> None:
    expression, zone, after = case.expression, case.zone, case.after_ns
    note(f"{expression.cronoq!r} (cronsim: {' '.join(f.cronsim for f in expression.fields)!r})")
    refusal: str | None = None
    try:
        schedule = CronSchedule.parse(expression.cronoq, zone)
    except InvalidCron as exc:
        refusal = str(exc)
    if refusal is not None:
        # cronoq accepts every generated form; the only refusal allowed is "never matches".
        assert "never matches" in refusal, refusal
        assert never_per_cronsim(expression)
        return
    assert schedule.preview(after, OCCURRENCES) == cronsim_occurrences(
        expression, zone, after, OCCURRENCES
    ), f"{expression.cronoq!r} in {zone} after {after}"


@pytest.mark.parametrize(
    "expression",
    ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 */31 * 1#5", "0 0 0 31 2 *", "0 0 31 2 */7"],
)
def test_never_matching_agrees(expression: str) -> None:
    with pytest.raises(InvalidCron, match="never matches"):
        CronSchedule.parse(expression)
    fields = [Field(f, f) for f in expression.split()]
    assert never_per_cronsim(Expression(tuple(fields)))
