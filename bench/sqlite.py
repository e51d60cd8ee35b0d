"""Benchmarks of SqliteStore: throughput and latency with full_sync on and off, and the raw
ceiling of this machine (a bare sqlite3 loop, each transaction one hop to a thread, as the
store runs them) with the same sync setting.

Run:  uv run python bench/sqlite.py             (100,000 tasks, 3 rounds; medians)
      uv run python bench/sqlite.py --quick     (10,000 tasks, smoke run)
      uv run python bench/sqlite.py --ceiling   (the raw loops alone: the store's ceiling)

Files go to a temporary directory on the same filesystem as /tmp (override with --dir).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

from _common import end_to_end, latency, median_of, row

from cronoq.store import Store
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig


class Files:
    """A fresh database path per measurement, so no run reads another's data."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.count = 0

    def next(self) -> Path:
        self.count += 1
        return self.directory / f"bench-{self.count}.db"


async def raw_commits(path: Path, *, full_sync: bool, rows_per_commit: int, rows: int) -> float:
    """Rows per second of a bare sqlite3 loop: BEGIN IMMEDIATE, insert, COMMIT, each
    transaction run on a thread in one hop."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {2 if full_sync else 1}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, payload BLOB)")

        def transaction(first: int) -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                "INSERT INTO t VALUES (?, ?)",
                [(i, b"") for i in range(first, first + rows_per_commit)],
            )
            conn.execute("COMMIT")

        start = time.perf_counter()
        for first in range(0, rows, rows_per_commit):
            await asyncio.to_thread(transaction, first)
        return rows / (time.perf_counter() - start)
    finally:
        conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--ceiling", action="store_true", help="the raw commit loops alone")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    n = 10_000 if args.quick else 100_000
    seconds = 3.0 if args.quick else 10.0

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        files = Files(Path(tmp))
        print(f"python {sys.version.split()[0]}, {rounds} rounds, medians (all runs in brackets)")
        for full_sync in (True, False):
            config = SqliteStoreConfig(full_sync=full_sync)
            tag = f"full_sync={'on' if full_sync else 'off'}"

            async def open_store(config: SqliteStoreConfig = config) -> Store:
                return await SqliteStore.open(files.next(), config)

            def raw(rows_per_commit: int, rows: int, full_sync: bool = full_sync) -> float:
                return asyncio.run(
                    raw_commits(
                        files.next(), full_sync=full_sync, rows_per_commit=rows_per_commit,
                        rows=rows,
                    )
                )  # fmt: skip

            one_row, values = median_of(rounds, lambda: raw(1, 2_000))
            row(f"raw sqlite3, 1-row commits, {tag}", one_row, "rows/s", values)
            median, values = median_of(rounds, lambda: raw(1000, 200_000))
            row(f"raw sqlite3, 1,000-row commits, {tag}", median, "rows/s", values)
            if args.ceiling:
                continue
            median, values = median_of(
                rounds, lambda: asyncio.run(end_to_end(open_store, n, batch=True))
            )
            row(f"end to end, submit_many, {n:,} tasks, {tag}", median, "tasks/s", values)
            median, values = median_of(
                rounds, lambda: asyncio.run(end_to_end(open_store, n, batch=False))
            )
            ratio = f"  ({median / one_row:.1f}x the 1-row commit loop)"
            row(f"end to end, single submits x100, {tag}", median, "tasks/s", values, ratio)
            figures = asyncio.run(latency(open_store, 200, seconds))
            print(
                f"{'latency at 200 tasks/s, ' + tag:<58} submit-to-start p50 "
                f"{figures['start_p50']:.2f} ms, p99 {figures['start_p99']:.2f} ms; "
                f"ack p50 {figures['ack_p50']:.2f} ms, p99 {figures['ack_p99']:.2f} ms",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
