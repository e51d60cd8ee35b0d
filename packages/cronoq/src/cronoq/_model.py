"""Values of the task model: statuses, policies and the persisted task spec.

Every time is Unix nanoseconds (``int``); every duration is nanoseconds too.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from cronoq._frozen import quick_init
from cronoq.errors import InvalidArgument

__all__ = [
    "LEGAL_TRANSITIONS",
    "TERMINAL",
    "CatchUpPolicy",
    "MissPolicy",
    "OverlapPolicy",
    "RetryPolicy",
    "ScheduleSpec",
    "Status",
    "TaskSpec",
    "TaskTemplate",
    "TraceContext",
]

NS_PER_S = 1_000_000_000
_TEN_YEARS_NS = 10 * 366 * 24 * 3600 * NS_PER_S
MAX_ATTEMPTS = 1000
"""The most attempts a retry policy may allow (an operator's retry of a task goes no further)."""


class Status(StrEnum):
    WAITING = "waiting"
    """Waiting for its dependencies to succeed."""
    SCHEDULED = "scheduled"
    """Its fixed start is in the future."""
    READY = "ready"
    """Queued in its pool, waiting for a free slot."""
    RUNNING = "running"
    """An attempt is running."""
    RETRYING = "retrying"
    """An attempt failed; the next one starts after the backoff."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.CANCELLED})

# The only transitions the engine makes; the property tests assert every observed one is here.
LEGAL_TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WAITING: frozenset({Status.READY, Status.SCHEDULED, Status.FAILED, Status.CANCELLED}),
    Status.SCHEDULED: frozenset({Status.READY, Status.FAILED, Status.CANCELLED}),
    Status.READY: frozenset({Status.RUNNING, Status.FAILED, Status.CANCELLED}),
    Status.RUNNING: frozenset({Status.RETRYING, Status.SUCCEEDED, Status.FAILED, Status.CANCELLED}),
    Status.RETRYING: frozenset({Status.READY, Status.FAILED, Status.CANCELLED}),
    Status.SUCCEEDED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


class MissPolicy(StrEnum):
    """What a fixed-start task does when its start passed by more than its grace."""

    RUN_LATE = "run_late"
    SKIP = "skip"


class OverlapPolicy(StrEnum):
    """What a schedule does when an occurrence comes while its last task is still live."""

    SKIP = "skip"
    ALLOW = "allow"


class CatchUpPolicy(StrEnum):
    """What a schedule does with occurrences missed while no leader ran."""

    COALESCE = "coalesce"
    """Run once for all the missed occurrences."""
    SKIP = "skip"
    """Run none of them; wait for the next occurrence."""


class OccurrenceOutcome(StrEnum):
    """What became of a schedule's occurrence that came due (its ledger record, see
    ``Scheduler.occurrences``)."""

    STARTED = "started"
    """It created its task."""
    COALESCED = "coalesced"
    """Several occurrences came due while no leader could fire them, and ran once, as one task
    (``catch_up="coalesce"``)."""
    SKIPPED = "skipped"
    """The task of an earlier occurrence was still live (``overlap="skip"``)."""
    MISSED = "missed"
    """It came due while no leader could fire it, later than its grace
    (``catch_up="skip"``); or the schedule was replaced or removed just as it came due."""
    PAUSED = "paused"
    """It came due while the schedule was paused."""
    NO_POOL = "no_pool"
    """Its pool was not configured (removed from the scheduler's configuration)."""
    REFUSED = "refused"
    """The scheduler could not create its task (its epoch's task ids were used up)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Attempts and exponential backoff: ``initial * multiplier**(n-1)``, capped, jittered.

    ``jitter`` is a fraction: the delay is drawn uniformly from ``delay * (1 ± jitter)``.
    """

    max_attempts: int = 3
    initial_ns: int = NS_PER_S
    multiplier: float = 2.0
    max_ns: int = 300 * NS_PER_S
    jitter: float = 0.1

    def __post_init__(self) -> None:
        # bool is an int subclass: RetryPolicy(jitter=True) is a mistake, not a jitter of 1.
        _int_field(self.max_attempts, "max_attempts")
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise InvalidArgument(
                f"max_attempts must be 1..{MAX_ATTEMPTS}, got {_shown(self.max_attempts)}"
            )
        _int_field(self.initial_ns, "initial_ns")
        _int_field(self.max_ns, "max_ns")
        if not 0 <= self.initial_ns <= self.max_ns <= _TEN_YEARS_NS:
            raise InvalidArgument(
                "backoff must satisfy 0 <= initial <= max <= ten years, got "
                f"initial_ns={_shown(self.initial_ns)} max_ns={_shown(self.max_ns)}"
            )
        # NaN fails both range checks, since every comparison with it is false.
        if not (_is_number(self.multiplier) and 1.0 <= self.multiplier <= 100.0):
            raise InvalidArgument(f"multiplier must be 1..100, got {_shown(self.multiplier)}")
        if not (_is_number(self.jitter) and 0.0 <= self.jitter <= 1.0):
            raise InvalidArgument(f"jitter must be 0..1, got {_shown(self.jitter)}")

    @classmethod
    def exponential(
        cls,
        max_attempts: int = 3,
        *,
        initial: float = 1.0,
        multiplier: float = 2.0,
        maximum: float = 300.0,
        jitter: float = 0.1,
    ) -> RetryPolicy:
        """Build a policy from durations in seconds (each at most ten years)."""
        return cls(
            max_attempts,
            _seconds_to_ns(initial, "initial"),
            multiplier,
            _seconds_to_ns(maximum, "maximum"),
            jitter,
        )

    def delay_ns(self, attempt: int, unit_random: float) -> int:
        """Backoff after failed ``attempt`` (1-based); ``unit_random`` is in [0, 1)."""
        if self.initial_ns == 0:
            base = 0.0
        else:
            try:
                growth = float(self.multiplier) ** (attempt - 1)
            except OverflowError:
                # 100.0 ** 199 overflows a float; the delay is capped at max_ns long before.
                growth = math.inf
            base = min(self.initial_ns * growth, self.max_ns)
        spread = 1.0 + self.jitter * (2.0 * unit_random - 1.0)
        return max(0, int(base * spread))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: object) -> str:
    if not _is_number(value):
        return type(value).__name__  # a repr of an arbitrary object may be huge or raise
    # Ints of more than 4300 digits cannot be printed (ValueError); describe them instead.
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    return repr(value)


