"""Run every system in turn, alternating across rounds, and print a table of medians.

Run:  uv run --group bench python -m bench.peers            (full sizes, 3 rounds)
      uv run --group bench python -m bench.peers --quick    (small sizes, 1 round)

Each measurement runs in a fresh process against a fresh database (CREATE DATABASE per system,
row and round, dropped afterwards). Within a round, each row is measured for every system
before the next row; the order of the systems rotates from round to round. See README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ._child import ROWS
from ._envs import compile_bytecode, python_for
from ._harness import ADMIN_DSN, Sizes, check_durability, fresh_database
from ._peer import REPO_ROOT

# (module, column, distribution)
SYSTEMS = [
    ("cronoq_pg", "cronoq-pg", "cronoq-store-postgres"),
    ("cronoq_sqlite", "cronoq-sqlite", "cronoq-store-sqlite"),
    ("cronoq_memory", "cronoq-memory", "cronoq"),
    ("cronoq_server_pg", "cronoq-server-pg", "cronoq-server"),
    ("cronoq_server_sqlite", "cronoq-server-sqlite", "cronoq-server"),
    ("cronoq_server_pg_auth", "cronoq-server-pg-auth", "cronoq-server"),
    ("cronoq_server_sqlite_auth", "cronoq-server-sqlite-auth", "cronoq-server"),
    ("pgqueuer", "pgqueuer", "pgqueuer"),
    ("procrastinate", "procrastinate", "procrastinate"),
    ("oban", "oban", "oban"),
    ("apscheduler", "apscheduler", "apscheduler"),
]
PEERS = ("pgqueuer", "procrastinate", "oban", "apscheduler")
# cronoq_memory is a reference line only
COMPARED = {
    "cronoq_pg": "cronoq-pg",
    "cronoq_sqlite": "cronoq-sqlite",
    "cronoq_server_pg": "cronoq-server-pg",
    "cronoq_server_sqlite": "cronoq-server-sqlite",
    "cronoq_server_pg_auth": "cronoq-server-pg-auth",
    "cronoq_server_sqlite_auth": "cronoq-server-sqlite-auth",
}


@dataclass(frozen=True)
class Metric:
    label: str
    row: str
    key: str | None
    better: Literal["higher", "lower"]
    digits: int
    compared: bool = True


def metrics(sizes: Sizes) -> list[Metric]:
    return [
        Metric(
            f"1. enqueue, single calls from {sizes.submitters} submitters (tasks/s)",
            "enqueue_single", None, "higher", 0,
        ),
        Metric(
            f"2. enqueue, batch API, {sizes.batch_size:,} per call (tasks/s)",
            "enqueue_batch", None, "higher", 0,
        ),
        Metric(
            f"3. end to end, {sizes.end_to_end:,} tasks, concurrency {sizes.concurrency} (tasks/s)",
            "end_to_end", "tasks_per_s", "higher", 0,
        ),
        Metric(f"4. enqueue to start p50 at {sizes.rate:.0f}/s (ms)", "latency", "start_p50",
               "lower", 2),
        Metric(f"4. enqueue to start p99 at {sizes.rate:.0f}/s (ms)", "latency", "start_p99",
               "lower", 2),
        Metric("4. enqueue acknowledgement p50 (ms)", "latency", "ack_p50", "lower", 2),
        Metric("4. enqueue acknowledgement p99 (ms)", "latency", "ack_p99", "lower", 2),
        Metric("5. worker CPU per task, row 3 (µs)", "end_to_end", "cpu_us_per_task", "lower", 0),
        Metric("5. worker peak RSS, row 3 (MiB)", "end_to_end", "peak_rss_mib", "lower", 1),
        Metric("5. enqueuing process CPU per task, row 3 (µs; cronoq: in the worker's)",
               "end_to_end", "enqueuer_cpu_us_per_task", "lower", 0, compared=False),
        Metric("5. cronoq-server process CPU per task, row 3 (µs)",
               "end_to_end", "server_cpu_us_per_task", "lower", 0, compared=False),
        Metric("5. cronoq-server process peak RSS, row 3 (MiB)",
               "end_to_end", "server_peak_rss_mib", "lower", 1, compared=False),
    ]  # fmt: skip


@dataclass
class Results:
    values: dict[tuple[str, str, str | None], list[float | None]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    raw: dict[str, list[float]] = field(default_factory=dict)

    def add(self, module: str, row: str, result: Any) -> None:
        if isinstance(result, dict):
            for key, value in result.items():
                self.values.setdefault((module, row, key), []).append(value)
        else:
            self.values.setdefault((module, row, None), []).append(result)

    def median(self, module: str, metric: Metric) -> float | str | None:
        """The median, None when not applicable, "failed" or "-" (not run)."""
        runs = self.values.get((module, metric.row, metric.key))
        if runs is None:
            failed = any(f.startswith(f"{module} {metric.row} ") for f in self.failures)
            return "failed" if failed else "-"
        numbers = [v for v in runs if v is not None]
        return statistics.median(numbers) if numbers else None


def run_child(python: str, module: str, row: str, sizes: Sizes, timeout: float) -> Any:
    args = [python, "-m", "bench.peers._child", module, row, json.dumps(sizes.to_json())]
    done = subprocess.run(args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("RESULT "):
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-12:])
        raise RuntimeError(f"exit {done.returncode}:\n{tail}")
    return json.loads(lines[-1].removeprefix("RESULT "))


async def raw_commits(rows_per_commit: int, rows: int) -> float:
    """Rows per second of a bare asyncpg loop: one transaction per ``rows_per_commit`` rows."""
    import asyncpg

    async with fresh_database("raw") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, payload bytea)")
            insert = "INSERT INTO t SELECT * FROM unnest($1::bigint[], $2::bytea[])"
            start = time.perf_counter()
            for first in range(0, rows, rows_per_commit):
                ids = list(range(first, first + rows_per_commit))
                async with conn.transaction():
                    await conn.execute(insert, ids, [b""] * len(ids))
            return rows / (time.perf_counter() - start)
        finally:
            await conn.close()


def _describe(value: float | str | None, digits: int) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return f"{value:,.{digits}f}"


def _ratio(value: float | str | None, best: float | None, better: str) -> str:
    if not isinstance(value, float | int) or best is None or value <= 0 or best <= 0:
        return "-"
    return f"{(value / best if better == 'higher' else best / value):.2f}x"


def table(results: Results, sizes: Sizes, modules: list[str]) -> str:
    columns = [column for module, column, _ in SYSTEMS if module in modules]
    compared = [module for module in COMPARED if module in modules]
    header = ["row", *columns, *(f"{COMPARED[m]} vs best peer" for m in compared)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for metric in metrics(sizes):
        cells = [metric.label]
        peers: list[float] = []
        for module, _, _ in SYSTEMS:
            if module not in modules:
                continue
            value = results.median(module, metric)
            cells.append(_describe(value, metric.digits))
            if module in PEERS and isinstance(value, float | int):
                peers.append(float(value))
        best = (max(peers) if metric.better == "higher" else min(peers)) if peers else None
        if not metric.compared:
            best = None
        for module in compared:
            cells.append(_ratio(results.median(module, metric), best, metric.better))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
        mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f"{mem_kib / 1024**2:.0f} GiB"
    except OSError:
        memory = "unknown memory"
    return f"{platform.platform()}, {os.cpu_count()} CPUs ({model}), {memory}"


async def _server_version() -> str:
    import asyncpg

    conn = await asyncpg.connect(ADMIN_DSN)
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


def _version(python: str, distribution: str) -> str:
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))",
         distribution],
        capture_output=True, text=True, cwd=REPO_ROOT,
    )  # fmt: skip
    return done.stdout.strip() if done.returncode == 0 else "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument(
        "--systems", default=",".join(m for m, _, _ in SYSTEMS), help="comma-separated modules"
    )
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per measurement")
    parser.add_argument("--json", type=Path, default=None, help="also write every value here")
    parser.add_argument(
        "--batch-size", type=int, default=None, help="tasks per batch call (rows 2 and 3)"
    )
    args = parser.parse_args(argv)
    sizes = Sizes.quick() if args.quick else Sizes.full()
    if args.batch_size is not None:
        sizes = dataclasses.replace(sizes, batch_size=args.batch_size)
    rounds = args.rounds or (1 if args.quick else 3)
    timeout = args.timeout or (300.0 if args.quick else 1800.0)
    wanted = args.systems.split(",")
    rows = [r for r in ROWS if r in args.rows.split(",")]
    unknown = set(wanted) - {m for m, _, _ in SYSTEMS}
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")

    durability = asyncio.run(check_durability(ADMIN_DSN))
    print(f"machine: {_machine()}")
    print(
        f"python {platform.python_version()}, PostgreSQL {asyncio.run(_server_version())} "
        f"at {ADMIN_DSN}, " + ", ".join(f"{k}={v}" for k, v in durability.items())
    )
    print(f"sizes: {sizes.to_json()}, {rounds} round(s), medians")

    pythons: dict[str, str] = {}
    results = Results()
    for module, column, distribution in SYSTEMS:
        if module not in wanted:
            continue
        python, note = python_for(module)
        if python is None:
            print(f"  {column}: NOT RUN: {note}")
            results.failures.append(f"{module} (all rows) not run: {note}")
            continue
        if python not in pythons.values():
            compile_bytecode(python)
        pythons[module] = python
        extra = f", {note}" if note else ""
        print(f"  {column}: {distribution} {_version(python, distribution)}{extra}")
    modules = [m for m, _, _ in SYSTEMS if m in pythons]
    print(flush=True)

    for number in range(rounds):
        one = asyncio.run(raw_commits(1, 500 if args.quick else 2_000))
        many = asyncio.run(raw_commits(1000, 50_000 if args.quick else 200_000))
        results.raw.setdefault("1-row commits", []).append(one)
        results.raw.setdefault("1,000-row commits", []).append(many)
        print(f"round {number + 1}: raw asyncpg {one:,.0f} rows/s (1-row commits), "
              f"{many:,.0f} rows/s (1,000-row commits)", flush=True)  # fmt: skip
        shift = number % len(modules) if modules else 0
        order = modules[shift:] + modules[:shift]
        for row in rows:
            for module in order:
                started = time.perf_counter()
                try:
                    result = run_child(pythons[module], module, row, sizes, timeout)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    results.failures.append(f"{module} {row} round {number + 1}: {exc}")
                    print(f"round {number + 1}: {row:<15} {module:<14} FAILED: {exc}", flush=True)
                    continue
                results.add(module, row, result)
                took = time.perf_counter() - started
                print(f"round {number + 1}: {row:<15} {module:<14} {_show(result)}"
                      f"  ({took:.1f} s)", flush=True)  # fmt: skip

    print()
    print(table(results, sizes, modules))
    print()
    for name, values in results.raw.items():
        shown = ", ".join(f"{v:,.0f}" for v in values)
        print(f"6. raw asyncpg, {name}: {statistics.median(values):,.0f} rows/s [{shown}]")
    print(
        "\nRatios: cronoq's median over the best peer's median (throughput), or the best "
        "peer's over cronoq's (latency, CPU, RSS): above 1 means cronoq is better."
    )
    if results.failures:
        print("\nFailures:")
        for failure in results.failures:
            print(f"- {failure}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "sizes": sizes.to_json(),
                    "rounds": rounds,
                    "values": [
                        {"system": m, "row": r, "key": k, "runs": v}
                        for (m, r, k), v in results.values.items()
                    ],
                    "raw": results.raw,
                    "failures": results.failures,
                },
                indent=1,
            )
        )
    return 1 if results.failures else 0


def _show(result: Any) -> str:
    if result is None:
        return "n/a (no batch API)"
    if isinstance(result, dict):
        return ", ".join(f"{k} {v:,.2f}" for k, v in result.items() if v is not None)
    return f"{result:,.0f} tasks/s"


if __name__ == "__main__":
    sys.exit(main())
