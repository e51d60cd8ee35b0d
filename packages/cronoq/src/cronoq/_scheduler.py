"""The public facade: ``Scheduler``, ``Pool``, ``TaskRequest``, ``TaskInfo``.

Every call validates its input here, then becomes one engine input that the driver batches into
the next step; the call returns once that step is committed.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

from cronoq import _validate as check
from cronoq._codecs import (
    BytesCodec,
    Codec,
    CodecContext,
    binds_context,
    decode_payload,
    decode_with,
)
from cronoq._cron import CronSchedule
from cronoq._driver import Driver
from cronoq._engine import (
    LEASE_ID_BYTES,
    AddSchedule,
    AttemptFailed,
    AttemptSucceeded,
    AttemptToken,
    CancelTask,
    EngineConfig,
    ExplainTask,
    GetDependants,
    GetTask,
    GetTaskByKey,
    HeartbeatReply,
    ListLimits,
    ListPools,
    ListSchedules,
    ListTasks,
    PausePool,
    PauseSchedule,
    PoolConfig,
    PoolInfo,
    RemoveSchedule,
    RerunTask,
    ResumeSchedule,
    RetryTask,
    SubmitResult,
    SubmitTasks,
    TaskSummary,
    TriggerSchedule,
    error_of,
)
from cronoq._executors import Executor, LocalExecutor, TaskFunction
from cronoq._explain import Explanation, Hold
from cronoq._frozen import quick_init
from cronoq._ingest import Ingester
from cronoq._limits import Limit, LimitInfo, check_limits, limit_keys, pool_limits
from cronoq._memory import MemoryStore
from cronoq._metrics import SchedulerMetrics
from cronoq._model import (
    NS_PER_S,
    CatchUpPolicy,
    MissPolicy,
    OverlapPolicy,
    RetryPolicy,
    ScheduleSpec,
    Status,
    TaskSpec,
    TaskTemplate,
    TraceContext,
)
from cronoq._occurrences import OccurrenceInfo
from cronoq._outbox import (
    MAX_OUTBOX_PAGE,
    OutboxRow,
    OutboxSource,
    OutboxStats,
    QuarantinedRow,
    decode_outbox_options,
)
from cronoq._parents import MAX_PARENT_OUTPUT_BYTES, ParentOutput, load_parent_outputs
from cronoq._remote import LeaseRenewed, RemoteExecutor, RemotePool, WorkerLink
from cronoq._tracebacks import split_traceback, stored_traceback
from cronoq.errors import (
    InvalidArgument,
    PayloadError,
    ScheduleNotFound,
    StaleAttempt,
    TaskError,
    TaskNotFound,
    UnknownLimit,
    UnknownPool,
)
from cronoq.store import MAX_OCCURRENCE_PAGE, ScheduleRecord, Store, TaskRecord

if TYPE_CHECKING:  # the otel extra: imported only when a Scheduler is given tracing
    from opentelemetry.trace import TracerProvider

    from cronoq.tracing import Tracing

__all__ = ["AttemptInfo", "Pool", "ScheduleInfo", "Scheduler", "TaskInfo", "TaskRequest"]

# What a store must have for the Scheduler to run on it (cronoq.store.Store).
_STORE_METHODS = (
    "acquire_leadership",
    "leadership_lost",
    "release_leadership",
    "recover",
    "commit",
    "load_output",
    "get_task",
    "get_task_by_key",
    "get_attempts",
    "close",
)


def _status(value: object) -> Status:
    if isinstance(value, Status):
        return value
    if isinstance(value, str):
        try:
            return Status(value)
        except ValueError:
            pass
    allowed = ", ".join(s.value for s in Status)
    given = check.shown(value) if isinstance(value, str) else type(value).__name__
    raise InvalidArgument(f"status must be among {allowed}, got {given}")


def _utc(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / NS_PER_S, UTC)


def _utc_or_none(ns: int | None) -> datetime | None:
    return None if ns is None else _utc(ns)


MAX_WORKER_SLOTS = 100_000
MAX_REPORT_MESSAGE = 64 * 1024
"""Characters in a worker's failure message (the worker runtime truncates to it)."""


def _token(value: object) -> AttemptToken:
    if not isinstance(value, AttemptToken):
        raise InvalidArgument(f"expected an AttemptToken, got {type(value).__name__}")
    check.integer(value.epoch, "token epoch", 1, 2**63 - 1)
    check.integer(value.task_id, "token task_id", 1, 2**63 - 1)
    check.integer(value.attempt, "token attempt", 1, 2**31 - 1)
    return value


def _lease_id(value: object) -> bytes:
    # Its value is never put in a message: it is a secret.
    if not isinstance(value, bytes):
        raise InvalidArgument(f"lease_id must be bytes, got {type(value).__name__}")
    if len(value) != LEASE_ID_BYTES:
        raise InvalidArgument(
            f"lease_id is {len(value)} bytes long; a lease id is {LEASE_ID_BYTES} bytes "
            "(the one the attempt came with)"
        )
    return value


def _names(value: Iterable[str] | None, what: str) -> frozenset[str] | None:
    """A set of pool or kind names (``submit_specs``'s key scope); None stays None."""
    if value is None:
        return None
    names = check.bounded(
        value, what, "an iterable of names", 100_000, lambda item: check.text(item, what)
    )
    return frozenset(names)


_log = logging.getLogger("cronoq.outbox")


def _row_ids(value: object) -> builtins.list[int]:
    return check.bounded(
        value,
        "row_ids",
        "an iterable of outbox row ids",
        MAX_OUTBOX_PAGE,
        lambda row_id: check.integer(row_id, "outbox row id", 1, check.MAX_TASK_ID),
    )


def _running_attempt(value: object) -> tuple[AttemptToken, bytes]:
    if not isinstance(value, tuple) or len(value) != 2:
        raise InvalidArgument(
            f"each running attempt must be a (token, lease_id) pair, got {type(value).__name__}"
        )
    return _token(value[0]), _lease_id(value[1])


@dataclass(frozen=True, slots=True)
class Pool:
    """A named queue with a concurrency limit and the function that runs its tasks."""

    name: str
    executor: TaskFunction
    concurrency: int = 10
    max_live: int | None = None
    """Bound on live tasks in this pool; submissions beyond it get AdmissionRejected."""
    limits: Sequence[str] = ()
    """Names of the scheduler's limits every task of this pool takes (none of them per key:
    a per-key limit is named by each submission, with its key). See docs/limits.md."""

    def __post_init__(self) -> None:
        check.text(self.name, "pool name")
        if not callable(self.executor):
            raise InvalidArgument(f"pool {self.name!r}: executor must be callable")
        check.integer(self.concurrency, f"pool {self.name!r} concurrency", 1, 1_000_000)
        if self.max_live is not None:
            check.integer(self.max_live, f"pool {self.name!r} max_live", 1, 1 << 40)
        object.__setattr__(self, "limits", pool_limits(self.limits, self.name))


