"""One measurement in a fresh process: ``python -m bench.peers._child MODULE ROW SIZES_JSON``.

Imports only ``bench.peers.MODULE`` (so no other system's libraries weigh on it), runs
``SYSTEM.<row>(sizes)`` and prints ``RESULT <json>`` as its last line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import json
import sys
from typing import Any

from ._harness import Sizes, System

ROWS = ("enqueue_single", "enqueue_batch", "end_to_end", "latency")


async def measure(system: System, row: str, sizes: Sizes) -> Any:
    if row == "enqueue_single":
        return await system.enqueue_single(sizes)
    if row == "enqueue_batch":
        return await system.enqueue_batch(sizes)
    if row == "end_to_end":
        return dataclasses.asdict(await system.end_to_end(sizes))
    if row == "latency":
        return dataclasses.asdict(await system.latency(sizes))
    raise ValueError(f"unknown row {row!r}; rows: {', '.join(ROWS)}")


def main(argv: list[str]) -> None:
    module, row, sizes_json = argv
    system: System = importlib.import_module(f"bench.peers.{module}").SYSTEM
    sizes = Sizes(**json.loads(sizes_json))
    result = asyncio.run(measure(system, row, sizes))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
