"""The overview's charts: a ring of the scheduler's finished-task counters, sampled every few
seconds, turned into rates per pool and drawn as inline SVG polylines with their axes, and
counted over the last few minutes for each pool's headline (pure functions; the sampling loop
is the dashboard's)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cronoq import Status

__all__ = [
    "HEADLINE_S",
    "SAMPLE_INTERVAL_S",
    "WINDOW_S",
    "Chart",
    "Rate",
    "Sample",
    "Tally",
    "chart",
    "rates",
    "tally",
]

SAMPLE_INTERVAL_S = 5.0
WINDOW_S = 15 * 60.0
"""How far back the charts go; the ring holds ``WINDOW_S / SAMPLE_INTERVAL_S`` samples."""
HEADLINE_S = 5 * 60.0
"""The window of a pool's headline: the tasks that finished, and failed, in these seconds."""
_FAILED = (Status.FAILED.value, Status.CANCELLED.value)


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    """Unix time, seconds."""
    epoch: int | None
    """The leadership the counters belong to: a new leader's counters start from zero."""
    finished: Mapping[tuple[str, str], int]
    """Tasks that ended since the scheduler started, by (pool, final status)."""


@dataclass(frozen=True, slots=True)
class Rate:
    at: float
    finished: float
    """Tasks that ended per second (any final status)."""
    failed: float
    """Of those, failed or cancelled, per second."""


def rates(samples: Sequence[Sample], pool: str) -> list[Rate]:
    """The rates between consecutive samples of one leadership, for one pool."""
    found: list[Rate] = []
    for before, after in itertools.pairwise(samples):
        elapsed = after.at - before.at
        if before.epoch != after.epoch or elapsed <= 0:
            continue  # counters restarted with a new leader: no rate across that
        ended, failed = _ended(before, after, pool)
        found.append(Rate(after.at, ended / elapsed, failed / elapsed))
    return found


def _ended(before: Sample, after: Sample, pool: str) -> tuple[int, int]:
    """The tasks of ``pool`` that ended between two samples of one leadership, and of those
    the ones that failed or were cancelled."""
    ended = failed = 0
    for (name, status), count in after.finished.items():
        if name != pool:
            continue
        delta = count - before.finished.get((name, status), 0)
        ended += delta
        if status in _FAILED:
            failed += delta
    return ended, failed


@dataclass(frozen=True, slots=True)
class Tally:
    """The tasks of one pool that ended within a window, from the counters' samples."""

    finished: int
    """Ended, whatever their final status."""
    failed: int
    """Of those, failed for good or cancelled."""
    span_s: float
    """The time the samples cover: the window, or less while the ring fills (0: no sample
    in it yet)."""

    @property
    def failure_ratio(self) -> float | None:
        """Failed among finished; None when nothing finished."""
        return self.failed / self.finished if self.finished > 0 else None


def tally(samples: Sequence[Sample], pool: str, now: float, window_s: float = HEADLINE_S) -> Tally:
    """What ended in ``pool`` within the last ``window_s`` seconds before ``now``: the counters'
    growth between consecutive samples of one leadership that both lie in the window (not a
    single sample's rate: the 22 failures of a minute ago still count when the last 5 seconds
    had none). A change of leader restarts the counters: nothing is counted across it."""
    start = now - window_s
    inside = [s for s in samples if start <= s.at <= now]
    finished = failed = 0
    for before, after in itertools.pairwise(inside):
        if before.epoch == after.epoch:
            ended, among = _ended(before, after, pool)
            finished, failed = finished + ended, failed + among
    span = now - inside[0].at if len(inside) > 1 else 0.0
    return Tally(finished, failed, span)


@dataclass(frozen=True, slots=True)
class Tick:
    at: float
    """Along its axis, in the plot's coordinates."""
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """Two polylines over the window (x: time, y: rate scaled to the peak), in a plot of
    ``width`` by ``height`` whose origin is its top left corner, and the ticks of its axes."""

    width: int
    height: int
    finished: str
    """SVG ``points`` of the finished rate."""
    failed: str
    peak: float
    span_s: float
    """How far back the x axis goes: the window, or less while the ring fills."""
    x_ticks: tuple[Tick, ...]
    """Time: minutes (or seconds) before now, ``now`` at the right end."""
    y_ticks: tuple[Tick, ...]
    """Tasks per second: 0 at the bottom, the peak at the top."""


def chart(found: Sequence[Rate], now: float, width: int = 300, height: int = 60) -> Chart:
    peak = max((r.finished for r in found), default=0.0)
    scale = peak if peak > 0 else 1.0
    # While the ring fills (the dashboard was just opened), the axis spans what it holds.
    start = max(now - WINDOW_S, found[0].at) if found else now - WINDOW_S
    span = max(now - start, SAMPLE_INTERVAL_S)

    def points(value: str) -> str:
        coordinates = []
        for rate in found:
            x = max(0.0, (rate.at - start) / span) * width
            y = height - getattr(rate, value) / scale * (height - 2) - 1
            coordinates.append(f"{x:.1f},{y:.1f}")
        return " ".join(coordinates)

    y_ticks = (Tick(height - 1.0, "0"), Tick(1.0, f"{peak:.2g}")) if peak > 0 else (
        Tick(height - 1.0, "0"),
    )  # fmt: skip
    return Chart(
        width, height, points("finished"), points("failed"), peak, span,
        _time_ticks(span, width), y_ticks,
    )  # fmt: skip


def _time_ticks(span: float, width: int) -> tuple[Tick, ...]:
    """Ticks every 5 minutes (every minute for a span under 10, its start alone under 2),
    from the left end of the axis (``span`` seconds ago) to ``now``."""
    if span < 120:
        return (Tick(0.0, f"-{span:.0f} s"), Tick(float(width), "now"))
    step = 300 if span >= 600 else 60
    ticks = [Tick(float(width), "now")]
    back = step
    while back <= span + 1e-6:
        ticks.append(Tick(round(width * (span - back) / span, 1), f"-{back // 60} min"))
        back += step
    return tuple(reversed(ticks))
