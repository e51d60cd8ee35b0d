"""cronoq: a durable task scheduler for asyncio.

The public API is what this module exports; everything in ``_``-prefixed modules is private.
Store authors also use ``cronoq.store``; every exception lives in ``cronoq.errors``.
"""

from cronoq._codecs import (
    BytesCodec,
    Codec,
    CodecContext,
    ContextCodec,
    JsonCodec,
    binds_context,
    decode_with,
    encode_with,
)
from cronoq._engine import LEASE_ID_BYTES, AttemptToken, PoolInfo, TaskSummary
from cronoq._executors import TaskContext
from cronoq._explain import Explanation, Hold
from cronoq._limits import Limit, LimitInfo, LimitKeyInfo, OnFull
from cronoq._memory import MemoryStore
from cronoq._metrics import Histogram, SchedulerMetrics
from cronoq._model import (
    CatchUpPolicy,
    MissPolicy,
    OccurrenceOutcome,
    OverlapPolicy,
    RetryPolicy,
    Status,
    TraceContext,
)
from cronoq._occurrences import OccurrenceInfo
from cronoq._parents import ParentOutput, decode_parent_outputs
from cronoq._remote import (
    CancelRequested,
    LeasedAttempt,
    LeaseRenewed,
    RemotePool,
    WorkerInfo,
    WorkerLink,
)
from cronoq._scheduler import (
    AttemptInfo,
    CheckedTask,
    Pool,
    ScheduleInfo,
    Scheduler,
    TaskInfo,
    TaskRequest,
    preview,
)
from cronoq._tracebacks import MAX_TRACEBACK, Raised, call_catching, format_traceback
from cronoq._validate import MAX_BATCH, unix_ns
from cronoq.errors import (
    AdmissionRejected,
    CronoqError,
    InvalidArgument,
    LimitFull,
    NotRetryable,
    PayloadError,
    SchedulerError,
    SchedulerStopped,
    StaleAttempt,
    TaskError,
    UnknownLimit,
    UnknownPool,
    WaitTimedOut,
    WorkerDetached,
)

__all__ = [
    "LEASE_ID_BYTES",
    "MAX_BATCH",
    "MAX_TRACEBACK",
    "AdmissionRejected",
    "AttemptInfo",
    "AttemptToken",
    "BytesCodec",
    "CancelRequested",
    "CatchUpPolicy",
    "CheckedTask",
    "Codec",
    "CodecContext",
    "ContextCodec",
    "CronoqError",
    "Explanation",
    "Histogram",
    "Hold",
    "InvalidArgument",
    "JsonCodec",
    "LeaseRenewed",
    "LeasedAttempt",
    "Limit",
    "LimitFull",
    "LimitInfo",
    "LimitKeyInfo",
    "MemoryStore",
    "MissPolicy",
    "NotRetryable",
    "OccurrenceInfo",
    "OccurrenceOutcome",
    "OnFull",
    "OverlapPolicy",
    "ParentOutput",
    "PayloadError",
    "Pool",
    "PoolInfo",
    "Raised",
    "RemotePool",
    "RetryPolicy",
    "ScheduleInfo",
    "Scheduler",
    "SchedulerError",
    "SchedulerMetrics",
    "SchedulerStopped",
    "StaleAttempt",
    "Status",
    "TaskContext",
    "TaskError",
    "TaskInfo",
    "TaskRequest",
    "TaskSummary",
    "TraceContext",
    "UnknownLimit",
    "UnknownPool",
    "WaitTimedOut",
    "WorkerDetached",
    "WorkerInfo",
    "WorkerLink",
    "binds_context",
    "call_catching",
    "decode_parent_outputs",
    "decode_with",
    "encode_with",
    "format_traceback",
    "preview",
    "unix_ns",
]

__version__ = "0.1.0"
