"""``cronoq schedules list|add|pause|resume|remove|preview|trigger|history``."""

from __future__ import annotations

from typing import Any
from zoneinfo import ZoneInfo

import click

from cronoq import CatchUpPolicy, OverlapPolicy, RetryPolicy
from cronoq_client._cli._payloads import parse_payload
from cronoq_client._cli._render import (
    emit,
    fields,
    listing,
    occurrence_record,
    output_option,
    schedule_record,
    table,
    watch_options,
)
from cronoq_client._cli._root import session
from cronoq_client._cli._times import iso_time

__all__ = ["schedules"]

SCHEDULE_COLUMNS = (
    ("name", "NAME"),
    ("cron", "CRON"),
    ("timezone", "ZONE"),
    ("kind", "KIND"),
    ("pool", "POOL"),
    ("paused", "PAUSED"),
    ("next_run_at", "NEXT RUN (UTC)"),
    ("last_task_id", "LAST TASK"),
    ("overlap", "OVERLAP"),
    ("catch_up", "CATCH-UP"),
)
OCCURRENCE_COLUMNS = (
    ("due_at", "DUE (UTC)"),
    ("outcome", "OUTCOME"),
    ("task_id", "TASK"),
    ("until", "UNTIL (UTC)"),
    ("decided_at", "DECIDED (UTC)"),
    ("message", "MESSAGE"),
)


@click.group()
def schedules() -> None:
    """List, add, pause, resume, remove, preview and trigger recurring schedules, and see what
    became of their occurrences."""


@schedules.command("list")
@output_option
@watch_options
def list_schedules(output: str, watch: bool, interval: float) -> None:
    """Every schedule, by name."""
    client = session().client()
    listing(
        output,
        watch,
        interval,
        lambda: [schedule_record(s) for s in client.list_schedules()],
        SCHEDULE_COLUMNS,
    )


def _show(output: str, record: dict[str, Any]) -> None:
    emit(output, record, lambda: fields(record))


@schedules.command("add")
@click.argument("name")
@click.argument("cron")
@click.option("-k", "--kind", required=True, help="kind of the tasks it creates")
@click.option("--payload", "payload_text", metavar="JSON", help="payload of each task")
@click.option("-p", "--pool", default="default", show_default=True)
@click.option("-z", "--timezone", default="UTC", show_default=True, help="IANA zone of CRON")
@click.option("--tag", "tags", multiple=True, help="tag of each task (repeatable)")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--max-attempts", type=click.IntRange(1, 1000), help="attempts of each task")
@click.option(
    "--attempt-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="seconds each attempt may run",
)
@click.option(
    "--overlap",
    type=click.Choice([p.value for p in OverlapPolicy]),
    default="skip",
    show_default=True,
    help="while its last task is live",
)
@click.option(
    "--catch-up",
    type=click.Choice([p.value for p in CatchUpPolicy]),
    default="coalesce",
    show_default=True,
    help="occurrences missed while down",
)
@click.option("--replace", is_flag=True, help="replace a schedule of that name (keeps its pause)")
@output_option
def add_schedule(
    name: str,
    cron: str,
    kind: str,
    payload_text: str | None,
    pool: str,
    timezone: str,
    tags: tuple[str, ...],
    priority: int,
    max_attempts: int | None,
    attempt_timeout: float | None,
    overlap: str,
    catch_up: str,
    replace: bool,
    output: str,
) -> None:
    """Create schedule NAME running CRON (5 or 6 fields, seconds first when 6)."""
    client = session().client()
    info = client.add_schedule(
        name,
        cron,
        kind=kind,
        payload=parse_payload(payload_text, client.codec),
        pool=pool,
        timezone=timezone,
        tags=tags,
        priority=priority,
        retry=None if max_attempts is None else RetryPolicy(max_attempts=max_attempts),
        timeout=attempt_timeout,
        overlap=overlap,
        catch_up=catch_up,
        replace=replace,
    )
    _show(output, schedule_record(info))


@schedules.command("pause")
@click.argument("name")
@output_option
def pause_schedule(name: str, output: str) -> None:
    """Pause NAME: no occurrence creates a task until it is resumed (tasks it made carry on)."""
    _show(output, schedule_record(session().client().pause_schedule(name)))


@schedules.command("resume")
@click.argument("name")
@output_option
def resume_schedule(name: str, output: str) -> None:
    """Resume NAME from its next occurrence; those missed while paused do not run."""
    _show(output, schedule_record(session().client().resume_schedule(name)))


@schedules.command("remove")
@click.argument("name")
@output_option
def remove_schedule(name: str, output: str) -> None:
    """Remove NAME; tasks it already created carry on."""
    session().client().remove_schedule(name)
    emit(output, {"name": name, "removed": True}, lambda: f"schedule {name}: removed")


@schedules.command("preview")
@click.argument("cron")
@click.option("-z", "--timezone", default="UTC", show_default=True)
@click.option("-n", "count", type=click.IntRange(1, 1000), default=10, show_default=True)
@output_option
def preview(cron: str, timezone: str, count: int, output: str) -> None:
    """The next occurrences of CRON, as the server computes them."""
    times = session().client().preview(cron, timezone, count)
    zone = ZoneInfo(timezone)  # the server knew it, or preview would have raised
    shown = [t.astimezone(zone).isoformat() for t in times]  # with the zone's offset
    emit(output, shown, lambda: table([{"at": t} for t in shown], (("at", timezone),)))


@schedules.command("trigger")
@click.argument("name")
@output_option
def trigger_schedule(name: str, output: str) -> None:
    """Run one occurrence of NAME now, through its overlap policy; print its task's id. A
    skip of the policy (its last task is live) is an answer, not an error: it exits 0."""
    task_id = session().client().trigger_schedule(name)
    emit(
        output,
        {"name": name, "task_id": task_id},
        lambda: (
            f"schedule {name}: task {task_id}"
            if task_id is not None
            else f"schedule {name}: skipped by its overlap policy (its last task is live)"
        ),
    )


@schedules.command("history")
@click.argument("name")
@click.option(
    "--before",
    metavar="TIME",
    help="only occurrences due before this ISO 8601 time with its offset (the DUE of the "
    "previous page's last row)",
)
@click.option(
    "-n",
    "--limit",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="at most this many records",
)
@output_option
def history(name: str, before: str | None, limit: int, output: str) -> None:
    """What became of NAME's occurrences, the newest first: started (and which task), skipped
    (its last task was live), paused, missed or coalesced while no leader ran, ... Kept as long
    as finished tasks are, also once the schedule is removed."""
    until = None if before is None else iso_time(before, "--before")
    found = session().client().occurrences(name, before=until, limit=limit)
    records = [occurrence_record(o) for o in found]
    emit(output, records, lambda: table(records, OCCURRENCE_COLUMNS))