def _int_field(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an int, got {type(value).__name__}")


def _seconds_to_ns(value: object, what: str) -> int:
    if not _is_number(value):
        raise InvalidArgument(f"{what} must be seconds (int or float), got {type(value).__name__}")
    assert isinstance(value, int | float)
    # Bounded before scaling: 10**400 has no float, and 1e300 * 1e9 is inf.
    # math.isfinite(10**400) itself overflows: ints are finite, only floats need the check.
    finite = isinstance(value, int) or math.isfinite(value)
    if not (finite and 0 <= value <= _TEN_YEARS_NS // NS_PER_S):
        raise InvalidArgument(f"{what} must be finite seconds in 0..ten years, got {_shown(value)}")
    return round(value * NS_PER_S)


DEFAULT_RETRY = RetryPolicy()

# W3C Trace Context, version 00: version-trace_id-parent_id-flags, lowercase hex.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
MAX_TRACESTATE_LENGTH = 512
"""W3C Trace Context asks every hop to carry at least 512 characters of ``tracestate``."""


@dataclass(frozen=True, slots=True)
class TraceContext:
    """The W3C trace context (``traceparent``, ``tracestate``) of the code that submitted a
    task, stored with it so that its attempts join that trace (``docs/tracing.md``)."""

    traceparent: str
    tracestate: str = ""

    def __post_init__(self) -> None:
        parent = self.traceparent
        match = _TRACEPARENT.fullmatch(parent) if isinstance(parent, str) else None
        # An all-zero trace or span id is invalid (W3C Trace Context, 3.2.2.3 and 3.2.2.4).
        if match is None or not int(match[1], 16) or not int(match[2], 16):
            shown = f"{parent!r:.80}" if isinstance(parent, str) else type(parent).__name__
            raise InvalidArgument(f"traceparent must be a W3C version-00 traceparent, got {shown}")
        state = self.tracestate
        if not isinstance(state, str):
            raise InvalidArgument(f"tracestate must be text, got {type(state).__name__}")
        if len(state) > MAX_TRACESTATE_LENGTH or not all(" " <= c <= "~" for c in state):
            raise InvalidArgument(
                f"tracestate must be at most {MAX_TRACESTATE_LENGTH} printable ASCII "
                f"characters, got {len(state)} characters"
            )

    @classmethod
    def from_headers(cls, traceparent: str | None, tracestate: str | None) -> TraceContext | None:
        """The context of received headers, or None if there is none or it is malformed: a
        receiver ignores an invalid ``traceparent`` (W3C Trace Context), and drops an invalid
        ``tracestate`` while keeping the parent."""
        if traceparent is None:
            return None
        try:
            return cls(traceparent, tracestate or "")
        except InvalidArgument:
            pass
        try:
            return cls(traceparent)
        except InvalidArgument:
            return None

    @classmethod
    def from_metadata(
        cls, metadata: Iterable[tuple[str, str | bytes]] | None
    ) -> TraceContext | None:
        """The context of received gRPC metadata (or any header pairs), as ``from_headers``."""
        headers: dict[str, str] = {}
        for key, value in metadata or ():
            if key in ("traceparent", "tracestate") and isinstance(value, str):
                headers[key] = value
        return cls.from_headers(headers.get("traceparent"), headers.get("tracestate"))


@quick_init
@dataclass(frozen=True, slots=True)
class TaskSpec:
    """Everything a submission says about a task; persisted once, never changed."""

    pool: str
    kind: str
    payload: bytes
    key: str | None = None
    tags: tuple[str, ...] = ()
    name: str | None = None
    priority: int = 0
    retry: RetryPolicy = DEFAULT_RETRY
    start_at_ns: int | None = None
    miss_policy: MissPolicy = MissPolicy.RUN_LATE
    grace_ns: int = 60 * NS_PER_S
    deadline_ns: int | None = None
    timeout_ns: int | None = None
    after: tuple[int, ...] = ()
    schedule: str | None = None
    """Name of the schedule that created the task, if any."""
    trace_context: TraceContext | None = None
    """The trace of the code that submitted it, when that code traced (``docs/tracing.md``)."""
    limits: tuple[tuple[str, str | None], ...] = ()
    """The limits it takes, each with its key (None: not per key), sorted by name; its pool's
    limits included (``docs/limits.md``)."""
    rerun_of: int | None = None
    """The finished task this one runs again (``Scheduler.rerun``)."""


@dataclass(frozen=True, slots=True)
class TaskTemplate:
    """The task a schedule creates at each occurrence."""

    pool: str
    kind: str
    payload: bytes
    tags: tuple[str, ...] = ()
    priority: int = 0
    retry: RetryPolicy = DEFAULT_RETRY
    timeout_ns: int | None = None


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A recurring schedule: a cron expression in a time zone and the task it creates."""

    name: str
    cron: str
    timezone: str
    template: TaskTemplate
    overlap: OverlapPolicy = OverlapPolicy.SKIP
    catch_up: CatchUpPolicy = CatchUpPolicy.COALESCE
    grace_ns: int = 60 * NS_PER_S
    """An occurrence later than this is "missed" and handled by ``catch_up``."""
