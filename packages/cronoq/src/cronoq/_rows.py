"""Text encodings of task and schedule specs for stores that keep rows.

A row keeps ``pool``, ``kind``, ``key`` and ``payload`` in columns of their own (they are
queried, or binary) and every other spec field in one compact JSON text that lists only the
fields that differ from their defaults, so the common task costs a few bytes. Decoding checks
every field and raises ``ValueError`` on anything malformed: stores quarantine such rows.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from typing import Any

from cronoq._model import (
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
from cronoq._mutations import AttemptLease, TaskRecord, quarantine_message

__all__ = [
    "LEASE_HASH_SIZE",
    "RECOVERY_COLUMNS",
    "TASK_COLUMNS",
    "decode_lease",
    "decode_looked_up_record",
    "decode_schedule_spec",
    "decode_task_record",
    "decode_task_spec",
    "encode_schedule_spec",
    "encode_task_options",
    "undecodable_reason",
]

_DEFAULT_SPEC = TaskSpec("", "", b"")

_COLUMNS = (
    "id, pool, kind, key, payload, options, status, attempt, message, submitted_ns, "
    "updated_ns, due_ns, cancel_requested, lease_epoch, lease_hash, started_ns"
)
TASK_COLUMNS = f"{_COLUMNS}, output"
"""The columns ``decode_task_record`` takes, in order (the SQL stores name them alike)."""
RECOVERY_COLUMNS = f"{_COLUMNS}, NULL"
"""The same, without reading outputs: recovery leaves them in the store."""


def _retry_fields(retry: RetryPolicy) -> list[Any]:
    return [retry.max_attempts, retry.initial_ns, retry.multiplier, retry.max_ns, retry.jitter]


def _retry(value: object) -> RetryPolicy:
    if not isinstance(value, list) or len(value) != 5:
        raise ValueError(f"retry must be a list of 5 values, got {value!r}")
    attempts, initial, multiplier, maximum, jitter = value
    return RetryPolicy(attempts, initial, multiplier, maximum, jitter)


def encode_task_options(spec: TaskSpec) -> str:
    """The spec's fields other than pool, kind, key and payload, as compact JSON."""
    options: dict[str, Any] = {}
    if spec.tags:
        options["tags"] = list(spec.tags)
    if spec.name is not None:
        options["name"] = spec.name
    if spec.priority:
        options["priority"] = spec.priority
    # Identity first: the default policy is one shared object, and comparing fields costs.
    if spec.retry is not _DEFAULT_SPEC.retry and spec.retry != _DEFAULT_SPEC.retry:
        options["retry"] = _retry_fields(spec.retry)
    # Spelled out, not a loop over the names: this runs for every task of every commit.
    if spec.start_at_ns is not None:
        options["start_at_ns"] = spec.start_at_ns
    if spec.deadline_ns is not None:
        options["deadline_ns"] = spec.deadline_ns
    if spec.timeout_ns is not None:
        options["timeout_ns"] = spec.timeout_ns
    if spec.miss_policy is not MissPolicy.RUN_LATE:
        options["miss_policy"] = spec.miss_policy.value
    if spec.grace_ns != _DEFAULT_SPEC.grace_ns:
        options["grace_ns"] = spec.grace_ns
    if spec.after:
        options["after"] = list(spec.after)
    if spec.schedule is not None:
        options["schedule"] = spec.schedule
    if spec.limits:
        options["limits"] = [list(pair) for pair in spec.limits]
    if spec.rerun_of is not None:
        options["rerun_of"] = spec.rerun_of
    if spec.trace_context is not None:
        options["traceparent"] = spec.trace_context.traceparent
        if spec.trace_context.tracestate:
            options["tracestate"] = spec.trace_context.tracestate
    return json.dumps(options, separators=(",", ":"), ensure_ascii=False) if options else "{}"


