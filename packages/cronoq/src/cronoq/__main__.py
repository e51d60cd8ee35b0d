"""``python -m cronoq demo``: real tasks on a cron schedule, with a retry and a dependency."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime

from cronoq import JsonCodec, Pool, RetryPolicy, Scheduler, TaskContext, TaskError


def _say(message: str) -> None:
    print(f"{datetime.now(UTC):%H:%M:%S.%f}"[:-3], message, flush=True)


async def _demo(seconds: float) -> None:
    async def work(ctx: TaskContext, payload: dict[str, str]) -> str:
        _say(f"  run  task {ctx.task_id} {ctx.kind:<8} attempt {ctx.attempt} {payload}")
        if ctx.kind == "flaky" and ctx.attempt < 3:
            raise TaskError(f"flaky failure on attempt {ctx.attempt}", retry_after=0.2)
        return f"{ctx.kind} done"

    pool = Pool("default", work, concurrency=4)
    async with Scheduler([pool], codec=JsonCodec()) as sched:
        await sched.add_schedule("heartbeat", "*/1 * * * * *", kind="tick", payload={"every": "1s"})
        _say("schedule 'heartbeat' fires every second (6-field cron, seconds first)")
        flaky = await sched.submit(
            "flaky", {"note": "fails twice"}, retry=RetryPolicy.exponential(5, initial=0.2)
        )
        report = await sched.submit("report", {"needs": str(flaky)}, after=[flaky])
        _say(f"submitted flaky task {flaky} and report task {report} that waits for it")
        done = await sched.wait(report, timeout=30)
        _say(f"report task {report}: {done.status} after its dependency -> {done.output!r}")
        flaky_info = await sched.get(flaky)
        _say(f"flaky task {flaky}: {flaky_info.status} on attempt {flaky_info.attempt}")
        await asyncio.sleep(seconds)
        ticks = await sched.list(kind="tick")
        _say(f"the schedule created {len(ticks)} tick tasks; stopping")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cronoq")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a short demonstration in memory")
    demo.add_argument("--seconds", type=float, default=3.0, help="how long the schedule runs")
    args = parser.parse_args(argv)
    if args.command == "demo":
        asyncio.run(_demo(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
