"""``cronoq workers list``: the remote workers attached to the leader now."""

from __future__ import annotations

import click

from cronoq_client._cli._render import listing, output_option, watch_options, worker_record
from cronoq_client._cli._root import session

__all__ = ["workers"]

WORKER_COLUMNS = (
    ("worker_id", "WORKER"),
    ("identity", "IDENTITY"),
    ("address", "ADDRESS"),
    ("pools", "POOLS"),
    ("slots", "SLOTS"),
    ("in_flight", "IN FLIGHT"),
    ("attached_at", "ATTACHED (UTC)"),
    ("last_heartbeat_at", "LAST HEARTBEAT (UTC)"),
)


@click.group()
def workers() -> None:
    """List the attached workers."""


@workers.command("list")
@output_option
@watch_options
def list_workers(output: str, watch: bool, interval: float) -> None:
    """The workers attached to the leader now, the oldest first."""
    client = session().client()
    listing(
        output,
        watch,
        interval,
        lambda: [worker_record(w) for w in client.list_workers()],
        WORKER_COLUMNS,
    )
