"""cronoq-server's cost of keeping a worker's long attempts alive: unary heartbeats or batched.

Run from the repository root:

    uv run --group bench python -m bench.peers.heartbeats
    uv run --group bench python -m bench.peers.heartbeats --attempts 1000 --lease 6 --intervals 4

A fresh server (``python -m cronoq_server serve``, memory store, as ``bench.peers`` starts it,
its pool with a lease of ``--lease`` seconds) and, in this process, one ``Worker`` with
``--attempts`` slots whose attempts all run until the end. Once every attempt was renewed
once, the load is measured over ``--intervals`` heartbeat intervals (a third of the lease)
from half an interval later (the attempts start together, so the window holds whole rounds):
heartbeat calls per second (the server's ``cronoq_grpc_calls_total`` of ``Heartbeat`` and
``HeartbeatMany``), leases renewed per second (counted by the worker), and the server
process's CPU (user + system, every thread, from /proc) per renewal.

Two rows in one run: ``unary``, the worker sending one ``Heartbeat`` per attempt as a worker
of an older release does (forced through the fallback it takes with a server that does not
know ``HeartbeatMany``), and ``batched``, the worker as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from cronoq import AttemptToken, LeaseRenewed, TaskContext, TaskRequest
from cronoq_client import AsyncClient
from cronoq_client import Worker as RemoteWorker

from ._server import POOL, ServerProcess

_METHODS = ("cronoq.v1.WorkerService/Heartbeat", "cronoq.v1.WorkerService/HeartbeatMany")


@dataclass(frozen=True, slots=True)
class Row:
    calls_per_s: float
    renewals_per_s: float
    cpu_us_per_renewal: float


def _heartbeat_calls(http_port: int) -> float:
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cronoq_grpc_calls_total" and sample.labels.get("method") in _METHODS
    )


async def _round(batched: bool, attempts: int, lease_s: float, intervals: int) -> Row:
    release = asyncio.Event()

    async def hold(ctx: TaskContext, payload: Any) -> None:
        await release.wait()

    with tempfile.TemporaryDirectory(prefix="cronoq-heartbeats-") as tmp:
        store = 'kind = "memory"'
        async with ServerProcess(store, Path(tmp), pool_options=f"lease_s = {lease_s}\n") as server:
            assert server.http_port is not None
            worker = RemoteWorker(server.target, {POOL: hold}, slots=attempts)
            # The worker's private parts, for a measurement only: its renewals are counted,
            # and the unary row sends as it does to a server without HeartbeatMany.
            beats: Any = worker._heartbeats
            renewals = 0
            counted = beats._renewed

            def renewed(token: AttemptToken, sent: float, renewal: LeaseRenewed) -> None:
                nonlocal renewals
                renewals += 1
                counted(token, sent, renewal)

            beats._renewed = renewed
            if not batched:
                beats._send = beats._send_each
            running = asyncio.create_task(worker.run())
            try:
                await worker.attached()
                async with AsyncClient(server.target) as client:
                    await client.submit_many([TaskRequest("hold") for _ in range(attempts)])
                while renewals < attempts:  # every attempt runs and was renewed once
                    server.check()
                    await asyncio.sleep(0.05)
                # From half an interval on: the attempts started together and are renewed
                # together, so a window of whole intervals from there holds whole rounds.
                await asyncio.sleep(lease_s / 6)
                calls, cpu, counted_from = (
                    _heartbeat_calls(server.http_port),
                    server.usage().cpu_s,
                    renewals,
                )
                began = time.monotonic()
                await asyncio.sleep(intervals * lease_s / 3)
                elapsed = time.monotonic() - began
                calls = _heartbeat_calls(server.http_port) - calls
                cpu = server.usage().cpu_s - cpu
                renewed_n = renewals - counted_from
            finally:
                release.set()
                worker.stop()
                worker.stop()
                await asyncio.gather(running, return_exceptions=True)
    return Row(calls / elapsed, renewed_n / elapsed, cpu / max(renewed_n, 1) * 1e6)


async def _main(args: argparse.Namespace) -> None:
    print(
        f"{args.attempts} long attempts in one worker, lease {args.lease} s "
        f"(a heartbeat every {args.lease / 3:.1f} s), {args.intervals} intervals measured"
    )
    print(f"{'':8} {'calls/s':>9} {'renewals/s':>11} {'server CPU µs/renewal':>22}")
    for label, batched in (("unary", False), ("batched", True)):
        row = await _round(batched, args.attempts, args.lease, args.intervals)
        print(
            f"{label:8} {row.calls_per_s:9.1f} {row.renewals_per_s:11.1f} "
            f"{row.cpu_us_per_renewal:22.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--lease", type=float, default=6.0, help="the pool's lease_s")
    parser.add_argument("--intervals", type=int, default=4)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
