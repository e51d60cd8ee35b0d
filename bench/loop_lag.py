"""How long the worst request the server's limits allow holds up every other call.

    uv run python bench/loop_lag.py

Starts ``cronoq-server serve`` (memory store, default 4 MiB message limit) and, while one
connection sends a probe (a ``Get`` of a known task) every 10 ms, another sends each worst
request in turn. A probe's latency above its idle latency is the time the server's event loop
spent on something else: the figure printed per request is the worst probe (minus the idle
median), which is what leadership renewal and heartbeats would wait too.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc

from cronoq_client.protocol import pb, pb_grpc

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


def _worst_requests(
    stub: pb_grpc.SchedulerServiceAsyncStub,
) -> dict[str, Callable[[], Awaitable[object]]]:
    cron = ",".join(str(i % 60) for i in range(400))[:1015].rstrip(",") + " * * * *"
    every_second = "* * * * * *"
    batch = pb.SubmitManyRequest(common=pb.TaskRequest(kind="k"), payloads=[b"p"] * 100_000)
    return {
        "PreviewSchedule, 1 KiB cron, n=10,000": lambda: stub.PreviewSchedule(
            pb.PreviewScheduleRequest(cron=every_second, n=10_000)
        ),
        "PreviewSchedule, 1 KiB cron": lambda: stub.PreviewSchedule(
            pb.PreviewScheduleRequest(cron=cron, n=10_000)
        ),
        "AddSchedule, 1 KiB cron": lambda: stub.AddSchedule(
            pb.AddScheduleRequest(name=f"s{time.monotonic_ns()}", cron=cron, kind="k")
        ),
        "SubmitMany, 100,000 tasks (MAX_BATCH)": lambda: stub.SubmitMany(batch),
        "List, a full page (10,000 tasks)": lambda: stub.List(pb.ListRequest()),
    }


async def main() -> None:
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
                idle: list[float] = []
                prober = asyncio.create_task(_probe(probes, known.task_id, idle))
                await asyncio.sleep(1.0)
                base = statistics.median(idle)
                print(f"idle probe: median {base * 1000:.1f} ms")
                for name, request in _worst_requests(work).items():
                    idle.clear()
                    start = time.perf_counter()
                    await request()
                    took = time.perf_counter() - start
                    await asyncio.sleep(0.2)  # the probes after it, too
                    worst = max(idle) - base
                    print(f"{name}: call {took * 1000:.0f} ms, ", end="")
                    print(f"worst probe delay {worst * 1000:.0f} ms")
                prober.cancel()
        finally:
            process.terminate()
            await process.wait()


if __name__ == "__main__":
    asyncio.run(main())
