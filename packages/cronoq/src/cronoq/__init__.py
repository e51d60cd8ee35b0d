"""cronoq: a durable task scheduler for asyncio.

The public API is what this module exports; everything in ``_``-prefixed modules is private.
Store authors also use :mod:`cronoq.store`; every exception lives in :mod:`cronoq.errors`.
"""

from cronoq._codecs import BytesCodec, Codec, JsonCodec
from cronoq._engine import TaskSummary
from cronoq._executors import TaskContext
from cronoq._memory import MemoryStore
from cronoq._model import CatchUpPolicy, MissPolicy, OverlapPolicy, RetryPolicy, Status
from cronoq._scheduler import Pool, ScheduleInfo, Scheduler, TaskInfo, TaskRequest, preview
from cronoq.errors import (
    AdmissionRejected,
    CronoqError,
    InvalidArgument,
    PayloadError,
    SchedulerError,
    SchedulerStopped,
    TaskError,
    UnknownPool,
    WaitTimedOut,
)

__all__ = [
    "AdmissionRejected",
    "BytesCodec",
    "CatchUpPolicy",
    "Codec",
    "CronoqError",
    "InvalidArgument",
    "JsonCodec",
    "MemoryStore",
    "MissPolicy",
    "OverlapPolicy",
    "PayloadError",
    "Pool",
    "RetryPolicy",
    "ScheduleInfo",
    "Scheduler",
    "SchedulerError",
    "SchedulerStopped",
    "Status",
    "TaskContext",
    "TaskError",
    "TaskInfo",
    "TaskRequest",
    "TaskSummary",
    "UnknownPool",
    "WaitTimedOut",
    "preview",
]

__version__ = "0.1.0"
