"""``cronoq tasks list|get|wait|cancel|retry|rerun|explain|attempts``."""

from __future__ import annotations

import click

from cronoq import Status
from cronoq_client._cli._errors import CommandFailed, ExitCode
from cronoq_client._cli._render import (
    attempt_record,
    emit,
    explained,
    explanation_record,
    fields,
    listing,
    output_option,
    summary_record,
    table,
    task_record,
    watch_options,
)
from cronoq_client._cli._root import session

__all__ = ["tasks"]

TASK_COLUMNS = (
    ("task_id", "ID"),
    ("status", "STATUS"),
    ("attempt", "ATTEMPT"),
    ("pool", "POOL"),
    ("kind", "KIND"),
    ("key", "KEY"),
    ("tags", "TAGS"),
    ("finished_at", "FINISHED (UTC)"),
    ("error", "ERROR"),
)
ATTEMPT_COLUMNS = (
    ("attempt", "ATTEMPT"),
    ("started_at", "STARTED (UTC)"),
    ("ended_at", "ENDED (UTC)"),
    ("message", "MESSAGE"),
)


@click.group()
def tasks() -> None:
    """List, show, explain, wait for, cancel, retry and rerun tasks."""


@tasks.command("list")
@click.option(
    "-s",
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in Status]),
    help="only tasks in this status (repeatable)",
)
@click.option("-p", "--pool", help="only tasks of this pool")
@click.option("-k", "--kind", help="only tasks of this kind")
@click.option("--tag", help="only tasks with this tag")
@click.option(
    "-n",
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="at most this many tasks",
)
@click.option("--all", "everything", is_flag=True, help="every task, whatever --limit says")
@click.option("--after", type=click.IntRange(min=0), help="only task ids above this one")
@click.option("--before", type=click.IntRange(min=0), help="only task ids below this one")
@click.option("--oldest-first", is_flag=True, help="in id (submission) order, not the newest first")
@output_option
@watch_options
def list_tasks(
    statuses: tuple[str, ...],
    pool: str | None,
    kind: str | None,
    tag: str | None,
    limit: int,
    everything: bool,
    after: int | None,
    before: int | None,
    oldest_first: bool,
    output: str,
    watch: bool,
    interval: float,
) -> None:
    """Tasks live and recently finished, the newest first, with why each failed."""
    client = session().client()

    def fetch() -> list[dict[str, object]]:
        found = client.list(
            status=statuses or None,
            pool=pool,
            kind=kind,
            tag=tag,
            limit=None if everything else limit,
            after=after,
            before=before,
            newest_first=not oldest_first,
        )
        return [summary_record(s) for s in found]

    listing(output, watch, interval, fetch, TASK_COLUMNS)


def _task_id(value: str) -> int:
    try:
        task_id = int(value)
    except ValueError:
        raise click.BadParameter(f"a task id is a number, got {value!r}") from None
    if task_id < 1:
        raise click.BadParameter(f"a task id is positive, got {task_id}")
    return task_id


TASK_ID = click.argument("task_id", callback=lambda _ctx, _param, value: _task_id(value))


@tasks.command("get")
@TASK_ID
@click.option("--no-payload", is_flag=True, help="leave the payload out (a large one)")
@click.option("--no-output", is_flag=True, help="leave the output out (a large one)")
@output_option
def get_task(task_id: int, no_payload: bool, no_output: bool, output: str) -> None:
    """One task, with its payload and output, and the tasks that depend on it."""
    client = session().client()
    info = client.get(task_id, include_payload=not no_payload, include_output=not no_output)
    record = task_record(info)
    # A read of the leader's memory, as cheap as the get: the other end of `after`.
    record["dependants"] = client.dependants(task_id)
    emit(output, record, lambda: fields(record))


@tasks.command("explain")
@TASK_ID
@output_option
def explain_task(task_id: int, output: str) -> None:
    """Why a task is where it is: what holds it now, since when, and what would release it
    (its dependencies, a start time, a backoff, its pool, a limit, no worker slot, ...)."""
    record = explanation_record(session().client().explain(task_id))
    emit(output, record, lambda: explained(record))


@tasks.command("attempts")
@TASK_ID
@output_option
def task_attempts(task_id: int, output: str) -> None:
    """The task's attempts that ended without success, oldest first (the latest 25): when
    each ran and why it failed (JSON: with its traceback)."""
    records = [attempt_record(a) for a in session().client().attempts(task_id)]
    emit(output, records, lambda: table(records, ATTEMPT_COLUMNS))


@tasks.command("wait")
@TASK_ID
@click.option(
    "--timeout",
    "seconds",
    type=click.FloatRange(min=0),
    help="give up after this many seconds (exit 9) [default: no limit]",
)
@output_option
def wait_task(task_id: int, seconds: float | None, output: str) -> None:
    """Wait until a task ends; print it. Exits 10 if it failed or was cancelled."""
    info = session().client().wait(task_id, seconds)
    record = task_record(info)
    emit(output, record, lambda: fields(record))
    if info.status is not Status.SUCCEEDED:
        raise CommandFailed(
            # One line: the traceback, if any, is in the record printed above.
            f"task {task_id} ended {info.status.value}: {info.error}",
            ExitCode.TASK_FAILED,
        )


@tasks.command("cancel")
@TASK_ID
@click.option("-r", "--reason", default="cancelled by request", show_default=True)
@output_option
def cancel_task(task_id: int, reason: str, output: str) -> None:
    """Cancel a task: a queued one at once, a running one once its attempt stops."""
    status = session().client().cancel(task_id, reason)
    emit(
        output,
        {"task_id": task_id, "status": status},
        lambda: f"task {task_id}: {status.value}",
    )


@tasks.command("retry")
@TASK_ID
@click.option("--no-payload", is_flag=True, help="leave the payload out (a large one)")
@output_option
def retry_task(task_id: int, no_payload: bool, output: str) -> None:
    """Run a failed or cancelled task again, with one more attempt if it used them all; print
    it. Exits 11 if it is live or succeeded, or could not run again."""
    info = session().client().retry(task_id, include_payload=not no_payload)
    record = task_record(info)
    emit(output, record, lambda: fields(record))


@tasks.command("rerun")
@TASK_ID
@output_option
def rerun_task(task_id: int, output: str) -> None:
    """Run a finished task (succeeded too) again as a new task, with its payload, key and
    options; print the new task's id. Exits 11 if it is live, or another live task holds its
    key."""
    new_id = session().client().rerun(task_id)
    emit(
        output,
        {"task_id": new_id, "rerun_of": task_id},
        lambda: f"task {task_id}: rerun as task {new_id}",
    )
