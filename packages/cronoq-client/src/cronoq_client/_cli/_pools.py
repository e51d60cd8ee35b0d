"""``cronoq pools list|pause|resume``: what each pool holds, and stopping its new attempts."""

from __future__ import annotations

import click

from cronoq import Status
from cronoq_client._cli._render import (
    emit,
    fields,
    listing,
    output_option,
    pool_record,
    watch_options,
)
from cronoq_client._cli._root import session

__all__ = ["pools"]

POOL_COLUMNS = (
    ("name", "NAME"),
    ("paused", "PAUSED"),
    ("remote", "REMOTE"),
    ("concurrency", "CONCURRENCY"),
    # Attempts holding a slot (stopped ones not yet returned included): not the same count
    # as the tasks in status running, the column of that name below.
    ("running", "SLOTS USED"),
    *((f"depth.{s.value}", s.value.upper()) for s in Status if not s.is_terminal),
)


@click.group()
def pools() -> None:
    """List, pause and resume pools."""


@pools.command("list")
@output_option
@watch_options
def list_pools(output: str, watch: bool, interval: float) -> None:
    """Every pool: paused or not, slots in use, and its live tasks by status."""
    client = session().client()
    listing(
        output,
        watch,
        interval,
        lambda: [pool_record(p) for p in client.list_pools()],
        POOL_COLUMNS,
    )


@pools.command("pause")
@click.argument("pool")
@output_option
def pause_pool(pool: str, output: str) -> None:
    """Start no new attempt in POOL until it is resumed; running ones finish. Survives
    failover and restart; pausing a paused pool changes nothing."""
    record = pool_record(session().client().pause_pool(pool))
    emit(output, record, lambda: fields(record))


@pools.command("resume")
@click.argument("pool")
@output_option
def resume_pool(pool: str, output: str) -> None:
    """Let POOL start attempts again, in its queue's order."""
    record = pool_record(session().client().resume_pool(pool))
    emit(output, record, lambda: fields(record))
