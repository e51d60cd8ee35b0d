"""The Python gRPC ceiling: a bare grpc.aio server and client with cronoq's messages.

Run:  uv run python bench/grpc_ceiling.py                (medians of 5 rounds)
      uv run python bench/grpc_ceiling.py --quick        (small sizes, one round)

What a cronoq-server call could cost at the least on this machine: the server (a process of
its own, on uvloop as ``cronoq-server serve`` runs by default) has the methods of cronoq's
protocol with cronoq's own messages, deserialized by protobuf, and answers each with a
constant reply (a ``SubmitResponse``, a ``SubmitManyResponse`` of as many ids as tasks, one
``AttachResponse`` of one ``Attempt`` per stream message), doing nothing else. This process
is its client (grpc.aio, one channel, asyncio's loop as ``AsyncClient`` has by default). The
requests are those of ``bench/peers``: a task ``noop`` with its index as payload, in the
compact form for ``SubmitMany``.

Rows: ``Submit`` from 100 concurrent callers (bench/peers' row 1); ``Submit`` one at a time
(its latency); ``SubmitMany`` of 100 and of 1,000 tasks, one call at a time (row 2); a server
stream of ``AttachResponse`` messages with one ``Attempt`` each (how attempts reach a
worker). Each row gives calls (or messages) per second and the server process's CPU (user +
system, every thread, from ``getrusage`` in the server) per call: the floor under the CPU a
cronoq-server spends per call.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from cronoq_client.protocol import pb

_SCHEDULER = "cronoq.v1.SchedulerService"
_WORKER = "cronoq.v1.WorkerService"
_CONTROL = "/cronoq.bench.Ceiling/Usage"
_STREAM = f"/{_WORKER}/Attach"


def _attempt_message() -> pb.AttachResponse:
    """One attempt as the server sends it to a worker: token, pool, kind, payload, lease."""
    attempt = pb.Attempt(
        token=pb.AttemptToken(epoch=3, task_id=123_456, attempt=1, lease_id=bytes(16)),
        pool="default",
        kind="noop",
        payload=b"123456",
    )
    attempt.lease_expires_at.FromNanoseconds(1_790_000_000_123_456_789)
    return pb.AttachResponse(events=[pb.WorkerEvent(attempt=attempt)])


# --- the server process --------------------------------------------------------------------


async def _serve() -> None:
    submit_reply = pb.SubmitResponse(task_id=123_456)
    attempt = _attempt_message()

    async def submit(request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        return submit_reply

    async def submit_many(request: pb.SubmitManyRequest, context: Any) -> pb.SubmitManyResponse:
        count = len(request.payloads) or len(request.tasks)
        return pb.SubmitManyResponse(task_ids=range(123_456, 123_456 + count))

    async def attach(request: bytes, context: Any) -> None:
        for _ in range(int(request)):
            await context.write(attempt)

    async def usage(request: bytes, context: Any) -> bytes:
        own = resource.getrusage(resource.RUSAGE_SELF)
        return repr(own.ru_utime + own.ru_stime).encode()

    def identity(data: bytes) -> bytes:
        return data

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                _SCHEDULER,
                {
                    "Submit": grpc.unary_unary_rpc_method_handler(
                        submit,
                        request_deserializer=pb.SubmitRequest.FromString,
                        response_serializer=pb.SubmitResponse.SerializeToString,
                    ),
                    "SubmitMany": grpc.unary_unary_rpc_method_handler(
                        submit_many,
                        request_deserializer=pb.SubmitManyRequest.FromString,
                        response_serializer=pb.SubmitManyResponse.SerializeToString,
                    ),
                },
            ),
            grpc.method_handlers_generic_handler(
                _WORKER,
                {
                    "Attach": grpc.unary_stream_rpc_method_handler(
                        attach,
                        request_deserializer=identity,
                        response_serializer=pb.AttachResponse.SerializeToString,
                    )
                },
            ),
            grpc.method_handlers_generic_handler(
                "cronoq.bench.Ceiling",
                {
                    "Usage": grpc.unary_unary_rpc_method_handler(
                        usage, request_deserializer=identity, response_serializer=identity
                    )
                },
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    # Until the client closes stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)


# --- the client (this process) -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Figure:
    per_second: float
    server_us: float
    """Server CPU per call (or per stream message), µs."""


class Ceiling:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._usage: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(_CONTROL)
        self.submit = channel.unary_unary(
            f"/{_SCHEDULER}/Submit",
            request_serializer=pb.SubmitRequest.SerializeToString,
            response_deserializer=pb.SubmitResponse.FromString,
        )
        self.submit_many = channel.unary_unary(
            f"/{_SCHEDULER}/SubmitMany",
            request_serializer=pb.SubmitManyRequest.SerializeToString,
            response_deserializer=pb.SubmitManyResponse.FromString,
        )
        self.stream: grpc.aio.UnaryStreamMultiCallable[bytes, pb.AttachResponse] = (
            channel.unary_stream(_STREAM, response_deserializer=pb.AttachResponse.FromString)
        )

    async def server_cpu(self) -> float:
        return float(await self._usage(b""))

    async def measure(self, calls: int, run: Callable[[], Awaitable[None]]) -> Figure:
        cpu = await self.server_cpu()
        start = time.perf_counter()
        await run()
        elapsed = time.perf_counter() - start
        spent = await self.server_cpu() - cpu
        return Figure(calls / elapsed, spent / calls * 1e6)


def _submit(index: int) -> pb.SubmitRequest:
    return pb.SubmitRequest(task=pb.TaskRequest(kind="noop", payload=str(index).encode()))


def _submit_many(first: int, size: int) -> pb.SubmitManyRequest:
    return pb.SubmitManyRequest(
        common=pb.TaskRequest(kind="noop"),
        payloads=[str(i).encode() for i in range(first, first + size)],
    )


async def _one_round(ceiling: Ceiling, sizes: Sizes) -> dict[str, Figure]:
    figures: dict[str, Figure] = {}
    per = sizes.unary // 100
    # The requests are made outside the timings, as a client's would be before the call.
    requests = [[_submit(c * per + i) for i in range(per)] for c in range(100)]

    async def concurrent() -> None:
        async def caller(mine: list[pb.SubmitRequest]) -> None:
            for request in mine:
                await ceiling.submit(request)

        await asyncio.gather(*(caller(mine) for mine in requests))

    figures["Submit, 100 concurrent callers"] = await ceiling.measure(sizes.unary, concurrent)
    alone = [_submit(i) for i in range(sizes.sequential)]

    async def sequential() -> None:
        for request in alone:
            await ceiling.submit(request)

    figures["Submit, one at a time"] = await ceiling.measure(sizes.sequential, sequential)
    for size, calls in ((100, sizes.many_100), (1000, sizes.many_1000)):
        batches = [_submit_many(c * size, size) for c in range(calls)]

        async def many(batches: list[pb.SubmitManyRequest] = batches) -> None:
            for request in batches:
                await ceiling.submit_many(request)

        figures[f"SubmitMany of {size:,}, one call at a time"] = await ceiling.measure(calls, many)

    async def stream() -> None:
        received = 0
        async for _ in ceiling.stream(str(sizes.stream).encode()):
            received += 1
        assert received == sizes.stream

    figures["stream of AttachResponse (1 Attempt each)"] = await ceiling.measure(
        sizes.stream, stream
    )
    return figures


@dataclass(frozen=True, slots=True)
class Sizes:
    unary: int
    sequential: int
    many_100: int
    many_1000: int
    stream: int


FULL = Sizes(unary=20_000, sequential=3_000, many_100=500, many_1000=100, stream=50_000)
QUICK = Sizes(unary=2_000, sequential=300, many_100=50, many_1000=10, stream=5_000)


async def _client(port: int, sizes: Sizes, rounds: int) -> list[dict[str, Figure]]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        ceiling = Ceiling(channel)
        await _one_round(ceiling, QUICK)  # warm-up: connection, caches; not counted
        results = []
        for index in range(rounds):
            results.append(await _one_round(ceiling, sizes))
            print(f"round {index + 1} of {rounds} done", file=sys.stderr, flush=True)
        return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--server-loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        if args.server_loop == "uvloop":
            import uvloop

            uvloop.run(_serve())
        else:
            asyncio.run(_serve())
        return 0
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (1 if args.quick else 5)
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--server-loop", args.server_loop],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        results = asyncio.run(_client(port, sizes, rounds))
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
    print(
        f"python {sys.version.split()[0]}, grpcio {grpc.__version__}, server on "
        f"{args.server_loop}, client on asyncio, {rounds} rounds (medians, every round in [])"
    )
    for name in results[0]:
        rates = [r[name].per_second for r in results]
        cpus = [r[name].server_us for r in results]
        print(
            f"{name:<44} {statistics.median(rates):>9,.0f} /s "
            f"[{', '.join(f'{v:,.0f}' for v in rates)}]   server CPU "
            f"{statistics.median(cpus):>7,.1f} µs per call "
            f"[{', '.join(f'{v:,.1f}' for v in cpus)}]",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
