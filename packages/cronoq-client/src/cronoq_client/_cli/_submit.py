"""``cronoq submit``: one task from the command line, or many from a JSON Lines file (one task
per line) in batches, each batch all-or-nothing, with a progress bar on stderr.

A file is read and checked whole before anything is sent, so a malformed line applies nothing.
Should a batch fail, the batches before it stay submitted: the error says which lines were,
and tasks with keys make running the same file again safe.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import IO, Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from cronoq import Codec, RetryPolicy, TaskRequest
from cronoq.errors import CronoqError
from cronoq_client._cli._errors import CommandFailed, ExitCode, failure
from cronoq_client._cli._payloads import parse_payload, payload_value
from cronoq_client._cli._render import emit, output_option
from cronoq_client._cli._root import session
from cronoq_client._cli._times import iso_time
from cronoq_client.protocol import MAX_SUBMIT_MANY_TASKS

__all__ = ["submit"]

_LINE_FIELDS = frozenset(
    {
        "kind",
        "payload",
        "pool",
        "key",
        "tags",
        "name",
        "priority",
        "start_at",
        "deadline",
        "timeout",
        "max_attempts",
        "after",
        "limits",
    }
)


def _start(text: str | None, where: str) -> datetime | timedelta | None:
    """``--start-at``: an ISO time, or ``+SECONDS`` from now."""
    if text is None:
        return None
    if text.startswith("+"):
        try:
            return timedelta(seconds=float(text[1:]))
        except ValueError:
            raise CommandFailed(f"{where}: {text!r} is not +SECONDS", ExitCode.USAGE) from None
    return iso_time(text, where)


def _limits(given: tuple[str, ...]) -> dict[str, str | None] | None:
    """``--limit tenant=acme --limit stripe``: name to key (None: no ``=``, no key)."""
    if not given:
        return None
    keys: dict[str, str | None] = {}
    for item in given:
        name, sep, key = item.partition("=")
        if not name:
            raise click.BadParameter(
                f"{item!r} names no limit: NAME or NAME=KEY", param_hint="--limit"
            )
        if name in keys:
            raise click.BadParameter(f"limit {name!r} is given twice", param_hint="--limit")
        keys[name] = key if sep else None
    return keys


def _request(line: dict[str, Any], codec: Codec, where: str) -> TaskRequest:
    unknown = set(line) - _LINE_FIELDS
    if unknown:
        raise CommandFailed(
            f"{where}: unknown fields {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(_LINE_FIELDS))})",
            ExitCode.USAGE,
        )
    if not isinstance(line.get("kind"), str):
        raise CommandFailed(f"{where}: kind (a string) is required", ExitCode.USAGE)
    options = dict(line)
    kind = options.pop("kind")
    payload = payload_value(options.pop("payload", None), codec, where)
    for name in ("start_at", "deadline"):
        if isinstance(options.get(name), str):
            options[name] = _start(options[name], f"{where}: {name}")
    if "max_attempts" in options:
        try:
            options["retry"] = RetryPolicy(max_attempts=options.pop("max_attempts"))
        except CronoqError as exc:
            raise CommandFailed(f"{where}: {exc}", ExitCode.USAGE) from None
    if isinstance(options.get("tags"), list):
        options["tags"] = tuple(options["tags"])
    if isinstance(options.get("after"), list):
        options["after"] = tuple(options["after"])
    return TaskRequest(kind, payload, **options)


def _read_lines(file: IO[str], codec: Codec) -> list[TaskRequest]:
    requests = []
    for number, text in enumerate(file, 1):
        if not text.strip():
            continue
        where = f"{file.name}:{number}"
        try:
            line = json.loads(text)
        except ValueError as exc:
            raise CommandFailed(f"{where}: not JSON: {exc}", ExitCode.USAGE) from None
        if not isinstance(line, dict):
            raise CommandFailed(f"{where}: a line is a JSON object", ExitCode.USAGE)
        requests.append(_request(line, codec, where))
    return requests


def _batches(requests: list[TaskRequest], size: int) -> Iterator[list[TaskRequest]]:
    for start in range(0, len(requests), size):
        yield requests[start : start + size]


def _submit_file(file: IO[str], batch_size: int, output: str) -> None:
    client = session().client()
    requests = _read_lines(file, client.codec)
    ids: list[int] = []
    bar_console = Console(file=sys.stderr)
    progress = Progress(
        TextColumn("submitting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=bar_console,
        transient=True,
        disable=not bar_console.is_terminal,
    )
    with progress:
        bar = progress.add_task("submit", total=len(requests))
        for batch in _batches(requests, batch_size):
            try:
                ids.extend(client.submit_many(batch))
            except CronoqError as exc:
                failed = failure(exc)
                done = f"the {len(ids)} tasks before it were submitted" if ids else "none was"
                raise CommandFailed(
                    f"{file.name}: the batch of tasks {len(ids) + 1}-{len(ids) + len(batch)} "
                    f"failed ({done}): {failed.format_message()}",
                    ExitCode(failed.exit_code),
                ) from None
            progress.advance(bar, len(batch))
    emit(output, ids, lambda: f"submitted {len(ids)} tasks")


@click.command()
@click.argument("kind", required=False)
@click.argument("payload", required=False, metavar="[PAYLOAD_JSON]")
@click.option(
    "-f",
    "--file",
    "file",
    type=click.File("r", encoding="utf-8"),
    help='JSON Lines of tasks ({"kind": ..., "payload": ...}); - for stdin',
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_SUBMIT_MANY_TASKS),
    default=500,
    show_default=True,
    help="tasks per call with --file (each batch all-or-nothing; a server takes at most "
    f"{MAX_SUBMIT_MANY_TASKS} per call)",
)
@click.option("-p", "--pool", default="default", show_default=True)
@click.option("--key", help="idempotency key: a live task holding it is returned instead")
@click.option("--tag", "tags", multiple=True, help="a tag (repeatable)")
@click.option("--name", help="a name for people")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--start-at", metavar="TIME|+SECONDS", help="start not before this")
@click.option("--deadline", metavar="TIME", help="fail the task if it has not ended by this")
@click.option(
    "--attempt-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="seconds each attempt may run",
)
@click.option("--max-attempts", type=click.IntRange(1, 1000), help="attempts before it fails")
@click.option(
    "--after",
    "parents",
    multiple=True,
    type=click.IntRange(min=1),
    help="a task id it waits for (repeatable)",
)
@click.option(
    "--limit",
    "limit_keys",
    multiple=True,
    metavar="NAME[=KEY]",
    help="a task limit it takes, with its key for a per-key limit (repeatable)",
)
@output_option
def submit(
    kind: str | None,
    payload: str | None,
    file: IO[str] | None,
    batch_size: int,
    pool: str,
    key: str | None,
    tags: tuple[str, ...],
    name: str | None,
    priority: int,
    start_at: str | None,
    deadline: str | None,
    attempt_timeout: float | None,
    max_attempts: int | None,
    parents: tuple[int, ...],
    limit_keys: tuple[str, ...],
    output: str,
) -> None:
    """Submit task KIND with PAYLOAD_JSON (prints its id), or the tasks of --file."""
    if file is not None:
        if kind is not None:
            raise click.UsageError("give KIND or --file, not both")
        _submit_file(file, batch_size, output)
        return
    if kind is None:
        raise click.UsageError("give KIND (and PAYLOAD_JSON), or --file")
    client = session().client()
    task_id = client.submit(
        kind,
        parse_payload(payload, client.codec, "PAYLOAD_JSON"),
        pool=pool,
        key=key,
        tags=tags,
        name=name,
        priority=priority,
        start_at=_start(start_at, "--start-at"),
        deadline=None if deadline is None else iso_time(deadline, "--deadline"),
        timeout=attempt_timeout,
        retry=None if max_attempts is None else RetryPolicy(max_attempts=max_attempts),
        after=parents,
        limits=_limits(limit_keys),
    )
    emit(output, {"task_id": task_id}, lambda: str(task_id))
