"""Why a task is where it is: ``Scheduler.explain``'s answer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from cronoq._model import Status
from cronoq._tracebacks import split_traceback

__all__ = ["Explanation", "Hold"]


class Hold(StrEnum):
    """What holds a task now (or, once it runs or ended, what it is doing or how it ended)."""

    DEPENDENCIES = "dependencies"
    """It waits for the tasks it was submitted ``after`` (``Explanation.parents``)."""
    START_TIME = "start_time"
    """Its fixed start time has not come (``until``)."""
    RETRY_BACKOFF = "retry_backoff"
    """An attempt failed; the next may start at ``until``."""
    POOL_PAUSED = "pool_paused"
    """An operator paused its pool: nothing starts there until it is resumed."""
    POOL_FULL = "pool_full"
    """Every slot of its pool is taken (``running`` of ``concurrency``)."""
    LIMIT = "limit"
    """A limit has no room now (``limit``, ``limit_key``; a rate's next start at ``until``)."""
    NO_WORKER_SLOTS = "no_worker_slots"
    """Its pool is remote, and no attached worker offers a free slot for it."""
    STOPPED_ATTEMPT = "stopped_attempt"
    """An earlier attempt was stopped (a timeout, a cancellation) but may still run on its
    worker: the task starts again once it reports or its lease ends (``until``)."""
    LEADER_CHANGE = "leader_change"
    """No leader can start it now: this scheduler does not lead, is taking over, or is
    stepping down."""
    DISPATCHING = "dispatching"
    """Nothing holds it: it starts at the scheduler's next step."""
    RUNNING = "running"
    """An attempt runs (``attempt``; a remote one's worker and lease end in ``worker`` and
    ``until``)."""
    CANCELLING = "cancelling"
    """Its running attempt was asked to stop and has not ended yet."""
    FINISHED = "finished"
    """It ended: ``status`` and ``summary`` say how."""


@dataclass(frozen=True, slots=True)
class Explanation:
    """The one thing that holds a task now, since when, and what would release it."""

    task_id: int
    status: Status
    hold: Hold
    summary: str
    """One line for people: what holds it and what releases it."""
    since: datetime
    """When the task entered its current status."""
    until: datetime | None = None
    """When the hold ends at the latest, if a clock ends it (a start time, a backoff, a rate
    limit's next start, a lease)."""
    attempt: int = 0
    """Its latest attempt (the running one while it runs)."""
    parents: tuple[int, ...] = ()
    """For ``dependencies``: the parents not finished yet, ascending."""
    pool: str = ""
    running: int | None = None
    """For ``pool_full``: the attempts holding its pool's slots."""
    concurrency: int | None = None
    limit: str | None = None
    limit_key: str | None = None
    worker: str | None = None
    """For a running remote attempt: the worker it was leased to, as it named itself."""

    @classmethod
    def finished(
        cls, task_id: int, status: Status, attempt: int, at: datetime, message: str, pool: str
    ) -> Explanation:
        """A task that ended: how, from its message (without a traceback kept after it)."""
        line = split_traceback(message)[0]
        summary = f"it {status}" + (f": {line}" if line else "")
        return cls(task_id, status, Hold.FINISHED, summary, at, attempt=attempt, pool=pool)
