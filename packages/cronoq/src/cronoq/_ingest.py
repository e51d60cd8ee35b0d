"""The leader's outbox ingest: rows in, submissions and quarantined rows out.

One loop per leading scheduler. It reads a batch of rows, turns each into a task spec by the
checks of ``submit`` (a row that fails them is quarantined with the reason, and never blocks
the rows behind it), and submits the rest as one step of the engine. From the store's own
database (a transactional source), that step's commit deletes the rows with the tasks it
creates: a row becomes exactly one task. From elsewhere, each row without a key submits with
one derived from it, and the rows are deleted after the commit: read twice, a row finds its
task by that key. A batch is read only once the previous one's commit is resolved, and the
source reads only once a write whose outcome the store did not learn is over, so no row is
submitted while an earlier submission of it may still land.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from cronoq._model import TaskSpec
from cronoq._mutations import sanitize_message
from cronoq._outbox import (
    MAX_QUARANTINE_REASON,
    OutboxRow,
    OutboxSource,
    OutboxStats,
    derived_key,
)
from cronoq.errors import (
    AdmissionRejected,
    CronoqError,
    Fenced,
    SchedulerError,
    SchedulerStopped,
    StoreFatal,
    Unavailable,
)

__all__ = ["INGEST_BATCH", "Ingester"]

log = logging.getLogger("cronoq.outbox")

INGEST_BATCH = 1000
"""Rows read, checked and submitted per step."""
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 2.0
_STATS_EVERY_S = 1.0


@dataclass(slots=True)
class IngestCounters:
    ingested: int = 0
    """Rows turned into tasks (or answered by a held key)."""
    quarantined: int = 0
    stats: OutboxStats | None = None
    """The source's last figures (refreshed about once a second while leading)."""


