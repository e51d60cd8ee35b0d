"""``cronoq worker MODULE:OBJECT``: a remote Worker for the pools of an importable mapping of
pool names to functions, as ``celery worker`` or ``pgq run`` start theirs. SIGTERM or a first
Ctrl-C drains it (no new attempt; the running ones finish and report), a second one stops it
at once (its attempts are retried after their lease)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping

import click

from cronoq_client._cli._errors import ConfigError
from cronoq_client._cli._imports import load_object
from cronoq_client._cli._root import session
from cronoq_client._worker import Worker

__all__ = ["worker"]


async def _run(worker: Worker) -> None:
    # Worker.run handles SIGTERM itself (it runs in the main thread); Ctrl-C does the same.
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, worker.stop)
    await worker.run()


@click.command()
@click.argument("pools_reference", metavar="MODULE:OBJECT")
@click.option("--slots", type=click.IntRange(min=1), default=10, show_default=True,
              help="attempts run at once")  # fmt: skip
@click.option("--worker-id", help="its name in the server's logs [default host:pid]")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)  # fmt: skip
def worker(pools_reference: str, slots: int, worker_id: str | None, log_level: str) -> None:
    """Run the attempts of the pools MODULE:OBJECT maps to functions ({"pool": fn}).

    Each function is ``async def fn(ctx, payload)`` or a plain ``def`` (run in a thread);
    payloads are decoded with --codec. Exits 0 once drained (SIGTERM, Ctrl-C).
    """
    pools = load_object(pools_reference, "MODULE:OBJECT")
    if not isinstance(pools, Mapping):
        raise ConfigError(
            f"{pools_reference} is {type(pools).__name__}: it must map pool names to functions"
        )
    settings = session().settings
    logging.basicConfig(
        level=log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    running = Worker(
        settings.target,
        pools,
        slots=slots,
        codec=settings.codec,
        tls=settings.tls,
        token=settings.token,
        worker_id=worker_id,
    )
    asyncio.run(_run(running))
