"""``cronoq outbox status|quarantine|requeue|discard``: the outbox's figures, and its quarantined
rows (those that could not become tasks), which an operator requeues once their cause is fixed
or discards."""

from __future__ import annotations

import click

from cronoq.store import MAX_OUTBOX_PAGE
from cronoq_client._cli._render import (
    emit,
    fields,
    listing,
    outbox_record,
    output_option,
    quarantine_record,
    watch_options,
)
from cronoq_client._cli._root import session

__all__ = ["outbox"]

QUARANTINE_COLUMNS = (
    ("row_id", "ID"),
    ("kind", "KIND"),
    ("enqueued_at", "ENQUEUED (UTC)"),
    ("reason", "REASON"),
)

ROW_IDS = click.argument("row_ids", nargs=-1, required=True, type=click.IntRange(min=1),
                         metavar="ID...")  # fmt: skip


@click.group()
def outbox() -> None:
    """See the outbox; requeue or discard its quarantined rows."""


@outbox.command("status")
@output_option
def outbox_status(output: str) -> None:
    """Rows waiting, the oldest one's age, rows quarantined, and what the leader ingested and
    quarantined since it began leading."""
    record = outbox_record(session().client().outbox_status())
    emit(output, record, lambda: fields(record))


@outbox.command("quarantine")
@click.option(
    "--after",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="only row ids above this one (the last ID of the previous page)",
)
@click.option(
    "-n",
    "--limit",
    type=click.IntRange(1, MAX_OUTBOX_PAGE),
    default=100,
    show_default=True,
    help="at most this many rows",
)
@output_option
@watch_options
def quarantine(after: int, limit: int, output: str, watch: bool, interval: float) -> None:
    """Quarantined rows in id order, each with why it could not become a task."""
    client = session().client()
    listing(
        output,
        watch,
        interval,
        lambda: [quarantine_record(r) for r in client.outbox_quarantine(after=after, limit=limit)],
        QUARANTINE_COLUMNS,
    )


@outbox.command("requeue")
@ROW_IDS
@output_option
def requeue(row_ids: tuple[int, ...], output: str) -> None:
    """Move quarantined rows back to the outbox once their cause is fixed (the pool configured,
    the options corrected by SQL): the leader ingests them again, and quarantines again one
    that still cannot become a task."""
    count = session().client().requeue_outbox(row_ids)
    _moved(output, "requeued", count, row_ids)


@outbox.command("discard")
@ROW_IDS
@output_option
def discard(row_ids: tuple[int, ...], output: str) -> None:
    """Delete quarantined rows for good."""
    count = session().client().discard_outbox(row_ids)
    _moved(output, "discarded", count, row_ids)


def _moved(output: str, done: str, count: int, row_ids: tuple[int, ...]) -> None:
    asked = len(set(row_ids))
    line = f"{count} of {asked} row{'' if asked == 1 else 's'} {done}"
    if count < asked:  # not an error: a row requeued or discarded already is what was asked
        line += f"; {asked - count} not in the quarantine (requeued or discarded already)"
    emit(output, {done: count, "row_ids": sorted(set(row_ids))}, lambda: line)