def _typed(options: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = options.get(name, default)
    if value is not default and (not isinstance(value, kind) or isinstance(value, bool)):
        raise ValueError(f"{name} must be {kind.__name__}, got {value!r}")
    return value


def decode_task_spec(
    pool: object, kind: object, key: object, payload: object, options_json: object
) -> TaskSpec:
    """Rebuild a spec from its row; ``ValueError`` if any part is malformed."""
    if not isinstance(pool, str) or not isinstance(kind, str):
        raise ValueError(f"pool and kind must be text, got {pool!r} and {kind!r}")
    if key is not None and not isinstance(key, str):
        raise ValueError(f"key must be text or NULL, got {key!r}")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise ValueError(f"payload must be bytes, got {type(payload).__name__}")
    if not isinstance(options_json, str):
        raise ValueError(f"options must be JSON text, got {type(options_json).__name__}")
    try:
        return _task_spec(pool, kind, key, bytes(payload), json.loads(options_json))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"task options are malformed: {exc!r}") from exc


def _task_spec(pool: str, kind: str, key: str | None, payload: bytes, options: Any) -> TaskSpec:
    if not isinstance(options, dict):
        raise ValueError(f"options must be a JSON object, got {options!r:.80}")
    tags = _typed(options, "tags", list, [])
    after = _typed(options, "after", list, [])
    if not all(isinstance(t, str) for t in tags) or not all(isinstance(a, int) for a in after):
        raise ValueError("tags must be text and after must be integers")
    return TaskSpec(
        pool=pool,
        kind=kind,
        payload=payload,
        key=key,
        tags=tuple(tags),
        name=_typed(options, "name", str, None),
        priority=_typed(options, "priority", int, 0),
        retry=_retry(options["retry"]) if "retry" in options else _DEFAULT_SPEC.retry,
        start_at_ns=_typed(options, "start_at_ns", int, None),
        miss_policy=MissPolicy(options.get("miss_policy", MissPolicy.RUN_LATE.value)),
        grace_ns=_typed(options, "grace_ns", int, _DEFAULT_SPEC.grace_ns),
        deadline_ns=_typed(options, "deadline_ns", int, None),
        timeout_ns=_typed(options, "timeout_ns", int, None),
        after=tuple(after),
        schedule=_typed(options, "schedule", str, None),
        trace_context=_trace_context(options),
        limits=_limits(options),
        rerun_of=_typed(options, "rerun_of", int, None),
    )


def _limits(options: dict[str, Any]) -> tuple[tuple[str, str | None], ...]:
    pairs = _typed(options, "limits", list, [])
    if not all(
        isinstance(p, list)
        and len(p) == 2
        and isinstance(p[0], str)
        and (p[1] is None or isinstance(p[1], str))
        for p in pairs
    ):
        raise ValueError("limits must be [name, key or null] pairs")
    return tuple((name, key) for name, key in pairs)


def _trace_context(options: dict[str, Any]) -> TraceContext | None:
    traceparent = _typed(options, "traceparent", str, None)
    if traceparent is None:
        return None
    # Checked as at submission (InvalidArgument is a ValueError): a malformed one is damage.
    return TraceContext(traceparent, _typed(options, "tracestate", str, ""))


