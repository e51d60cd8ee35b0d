"""The cost of authentication (issue 20): single submits and end to end through a real
``cronoq-server`` (memory store, so that the wire and the checks dominate), in three setups:
plaintext without authentication, TLS without authentication, and TLS with bearer tokens (the
client an ``app`` identity restricted to one pool, the worker a ``work`` identity of that pool,
so that every heartbeat and report pays the pool check).

    uv run python bench/auth.py [--rounds 3] [--submits 2000] [--tasks 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import hashlib
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cronoq import TaskContext, TaskRequest
from cronoq_client import AsyncClient, Tls, Worker

APP, WORKER = secrets.token_urlsafe(32), secrets.token_urlsafe(32)


@dataclass(frozen=True, slots=True)
class Setup:
    name: str
    tls: bool
    auth: bool


SETUPS = (
    Setup("plaintext", False, False),
    Setup("tls", True, False),
    Setup("tls+auth", True, True),
)


def _certificate(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "server.pem", directory / "server-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _config(setup: Setup, cert: Path, key: Path) -> str:
    lines = [
        '[store]\nkind = "memory"',
        '[listen]\ngrpc = "127.0.0.1:0"\nhttp = "127.0.0.1:0"',
        '[logging]\nlevel = "info"',
    ]
    if setup.tls:
        lines.append(f'[tls]\ncert = "{cert}"\nkey = "{key}"')
    if setup.auth:
        digest = {t: hashlib.sha256(t.encode()).hexdigest() for t in (APP, WORKER)}
        lines.append(
            '[[auth.identities]]\nname = "app"\npermissions = ["read", "submit"]\n'
            f'submit_pools = ["bench"]\ntoken_sha256 = ["{digest[APP]}"]\n'
            '[[auth.identities]]\nname = "worker"\npermissions = ["work"]\n'
            f'work_pools = ["bench"]\ntoken_sha256 = ["{digest[WORKER]}"]'
        )
    lines.append('[[pools]]\nname = "bench"\nconcurrency = 1000')
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def server(setup: Setup, directory: Path) -> AsyncIterator[int]:
    cert, key = _certificate(directory)
    config = directory / f"{setup.name}.toml"
    config.write_text(_config(setup, cert, key))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cronoq_server", "serve", "--config", str(config),
        stderr=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert process.stderr is not None
    try:
        port = 0
        while not port:
            line = (await process.stderr.readline()).decode()
            if not line:
                raise RuntimeError("the server exited before listening")
            found = re.search(r"grpc_port=(\d+)", line)
            port = int(found[1]) if found and "role=leading" in line else 0
        drain = asyncio.create_task(process.stderr.read())
        yield port
    finally:
        process.kill()
        await process.wait()
        drain.cancel()


def _client(setup: Setup, ca: Path, token: str) -> dict[str, Any]:
    return {
        "tls": Tls(str(ca)) if setup.tls else False,
        "token": token if setup.auth else None,
    }


async def single_submits(target: str, creds: dict[str, Any], n: int) -> tuple[float, float]:
    """Median and p99 of one submit after another, in µs."""
    async with AsyncClient(target, **creds) as client:
        for _ in range(50):  # connect and warm up
            await client.submit("warm", pool="bench")
        latencies = []
        for _ in range(n):
            start = time.perf_counter()
            await client.submit("one", pool="bench")
            latencies.append((time.perf_counter() - start) * 1e6)
    latencies.sort()
    return statistics.median(latencies), latencies[int(len(latencies) * 0.99)]


async def end_to_end(target: str, setup: Setup, ca: Path, n: int) -> float:
    """Tasks per second: n tasks submitted in batches of 500, run by one worker of 50 slots."""
    done = asyncio.Event()
    count = 0

    async def run(ctx: TaskContext, payload: Any) -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    worker = Worker(target, {"bench": run}, slots=50, **_client(setup, ca, WORKER))
    working = asyncio.create_task(worker.run())
    await worker.attached()
    async with AsyncClient(target, **_client(setup, ca, APP)) as client:
        start = time.perf_counter()
        for first in range(0, n, 500):
            batch = [TaskRequest("e2e", pool="bench") for _ in range(min(500, n - first))]
            await client.submit_many(batch)
        await done.wait()
        elapsed = time.perf_counter() - start
    worker.stop()
    await working
    return n / elapsed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--tasks", type=int, default=5000)
    args = parser.parse_args()
    results: dict[str, list[tuple[float, float, float]]] = {s.name: [] for s in SETUPS}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for _ in range(args.rounds):
            for setup in SETUPS:
                async with server(setup, directory) as port:
                    target = f"localhost:{port}"
                    ca = directory / "server.pem"
                    p50, p99 = await single_submits(target, _client(setup, ca, APP), args.submits)
                    rate = await end_to_end(target, setup, ca, args.tasks)
                results[setup.name].append((p50, p99, rate))
    print(f"{'setup':<10} {'submit p50 µs':>14} {'submit p99 µs':>14} {'end to end tasks/s':>19}")
    for name, rounds in results.items():
        p50 = statistics.median(r[0] for r in rounds)
        p99 = statistics.median(r[1] for r in rounds)
        rate = statistics.median(r[2] for r in rounds)
        print(f"{name:<10} {p50:>14.0f} {p99:>14.0f} {rate:>19,.0f}   rounds: {rounds}")


if __name__ == "__main__":
    os.environ.pop("CRONOQ_TOKEN", None)
    asyncio.run(main())
