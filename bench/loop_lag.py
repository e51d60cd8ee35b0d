"""How long the worst request the server's limits allow holds up every other call.

    uv run python bench/loop_lag.py [--rounds 3] [--tasks 100000]

Starts ``cronoq-server serve`` (memory store, default 4 MiB message limit), puts ``--tasks``
tasks in its memory (SubmitMany calls of the most a call takes), then, while one connection
sends a probe (a ``Get`` of a known task) every 10 ms, another sends each worst request in turn,
``--rounds`` times. A probe's latency above its idle latency is the time the server's event
loop spent on something else: the figure printed per request is the worst probe (minus the idle
median) of each round, which is what leadership renewal and heartbeats would wait too.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import grpc

from cronoq_client.protocol import (
    MAX_LIST_PAGE,
    MAX_SUBMIT_EACH,
    MAX_SUBMIT_MANY_REFERENCES,
    MAX_SUBMIT_MANY_TASKS,
    pb,
    pb_grpc,
)

CONFIG = """
[store]
kind = "memory"
[listen]
grpc = "127.0.0.1:0"
http = "127.0.0.1:0"
[[pools]]
name = "default"
"""
PROBE_INTERVAL_S = 0.01


async def _start(directory: Path) -> tuple[asyncio.subprocess.Process, str]:
    config = directory / "cronoq.toml"
    config.write_text(CONFIG)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cronoq_server", "serve", "--config", str(config),
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert process.stderr is not None
    while True:
        line = (await process.stderr.readline()).decode()
        if not line:
            raise SystemExit("the server exited before listening")
        if 'msg="listening"' in line:
            port = line.split("grpc_port=")[1].split()[0]
        if "role=leading" in line and 'msg="serving"' in line:
            return process, f"127.0.0.1:{port}"


async def _probe(stub: pb_grpc.SchedulerServiceAsyncStub, task_id: int, out: list[float]) -> None:
    while True:
        start = time.perf_counter()
        await stub.Get(pb.GetRequest(task_id=task_id))
        out.append(time.perf_counter() - start)
        await asyncio.sleep(PROBE_INTERVAL_S)


def _richest_batch(parents: list[int]) -> pb.SubmitManyRequest:
    """The most a SubmitMany may carry, every task in full: as many tasks, dependencies and
    tags as a call takes, each task with a key of 1,024 characters and a retry policy."""
    per_task = MAX_SUBMIT_MANY_REFERENCES // MAX_SUBMIT_MANY_TASKS
    stamp = time.monotonic_ns()
    tasks = [
        pb.TaskRequest(
            kind="k",
            key=f"{stamp}-{i}-".ljust(1024, "k"),
            tags=[f"tag-{j}".ljust(200, "t") for j in range(per_task)],
            after=parents[i * per_task : (i + 1) * per_task],
            retry=pb.RetryPolicy(max_attempts=3),
        )
        for i in range(MAX_SUBMIT_MANY_TASKS)
    ]
    return pb.SubmitManyRequest(tasks=tasks)


def _each(tasks: Iterable[pb.TaskRequest]) -> pb.SubmitEachRequest:
    return pb.SubmitEachRequest(submissions=[pb.SubmitRequest(task=task) for task in tasks])


def _worst_requests(
    stub: pb_grpc.SchedulerServiceAsyncStub, parents: list[int]
) -> dict[str, Callable[[], Awaitable[object]]]:
    cron = ",".join(str(i % 60) for i in range(400))[:1015].rstrip(",") + " * * * *"
    every_second = "* * * * * *"
    compact = pb.SubmitManyRequest(
        common=pb.TaskRequest(kind="k"), payloads=[b"p"] * MAX_SUBMIT_MANY_TASKS
    )
    return {
        "PreviewSchedule, every second, n=10,000": lambda: stub.PreviewSchedule(
            pb.PreviewScheduleRequest(cron=every_second, n=10_000)
        ),
        "PreviewSchedule, 1 KiB cron, n=10,000": lambda: stub.PreviewSchedule(
            pb.PreviewScheduleRequest(cron=cron, n=10_000)
        ),
        "AddSchedule, 1 KiB cron": lambda: stub.AddSchedule(
            pb.AddScheduleRequest(name=f"s{time.monotonic_ns()}", cron=cron, kind="k")
        ),
        f"SubmitMany, {MAX_SUBMIT_MANY_TASKS:,} tasks, compact form": lambda: stub.SubmitMany(
            compact
        ),
        f"SubmitMany, {MAX_SUBMIT_MANY_TASKS:,} tasks in full, "
        f"{MAX_SUBMIT_MANY_REFERENCES:,} dependencies and tags, 1 KiB keys": lambda: (
            stub.SubmitMany(_richest_batch(parents))
        ),
        f"SubmitEach, {MAX_SUBMIT_EACH:,} submissions of kind and payload": lambda: stub.SubmitEach(
            _each([pb.TaskRequest(kind="k", payload=b"p")] * MAX_SUBMIT_EACH)
        ),
        f"SubmitEach, {MAX_SUBMIT_EACH:,} submissions in full, "
        f"{MAX_SUBMIT_MANY_REFERENCES:,} dependencies and tags, 1 KiB keys": lambda: (
            stub.SubmitEach(_each(_richest_batch(parents).tasks))
        ),
        f"List, a full page ({MAX_LIST_PAGE:,} tasks)": lambda: stub.List(pb.ListRequest()),
        "List, a filter no task matches (every task examined)": lambda: stub.List(
            pb.ListRequest(kind="nothing")
        ),
    }


async def _fill(stub: pb_grpc.SchedulerServiceAsyncStub, count: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        size = min(MAX_SUBMIT_MANY_TASKS, count - len(ids))
        batch = pb.SubmitManyRequest(common=pb.TaskRequest(kind="k"), payloads=[b"p"] * size)
        ids += (await stub.SubmitMany(batch)).task_ids
    return ids


async def main(rounds: int, tasks: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        process, target = await _start(Path(directory))
        try:
            options = [("grpc.max_send_message_length", 8 << 20)]
            async with (
                grpc.aio.insecure_channel(target) as probe_channel,
                grpc.aio.insecure_channel(target, options=options) as work_channel,
            ):
                probes = pb_grpc.SchedulerServiceStub(probe_channel)
                work = pb_grpc.SchedulerServiceStub(work_channel)
                known = await probes.Submit(pb.SubmitRequest(task=pb.TaskRequest(kind="k")))
                parents = await _fill(work, tasks)
                print(f"{len(parents) + 1:,} tasks in memory")
                idle: list[float] = []
                prober = asyncio.create_task(_probe(probes, known.task_id, idle))
                await asyncio.sleep(1.0)
                base = statistics.median(idle)
                print(f"idle probe: median {base * 1000:.1f} ms")
                for name, request in _worst_requests(work, parents).items():
                    calls: list[float] = []
                    delays: list[float] = []
                    for _ in range(rounds):
                        idle.clear()
                        start = time.perf_counter()
                        await request()
                        calls.append(time.perf_counter() - start)
                        await asyncio.sleep(0.2)  # the probes after it, too
                        delays.append(max(idle) - base)
                    print(
                        f"{name}: call {statistics.median(calls) * 1000:.0f} ms, worst probe "
                        f"delay {max(delays) * 1000:.0f} ms "
                        f"[{', '.join(f'{d * 1000:.0f}' for d in delays)}]"
                    )
                prober.cancel()
        finally:
            process.terminate()
            await process.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.tasks))
