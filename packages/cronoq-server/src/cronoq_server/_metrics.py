"""The server's Prometheus metrics, read from ``Scheduler.metrics()`` at every scrape.

A server process goes through several ``cronoq.Scheduler`` objects: a standby's, which
starts leading (or not), and a new one each time it leads again after stepping down. Each counts
from zero, so ``SchedulerCollector`` adds in what the schedulers it watched before counted
(read live while they still run, as a draining leader does, then kept once they stopped):
counters and histograms never go down while the process lives. Gauges (queue depth, running
attempts, leadership) are the current scheduler's alone.

Every series labelled by pool exists for each configured pool from the first scrape, at 0 (a
standby's gauges too: it holds none of the cluster's tasks), so that a rate or a sum over the
replicas is 0 rather than missing until something happens.

Schedule occurrences count by schedule and outcome (``SchedulerMetrics.occurrences``, one per
occurrence-ledger record): a schedule's series appear, every outcome at 0, once one of its
occurrences came due (the collector knows no list of schedules). A schedule's name may be any
text: the exposition escapes it as any label value (backslash, double quote, newline).

Task limits (docs/limits.md) are gauges by limit, never by key (keys are unbounded: a tenant
each), read from the leader's ``list_limits(keys=0)`` just before each scrape (``refresh``): 0 on
a standby, and for every configured limit from the first scrape.

The outbox's series exist only on a server whose store has an outbox: its two counters from
the first scrape, at 0 on a standby as the others; its gauges once the leader has read the
outbox (within a second of leading), absent on a standby, which reads none.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from cronoq import LimitInfo, OccurrenceOutcome, Status
from cronoq.errors import CronoqError

if TYPE_CHECKING:
    from cronoq import Histogram, Scheduler, SchedulerMetrics

__all__ = ["SchedulerCollector", "metrics_registry"]

# (metric name without _total, SchedulerMetrics field, labels, help)
# Prometheus' own spelling of a bucket bound (+Inf, 0.005, 1e+06 ...); the library leaves it
# unannotated.
_bound_label: Callable[[float], str] = floatToGoString

_COUNTERS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("cronoq_tasks_submitted", "submitted", ("pool",), "Tasks created."),
    ("cronoq_tasks_finished", "finished", ("pool", "status"), "Tasks that ended, by status."),
    ("cronoq_task_retries", "retries", ("pool",), "Failed attempts whose task will retry."),
    ("cronoq_tasks_dead_lettered", "dead_lettered", ("pool",), "Tasks failed for good."),
    ("cronoq_attempts_lost", "attempts_lost", ("pool",), "Attempts whose executor vanished."),
    (
        "cronoq_schedule_occurrences",
        "occurrences",
        ("schedule", "outcome"),
        "Schedule occurrences that came due, by schedule and outcome (a ledger record each).",
    ),
)
_OUTBOX_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("cronoq_outbox_ingested", "outbox_ingested", "Outbox rows turned into tasks."),
    ("cronoq_outbox_quarantined", "outbox_quarantined", "Outbox rows quarantined."),
)
_OUTBOX_GAUGES: tuple[tuple[str, str, str], ...] = (
    ("cronoq_outbox_depth", "outbox_depth", "Rows waiting in the outbox."),
    (
        "cronoq_outbox_oldest_age_seconds",
        "outbox_oldest_age_seconds",
        "Age of the oldest row waiting in the outbox (0 when none waits), seconds.",
    ),
    (
        "cronoq_outbox_quarantined_rows",
        "outbox_quarantine_depth",
        "Rows in the outbox's quarantine, waiting to be requeued or discarded.",
    ),
)
_HISTOGRAMS: tuple[tuple[str, str, str], ...] = (
    ("cronoq_commit_seconds", "commit_seconds", "Store commit latency, seconds."),
    ("cronoq_commit_batch_size", "commit_batch_size", "Mutations per store commit."),
    (
        "cronoq_start_delay_seconds",
        "start_delay_seconds",
        "From a task becoming ready to its attempt starting, seconds.",
    ),
)


@dataclass(slots=True)
class _HistogramSum:
    bounds: tuple[float, ...]
    counts: list[int]
    total: float
    count: int

    @classmethod
    def of(cls, histogram: Histogram) -> _HistogramSum:
        return cls(histogram.bounds, list(histogram.counts), histogram.total, histogram.count)

    def add(self, histogram: Histogram) -> None:
        # One build of cronoq has one set of bounds; summing other bounds would be nonsense.
        if histogram.bounds != self.bounds:
            raise ValueError(f"histogram bounds changed: {self.bounds} -> {histogram.bounds}")
        self.counts = [a + b for a, b in zip(self.counts, histogram.counts, strict=True)]
        self.total += histogram.total
        self.count += histogram.count


class _Totals:
    """Counters and histograms summed over scheduler snapshots."""

    __slots__ = ("counters", "histograms", "outbox")

    def __init__(self) -> None:
        self.counters: dict[str, dict[object, int]] = {field: {} for _, field, _, _ in _COUNTERS}
        self.histograms: dict[str, _HistogramSum] = {}
        self.outbox: dict[str, int] = {field: 0 for _, field, _ in _OUTBOX_COUNTERS}

    def add(self, snapshot: SchedulerMetrics) -> None:
        for _, field, _, _ in _COUNTERS:
            counts = self.counters[field]
            values: Mapping[object, int] = getattr(snapshot, field)
            for key, value in values.items():
                counts[key] = counts.get(key, 0) + value
        for _, field, _ in _OUTBOX_COUNTERS:
            self.outbox[field] += getattr(snapshot, field)
        for _, field, _ in _HISTOGRAMS:
            histogram: Histogram = getattr(snapshot, field)
            if field in self.histograms:
                self.histograms[field].add(histogram)
            else:
                self.histograms[field] = _HistogramSum.of(histogram)

    def copy(self) -> _Totals:
        result = _Totals()
        result.counters = {field: dict(counts) for field, counts in self.counters.items()}
        result.outbox = dict(self.outbox)
        result.histograms = {
            field: _HistogramSum(h.bounds, list(h.counts), h.total, h.count)
            for field, h in self.histograms.items()
        }
        return result


class SchedulerCollector(Collector):
    """Metrics of the scheduler being ``watch()``-ed, with the counts of those before it."""

    def __init__(
        self,
        workers_connected: Callable[[], int],
        pools: Iterable[str],
        *,
        outbox: bool = False,
        limits: Iterable[str] = (),
    ) -> None:
        """``outbox``: the server's store has an outbox, whose series it exports. ``limits``:
        the names of the configured task limits."""
        self._workers_connected = workers_connected
        self._pools = tuple(pools)
        self._limit_names = tuple(limits)
        self._limits: list[LimitInfo] = []
        """The current scheduler's limits at the last ``refresh``."""
        self._outbox = outbox
        self._current: Scheduler | None = None
        self._retiring: list[Scheduler] = []
        """Schedulers no longer watched that may still count (a leader draining its attempts):
        read at every scrape until they stop, then folded into ``_retired``."""
        self._retired = _Totals()

    def watch(self, scheduler: Scheduler | None) -> None:
        """Read ``scheduler`` from now on (None: no scheduler, as on a standby).

        The one watched until now keeps counting into the totals until it stops, whenever this
        is called: a leader that starts draining may be replaced at once.
        """
        if scheduler is self._current:
            return
        if self._current is not None:
            self._retiring.append(self._current)
        if scheduler in self._retiring:
            self._retiring.remove(scheduler)  # watched again: counted as the current one
        self._current = scheduler

    async def refresh(self) -> None:
        """Read what a scrape needs that only an async call answers: the limits' use. A
        scheduler that cannot answer at once (stopping, or slow) leaves them at 0."""
        self._limits = []
        scheduler = self._current
        if scheduler is None or not self._limit_names:
            return
        with contextlib.suppress(CronoqError, TimeoutError):
            async with asyncio.timeout(_LIMITS_TIMEOUT_S):
                self._limits = await scheduler.list_limits(keys=0)

    def _totals(self, snapshot: SchedulerMetrics | None) -> _Totals:
        for scheduler in [s for s in self._retiring if not s.running]:
            # Stopped: its counts are final, and the scheduler need not be kept alive.
            self._retired.add(scheduler.metrics())
            self._retiring.remove(scheduler)
        totals = self._retired.copy()
        for live in [s.metrics() for s in self._retiring] + (
            [] if snapshot is None else [snapshot]
        ):
            totals.add(live)
        return totals

    def collect(self) -> Iterator[Metric]:
        snapshot = self._current.metrics() if self._current is not None else None
        totals = self._totals(snapshot)
        for name, field, labels, help_text in _COUNTERS:
            counter = CounterMetricFamily(name, help_text, labels=labels)
            counted = totals.counters[field]
            if labels[0] == "schedule":
                zeros = _outcome_zeros(counted)
            else:
                zeros = self._zeros(_FINAL if "status" in labels else ())
            counts = zeros | counted
            for key, value in sorted(counts.items(), key=_label_order):
                counter.add_metric(_labels(key), value)
            yield counter
        for name, field, help_text in _HISTOGRAMS:
            histogram = HistogramMetricFamily(name, help_text, labels=())
            if field in totals.histograms:
                summed = totals.histograms[field]
                cumulative = 0
                buckets: list[tuple[str, float]] = []
                for bound, count in zip((*summed.bounds, float("inf")), summed.counts, strict=True):
                    cumulative += count
                    buckets.append((_bound_label(bound), cumulative))
                histogram.add_metric((), buckets, summed.total)
            yield histogram
        depth = GaugeMetricFamily(
            "cronoq_queue_depth", "Live tasks, by pool and status.", labels=("pool", "status")
        )
        running = GaugeMetricFamily(
            "cronoq_attempts_running", "Attempts running, by pool.", labels=("pool",)
        )
        epoch = GaugeMetricFamily("cronoq_epoch", "Fencing epoch of this leader (absent if none).")
        depths = self._zeros(_LIVE)
        runs = self._zeros(())
        if snapshot is not None:
            depths.update(snapshot.queue_depth.items())
            runs.update(snapshot.running.items())
            if snapshot.epoch is not None:
                epoch.add_metric((), snapshot.epoch)
        for key, value in sorted(depths.items(), key=_label_order):
            depth.add_metric(_labels(key), value)
        for key, value in sorted(runs.items(), key=_label_order):
            running.add_metric(_labels(key), value)
        yield depth
        yield running
        yield GaugeMetricFamily(
            "cronoq_leader",
            "1 while this process leads its cluster, else 0.",
            value=int(snapshot is not None and snapshot.leading),
        )
        yield epoch
        yield GaugeMetricFamily(
            "cronoq_workers_connected",
            "Remote workers attached to this process.",
            value=self._workers_connected(),
        )
        if self._outbox:
            yield from _outbox_metrics(totals, snapshot)
        yield from self._limit_metrics()

    def _limit_metrics(self) -> Iterator[Metric]:
        read = {info.limit.name: info for info in self._limits}
        for name, field, help_text in _LIMIT_GAUGES:
            gauge = GaugeMetricFamily(name, help_text, labels=("limit",))
            for limit in sorted(self._limit_names):
                info = read.get(limit)
                gauge.add_metric((limit,), 0 if info is None else getattr(info, field))
            yield gauge

    def _zeros(self, statuses: tuple[str, ...]) -> dict[object, int]:
        """0 for each configured pool (and each of ``statuses``), keyed as the scheduler's
        metrics are: the pool, or (pool, status)."""
        if not statuses:
            return dict.fromkeys(self._pools, 0)
        return {(pool, status): 0 for pool in self._pools for status in statuses}