@quick_init
@dataclass(frozen=True, slots=True)
class TaskRequest:
    """One task to submit: the arguments of ``Scheduler.submit()``, for ``submit_many``."""

    kind: str
    payload: Any = None
    """None: no payload, whatever the codec (stored as ``b""``; the function gets None)."""
    pool: str = "default"
    key: str | None = None
    tags: Sequence[str] = ()
    name: str | None = None
    priority: int = 0
    retry: RetryPolicy | None = None
    start_at: datetime | Any = None
    """Aware datetime, or a timedelta from now."""
    miss_policy: MissPolicy | str = MissPolicy.RUN_LATE
    grace: float | Any = 60.0
    deadline: datetime | Any = None
    timeout: float | Any = None
    """Per-attempt timeout, seconds or timedelta."""
    after: Iterable[int] = ()
    trace_context: TraceContext | None = None
    """The trace the task's attempts join (``docs/tracing.md``); a tracing Scheduler sets its
    submission's own when None. cronoq-server sets the one its client sent."""
    limits: Mapping[str, str | None] | None = None
    """The limits it takes, each with its key (None for a limit that is not per key):
    ``{"tenant": "acme", "stripe": None}``. Its pool's limits are added (docs/limits.md)."""

    @property
    def only_kind_payload_pool(self) -> bool:
        """Whether every field but kind, payload and pool holds its default object (not an
        equal value), as most requests do. Fast paths (the Scheduler's checks, the client's
        wire form) then take those fields as their defaults without looking at them."""
        return self.limits is None and self.only_kind_payload_pool_limits

    @property
    def only_kind_payload_pool_limits(self) -> bool:
        """As ``only_kind_payload_pool``, ``limits`` aside (a tenant's tasks name theirs)."""
        return (
            self.key is None
            and (type(self.tags) is tuple and not self.tags)
            and self.name is None
            and (type(self.priority) is int and not self.priority)
            and self.retry is None
            and self.start_at is None
            and self.miss_policy is MissPolicy.RUN_LATE
            and self.grace is _DEFAULT_GRACE
            and self.deadline is None
            and self.timeout is None
            and (type(self.after) is tuple and not self.after)
            and self.trace_context is None
        )


_DEFAULT_GRACE = TaskRequest("").grace
_DEFAULT_GRACE_NS = check.duration_ns(_DEFAULT_GRACE, "grace")


@quick_init
@dataclass(frozen=True, slots=True)
class TaskInfo:
    """A task as the scheduler knows it, with its payload and output decoded."""

    task_id: int
    status: Status
    attempt: int
    message: str
    pool: str
    kind: str
    key: str | None
    tags: tuple[str, ...]
    name: str | None
    priority: int
    payload: Any
    output: Any
    submitted_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    after: tuple[int, ...]
    schedule: str | None
    started_at: datetime | None = None
    """The start of its latest attempt: a running task's (its ``updated_at``), a finished
    one's (its row keeps it; ``wait`` answers with it when an attempt's end finished the
    task). None before the first attempt, and for a live task between attempts (retrying:
    ``attempts`` has the last one's start)."""
    limits: tuple[tuple[str, str | None], ...] = ()
    """The limits it takes with their keys, sorted by name (its pool's included)."""
    waiting_for: str | None = None
    """For a ready task, the limit that holds it back now, and how full it is (``limit
    'tenant' key 'acme': 2 of 2 running``); None when none does."""
    rerun_of: int | None = None
    """The finished task it runs again (``Scheduler.rerun``)."""

    @property
    def error(self) -> str | None:
        """Why it failed, was cancelled or is retrying: its message's first line (the list's
        ``TaskSummary.error``); None in any other status."""
        return error_of(self.status, self.message)

    @property
    def description(self) -> str:
        """``message`` without the traceback kept after its first line: what happened."""
        return split_traceback(self.message)[0]

    @property
    def traceback(self) -> str | None:
        """Where the exception of its last failed attempt was raised, as Python prints it,
        bounded (see docs/concepts.md): kept after the first line of ``message``. None when
        that attempt raised no exception a traceback was kept of (a TaskError, a timeout, a
        lost worker), and for a live task (retrying: its memory keeps none; ``attempts`` has
        each failed attempt's)."""
        return split_traceback(self.message)[1]


@dataclass(frozen=True, slots=True)
class AttemptInfo:
    """An attempt of a task that ended without success (see ``Scheduler.attempts``)."""

    attempt: int
    started_at: datetime
    ended_at: datetime
    message: str
    """The task's message as the attempt's end left it (why it failed, and what followed)."""

    @property
    def description(self) -> str:
        """``message`` without its traceback (see ``TaskInfo.description``)."""
        return split_traceback(self.message)[0]

    @property
    def traceback(self) -> str | None:
        """Where the attempt's exception was raised (see ``TaskInfo.traceback``)."""
        return split_traceback(self.message)[1]


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    name: str
    cron: str
    timezone: str
    kind: str
    pool: str
    paused: bool
    next_run_at: datetime
    last_task_id: int | None
    overlap: OverlapPolicy
    catch_up: CatchUpPolicy


def _pool_limits(pool: Pool | RemotePool, limits: Mapping[str, Limit]) -> tuple[str, ...]:
    """The limits a pool applies, each configured and none per key."""
    for name in pool.limits:
        limit = limits.get(name)
        if limit is None:
            shown = ", ".join(sorted(limits)[:20]) or "none"
            raise UnknownLimit(
                f"pool {pool.name!r} names unknown limit {name!r}; configured: {shown}"
            )
        if limit.per_key:
            raise InvalidArgument(
                f"pool {pool.name!r} names limit {name!r}, which is per key: a pool's limits "
                "hold for all its tasks together; name a per-key limit in each submission"
            )
    return tuple(pool.limits)


def _schedule_info(record: ScheduleRecord) -> ScheduleInfo:
    spec = record.spec
    next_run = _utc(record.next_ns)
    return ScheduleInfo(
        spec.name,
        spec.cron,
        spec.timezone,
        spec.template.kind,
        spec.template.pool,
        record.paused,
        next_run,
        record.last_task_id,
        spec.overlap,
        spec.catch_up,
    )


@dataclass(frozen=True, slots=True)
class CheckedTask:
    """A task ``Scheduler.task_spec()`` checked, for that scheduler's
    ``Scheduler.submit_specs()``: the only way past the checks of a submission."""

    spec: TaskSpec
    issuer: object = field(repr=False, compare=False)


