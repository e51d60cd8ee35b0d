"""How much a page of ``Scheduler.list`` costs with a million live tasks in memory: what the
dashboard's tasks page and ``cronoq tasks list`` pay per page.

Run:  uv run python bench/list_pages.py [--tasks 1000000] [--runs 5]

The tasks wait in a remote pool no worker attached to (so they stay ready); each page is
timed ``--runs`` times in this process, and the median printed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from cronoq import MemoryStore, RemotePool, Scheduler, Status, TaskRequest


async def main(tasks: int, runs: int) -> None:
    async with Scheduler([RemotePool("default")], store=MemoryStore()) as sched:
        started = time.perf_counter()
        for offset in range(0, tasks, 100_000):
            size = min(100_000, tasks - offset)
            await sched.submit_many([TaskRequest("k", pool="default")] * size)
        print(f"{tasks:,} tasks submitted in {time.perf_counter() - started:.1f} s")
        first = (await sched.list(limit=1))[0].task_id

        async def timed(label: str, **query: Any) -> None:
            seconds = []
            for _ in range(runs):
                began = time.perf_counter()
                page = await sched.list(**query)
                seconds.append(time.perf_counter() - began)
            median = statistics.median(seconds) * 1000
            print(f"{label}: {median:.1f} ms ({len(page)} tasks)", flush=True)

        await timed("the first page of 50", limit=50)
        await timed("a page of 50 in the middle", limit=50, after=first + tasks // 2)
        await timed("a page of 200 near the end", limit=200, after=first + tasks - 1_000)
        await timed("a status filter every task matches", limit=50, status=[Status.READY])
        await timed("a status filter no task matches", limit=50, status=[Status.FAILED])
        await timed("a kind filter no task matches", limit=50, kind="other")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.runs))