_LIMITS_TIMEOUT_S = 1.0
_LIMIT_GAUGES = (
    ("cronoq_limit_running", "running", "Attempts holding a task limit, by limit."),
    ("cronoq_limit_waiting", "waiting", "Ready tasks that name a task limit, by limit."),
    ("cronoq_limit_starts", "starts", "Attempt starts in a rate limit's current window."),
    ("cronoq_limit_keys", "keys_in_use", "Keys of a task limit in use (running or waiting)."),
)

_FINAL = tuple(status.value for status in Status if status.is_terminal)
_OUTCOMES = tuple(outcome.value for outcome in OccurrenceOutcome)


def _outcome_zeros(counted: Mapping[object, int]) -> dict[object, int]:
    """0 for every outcome of each schedule counted so far (keyed (schedule, outcome)), so that
    a rate of its misses or skips is 0 rather than missing once the schedule came due. A
    schedule is unknown here until then: the collector is given no list of them."""
    schedules = {key[0] for key in counted if isinstance(key, tuple)}
    return {(schedule, outcome): 0 for schedule in schedules for outcome in _OUTCOMES}


_LIVE = tuple(status.value for status in Status if not status.is_terminal)


def _outbox_metrics(totals: _Totals, snapshot: SchedulerMetrics | None) -> Iterator[Metric]:
    for name, field, help_text in _OUTBOX_COUNTERS:
        yield CounterMetricFamily(name, help_text, value=totals.outbox[field])
    for name, field, help_text in _OUTBOX_GAUGES:
        value: float | None = None if snapshot is None else getattr(snapshot, field)
        if value is not None:  # not read yet by this leader (or a standby): absent, not 0
            yield GaugeMetricFamily(name, help_text, value=value)


def _labels(key: object) -> tuple[str, ...]:
    return key if isinstance(key, tuple) else (str(key),)


def _label_order(item: tuple[object, int]) -> tuple[str, ...]:
    return _labels(item[0])


def metrics_registry(collector: SchedulerCollector) -> CollectorRegistry:
    """A registry with ``collector`` and the process's own metrics (memory, CPU, open file
    descriptors, garbage collection, Python version)."""
    registry = CollectorRegistry()
    registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
