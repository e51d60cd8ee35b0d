"""A peer's worker process: ``python -m bench.peers._worker MODULE DSN CONCURRENCY TARGET RECORD``.

Runs ``bench.peers.MODULE.PEER.serve(DSN, CONCURRENCY)`` on the event loop the peer's own
worker command uses. The no-op task reports to :data:`bench.peers._harness.probe`: ``DONE`` on
stdout once TARGET counted tasks have started, and (unless RECORD is ``-``) one line per start
in RECORD. A thread answers ``STATS`` on stdin with this process's CPU time and peak RSS, and
ends the process when stdin closes, so a worker never outlives its measurement process.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import threading
from collections.abc import Coroutine
from typing import Any

from ._harness import Usage, probe


def _answer_stats() -> None:
    for line in sys.stdin:
        if line.strip() == "STATS":
            os.write(1, (Usage.of_self().line() + "\n").encode())
    os._exit(0)


def _run(loop: str, main: Coroutine[Any, Any, None]) -> None:
    if loop == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


def main(argv: list[str]) -> None:
    module, dsn, concurrency, target, record = argv
    peer = importlib.import_module(f"bench.peers.{module}").PEER
    probe.target = int(target)
    if record != "-":
        probe.record_fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    threading.Thread(target=_answer_stats, daemon=True).start()
    _run(peer.worker_loop, peer.serve(dsn, int(concurrency)))


if __name__ == "__main__":
    main(sys.argv[1:])