class Scheduler:
    """A durable task scheduler. Use as ``async with Scheduler(...) as sched:``.

    Entering blocks until this instance leads its store's cluster and has recovered. Every call
    returns only after its effect is committed to the store.
    """

    def __init__(
        self,
        pools: Sequence[Pool | RemotePool],
        *,
        store: Store | None = None,
        codec: Codec | None = None,
        commit_timeout: float = 30.0,
        retention: float = 3600.0,
        max_live_tasks: int | None = None,
        max_payload_bytes: int = check.DEFAULT_MAX_PAYLOAD_BYTES,
        seed: int | None = None,
        tracing: bool | TracerProvider = False,
        outbox: OutboxSource | None = None,
        limits: Sequence[Limit] | None = None,
    ) -> None:
        """``tracing``: OpenTelemetry spans of submissions, commits, dispatches and attempts
        (``docs/tracing.md``; needs ``cronoq[otel]``): True for the global tracer provider's,
        or a ``TracerProvider``. Off by default, at no cost.

        ``limits``: the limits tasks and pools may name (``docs/limits.md``).

        ``outbox``: where the leader ingests rows that applications wrote in their own
        transactions (``docs/outbox.md``); None: the store's own (``store.outbox``), if it
        has one (a ``PgStore``'s, unless its config turns it off)."""
        if isinstance(pools, Pool | RemotePool):
            pools = [pools]
        if isinstance(pools, str) or not isinstance(pools, Sequence):
            raise InvalidArgument(f"pools must be a list of Pool, got {type(pools).__name__}")
        if not pools:
            raise InvalidArgument("a Scheduler needs at least one Pool")
        if not all(isinstance(p, Pool | RemotePool) for p in pools):
            raise InvalidArgument("pools must be Pool or RemotePool instances")
        names = [p.name for p in pools]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"pool names must be unique, got {names}")
        # Checked now, not at start(): a str store or a list seed would otherwise fail in
        # start() with AttributeError or TypeError, far from the mistake.
        if codec is not None and (
            isinstance(codec, type)  # JsonCodec instead of JsonCodec()
            or not isinstance(codec, Codec)
            or not (callable(codec.encode) and callable(codec.decode))
        ):
            raise InvalidArgument(
                f"codec must have encode(value) -> bytes and decode(bytes), got "
                f"{type(codec).__name__}"
            )
        if codec is not None and callable(getattr(codec, "encode_for", None)) != callable(
            getattr(codec, "decode_for", None)
        ):
            # One without the other would bind values on one side only: none would decode.
            raise InvalidArgument(
                f"codec {type(codec).__name__} must have both encode_for(value, context) and "
                "decode_for(data, context), or neither"
            )
        if store is not None and not isinstance(store, Store):
            missing = [
                name for name in _STORE_METHODS if not callable(getattr(type(store), name, None))
            ]
            raise InvalidArgument(
                f"store must implement cronoq.store.Store, got {type(store).__name__} "
                f"(missing: {', '.join(missing)})"
            )
        if seed is not None:
            check.integer(seed, "seed", -(2**64), 2**64)
        self._tracing: Tracing | None = None
        if tracing is not False:  # cronoq.tracing (and OpenTelemetry) imported only if asked
            from cronoq.tracing import Tracing

            self._tracing = Tracing.of(tracing)
        self._codec: Codec = codec if codec is not None else BytesCodec()
        # Contexts are made only for a codec that takes them: none on the path of a submit
        # with BytesCodec or JsonCodec.
        self._binds = binds_context(self._codec)
        self._store: Store = store if store is not None else MemoryStore()
        self._max_payload = check.integer(max_payload_bytes, "max_payload_bytes", 1, 1 << 31)
        self._issuer = object()  # what the tasks of its task_spec carry (CheckedTask)
        if max_live_tasks is not None:
            check.integer(max_live_tasks, "max_live_tasks", 1, 1 << 40)
        retention_ns = check.duration_ns(retention, "retention")
        self._limits = {limit.name: limit for limit in check_limits(limits)}
        self._pool_limits = {p.name: _pool_limits(p, self._limits) for p in pools}
        for limit in self._limits.values():
            if (limit.per_ns or 0) > retention_ns:
                raise InvalidArgument(
                    f"limit {limit.name!r}: its window ({limit.per:g}s) is longer than the "
                    f"retention ({retention}s), which a new leader recounts its starts from; "
                    "raise retention or shorten the window"
                )
        config = EngineConfig(
            pools=[
                PoolConfig(
                    p.name,
                    p.concurrency,
                    p.max_live,
                    p.lease_ns if isinstance(p, RemotePool) else None,
                    tuple(p.limits),
                )
                for p in pools
            ],
            retention_ns=retention_ns,
            max_live_tasks=max_live_tasks,
            seed=seed,
            limits=tuple(self._limits.values()),
        )
        self._remote = RemoteExecutor(frozenset(p.name for p in pools if isinstance(p, RemotePool)))
        executors: dict[str, Executor] = {
            p.name: (
                LocalExecutor(
                    p.executor,
                    self._codec,
                    p.concurrency,
                    p.name,
                    self._tracing,
                    self.parent_outputs,
                )
                if isinstance(p, Pool)
                else self._remote
            )
            for p in pools
        }
        self._pools = frozenset(names)
        self._driver = Driver(
            config,
            self._store,
            executors,
            check.duration_ns(commit_timeout, "commit_timeout", allow_zero=False) / NS_PER_S,
            tracing=self._tracing,
        )
        self._remote.bind(self._driver, self._driver.nudge, self._driver.stopped)
        self._started = False
        own = getattr(self._store, "outbox", None)
        own = own if isinstance(own, OutboxSource) else None  # another store's attribute
        if outbox is None:
            outbox = own
        elif not isinstance(outbox, OutboxSource):
            raise InvalidArgument(
                f"outbox must implement cronoq.store.OutboxSource, got {type(outbox).__name__}"
            )
        elif outbox.transactional and outbox is not own:
            # Its rows would be deleted by the commits of a store that does not hold them.
            raise InvalidArgument(
                "a transactional outbox must be the scheduler's own store's (store.outbox); "
                "an outbox elsewhere is PgOutbox.connect(...), which is not transactional"
            )
        self._outbox: OutboxSource | None = outbox
        self._ingester = (
            None
            if outbox is None
            else Ingester(
                outbox,
                lambda: self._driver.epoch,
                self._outbox_spec,
                self._ingest,
                binds=self._binds,
            )
        )
        self._ingesting: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Wait for leadership, recover, and start serving."""
        if self._started:
            raise InvalidArgument("this Scheduler was already started")
        self._started = True
        await self._driver.start()
        if self._ingester is not None:
            self._ingesting = asyncio.get_running_loop().create_task(
                self._ingest_while_leading(self._ingester), name="cronoq-outbox"
            )

    async def _ingest_while_leading(self, ingester: Ingester) -> None:
        run = asyncio.ensure_future(ingester.run())
        stopped = asyncio.ensure_future(self._driver.stopped.wait())
        try:
            await asyncio.wait({run, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            run.cancel()
            stopped.cancel()
        if run.done() and not run.cancelled() and run.exception() is not None:
            _log.error("outbox ingest stopped by a bug", exc_info=run.exception())

    async def close(self, timeout: float = 10.0) -> None:
        """Stop taking calls, let running attempts finish for up to ``timeout`` seconds, commit
        their outcomes and release leadership; returns within ``timeout`` plus one second.

        Attempts still running after that are abandoned: the next leader retries them.
        """
        if self._ingesting is not None:
            self._ingesting.cancel()
        await self._driver.stop(check.duration_ns(timeout, "timeout") / NS_PER_S)

    def abort(self) -> None:
        """Stop at once, as if the process died: nothing more is committed, running attempts
        are cancelled and abandoned (the next leader retries them), waiting callers get
        ``SchedulerStopped``. Leadership is released in the background so that a standby takes
        over at once; ``await close()`` afterwards waits for that release."""
        if self._ingesting is not None:
            self._ingesting.cancel()
        self._driver.abort()

    async def leadership_lost(self) -> None:
        """Return when this instance stops leading (fenced by a successor or store failure)."""
        await self._driver.stopped.wait()

    @property
    def running(self) -> bool:
        return self._started and not self._driver.stopped.is_set()

    @property
    def failure(self) -> BaseException | None:
        """Why the scheduler stopped on its own, if it did."""
        return self._driver.failure

    @property
    def has_outbox(self) -> bool:
        """It ingests an outbox (``Scheduler(outbox=)`` or its store's): the ``outbox_*``
        calls answer, and ``metrics()`` reports its figures. A server or dashboard asks this
        rather than provoking the calls' refusal."""
        return self._outbox is not None

    @property
    def codec(self) -> Codec:
        return self._codec

    @property
    def leading(self) -> bool:
        """True while this instance holds its cluster's leadership: started, with an epoch of
        its own (false while ``start`` still waits for leadership), not stopped."""
        return self.running and self._driver.epoch != 0

    @property
    def epoch(self) -> int | None:
        """The fencing epoch this instance leads under; None before it leads."""
        return self._driver.epoch if self._started and self._driver.epoch else None

    @property
    def workers(self) -> int:
        """Worker links attached now."""
        return self._remote.links

    def metrics(self, *, gauges: bool = True) -> SchedulerMetrics:
        """What this scheduler did since it started, and its queues now (cheap: no I/O; the
        queue depths cost one pass over the live tasks). ``gauges=False`` leaves the queue
        depths and running counts empty, for a caller that samples the counters often (the
        server's dashboard): they cost nothing."""
        driver = self._driver
        counters = driver.counters
        engine = driver.engine
        depth, running = ({}, {}) if engine is None or not gauges else engine.gauges()
        return SchedulerMetrics(
            leading=self.leading,
            epoch=self.epoch,
            submitted=dict(counters.submitted),
            finished=dict(counters.finished),
            retries=dict(counters.retries),
            dead_lettered=dict(counters.dead_lettered),
            attempts_lost=dict(counters.attempts_lost),
            occurrences=dict(counters.occurrences),
            queue_depth=depth,
            running=running,
            commit_seconds=driver.commit_seconds.snapshot(),
            commit_batch_size=driver.commit_batch_size.snapshot(),
            start_delay_seconds=counters.start_delay.snapshot(),
            **self._outbox_metrics(),
        )

    def _outbox_metrics(self) -> dict[str, Any]:
        if self._ingester is None:
            return {}
        ingested = self._ingester.counters
        figures: dict[str, Any] = {
            "outbox_ingested": ingested.ingested,
            "outbox_quarantined": ingested.quarantined,
        }
        stats = ingested.stats
        if stats is not None:
            oldest = stats.oldest_enqueued_unix_ns
            figures["outbox_depth"] = stats.depth
            figures["outbox_quarantine_depth"] = stats.quarantined
            figures["outbox_oldest_age_seconds"] = (
                0.0 if oldest is None else max(time.time_ns() - oldest, 0) / NS_PER_S
            )
        return figures

    @property
    def store(self) -> Store:
        return self._store

    # --- calls ----------------------------------------------------------------------------

    async def _call(self, make: Any) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._driver.call(make(future))
        return await future

    def _pool(self, value: object) -> str:
        pool = check.text(value, "pool")
        if pool not in self._pools:
            raise UnknownPool(
                f"unknown pool {pool!r}; configured: {', '.join(sorted(self._pools))}"
            )
        return pool

    def _spec(self, request: object, now_ns: int) -> TaskSpec:
        if not isinstance(request, TaskRequest):
            raise InvalidArgument(f"expected a TaskRequest, got {type(request).__name__}")
        if request.only_kind_payload_pool_limits:
            # Every field but these four at its default, as most submissions are: the checks
            # of _checked_spec would give the spec's defaults (test_spec_short_path.py).
            pool = self._pool(request.pool)
            kind = check.text(request.kind, "kind")
            payload = self._payload(request.payload, kind, pool, None)
            pool_limits = self._pool_limits[pool]
            if request.limits is None and not pool_limits:
                return TaskSpec(pool, kind, payload)
            limits = limit_keys(request.limits, self._limits, pool_limits)
            return TaskSpec(pool, kind, payload, limits=limits)
        return self._checked_spec(request, now_ns)

    def _checked_spec(self, request: TaskRequest, now_ns: int) -> TaskSpec:
        return self.task_spec(
            now_ns, request.kind, request.payload, request.pool, request.key, request.tags,
            request.name, request.priority, request.retry, request.start_at,
            request.miss_policy, request.grace, request.deadline, request.timeout, request.after,
            request.trace_context, request.limits,
        ).spec  # fmt: skip

    def task_spec(
        self,
        now_ns: int,
        kind: object,
        payload: Any = None,
        pool: object = "default",
        key: object = None,
        tags: object = (),
        name: object = None,
        priority: object = 0,
        retry: object = None,
        start_at: object = None,
        miss_policy: object = MissPolicy.RUN_LATE,
        grace: object = _DEFAULT_GRACE,
        deadline: object = None,
        timeout: object = None,
        after: object = (),
        trace_context: object = None,
        limits: object = None,
    ) -> CheckedTask:
        """One task as ``submit_specs()`` takes it, from the fields of a ``TaskRequest``
        (as its constructor takes them), with every check ``submit_many()`` makes and the
        same errors; delays (a ``timedelta`` ``start_at`` or ``deadline``) count from
        ``now_ns`` (Unix ns).

        For a caller that holds the fields apart, as a server decoding its wire messages does:
        the fields go from the message to the engine's input in one pass, with no
        ``TaskRequest`` in between and no second round of checks.
        """
        pool = self._pool(pool)
        start_at_ns = check.optional_instant_ns(start_at, "start_at", now_ns)
        deadline_ns = check.optional_instant_ns(deadline, "deadline", now_ns)
        if deadline_ns is not None and start_at_ns is not None and deadline_ns <= start_at_ns:
            raise InvalidArgument("deadline must be after start_at")
        kind = check.text(kind, "kind")
        # Positional, in TaskSpec's field order (a quarter faster than keywords: this runs for
        # every task); test_every_request_field_reaches_its_spec_field keeps the order honest.
        spec = TaskSpec(
            pool,
            kind,
            self._payload(payload, kind, pool, key),
            check.optional_text(key, "key", max_length=check.MAX_KEY_LENGTH),
            check.tags(tags),
            check.optional_text(name, "name"),
            check.integer(priority, "priority", -check.MAX_PRIORITY, check.MAX_PRIORITY),
            check.retry(retry),
            start_at_ns,
            check.enum_value(miss_policy, MissPolicy, "miss_policy"),
            # The default grace (one float object) is on the path of nearly every task.
            _DEFAULT_GRACE_NS if grace is _DEFAULT_GRACE else check.duration_ns(grace, "grace"),
            deadline_ns,
            check.optional_duration_ns(timeout, "timeout", allow_zero=False),
            check.dependencies(after),
            None,
            check.trace_context(trace_context),
            limit_keys(limits, self._limits, self._pool_limits[pool]),
        )
        return CheckedTask(spec, self._issuer)

    def _payload(self, value: Any, kind: str, pool: str, key: object) -> bytes:
        """A payload encoded for its task (checked kind and pool), within the limit.

        The key is checked here only for a codec that binds it (CodecContext): for any other,
        a bad payload is reported before a bad key, as it always was.
        """
        context = None
        if self._binds and value is not None:
            key = check.optional_text(key, "key", max_length=check.MAX_KEY_LENGTH)
            context = CodecContext("payload", kind, pool, key)
        return check.payload(self._codec, value, self._max_payload, context)

    def _context(self, spec: TaskSpec, task_id: int | None = None) -> CodecContext | None:
        """The context of a task's payload (or, with its id, output), if the codec takes one."""
        if not self._binds:
            return None
        role: Literal["payload", "output"] = "payload" if task_id is None else "output"
        return CodecContext(role, spec.kind, spec.pool, spec.key, task_id)

    def payload_specs(self, template: CheckedTask, payloads: Iterable[Any]) -> list[CheckedTask]:
        """One task per payload, each ``template`` (made by ``task_spec()``) with that
        payload, checked as ``task_spec()`` checks a payload: the tasks of a bulk submission,
        whose other fields are checked once for all of them (at most ``MAX_BATCH``)."""
        t = self._issued(template).spec
        codec, limit, issuer = self._codec, self._max_payload, self._issuer
        context = self._context(t)  # the same for every payload: one kind, pool and key
        return check.bounded(
            payloads,
            "payload_specs payloads",
            "an iterable of payloads",
            check.MAX_BATCH,
            lambda p: CheckedTask(
                TaskSpec(
                    t.pool, t.kind, check.payload(codec, p, limit, context), t.key, t.tags, t.name,
                    t.priority, t.retry, t.start_at_ns, t.miss_policy, t.grace_ns,
                    t.deadline_ns, t.timeout_ns, t.after, t.schedule, t.trace_context, t.limits,
                ),
                issuer,
            ),
        )  # fmt: skip

    def _outbox_spec(self, now_ns: int, row: OutboxRow) -> TaskSpec:
        """An outbox row's task, checked as a submission with its payload already encoded;
        ``CronoqError`` says why the row cannot become one (it is quarantined)."""
        spec = self.task_spec(now_ns, row.kind, None, **decode_outbox_options(row.options)).spec
        if len(row.payload) > self._max_payload:
            raise PayloadError(
                f"payload is {len(row.payload)} bytes, over the limit of {self._max_payload}"
            )
        if not isinstance(self._codec, BytesCodec):
            decode_payload(self._codec, row.payload, self._context(spec))
        return dataclasses.replace(spec, payload=row.payload)

    # --- the outbox -----------------------------------------------------------------------

    def _outbox_source(self) -> OutboxSource:
        if self._outbox is None:
            raise InvalidArgument(
                "this scheduler has no outbox: give Scheduler(outbox=...) or a store with one "
                "(docs/outbox.md)"
            )
        return self._outbox

    async def outbox_stats(self) -> OutboxStats:
        """Rows waiting in the outbox, the oldest one's enqueue time, rows quarantined."""
        return await self._outbox_source().stats()

    async def outbox_quarantine(
        self, *, after: int = 0, limit: int = 100
    ) -> builtins.list[QuarantinedRow]:
        """Quarantined outbox rows with ids above ``after``, in id order (at most ``limit``,
        1 to 1,000), each with the reason it could not become a task."""
        source = self._outbox_source()
        after = check.integer(after, "after", 0, check.MAX_TASK_ID)
        limit = check.integer(limit, "limit", 1, MAX_OUTBOX_PAGE)
        return builtins.list(await source.quarantined(after, limit))

    async def requeue_outbox(self, row_ids: Iterable[int]) -> int:
        """Move quarantined rows back to the outbox, once their cause is fixed (the pool
        configured, the option corrected by SQL); return how many moved."""
        source = self._outbox_source()
        return await source.requeue(_row_ids(row_ids))

    async def discard_outbox(self, row_ids: Iterable[int]) -> int:
        """Delete quarantined rows for good; return how many."""
        source = self._outbox_source()
        return await source.discard(_row_ids(row_ids))

    async def _ingest(self, specs: builtins.list[TaskSpec], row_ids: tuple[int, ...]) -> object:
        return await self._call(lambda f: SubmitTasks(specs, f, outbox=row_ids))

    def _issued(self, task: object) -> CheckedTask:
        if type(task) is not CheckedTask or task.issuer is not self._issuer:
            raise InvalidArgument(
                "expected a task made by this scheduler's task_spec or payload_specs, "
                f"got {type(task).__name__}"
            )
        return task

    async def submit(self, kind: str, payload: Any = None, **options: Any) -> int:
        """Submit one task; return its id (the existing task's id if its key is held).

        Options are the fields of ``TaskRequest``. ``payload=None`` means no payload, for
        every codec: the function receives None.
        """
        try:
            request = TaskRequest(kind, payload, **options)
        except TypeError as exc:
            raise InvalidArgument(str(exc)) from None
        results: list[SubmitResult] = await self._submit_specs(
            [self._spec(request, time.time_ns())]
        )
        return results[0].task_id

    async def submit_many(self, requests: Iterable[TaskRequest]) -> list[int]:
        """Submit several tasks in one step: all are accepted, or none is.

        At most ``MAX_BATCH`` (100,000) per call; the iterable is read one request at a time,
        so an endless one is refused after that many.
        """
        now = time.time_ns()
        if type(requests) is list and len(requests) <= check.MAX_BATCH:
            # What bounded() makes of a list within the limit, without its per-item calls.
            specs = [self._spec(request, now) for request in requests]
        else:
            specs = check.bounded(
                requests,
                "submit_many requests",
                "an iterable of TaskRequest",
                check.MAX_BATCH,
                lambda request: self._spec(request, now),
            )
        return await self._submit_all(specs)

    async def submit_specs(
        self,
        tasks: builtins.list[CheckedTask],
        *,
        key_pools: Iterable[str] | None = None,
        key_kinds: Iterable[str] | None = None,
    ) -> builtins.list[int]:
        """Submit tasks made by this scheduler's ``task_spec()`` or ``payload_specs()``
        in one step, as ``submit_many()`` does (all or none; at most ``MAX_BATCH``), without
        checking their fields again; anything else is refused with ``InvalidArgument``.

        ``key_pools``, ``key_kinds``: the pools and kinds whose tasks a key may be answered
        with (None: any). A key held by a task of another pool or kind refuses the call with
        ``PermissionDenied`` (permission ``submit``), before anything is applied and without
        naming that task: a server gives its caller's grant, so that a caller limited to some
        pools cannot learn the ids of other pools' tasks by submitting their keys."""
        if type(tasks) is not list:
            raise InvalidArgument(f"expected a list of tasks, got {type(tasks).__name__}")
        if len(tasks) > check.MAX_BATCH:
            raise InvalidArgument(f"at most {check.MAX_BATCH} tasks per call, got {len(tasks)}")
        specs = [self._issued(task).spec for task in tasks]
        pools = _names(key_pools, "key_pools")
        kinds = _names(key_kinds, "key_kinds")
        return await self._submit_all(specs, pools, kinds)

    async def _submit_all(
        self,
        specs: builtins.list[TaskSpec],
        key_pools: frozenset[str] | None = None,
        key_kinds: frozenset[str] | None = None,
    ) -> builtins.list[int]:
        if not specs:
            return []
        return [r.task_id for r in await self._submit_specs(specs, key_pools, key_kinds)]

    async def _submit_specs(
        self,
        specs: builtins.list[TaskSpec],
        key_pools: frozenset[str] | None = None,
        key_kinds: frozenset[str] | None = None,
    ) -> builtins.list[SubmitResult]:
        if self._tracing is not None:
            return await self._traced_submit(self._tracing, specs, key_pools, key_kinds)
        result: builtins.list[SubmitResult] = await self._call(
            lambda f: SubmitTasks(specs, f, key_pools, key_kinds)
        )
        return result

    async def _traced_submit(
        self,
        tracing: Tracing,
        specs: list[TaskSpec],
        key_pools: frozenset[str] | None,
        key_kinds: frozenset[str] | None,
    ) -> list[SubmitResult]:
        if all(spec.trace_context is not None for spec in specs):
            # A server's, carrying its client's submission span: the call's span covers it.
            result: list[SubmitResult] = await self._call(
                lambda f: SubmitTasks(specs, f, key_pools, key_kinds)
            )
            return result
        with tracing.submit([spec.pool for spec in specs], len(specs)) as span:
            context = tracing.context_of(span)  # None when the span is not sampled
            if context is not None:
                specs = [
                    spec
                    if spec.trace_context is not None
                    else dataclasses.replace(spec, trace_context=context)
                    for spec in specs
                ]
            result = await self._call(lambda f: SubmitTasks(specs, f, key_pools, key_kinds))
            tracing.submitted(span, [r.task_id for r in result])
        return result

    async def get(self, task_id: int) -> TaskInfo:
        """The task with this id. Raises TaskNotFound if it is unknown or pruned."""
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        try:
            found = await self._call(lambda f: GetTask(task_id, f))
        except TaskNotFound:
            return await self._stored(task_id)
        return await self._info(found, task_id)

    async def attempts(self, task_id: int) -> builtins.list[AttemptInfo]:
        """The task's attempts that ended without success (failed, timed out, lost,
        cancelled or stopped while they ran), oldest first: the latest ``ATTEMPTS_KEPT``
        (25) the store keeps. A successful attempt is the task itself (``get``: succeeded,
        its attempt, its finish time), and so is a running one (its ``updated_at`` is the
        attempt's start). Raises TaskNotFound if the task is unknown or pruned."""
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        try:
            await self._call(lambda f: GetTask(task_id, f))
        except TaskNotFound:
            await self._require_stored(task_id)
        rows = await self._store.get_attempts(task_id)
        return [
            AttemptInfo(row.attempt, _utc(row.started_ns), _utc(row.ended_ns), row.message)
            for row in rows
        ]

    async def dependants(self, task_id: int) -> builtins.list[int]:
        """The ids of the tasks that depend on this one (name it in ``after``), ascending,
        as the scheduler's memory knows them: for a live task, every task that named it
        while it was live, under this leader (or waiting for it at this leader's recovery);
        for a finished one inside the retention, those its live life had under this leader.
        Empty for a task finished before this leader recovered, or before the retention:
        only a scan of the store's rows could tell. Raises TaskNotFound if the task is
        unknown or pruned."""
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        try:
            found: builtins.list[int] = await self._call(lambda f: GetDependants(task_id, f))
        except TaskNotFound:
            await self._require_stored(task_id)
            return []
        return found

    async def _require_stored(self, task_id: int) -> None:
        """Raise TaskNotFound, as ``get`` does, unless the store keeps the task."""
        if await self._store.get_task(task_id) is None:
            raise TaskNotFound(f"no task {task_id}")

    async def _stored(self, task_id: int) -> TaskInfo:
        """A task memory no longer holds (finished before the retention) but the store keeps
        until ``keep_finished``."""
        record = await self._store.get_task(task_id)
        if record is None:
            raise TaskNotFound(f"no task {task_id}")
        return self._decode(record)

    async def get_by_key(self, key: str) -> TaskInfo | None:
        """The task holding ``key`` (live or finished within the retention), or None."""
        check.text(key, "key", max_length=check.MAX_KEY_LENGTH)
        found = await self._call(lambda f: GetTaskByKey(key, f))
        if found is None:
            record = await self._store.get_task_by_key(key)
            return None if record is None else self._decode(record)
        return await self._info(found, None)

    async def wait(self, task_id: int, timeout: float | None = None) -> TaskInfo:
        """Wait until the task is terminal; return it with its output.

        ``timeout`` (seconds) bounds the wait for a live task: past it, ``WaitTimedOut`` (a
        ``TimeoutError``) is raised and the task carries on. A finished task is returned even
        with ``timeout=0``. Raises ``SchedulerStopped`` if the scheduler stops meanwhile.
        """
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        seconds = None if timeout is None else check.duration_ns(timeout, "timeout") / NS_PER_S
        try:
            found = await self._driver.wait(task_id, seconds)
        except TaskNotFound:
            return await self._stored(task_id)
        return await self._info(found, task_id)  # type: ignore[arg-type]

    async def _info(self, found: TaskRecord | TaskSummary, task_id: int | None) -> TaskInfo:
        if isinstance(found, TaskRecord):
            return self._decode(found)
        # A finished task: memory keeps only a summary; the store has the rest.
        record = await self._store.get_task(found.task_id)
        if record is None:
            raise TaskNotFound(f"task {task_id or found.task_id} was pruned from the store")
        return self._decode(record)

    def _decode(self, record: TaskRecord) -> TaskInfo:
        """The record with payload and output decoded; PayloadError if the codec cannot.

        Only a call about this task raises: the record stays as it is, and every other task,
        ``list()`` and the scheduler carry on. The error says the task's status and message,
        since a task whose payload cannot be decoded has failed for that reason.
        """
        spec = record.spec
        try:
            payload = decode_payload(self._codec, spec.payload, self._context(spec))
            output = None
            if record.output is not None and record.status is Status.SUCCEEDED:
                context = self._context(spec, record.task_id)
                output = decode_with(self._codec, record.output, "output", context)
        except InvalidArgument as exc:  # PayloadError, or a row no CodecContext can describe
            message = record.message
            if len(message) > 200:
                message = f"{message[:200]}..."
            raise PayloadError(
                f"task {record.task_id} ({record.status}: {message}): {exc}"
            ) from exc
        return TaskInfo(
            task_id=record.task_id,
            status=record.status,
            attempt=record.attempt,
            message=record.message,
            pool=spec.pool,
            kind=spec.kind,
            key=spec.key,
            tags=spec.tags,
            name=spec.name,
            priority=spec.priority,
            payload=payload,
            output=output,
            submitted_at=_utc(record.submitted_ns),
            updated_at=_utc(record.updated_ns),
            finished_at=_utc_or_none(record.finished_ns),
            after=spec.after,
            schedule=spec.schedule,
            started_at=_utc_or_none(record.started_ns),
            limits=spec.limits,
            rerun_of=spec.rerun_of,
            waiting_for=record.waiting_for,
        )

    async def list(
        self,
        *,
        status: Status | str | Iterable[Status | str] | None = None,
        pool: str | None = None,
        kind: str | None = None,
        tag: str | None = None,
        limit: int | None = None,
        after: int | None = None,
        before: int | None = None,
        newest_first: bool = False,
    ) -> list[TaskSummary]:
        """Tasks in memory (live, and finished within the retention), filtered, in ascending
        id (submission) order, or the newest first with ``newest_first``. Only ids above
        ``after`` and below ``before``, ``limit`` at most: the last id of a page is the
        ``after`` of the next one oldest first, and its ``before`` newest first."""
        statuses: frozenset[Status] | None = None
        if status is not None:
            items = [status] if isinstance(status, str) else status
            # Read one at a time against a bound: status=itertools.repeat("ready") must not hang.
            expected = "a Status, a str or an iterable of them"
            statuses = frozenset(
                check.bounded(items, "status", expected, check.MAX_STATUSES, _status)
            )
        pool = check.optional_text(pool, "pool")
        kind = check.optional_text(kind, "kind")
        tag = check.optional_text(tag, "tag")
        if limit is not None:
            check.integer(limit, "limit", 1, 1 << 40)
        if after is not None:
            check.integer(after, "after", 0, 2**63 - 1)
        if before is not None:
            check.integer(before, "before", 0, 2**63 - 1)
        check.flag(newest_first, "newest_first")
        result: list[TaskSummary] = await self._call(
            lambda f: ListTasks(f, statuses, pool, kind, tag, limit, after, before, newest_first)
        )
        return result

    async def cancel(self, task_id: int, reason: str = "cancelled by request") -> Status:
        """Cancel a task. Queued: it ends ``cancelled`` now. Running: its attempt is asked to
        stop, and this returns ``running``; the task ends ``cancelled`` when the attempt stops.
        Finished: nothing changes and its final status is returned."""
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        check.text(reason, "reason", max_length=4096)
        try:
            result: Status = await self._call(lambda f: CancelTask(task_id, reason, f))
        except TaskNotFound:
            return (await self._stored(task_id)).status  # finished long ago: nothing to do
        return result

    async def retry(self, task_id: int) -> TaskInfo:
        """Make a failed (dead-lettered) or cancelled task live again, and return it.

        It goes back to ready (scheduled if its fixed start is still ahead, waiting if a
        dependency is live again). Its attempts keep counting: the next one is its last + 1,
        and if it had used every attempt its retry policy allows, the policy allows exactly
        that one more (one with attempts left keeps them). It takes its key back. Dependants
        its failure already failed or cancelled stay so (retry each in turn; it then waits for
        this one). Raises ``NotRetryable`` for a live or succeeded task, and when running it
        could not work: its deadline passed, another live task holds its key now, one of its
        dependencies failed or was cancelled, it used the most attempts a task may have (1000)
        or its row was quarantined; ``TaskNotFound`` if it is unknown or pruned.
        """
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        # Memory keeps no spec of a finished task: the store's row gives it.
        record = await self._store.get_task(task_id)
        message = "retried by request"
        retried: TaskRecord = await self._call(lambda f: RetryTask(task_id, record, message, f))
        return self._decode(retried)

    async def rerun(self, task_id: int) -> int:
        """Run a finished task again, as a new task: the id of the new task, whose
        ``rerun_of`` names this one. Unlike ``retry``, which continues the same failed or
        cancelled task (its attempts keep counting), this works for a succeeded task too,
        and leaves the original as it ended.

        The new task has the original's spec (pool, kind, payload, tags, priority, retry,
        timeout, limits still configured, parents), starts now (the original's fixed start
        and deadline are not copied), is no schedule's occurrence, and takes the original's
        key over. Raises ``NotRetryable`` for a live task, a task another live task's key
        blocks, a quarantined row, or a parent that failed or was cancelled;
        ``TaskNotFound`` if it is unknown or pruned; ``AdmissionRejected`` if its pool is
        full."""
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        record = await self._store.get_task(task_id)  # memory keeps no finished spec
        new_id: int = await self._call(lambda f: RerunTask(task_id, record, f))
        return new_id

    async def explain(self, task_id: int) -> Explanation:
        """What holds the task now, since when, and what would release it (``Hold``): its
        dependencies, a start time, a retry backoff, its pool full or paused, a limit, no
        worker slot for its remote pool, a stopped attempt still holding its slot, or no
        leader; for a running task its attempt (and a remote one's worker and lease end);
        for a finished one how it ended. Raises TaskNotFound if it is unknown or pruned."""
        check.integer(task_id, "task_id", 1, 2**63 - 1)
        if not self.leading:
            return await self._explain_stored(task_id)
        try:
            found: Explanation = await self._call(lambda f: ExplainTask(task_id, f))
        except TaskNotFound:
            return await self._explain_stored(task_id)
        if found.hold in (Hold.RUNNING, Hold.CANCELLING):
            worker = self._remote.worker_of(task_id, found.attempt)
            if worker is not None:
                found = dataclasses.replace(found, worker=worker)
        return found

    async def _explain_stored(self, task_id: int) -> Explanation:
        """From the store's row, when memory cannot say: a task finished before the
        retention, or any task while this scheduler does not lead."""
        record = await self._store.get_task(task_id)
        if record is None:
            raise TaskNotFound(f"no task {task_id}")
        since = _utc(record.updated_ns)
        pool = record.spec.pool
        if record.status.is_terminal:
            return Explanation.finished(
                task_id, record.status, record.attempt, since, record.message, pool
            )
        return Explanation(
            task_id,
            record.status,
            Hold.LEADER_CHANGE,
            f"no leader here: this scheduler {'is taking over' if self.running else 'stopped'}; "
            "the task waits for a leader, which starts it or counts its attempt",
            since,
            None,
            record.attempt,
            pool=pool,
        )

    async def parent_outputs(
        self, after: Sequence[int], *, max_bytes: int = MAX_PARENT_OUTPUT_BYTES
    ) -> builtins.list[ParentOutput]:
        """The stored outputs of these parents, as encoded (``ParentOutput``), for a worker
        to decode with its codec (``decode_parent_outputs``); a parent the store no longer
        keeps, or that did not succeed, is left out. PayloadError past ``max_bytes`` of them
        (64 MiB by default): memory never holds more."""
        parents = check.dependencies(after)
        check.integer(max_bytes, "max_bytes", 0, 2**40)
        return await load_parent_outputs(self._store, parents, max_bytes)

    # --- pools ----------------------------------------------------------------------------

    async def pause_pool(self, name: str) -> PoolInfo:
        """Start no new attempt in this pool, local or remote, until it is resumed; attempts
        running finish. Durable: the pause survives a restart and a failover. Pausing a paused
        pool changes nothing."""
        return await self._pool_call(name, paused=True)

    async def resume_pool(self, name: str) -> PoolInfo:
        """Let a paused pool start attempts again, in its queue's order."""
        return await self._pool_call(name, paused=False)

    async def _pool_call(self, name: str, *, paused: bool) -> PoolInfo:
        pool = self._pool(name)
        info: PoolInfo = await self._call(lambda f: PausePool(pool, paused, f))
        return info

    async def list_pools(self) -> builtins.list[PoolInfo]:
        """Every configured pool: its concurrency, whether it is paused, its attempts running
        and its live tasks by status."""
        pools: builtins.list[PoolInfo] = await self._call(lambda f: ListPools(f))
        return pools

    async def list_limits(self, *, keys: int = 20) -> builtins.list[LimitInfo]:
        """Every configured limit with its use now: keys in use, attempts running, starts in
        the current rate window and tasks waiting, in total and for its ``keys`` busiest
        keys (0..1000)."""
        top = check.integer(keys, "keys", 0, 1000)
        limits: builtins.list[LimitInfo] = await self._call(lambda f: ListLimits(f, top))
        return limits

    # --- remote workers -------------------------------------------------------------------

    def attach(
        self,
        pools: Iterable[str],
        slots: int,
        *,
        running: Iterable[tuple[AttemptToken, bytes]] = (),
        name: str = "",
    ) -> WorkerLink:
        """Attach a remote worker that runs attempts of these remote pools, ``slots`` at a
        time; attempts leased to it and cancellations arrive on the returned link.

        ``running`` names the attempts the worker still runs from an earlier link or an
        earlier leader, as (token, lease id) pairs: each keeps a slot on this one until the
        worker reports it. ``name``: what the worker calls itself (host and pid, say), shown
        by ``explain`` for its attempts. Close the link when the worker goes away.
        """
        names = frozenset(
            check.bounded(pools, "pools", "an iterable of pool names", 1000, self._remote_pool)
        )
        if not names:
            raise InvalidArgument("a worker must attach to at least one pool")
        check.integer(slots, "slots", 1, MAX_WORKER_SLOTS)
        tokens = check.bounded(
            running,
            "running",
            "an iterable of (AttemptToken, lease_id) pairs",
            MAX_WORKER_SLOTS,
            _running_attempt,
        )
        if not self.running:
            raise self._driver.failure_error()
        name = "" if isinstance(name, str) and not name else check.text(name, "worker name")
        return self._remote.attach(names, slots, self._driver.stopped, tokens, name)

    def _remote_pool(self, value: object) -> str:
        pool = self._pool(value)
        if pool not in self._remote.pools:
            raise InvalidArgument(f"pool {pool!r} runs in this process: it has no remote workers")
        return pool

    def remote_attempt_pool(self, token: AttemptToken, *, lease_id: bytes) -> str | None:
        """The pool of a remote attempt leased with ``lease_id`` and not reported yet, by
        this scheduler or by an earlier leader (an attempt it adopted), without a step (a
        server checks a worker's permission with it). None for any other caller or attempt,
        whatever it is: a guessed token learns nothing, and the scheduler's own answer to that
        caller is "unknown"."""
        token, lease_id = _token(token), _lease_id(lease_id)
        pool = self._remote.pool_of(token, lease_id)
        engine = self._driver.engine
        if pool is None and engine is not None:
            pool = engine.attempt_pool(token, lease_id)
        return pool

    async def heartbeat(self, token: AttemptToken, *, lease_id: bytes) -> LeaseRenewed:
        """Extend the lease of a remote attempt; learn whether it should stop.

        ``lease_id`` is the one the attempt came with. An attempt the scheduler stopped (its
        timeout, its deadline, a cancellation) that still runs is answered ``stopped``: keep
        heartbeating it until the function returns, then report it. Raises StaleAttempt
        (nothing changes) otherwise: an earlier attempt, an earlier leader's attempt not
        adopted, an expired lease, a finished task, or an attempt unknown with that lease id;
        the worker should still report the attempt once its function returns, to free its slot.
        """
        _token(token)
        _lease_id(lease_id)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._driver.heartbeat(token, lease_id, future)
        try:
            reply: HeartbeatReply = await future
        except StaleAttempt:
            self._remote.heard(token, lease_id)  # alive, if late: its link may lease again
            raise
        assert reply.lease_expires_ns is not None, "a remote attempt has a lease"
        self._remote.renewed(token, lease_id, reply.lease_expires_ns)
        return LeaseRenewed(_utc(reply.lease_expires_ns), reply.cancel_reason, reply.stopped)

    async def report_success(
        self, token: AttemptToken, output: bytes | None = None, *, lease_id: bytes
    ) -> None:
        """A remote attempt succeeded with ``output`` (as the client's codec made it).
        Returns once committed; StaleAttempt if it is not current (nothing changes)."""
        _token(token)
        _lease_id(lease_id)
        if output is not None:
            if not isinstance(output, bytes):
                raise InvalidArgument(f"output must be bytes or None, got {type(output).__name__}")
            if len(output) > self._max_payload:
                raise InvalidArgument(
                    f"output is {len(output)} bytes; the limit is {self._max_payload}"
                )
        await self._report(token, AttemptSucceeded(output), lease_id)

    async def report_failure(
        self,
        token: AttemptToken,
        message: str,
        *,
        lease_id: bytes,
        retryable: bool = True,
        retry_after: float | Any = None,
        traceback: str = "",
    ) -> None:
        """A remote attempt failed; ``retryable`` and ``retry_after`` as for TaskError, and
        the ``traceback`` of its exception ("": none), cut to ``MAX_TRACEBACK`` characters
        as a local one is. Returns
        once committed; StaleAttempt if it is not current (nothing changes)."""
        _token(token)
        _lease_id(lease_id)
        if isinstance(message, str) and len(message) > MAX_REPORT_MESSAGE:
            raise InvalidArgument(
                f"message is {len(message)} characters long; the limit is {MAX_REPORT_MESSAGE}"
            )
        if not isinstance(traceback, str):
            raise InvalidArgument(f"traceback must be a str, got {type(traceback).__name__}")
        # Any length is cut to MAX_TRACEBACK, not refused: a worker in another language may
        # send a longer stack, and refusing the report would lose the attempt's outcome.
        error = TaskError(message, retryable=retryable, retry_after=retry_after)  # validates
        failed = AttemptFailed(
            message, retryable, error.retry_after_ns, stored_traceback(traceback)
        )
        await self._report(token, failed, lease_id)

    async def _report(
        self, token: AttemptToken, outcome: AttemptSucceeded | AttemptFailed, lease_id: bytes
    ) -> None:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._driver.report(token, outcome, future, remote=True, lease_id=lease_id)
        try:
            await future
        finally:
            # The worker is done with it whatever the answer (applied, stale, or unknown and
            # retried by the worker), and even if this caller gave up: the report stays queued.
            self._remote.reported(token, lease_id)

    # --- schedules ------------------------------------------------------------------------

    async def add_schedule(
        self,
        name: str,
        cron: str,
        *,
        kind: str,
        payload: Any = None,
        pool: str = "default",
        timezone: str = "UTC",
        tags: Sequence[str] = (),
        priority: int = 0,
        retry: RetryPolicy | None = None,
        timeout: float | Any = None,
        overlap: OverlapPolicy | str = OverlapPolicy.SKIP,
        catch_up: CatchUpPolicy | str = CatchUpPolicy.COALESCE,
        grace: float | Any = 60.0,
        replace: bool = False,
        **unknown: Any,
    ) -> ScheduleInfo:
        """Create a recurring schedule (or replace one of that name with ``replace=True``).

        Replacing keeps the schedule's pause: a redeploy that re-registers its schedules does
        not resume one an operator paused.
        """
        if unknown:
            # As submit does, instead of Python's TypeError for an unexpected keyword.
            raise InvalidArgument(f"add_schedule got unknown options: {', '.join(sorted(unknown))}")
        check.flag(replace, "replace")
        name = check.text(name, "schedule name")
        pool = self._pool(pool)
        parsed = CronSchedule.parse(cron, timezone)
        kind = check.text(kind, "kind")
        spec = ScheduleSpec(
            name=name,
            cron=parsed.expression,
            timezone=parsed.timezone,
            template=TaskTemplate(
                pool=pool,
                kind=kind,
                # Its tasks have no key (TaskSpec of a schedule's occurrence).
                payload=self._payload(payload, kind, pool, None),
                tags=check.tags(tags),
                priority=check.integer(
                    priority, "priority", -check.MAX_PRIORITY, check.MAX_PRIORITY
                ),
                retry=check.retry(retry),
                timeout_ns=check.optional_duration_ns(timeout, "timeout", allow_zero=False),
            ),
            overlap=check.enum_value(overlap, OverlapPolicy, "overlap"),
            catch_up=check.enum_value(catch_up, CatchUpPolicy, "catch_up"),
            grace_ns=check.duration_ns(grace, "grace"),
        )
        record: ScheduleRecord = await self._call(lambda f: AddSchedule(spec, replace, f))
        return _schedule_info(record)

    async def pause_schedule(self, name: str) -> ScheduleInfo:
        return await self._schedule_call(name, PauseSchedule)

    async def resume_schedule(self, name: str) -> ScheduleInfo:
        """Resume from the next occurrence after now; those missed while paused do not run."""
        return await self._schedule_call(name, ResumeSchedule)

    async def _schedule_call(
        self, name: str, make: type[PauseSchedule | ResumeSchedule]
    ) -> ScheduleInfo:
        check.text(name, "schedule name")
        record: ScheduleRecord = await self._call(lambda f: make(name, f))
        return _schedule_info(record)

    async def trigger_schedule(self, name: str) -> int | None:
        """Run one occurrence of the schedule now, through its overlap policy: the id of the
        task it created, or None if its last task is still live and its overlap policy is
        ``skip``. Its timetable does not move, and a paused schedule stays paused."""
        check.text(name, "schedule name")
        task_id: int | None = await self._call(lambda f: TriggerSchedule(name, f))
        return task_id

    async def remove_schedule(self, name: str) -> None:
        """Remove a schedule; tasks it already created carry on."""
        check.text(name, "schedule name")
        await self._call(lambda f: RemoveSchedule(name, f))

    async def list_schedules(self) -> builtins.list[ScheduleInfo]:
        records: builtins.list[ScheduleRecord] = await self._call(lambda f: ListSchedules(f))
        return [_schedule_info(r) for r in records]

    async def occurrences(
        self, name: str, *, before: datetime | None = None, limit: int = 100
    ) -> builtins.list[OccurrenceInfo]:
        """The schedule's occurrence ledger, newest first: what became of each occurrence
        that came due (``OccurrenceInfo``), kept as long as the store keeps finished tasks,
        also after the schedule was removed. Page with ``before`` (the ``due_at`` of a page's
        last record; only records due before it). At most ``limit`` (1 to 1,000) records.
        Raises ScheduleNotFound if no such schedule exists and none is recorded."""
        name = check.text(name, "schedule name")
        check.integer(limit, "limit", 1, MAX_OCCURRENCE_PAGE)
        before_ns = None
        if before is not None:  # any year: a bound past int64 reads as "all"
            before_ns = min(max(check.unix_ns(before, "before"), -(2**63)), 2**63 - 1)
        records = await self._store.get_occurrences(name, before_ns, limit)
        # Whether it exists is the leader's to say: a standby answers with what is recorded.
        if not records and before_ns is None and self.leading:
            schedules: builtins.list[ScheduleRecord] = await self._call(ListSchedules)
            if all(record.spec.name != name for record in schedules):
                raise ScheduleNotFound(f"no schedule named {name!r}")
        return [OccurrenceInfo.of(record) for record in records]


def preview(
    cron: str, timezone: str = "UTC", n: int = 10, *, after: datetime | None = None
) -> list[datetime]:
    """The next ``n`` occurrences of a cron expression as UTC datetimes (DST applied)."""
    parsed = CronSchedule.parse(cron, timezone)
    start = time.time_ns() if after is None else check.instant_ns(after, "after", time.time_ns())
    return [_utc(ns) for ns in parsed.preview(start, n)]
