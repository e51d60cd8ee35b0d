"""What a step returns: the mutations to commit, the replies, the attempts to start or stop."""

from __future__ import annotations

from dataclasses import dataclass, field

from cronoq._engine.inputs import AttemptToken
from cronoq._frozen import quick_init
from cronoq._model import Status, TaskSpec
from cronoq._tracebacks import error_line
from cronoq.store import Mutation

__all__ = [
    "CancelAttempt",
    "Dispatch",
    "HeartbeatReply",
    "PoolInfo",
    "StepResult",
    "SubmitResult",
    "TaskSummary",
    "error_of",
]


@quick_init
@dataclass(frozen=True, slots=True)
class SubmitResult:
    task_id: int
    created: bool
    """False when the key was already held and ``task_id`` is the existing task."""


@dataclass(frozen=True, slots=True)
class TaskSummary:
    """What the engine keeps of a finished task, and what ``list`` returns for every task."""

    task_id: int
    status: Status
    attempt: int
    pool: str
    kind: str
    key: str | None
    tags: tuple[str, ...]
    finished_ns: int | None
    error: str | None = None
    """Why it failed, was cancelled, or is retrying: its message's first line, bounded (see
    ``summarize``); None in any other status."""
    waiting_for: str | None = None
    """The limit holding a ready task back now (``limit 'tenant' key 'acme': 2 of 2
    running``); None when none does."""

    @classmethod
    def summarize(
        cls,
        task_id: int,
        status: Status,
        attempt: int,
        spec: TaskSpec,
        finished_ns: int | None,
        message: str,
    ) -> TaskSummary:
        error = error_of(status, message)
        return cls(
            task_id, status, attempt, spec.pool, spec.kind, spec.key, spec.tags, finished_ns, error
        )


_ERROR_STATUSES = frozenset({Status.FAILED, Status.CANCELLED, Status.RETRYING})


def error_of(status: Status, message: str) -> str | None:
    """A task's error as its summary shows it: the first line of the message of a failed,
    cancelled or retrying task, bounded; None in any other status."""
    return error_line(message) if status in _ERROR_STATUSES else None


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """A pool as ``list_pools`` shows it."""

    name: str
    concurrency: int
    paused: bool
    """An operator paused it: it starts no attempt (those running finish)."""
    running: int
    """Attempts holding a slot, stopped ones that have not returned included."""
    depth: dict[Status, int]
    """Live tasks by status (every live status, zero included)."""
    remote: bool
    """Its attempts run on remote workers (a ``RemotePool``)."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Start this attempt. Released by the driver only after the step committed."""

    token: AttemptToken
    spec: TaskSpec
    lease_expires_ns: int | None = None
    """Leased pools: when the attempt is lost unless its worker heartbeats."""
    slot_pools: frozenset[str] | None = None
    """Leased pools: the offered slot group it took (the pools of the workers it may go to)."""
    lease_id: bytes | None = field(default=None, repr=False)
    """Leased pools: the attempt's capability, for its worker only (never stored or logged)."""


@dataclass(frozen=True, slots=True)
class CancelAttempt:
    """Ask the executor running this attempt to stop (cooperatively)."""

    token: AttemptToken
    pool: str
    reason: str


@dataclass(frozen=True, slots=True)
class HeartbeatReply:
    """The answer to a heartbeat of a current attempt, or of a stopped one that still holds
    its slot."""

    lease_expires_ns: int | None
    """None when the pool has no lease."""
    cancel_reason: str | None
    """Why the attempt should stop, once a cancellation was requested."""
    stopped: bool = False
    """The engine ended the attempt (timeout, deadline, cancellation) and its task waits for
    it: keep heartbeating until the function returns, then report (the report changes
    nothing but frees the slot and lets the task go on)."""


@dataclass(slots=True)
class StepResult:
    mutations: list[Mutation] = field(default_factory=list)
    replies: list[tuple[object, object]] = field(default_factory=list)
    """(reply_to, value); a value that is an exception is raised to the caller."""
    dispatches: list[Dispatch] = field(default_factory=list)
    cancels: list[CancelAttempt] = field(default_factory=list)
    expired: list[AttemptToken] = field(default_factory=list)
    """Stopped leased attempts whose lease ended without a report, and attempts a rebuild does
    not hold again: no report of theirs is awaited any more (one that comes is stale)."""
    next_wake_ns: int | None = None
