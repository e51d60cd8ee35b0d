"""What the engine takes: its configuration and the inputs a step applies."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cronoq._limits import Limit
from cronoq._model import NS_PER_S, ScheduleSpec, Status, TaskSpec
from cronoq._mutations import TaskRecord

__all__ = [
    "LEASE_ID_BYTES",
    "AddSchedule",
    "AttemptFailed",
    "AttemptReport",
    "AttemptSucceeded",
    "AttemptToken",
    "CancelTask",
    "EngineConfig",
    "GetDependants",
    "GetTask",
    "GetTaskByKey",
    "Heartbeat",
    "InFlight",
    "Input",
    "ListLimits",
    "ListPools",
    "ListSchedules",
    "ListTasks",
    "OfferSlots",
    "PausePool",
    "PauseSchedule",
    "PoolConfig",
    "RemoveSchedule",
    "ResumeSchedule",
    "RetryTask",
    "SubmitTasks",
    "TriggerSchedule",
    "WaitTask",
    "WithdrawAttempts",
    "lease_hash",
    "lease_matches",
]

LEASE_ID_BYTES = 16
"""A lease id is 128 random bits: a capability, not a name (no one can guess another's)."""


def _random_lease_id() -> bytes:
    return secrets.token_bytes(LEASE_ID_BYTES)


def lease_hash(lease_id: bytes) -> bytes:
    """What a store keeps of a lease id (SHA-256): enough to check a worker, not to be one."""
    return hashlib.sha256(lease_id).digest()


def lease_matches(lease_id: bytes | None, id_hash: bytes) -> bool:
    """Whether ``lease_id`` is the id whose hash is ``id_hash``, in constant time."""
    return lease_id is not None and hmac.compare_digest(lease_hash(lease_id), id_hash)


@dataclass(frozen=True, slots=True)
class PoolConfig:
    name: str
    concurrency: int
    max_live: int | None = None
    """Bound on live (not finished) tasks in this pool; None means only the global bound."""
    lease_ns: int | None = None
    """Remote executors: an attempt not heartbeaten for this long is lost and retried. Such a
    pool also starts attempts only into the free slots its executor offers (OfferSlots)."""
    limits: tuple[str, ...] = ()
    """The limits every task of this pool takes (``Pool.limits``): submissions add them to
    each task's ``TaskSpec.limits``."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    pools: Sequence[PoolConfig]
    retention_ns: int = 3600 * NS_PER_S
    """How long finished tasks stay in memory for key deduplication and dependencies."""
    max_live_tasks: int | None = None
    seed: int | None = None
    """Seed of the backoff jitter; None draws one from the OS."""
    lease_ids: Callable[[], bytes] = _random_lease_id
    """Draws the lease id of each remote attempt (tests pass a deterministic one)."""
    limits: Sequence[Limit] = ()
    """The limits tasks may take (``docs/limits.md``)."""


# --- inputs -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AttemptToken:
    """Names one attempt. Reports carrying any other token are rejected."""

    epoch: int
    task_id: int
    attempt: int


@dataclass(frozen=True, slots=True)
class AttemptSucceeded:
    output: bytes | None
    """None when the function returned None."""


@dataclass(frozen=True, slots=True)
class AttemptFailed:
    message: str
    retryable: bool = True
    retry_after_ns: int | None = None
    traceback: str = ""
    """Where it was raised, as ``_tracebacks.stored_traceback`` bounds it ("": none): the
    task's row and its attempt's history keep it after the message; memory does not."""


@dataclass(frozen=True, slots=True)
class SubmitTasks:
    specs: Sequence[TaskSpec]
    reply_to: object
    key_pools: frozenset[str] | None = None
    """When set (or ``key_kinds``): a key of ``specs`` held by a task of another pool (or
    kind) refuses the whole input with PermissionDenied before anything is applied, instead
    of answering with that task's id (a server's identity limited to some pools must not
    learn the tasks of the others by their keys)."""
    key_kinds: frozenset[str] | None = None
    outbox: tuple[int, ...] = ()
    """The outbox rows these specs were read from (``OutboxTaken``): deleted by the step's
    commit if the submission is accepted, kept if it is refused."""


@dataclass(frozen=True, slots=True)
class CancelTask:
    task_id: int
    message: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class AttemptReport:
    token: AttemptToken
    outcome: AttemptSucceeded | AttemptFailed
    reply_to: object = None
    remote: bool = False
    """From a remote worker: only an attempt of a leased pool may be reported so."""
    received_ns: int | None = None
    """When the driver received it: a lease is judged by that, not by a step a slow commit
    delayed."""
    lease_id: bytes | None = field(default=None, repr=False)
    """From a remote worker: the lease id it was given with the attempt."""


@dataclass(frozen=True, slots=True)
class Heartbeat:
    token: AttemptToken
    reply_to: object = None
    remote: bool = False
    received_ns: int | None = None
    lease_id: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class OfferSlots:
    """The free slots of remote workers now, as (the pools they serve, how many), replacing
    the previous offer. The driver sends it before every step, so that the engine never
    dispatches an attempt to a leased pool that no worker can take."""

    groups: Sequence[tuple[frozenset[str], int]]
    reply_to: object = None


@dataclass(frozen=True, slots=True)
class AddSchedule:
    spec: ScheduleSpec
    replace: bool
    reply_to: object


@dataclass(frozen=True, slots=True)
class PauseSchedule:
    name: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class ResumeSchedule:
    name: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class RemoveSchedule:
    name: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class TriggerSchedule:
    """Run one occurrence of a schedule now, through its overlap policy; its timetable stays."""

    name: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class PausePool:
    """Pause (``paused``) or resume a pool: a paused pool starts no attempt."""

    name: str
    paused: bool
    reply_to: object


@dataclass(frozen=True, slots=True)
class ListPools:
    reply_to: object


@dataclass(frozen=True, slots=True)
class ListLimits:
    """Every configured limit with its use; per limit, the ``keys`` busiest keys."""

    reply_to: object
    keys: int = 20


@dataclass(frozen=True, slots=True)
class RetryTask:
    """Make a failed or cancelled task live again. ``record`` is its row as the store had it
    just before (the engine keeps no spec of a finished task), None if the store has none."""

    task_id: int
    record: TaskRecord | None
    message: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class RerunTask:
    """Submit a new task with a finished task's spec. ``record`` is its row as the store had
    it (memory keeps no spec of a finished task), None if the store has none."""

    task_id: int
    record: TaskRecord | None
    reply_to: object


@dataclass(frozen=True, slots=True)
class ExplainTask:
    task_id: int
    reply_to: object


@dataclass(frozen=True, slots=True)
class GetTask:
    task_id: int
    reply_to: object


@dataclass(frozen=True, slots=True)
class GetDependants:
    task_id: int
    reply_to: object


@dataclass(frozen=True, slots=True)
class GetTaskByKey:
    key: str
    reply_to: object


@dataclass(frozen=True, slots=True)
class WaitTask:
    task_id: int
    reply_to: object
    timeout_s: float | None = None
    """For the driver: how long the caller waits once the task is known to be live."""


@dataclass(frozen=True, slots=True)
class WithdrawAttempts:
    """Attempts dispatched by a committed step but never released to an executor (the
    scheduler began closing meanwhile): back to their queue, not counted as used."""

    tokens: Sequence[AttemptToken]
    reason: str
    reply_to: object = None


@dataclass(frozen=True, slots=True)
class ListTasks:
    reply_to: object
    statuses: frozenset[Status] | None = None
    pool: str | None = None
    kind: str | None = None
    tag: str | None = None
    limit: int | None = None
    after: int | None = None
    """Only tasks with a larger id (paging oldest first)."""
    before: int | None = None
    """Only tasks with a smaller id (paging newest first)."""
    newest_first: bool = False
    """Descending id (submission) order; otherwise ascending."""


@dataclass(frozen=True, slots=True)
class ListSchedules:
    reply_to: object


Input = (
    SubmitTasks
    | CancelTask
    | AttemptReport
    | Heartbeat
    | AddSchedule
    | PauseSchedule
    | ResumeSchedule
    | RemoveSchedule
    | GetTask
    | GetDependants
    | GetTaskByKey
    | WaitTask
    | ListTasks
    | ListSchedules
    | WithdrawAttempts
    | OfferSlots
    | TriggerSchedule
    | PausePool
    | ListPools
    | ListLimits
    | RetryTask
    | RerunTask
    | ExplainTask
)


@dataclass(frozen=True, slots=True)
class InFlight:
    """What the process rebuilding an engine in its own epoch knows of the attempts it
    released to executors (after a commit whose outcome is uncertain)."""

    executing: Mapping[AttemptToken, str] = field(default_factory=dict)
    """Released and still running (no report yet), with the pool each runs in."""
    reported: frozenset[AttemptToken] = frozenset()
    """Ended; their reports are applied again after the rebuild."""
    abandoned: frozenset[AttemptToken] = frozenset()
    """Released, then left running without a report (a graceful close that timed out)."""
    lease_ids: Mapping[AttemptToken, bytes] = field(default_factory=dict, repr=False)
    """The lease ids of the remote ones among ``executing``."""
    lanes: Mapping[AttemptToken, tuple[tuple[str, str | None], ...]] = field(default_factory=dict)
    """The limits each of ``executing`` holds (``TaskSpec.limits``), for those that take any:
    its task may be gone from the rows by the time of the rebuild."""

    def released(self, token: AttemptToken) -> bool:
        return token in self.executing or token in self.reported or token in self.abandoned
