"""What tracing costs: embedded submit-and-run throughput with tracing off and on, in one run.

Run:  uv run python bench/tracing.py            (10,000 tasks a round, 5 rounds; medians)
      uv run python bench/tracing.py --quick    (smaller, for a smoke run)

N no-op tasks through a Scheduler over MemoryStore (pool concurrency 1,000), submitted with
``submit_many`` (chunks of 1,000) and with single ``submit`` calls from 100 concurrent
submitters, timed until the last completion is committed (bench/_common.py ``end_to_end``).
Three settings, interleaved round by round so that the machine's drift hits each alike:

- off: ``Scheduler(...)`` as by default (no tracing object; cronoq.tracing not used);
- on, no-op: ``tracing=True`` with no SDK installed as the global provider, so OpenTelemetry's
  API hands out non-recording spans (cronoq's own instrumentation, nothing recorded);
- on, SDK: ``tracing=<an SDK TracerProvider>`` sampling every span into an in-memory exporter
  through a ``SimpleSpanProcessor`` (every span recorded and exported as it ends).

Prints each median (tasks/s, with the rounds) and its ratio to off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from typing import Any

from _common import end_to_end, row
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from cronoq import MemoryStore
from cronoq.store import Store


async def _memory() -> Store:
    return MemoryStore()


def _sdk() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _measure(n: int, batch: bool, tracing: Any) -> float:
    return asyncio.run(end_to_end(_memory, n, batch=batch, tracing=tracing))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 tasks, 3 rounds")
    args = parser.parse_args()
    n, rounds = (2_000, 3) if args.quick else (10_000, 5)
    print(f"python {sys.version.split()[0]}; {n:,} no-op tasks a round, {rounds} rounds")
    for batch in (True, False):
        how = "submit_many" if batch else "submit x100 concurrent"
        results: dict[str, list[float]] = {"off": [], "on, no-op": [], "on, SDK": []}
        spans = 0
        for _ in range(rounds):
            provider, exporter = _sdk()
            settings: list[tuple[str, Any]] = [
                ("off", False),
                ("on, no-op", True),
                ("on, SDK", provider),
            ]
            for label, setting in settings:
                results[label].append(_measure(n, batch, setting))
            spans = len(exporter.get_finished_spans())
            provider.shutdown()
        off = statistics.median(results["off"])
        for label, values in results.items():
            median = statistics.median(values)
            note = "" if label == "off" else f"  ratio to off {median / off:.2f}"
            row(f"{how}: tracing {label}", median, "tasks/s", values, note)
        print(f"  (spans recorded by the SDK in the last round: {spans:,})", flush=True)


if __name__ == "__main__":
    main()
