"""What the commands print: rich tables for people, JSON for scripts (``--output json``), and
``--watch``, which prints the listing again every few seconds until interrupted."""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from cronoq import (
    AttemptInfo,
    Explanation,
    LimitInfo,
    OccurrenceInfo,
    PoolInfo,
    ScheduleInfo,
    TaskInfo,
    TaskSummary,
    WorkerInfo,
)
from cronoq_client._client import Unreachable
from cronoq_client._outbox import OutboxStatus, QuarantinedOutboxRow

__all__ = [
    "Columns",
    "attempt_record",
    "emit",
    "explained",
    "explanation_record",
    "limit_record",
    "occurrence_record",
    "outbox_record",
    "output_option",
    "pool_record",
    "quarantine_record",
    "schedule_record",
    "summary_record",
    "task_record",
    "watch_options",
    "worker_record",
]

Columns = Sequence[tuple[str, str]]
"""(record key, column title) of a table; ``a.b`` is key ``b`` of the dict at key ``a``."""

output_option = click.option(
    "-o",
    "--output",
    type=click.Choice(["table", "json"]),
    default="table",
    show_default=True,
    help="table for people, json for scripts",
)


def watch_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--interval",
        type=click.FloatRange(min=0.1),
        default=2.0,
        show_default=True,
        help="seconds between refreshes with --watch",
    )(command)
    return click.option("-w", "--watch", is_flag=True, help="refresh until interrupted (Ctrl-C)")(
        command
    )


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}  # a payload of BytesCodec
    if isinstance(value, Enum):
        return value.value
    return repr(value)  # a value of a user codec that JSON cannot hold


def _json(data: Any) -> str:
    return json.dumps(data, default=_json_default, ensure_ascii=False)


def _records(info: Any) -> dict[str, Any]:
    return {field.name: getattr(info, field.name) for field in dataclasses.fields(info)}


def task_record(info: TaskInfo) -> dict[str, Any]:
    record = _records(info)
    # Name to key (null: not per key), as a submission gives them.
    record["limits"] = dict(info.limits)
    traceback = info.traceback
    if traceback is not None:  # kept after the message's first line: shown as its own field
        record["message"] = info.description
        record["traceback"] = traceback
    return record


def summary_record(summary: TaskSummary) -> dict[str, Any]:
    record = _records(summary)
    finished = record.pop("finished_ns")
    record["finished_at"] = (
        None if finished is None else datetime.fromtimestamp(finished / 1e9, UTC)
    )
    return record


def schedule_record(info: ScheduleInfo) -> dict[str, Any]:
    return _records(info)


def pool_record(info: PoolInfo) -> dict[str, Any]:
    record = _records(info)
    # Keyed by the status's name: JSON's keys are strings, and a table column names one.
    record["depth"] = {status.value: count for status, count in info.depth.items()}
    return record


def limit_record(info: LimitInfo) -> dict[str, Any]:
    """A limit, its bound in words and as fields, and its use; ``busiest`` is the keys in
    short for a table (``acme 2/1/0``: running, waiting, starts)."""
    limit = info.limit
    return {
        "name": limit.name,
        "bound": limit.describe(),
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "per_s": limit.per,
        "burst": limit.burst,
        "per_key": limit.per_key,
        "on_full": limit.on_full,
        "keys_in_use": info.keys_in_use,
        "running": info.running,
        "starts": info.starts,
        "waiting": info.waiting,
        "keys": [_records(key) for key in info.keys],
        "busiest": ", ".join(
            f"{'-' if k.key is None else k.key} {k.running}/{k.waiting}/{k.starts}"
            for k in info.keys
        ),
    }


def worker_record(info: WorkerInfo) -> dict[str, Any]:
    return _records(info)


def outbox_record(status: OutboxStatus) -> dict[str, Any]:
    record = _records(status)
    age = record.pop("oldest_age")
    # Seconds, as every duration of the configuration: JSON has no duration.
    record["oldest_age_s"] = None if age is None else age.total_seconds()
    return record


def quarantine_record(row: QuarantinedOutboxRow) -> dict[str, Any]:
    return _records(row)


def explanation_record(explanation: Explanation) -> dict[str, Any]:
    return _records(explanation)


def attempt_record(info: AttemptInfo) -> dict[str, Any]:
    """An attempt, its message's first part and its traceback apart (as ``task_record``)."""
    record = _records(info)
    record["message"] = info.description
    record["traceback"] = info.traceback
    return record


def occurrence_record(info: OccurrenceInfo) -> dict[str, Any]:
    return _records(info)


