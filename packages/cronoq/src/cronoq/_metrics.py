"""What a scheduler counts about itself, for ``Scheduler.metrics()``.

The engine and the driver update plain integers and bucket counts as they work (no callbacks, no
locks: one event loop owns them); a snapshot copies them into frozen values. Counts are per
process and start at zero; a monitoring system sums them over replicas.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Counters", "Histogram", "HistogramCounter", "SchedulerMetrics", "bump"]

# Seconds: from a sub-millisecond group commit to a stalled store (commit_timeout is 30 s).
LATENCY_BOUNDS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
)  # fmt: skip
# Mutations per commit: one lone call up to a submit_many of 100,000 tasks.
BATCH_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 100000)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observations by bucket, as Prometheus wants them (before it makes them cumulative)."""

    bounds: tuple[float, ...]
    """Upper bounds of the buckets, ascending; one more bucket, +Inf, follows them."""
    counts: tuple[int, ...]
    """Observations per bucket (``len(bounds) + 1``), not cumulative."""
    total: float
    """Sum of every observation."""
    count: int


class HistogramCounter:
    """The mutable side of a ``Histogram``."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le=bound).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def snapshot(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.total, self.count)


@dataclass(slots=True)
class Counters:
    """Per-pool counts the engine keeps; one instance outlives the engines a driver rebuilds.

    A step whose commit failed and did not land may have been counted (rare: a store fault),
    so these are what the scheduler did, not an audit of the store.
    """

    submitted: dict[str, int] = field(default_factory=dict)
    finished: dict[tuple[str, str], int] = field(default_factory=dict)
    retries: dict[str, int] = field(default_factory=dict)
    dead_lettered: dict[str, int] = field(default_factory=dict)
    attempts_lost: dict[str, int] = field(default_factory=dict)
    occurrences: dict[tuple[str, str], int] = field(default_factory=dict)
    start_delay: HistogramCounter = field(default_factory=lambda: HistogramCounter(LATENCY_BOUNDS))


K = TypeVar("K")


def bump(counts: dict[K, int], key: K, by: int = 1) -> None:
    counts[key] = counts.get(key, 0) + by


@dataclass(frozen=True, slots=True)
class SchedulerMetrics:
    """A snapshot of ``Scheduler.metrics()``. Keys are pool names and status values, never
    task ids, so that a monitoring system's label sets stay small."""

    leading: bool
    epoch: int | None
    submitted: Mapping[str, int]
    """Tasks created, by pool (a submission answered by a held key creates none)."""
    finished: Mapping[tuple[str, str], int]
    """Tasks that ended, by (pool, final status)."""
    retries: Mapping[str, int]
    """Failed attempts whose task will try again, by pool."""
    dead_lettered: Mapping[str, int]
    """Tasks that failed for good after their attempts failed, by pool."""
    attempts_lost: Mapping[str, int]
    """Attempts whose executor vanished (a leader change, a worker's lease expiring)."""
    queue_depth: Mapping[tuple[str, str], int]
    """Live tasks by (pool, status)."""
    running: Mapping[str, int]
    """Attempts holding a slot, by pool."""
    commit_seconds: Histogram
    commit_batch_size: Histogram
    """Mutations per commit."""
    start_delay_seconds: Histogram
    """From the moment a task became ready to the start of its attempt."""
    occurrences: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """Schedule occurrences that came due, by (schedule, outcome): each ledger record counts
    once (see ``Scheduler.occurrences``). Schedules are few, so the label set stays small."""
    outbox_ingested: int = 0
    """Outbox rows this leader turned into tasks (or answered by a held key)."""
    outbox_quarantined: int = 0
    """Outbox rows this leader quarantined."""
    outbox_depth: int | None = None
    """Rows waiting in the outbox, as last read (about once a second); None: no outbox, or
    not read yet."""
    outbox_oldest_age_seconds: float | None = None
    """Age of the oldest row waiting in the outbox (0 when it is empty)."""
    outbox_quarantine_depth: int | None = None
    """Rows in the outbox's quarantine, as last read."""
