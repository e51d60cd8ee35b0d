"""``cronoq limits``: each task limit's bound and use now, with its busiest keys
(docs/limits.md)."""

from __future__ import annotations

import click

from cronoq_client._cli._render import limit_record, listing, output_option, watch_options
from cronoq_client._cli._root import session

__all__ = ["limits"]

LIMIT_COLUMNS = (
    ("name", "NAME"),
    ("bound", "BOUND"),
    ("on_full", "ON FULL"),
    ("keys_in_use", "KEYS IN USE"),
    ("running", "RUNNING"),
    ("starts", "STARTS"),
    ("waiting", "WAITING"),
    ("busiest", "BUSIEST KEYS (RUNNING/WAITING/STARTS)"),
)


@click.command()
@click.option(
    "--keys",
    type=click.IntRange(0, 1000),
    default=5,
    show_default=True,
    help="how many of each limit's busiest keys to show",
)
@output_option
@watch_options
def limits(keys: int, output: str, watch: bool, interval: float) -> None:
    """Every task limit: its bound, keys in use, attempts running, starts in the current rate
    window, tasks waiting for it, and its busiest keys."""
    client = session().client()
    listing(
        output,
        watch,
        interval,
        lambda: [limit_record(info) for info in client.list_limits(keys=keys)],
        LIMIT_COLUMNS,
    )