class Ingester:
    def __init__(
        self,
        source: OutboxSource,
        epoch: Callable[[], int],
        spec_of: Callable[[int, OutboxRow], TaskSpec],
        submit: Callable[[list[TaskSpec], tuple[int, ...]], Awaitable[object]],
        *,
        binds: bool = False,
    ) -> None:
        """``spec_of(now_ns, row)``: the row's task spec, or ``CronoqError`` saying why it
        cannot become a task. ``submit(specs, row_ids)``: one submission whose commit takes
        the rows (``row_ids`` is empty for a source that is not transactional). ``binds``:
        the scheduler's codec binds payloads to their task's key (``CodecContext``)."""
        self._source = source
        self._binds = binds
        self._epoch = epoch
        self._spec_of = spec_of
        self._submit = submit
        self.counters = IngestCounters()
        self._stats_at = 0.0

    async def run(self) -> None:
        """Ingest until the scheduler stops or is fenced; store outages are waited out."""
        pause = _RETRY_FIRST_S
        while True:
            try:
                # A batch first: its read checks the grants, and says which are missing.
                ingested = await self._ingest_batch()
                await self._refresh_stats()
                if ingested:
                    pause = _RETRY_FIRST_S
                    continue
                await self._source.wait()
            except SchedulerStopped:
                return
            except Fenced as exc:
                log.warning("outbox ingest stopped: %s", exc)
                return
            except StoreFatal as exc:
                # A refused privilege, say: the scheduler serves on, without the outbox.
                log.error("outbox ingest stopped, the scheduler serves on without it: %s", exc)
                return
            except (Unavailable, SchedulerError, AdmissionRejected) as exc:
                # Not applied, or perhaps applied: the rows themselves say which when read
                # again. Admission: the pools are full; their rows wait in the outbox.
                log.warning("outbox ingest waits %.2fs: %s", pause, exc)
                with contextlib.suppress(CronoqError):  # the figures show the rows waiting
                    await self._refresh_stats()
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RETRY_MAX_S)

    async def _ingest_batch(self) -> bool:
        """Read, check and submit one batch; False if the outbox was empty."""
        source, epoch = self._source, self._epoch()
        rows = await source.read(epoch, INGEST_BATCH)
        if not rows:
            return False
        # A codec decodes every payload to check it: megabytes of them would stall the loop
        # (and the store's keepalives) for seconds.
        specs, taken, bad = await asyncio.to_thread(self.check, rows, time.time_ns())
        if bad:
            await self._quarantine(epoch, bad)
        # One submission per pool, in one step: a full pool (max_live) refuses its own rows,
        # which wait in the outbox, and not the other pools' behind them.
        pools: dict[str, tuple[list[TaskSpec], list[int]]] = {}
        for spec, row_id in zip(specs, taken, strict=True):
            group = pools.setdefault(spec.pool, ([], []))
            group[0].append(spec)
            group[1].append(row_id)
        outcomes = await asyncio.gather(
            *(self._submit_pool(group_specs, ids) for group_specs, ids in pools.values()),
            return_exceptions=True,
        )
        refused = [o for o in outcomes if isinstance(o, BaseException)]
        for outcome in refused:
            if not isinstance(outcome, AdmissionRejected):
                raise outcome
        if refused and len(refused) == len(outcomes) and not bad:
            raise refused[0]  # nothing moved: the run loop backs off
        return True

    async def _submit_pool(self, specs: list[TaskSpec], row_ids: list[int]) -> None:
        """A pool's rows, as many as its ``max_live`` admits: halved while it refuses them,
        so that a nearly full pool takes what it has room for, oldest first."""
        try:
            await self._submit_rows(specs, row_ids)
        except AdmissionRejected:
            if len(specs) == 1:
                raise
            half = len(specs) // 2
            await self._submit_pool(specs[:half], row_ids[:half])
            await self._submit_pool(specs[half:], row_ids[half:])

    async def _submit_rows(self, specs: list[TaskSpec], row_ids: list[int]) -> None:
        source = self._source
        await self._submit(specs, tuple(row_ids) if source.transactional else ())
        if not source.transactional:
            await source.take(self._epoch(), row_ids)
        self.counters.ingested += len(specs)

    async def _quarantine(self, epoch: int, bad: list[tuple[int, str]]) -> None:
        await self._source.quarantine(epoch, bad)
        self.counters.quarantined += len(bad)
        for row_id, reason in bad:
            log.warning("outbox row %d quarantined: %s", row_id, reason)

    def check(
        self, rows: Sequence[OutboxRow], now_ns: int
    ) -> tuple[list[TaskSpec], list[int], list[tuple[int, str]]]:
        """The rows' specs and ids, and (id, reason) of the rows that cannot become tasks."""
        specs: list[TaskSpec] = []
        taken: list[int] = []
        bad: list[tuple[int, str]] = []
        derive = not self._source.transactional
        for row in rows:
            try:
                spec = self._spec_of(now_ns, row)
            except CronoqError as exc:
                bad.append((row.row_id, _reason(exc)))
                continue
            if derive and spec.key is None:
                if self._binds:
                    bad.append((row.row_id, _KEYLESS_BOUND))
                    continue
                spec = dataclasses.replace(spec, key=derived_key(row))
            specs.append(spec)
            taken.append(row.row_id)
        return specs, taken, bad

    async def _refresh_stats(self) -> None:
        now = time.monotonic()
        if now - self._stats_at >= _STATS_EVERY_S:
            self._stats_at = now
            self.counters.stats = await self._source.stats()


_KEYLESS_BOUND = (
    "InvalidArgument: a row without a key, from an outbox outside the store's database, is "
    "deduplicated by a key derived from it, but the scheduler's codec binds payloads to their "
    "key: give the row a key of its own (docs/outbox.md)"
)


def _reason(exc: CronoqError) -> str:
    """Why a row cannot become a task: bounded (a codec's error may be of any length) and
    storable (no NUL, no lone surrogate, whatever the error held)."""
    reason = sanitize_message(f"{type(exc).__name__}: {exc}")
    if len(reason) > MAX_QUARANTINE_REASON:
        reason = reason[: MAX_QUARANTINE_REASON - 3] + "..."
    return reason
