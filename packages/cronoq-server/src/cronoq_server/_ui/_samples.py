"""The overview's charts: a ring of the scheduler's finished-task counters, sampled every few
seconds, turned into rates per pool and drawn as inline SVG polylines (pure functions; the
sampling loop is the dashboard's)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cronoq import Status

__all__ = ["SAMPLE_INTERVAL_S", "WINDOW_S", "Chart", "Rate", "Sample", "chart", "rates"]

SAMPLE_INTERVAL_S = 5.0
WINDOW_S = 15 * 60.0
"""How far back the charts go; the ring holds ``WINDOW_S / SAMPLE_INTERVAL_S`` samples."""
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
        ended = failed = 0
        for (name, status), count in after.finished.items():
            if name != pool:
                continue
            delta = count - before.finished.get((name, status), 0)
            ended += delta
            if status in _FAILED:
                failed += delta
        found.append(Rate(after.at, ended / elapsed, failed / elapsed))
    return found


@dataclass(frozen=True, slots=True)
class Chart:
    """Two polylines over the window (x: time, y: rate scaled to the peak)."""

    width: int
    height: int
    finished: str
    """SVG ``points`` of the finished rate."""
    failed: str
    peak: float
    latest: Rate | None
    span_s: float
    """How far back the x axis goes: the window, or less while the ring fills."""

    @property
    def failure_ratio(self) -> float | None:
        """Failed among finished at the latest sample, None when nothing finished."""
        if self.latest is None or self.latest.finished <= 0:
            return None
        return self.latest.failed / self.latest.finished


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

    latest = found[-1] if found else None
    return Chart(width, height, points("finished"), points("failed"), peak, latest, span)