def encode_schedule_spec(spec: ScheduleSpec) -> str:
    """The whole schedule definition (payload in base64) as JSON."""
    template = spec.template
    return json.dumps(
        {
            "cron": spec.cron,
            "timezone": spec.timezone,
            "overlap": spec.overlap.value,
            "catch_up": spec.catch_up.value,
            "grace_ns": spec.grace_ns,
            "pool": template.pool,
            "kind": template.kind,
            "payload": base64.b64encode(template.payload).decode(),
            "tags": list(template.tags),
            "priority": template.priority,
            "retry": _retry_fields(template.retry),
            "timeout_ns": template.timeout_ns,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def _required(data: dict[str, Any], name: str, kind: type) -> Any:
    if name not in data:
        raise ValueError(f"{name} is missing")
    return _typed(data, name, kind, None)


def decode_schedule_spec(name: str, text: str) -> ScheduleSpec:
    """Rebuild a schedule from its row; ``ValueError`` if malformed."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"schedule {name!r} is not a JSON object")
        return _schedule(name, data)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"schedule {name!r} is malformed: {exc!r}") from exc


def _schedule(name: str, data: dict[str, Any]) -> ScheduleSpec:
    template = TaskTemplate(
        pool=_required(data, "pool", str),
        kind=_required(data, "kind", str),
        payload=base64.b64decode(data["payload"], validate=True),
        tags=tuple(_typed(data, "tags", list, [])),
        priority=_typed(data, "priority", int, 0),
        retry=_retry(data["retry"]),
        timeout_ns=_typed(data, "timeout_ns", int, None),
    )
    return ScheduleSpec(
        name=name,
        cron=_required(data, "cron", str),
        timezone=_required(data, "timezone", str),
        template=template,
        overlap=OverlapPolicy(data["overlap"]),
        catch_up=CatchUpPolicy(data["catch_up"]),
        grace_ns=_typed(data, "grace_ns", int, 0),
    )


LEASE_HASH_SIZE = 32
"""Bytes of ``AttemptLease.id_hash`` (a SHA-256)."""


def decode_lease(epoch: object, id_hash: object) -> AttemptLease | None:
    """The lease of a row's ``lease_epoch`` and ``lease_hash`` columns: None when both are
    NULL; ``ValueError`` when only one is, or either is malformed (a hash of another length).

    A malformed lease is not read as None: a new leader would then count a remote attempt
    whose worker may still run it as lost, and start another (two attempts at once, which the
    lease exists to rule out). The row is quarantined like any undecodable row instead."""
    if epoch is None and id_hash is None:
        return None
    if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
        raise ValueError(f"lease_epoch must be a non-negative integer, got {epoch!r}")
    if not isinstance(id_hash, bytes | bytearray | memoryview):
        raise ValueError(f"lease_hash must be bytes, got {type(id_hash).__name__}")
    id_hash = bytes(id_hash)
    if len(id_hash) != LEASE_HASH_SIZE:
        raise ValueError(f"lease_hash must be {LEASE_HASH_SIZE} bytes, got {len(id_hash)}")
    return AttemptLease(epoch, id_hash)


def decode_task_record(
    row: Iterable[Any], to_engine: Callable[[int], int], *, with_output: bool
) -> TaskRecord:
    """A ``TaskRecord`` from the values of ``TASK_COLUMNS``; ``ValueError`` if malformed."""
    (task_id, pool, kind, key, payload, options, status, attempt, message, submitted_ns,
     updated_ns, due_ns, cancel_requested, lease_epoch, lease_hash, started_ns,
     output) = row  # fmt: skip
    if not isinstance(attempt, int) or not isinstance(message, str):
        raise ValueError(f"attempt {attempt!r} or message {message!r} has the wrong type")
    return TaskRecord(
        task_id=task_id,
        spec=decode_task_spec(pool, kind, key, payload, options),
        status=Status(status),
        attempt=attempt,
        message=message,
        submitted_ns=to_engine(submitted_ns),
        updated_ns=to_engine(updated_ns),
        due_ns=None if due_ns is None else to_engine(due_ns),
        cancel_requested=bool(cancel_requested),
        output=bytes(output) if with_output and output is not None else None,
        lease=decode_lease(lease_epoch, lease_hash),
        started_ns=None if started_ns is None else to_engine(started_ns),
    )


def undecodable_reason(exc: BaseException) -> str:
    """The quarantine reason of a row ``decode_task_record`` refused with ``exc``."""
    return f"undecodable row ({exc})"


def decode_looked_up_record(row: Iterable[Any], to_engine: Callable[[int], int]) -> TaskRecord:
    """``decode_task_record`` with the output, for lookups. A row that cannot be decoded (one
    recovery quarantined, or will) reads as recovery leaves it: failed, with the quarantine
    message, and what of it can be read (pool, kind and key, when they are text), so that a
    lookup answers as the engine does for the quarantined task instead of raising."""
    values = list(row)
    try:
        return decode_task_record(values, to_engine, with_output=True)
    except (ValueError, TypeError) as exc:
        reason = undecodable_reason(exc)
    task_id, pool, kind, key, _, _, _, attempt, _, submitted_ns, updated_ns = values[:11]
    submitted = to_engine(submitted_ns) if _is_int(submitted_ns) else 0
    return TaskRecord(
        task_id=task_id,
        spec=TaskSpec(
            pool if isinstance(pool, str) else "",
            kind if isinstance(kind, str) else "",
            b"",
            key if isinstance(key, str) else None,
        ),
        status=Status.FAILED,
        attempt=attempt if _is_int(attempt) else 0,
        message=quarantine_message(reason),
        submitted_ns=submitted,
        updated_ns=to_engine(updated_ns) if _is_int(updated_ns) else submitted,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
