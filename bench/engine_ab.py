"""The pure engine (bench/engine.py's row (b)), or the embedded Scheduler end to end over
MemoryStore, of several source trees, interleaved.

Run:  git worktree add --detach /tmp/before <commit>
      uv run python bench/engine_ab.py before=/tmp/before after=. [--runs 11] [--tasks 300000]
          [--measure engine|submit_many|submit]

``--measure``: ``engine`` (default), transitions per second of the pure engine;
``submit_many`` and ``submit``, tasks per second from the first submission to the last
committed completion (bench/_common.py ``end_to_end``: chunks of 1,000, or single calls from
100 concurrent submitters), which includes the driver, the Scheduler's validation and the
executors.

Each measurement runs in a fresh process with the tree's ``packages/cronoq/src`` first on the
path; the trees take turns, so that load on the machine falls on each alike. Prints every run,
then per tree the median and its ratio to the first tree's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
MEASURES = {
    "engine": "print(engine.engine_transitions({n}))",
    "submit_many": "print(asyncio.run(_common.end_to_end(engine.memory, {n}, batch=True)))",
    "submit": "print(asyncio.run(_common.end_to_end(engine.memory, {n}, batch=False)))",
}
PRELUDE = "import asyncio, sys; sys.path.insert(0, {bench!r}); import _common, engine; "


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", help="NAME=PATH of a checkout")
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--tasks", type=int, default=300_000)
    parser.add_argument("--measure", choices=sorted(MEASURES), default="engine")
    args = parser.parse_args()
    trees = dict(tree.split("=", 1) for tree in args.trees)
    code = PRELUDE.format(bench=str(BENCH)) + MEASURES[args.measure].format(n=args.tasks)
    unit = "transitions/s" if args.measure == "engine" else "tasks/s"
    results: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, path in trees.items():
            src = str(Path(path).resolve() / "packages" / "cronoq" / "src")
            env = {**os.environ, "PYTHONPATH": src}
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            results[name].append(float(out.stdout.split()[-1]))
            print(f"{name}: {results[name][-1]:,.0f} {unit}", flush=True)
    first = statistics.median(next(iter(results.values())))
    for name, values in results.items():
        median = statistics.median(values)
        spread = ", ".join(f"{v:,.0f}" for v in sorted(values))
        print(f"{name}: median {median:,.0f} {unit} [{spread}]  {median / first:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
