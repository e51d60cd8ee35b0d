"""The ``cronoq`` command (console script of cronoq-client): click commands over the sync
``Client`` and ``Worker``.

Each command group lives in a module of its own and is registered in ``COMMANDS`` below: a new
group is a module and one line there; a new command of an existing group goes in that group's
module.
"""

from __future__ import annotations

import click

from cronoq_client._cli._completion import completion
from cronoq_client._cli._limits import limits
from cronoq_client._cli._outbox import outbox
from cronoq_client._cli._pools import pools
from cronoq_client._cli._root import cli
from cronoq_client._cli._run_worker import worker
from cronoq_client._cli._schedules import schedules
from cronoq_client._cli._submit import submit
from cronoq_client._cli._tasks import tasks
from cronoq_client._cli._workers import workers

__all__ = ["cli", "main"]

COMMANDS: tuple[click.Command, ...] = (
    tasks,
    submit,
    schedules,
    pools,
    limits,
    workers,
    outbox,
    worker,
    completion,
)

for _command in COMMANDS:
    cli.add_command(_command)


def main() -> None:
    cli(prog_name="cronoq")