def _cell(value: Any, zone: bool = False) -> str:
    """A value as a table cell. A time is in UTC: a table's column title says so ("FINISHED
    (UTC)"), a cell of ``fields`` (``zone``), which has no title, says it itself."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        shown = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"{shown} UTC" if zone else shown
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, tuple | list):
        return ",".join(_cell(v, zone) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    return _json(value)


_WHOLE = frozenset(
    {
        "task_id",
        "row_id",
        "enqueued_at",
        "status",
        "name",
        "last_task_id",
        "next_run_at",
        "at",
        "worker_id",
        "identity",
        "address",
        "attached_at",
        "last_heartbeat_at",
        "started_at",
        "ended_at",
        "due_at",
        "until",
        "decided_at",
    }
)


def _value(record: dict[str, Any], key: str) -> Any:
    outer, _, inner = key.partition(".")
    return record[outer][inner] if inner else record[outer]


def table(records: Sequence[dict[str, Any]], columns: Columns) -> Table:
    grid = Table(box=None, header_style="bold", pad_edge=False)
    for key, title in columns:
        # An id or a name cut over two lines could not be copied; the rest may fold.
        grid.add_column(title, overflow="fold", no_wrap=key in _WHOLE)
    for record in records:
        grid.add_row(*(_text(_cell(_value(record, key))) for key, _ in columns))
    return grid


def fields(record: dict[str, Any]) -> Table:
    """One record as ``name value`` lines (``tasks get``)."""
    grid = Table(box=None, show_header=False, pad_edge=False)
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for key, value in record.items():
        grid.add_row(_text(key), _text(_cell(value, zone=True)))
    return grid


_EXPLAINED_APART = frozenset({"task_id", "status", "summary"})


def explained(record: dict[str, Any]) -> Group:
    """``tasks explain``: its one line (the task, its status and what holds it), then the
    fields that apply to that hold (a field of another hold is None or empty, and attempt 0
    means none yet)."""
    line = f"task {record['task_id']} ({_cell(record['status'])}): {record['summary']}"
    applying = {
        key: value
        for key, value in record.items()
        if key not in _EXPLAINED_APART
        and value not in (None, (), "")
        and not (key == "attempt" and value == 0)
    }
    return Group(_text(line), fields(applying))


def _text(value: str) -> Text:
    """A cell as plain text: a value is the callers' (a tenant's key, a task's kind), never
    rich markup (``[/x]`` would fail the whole table, ``[link=...]`` would be a link) nor a
    terminal escape; a character that does not print is shown escaped (``\\x1b``)."""
    if not value.isprintable():
        value = "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)
    return Text(value)


_PIPE_WIDTH = 10_000


def console() -> Console:
    # Made per command: click's runner (and tests) swap sys.stdout. Into a pipe, a table is
    # as wide as its widest row (80 columns would fold it for grep and awk).
    out = Console(file=sys.stdout)
    return out if out.is_terminal else Console(file=sys.stdout, width=_PIPE_WIDTH)


def emit(output: str, data: Any, render: Callable[[], Any]) -> None:
    """Print ``data`` as JSON, or what ``render`` makes of it for people."""
    if output == "json":
        click.echo(_json(data))
    else:
        console().print(render())


def listing(
    output: str,
    watch: bool,
    interval: float,
    fetch: Callable[[], list[dict[str, Any]]],
    columns: Columns,
) -> None:
    """Print a listing once, or with ``watch`` every ``interval`` seconds until Ctrl-C (a
    table redrawn in place on a terminal; a JSON document per line for scripts).

    Only the first fetch fails fast when no server answers: once watching, a server that
    restarts is waited for (a line on stderr each time it cannot be reached), as a person
    watching it restart expects."""
    if not watch:
        records = fetch()
        emit(output, records, lambda: table(records, columns))
        return

    def refetch() -> list[dict[str, Any]] | None:
        try:
            return fetch()
        except Unreachable as exc:
            click.echo(f"warning: {exc} (still watching)", err=True)
            return None

    out = console()
    try:
        if output == "table" and out.is_terminal:
            with Live(table(fetch(), columns), console=out, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    found = refetch()
                    if found is not None:
                        live.update(table(found, columns), refresh=True)
        records = fetch()
        while True:
            if output == "json":
                click.echo(_json(records))
            else:
                out.print(table(records, columns))
                out.print()
            sys.stdout.flush()
            found = None
            while found is None:
                time.sleep(interval)
                found = refetch()
            records = found
    except KeyboardInterrupt:
        return  # the way to stop watching: not an error
