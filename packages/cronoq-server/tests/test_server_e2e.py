"""The server end to end: real processes, real gRPC channels, real stores."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from server_process import AttachStream, config_toml, running_server

from cronoq import BytesCodec, LeasedAttempt, SchedulerError, Status, TaskRequest
from cronoq_client import AsyncClient
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb_grpc

MEMORY = '[store]\nkind = "memory"\n'


async def _attempt(stream: AttachStream) -> LeasedAttempt:
    event = await stream.event()
    assert isinstance(event, LeasedAttempt), event
    return event


async def _one_leased(
    tasks: pb_grpc.SchedulerServiceAsyncStub, workers: pb_grpc.WorkerServiceAsyncStub
) -> tuple[AttachStream, LeasedAttempt]:
    """Submit a task and attach a one-slot worker: its stream, and the attempt it leased."""
    await tasks.Submit(wire.submit_request(TaskRequest("job", b""), BytesCodec()))
    stream = AttachStream(workers.Attach(wire.attach_request("test", ["default"], 1)))
    assert isinstance(await stream.event(), wire.Attached)
    return stream, await _attempt(stream)


async def test_a_task_submitted_over_grpc_runs_on_an_attached_worker(tmp_path: Path) -> None:
    async with running_server(tmp_path, config_toml(MEMORY)) as server:
        await server.leading()
        # The default runtime.event_loop ("auto") with uvloop installed, as it is here.
        assert server.events("listening")[0]["event_loop"] == "uvloop"
        async with grpc.aio.insecure_channel(server.target) as channel:
            tasks = pb_grpc.SchedulerServiceStub(channel)
            workers = pb_grpc.WorkerServiceStub(channel)
            submitted = await tasks.Submit(
                wire.submit_request(TaskRequest("job", b"in"), BytesCodec())
            )
            stream = AttachStream(workers.Attach(wire.attach_request("test", ["default"], 1)))
            attached = await stream.event()
            assert isinstance(attached, wire.Attached) and attached.leases == {"default": 30.0}
            attempt = await _attempt(stream)
            assert attempt.token.task_id == submitted.task_id
            assert attempt.payload == b"in"
            await workers.Report(
                wire.report_request(attempt.token, attempt.lease_id, wire.ReportSuccess(b"out"))
            )
            done = await tasks.Wait(wire.wait_request(submitted.task_id, 5, include_output=True))
            info = wire.task_info_from_pb(done, BytesCodec())
            assert (info.status, info.output) == (Status.SUCCEEDED, b"out")
            stream.cancel()


_NO_CONFIG_CLIENT = """
import asyncio, grpc, sys
from cronoq import BytesCodec, TaskRequest
from cronoq_client import AsyncClient
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb, pb_grpc

async def main():
    async with grpc.aio.insecure_channel("127.0.0.1:50051") as channel:
        await asyncio.wait_for(channel.channel_ready(), 20)
        tasks = pb_grpc.SchedulerServiceStub(channel)
        workers = pb_grpc.WorkerServiceStub(channel)
        for _ in range(200):  # the server may still be taking the lease
            try:
                sub = await tasks.Submit(wire.submit_request(TaskRequest("j", b"x"), BytesCodec()))
                break
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                await asyncio.sleep(0.05)
        stream = workers.Attach(wire.attach_request("w", ["default"], 1))
        await stream.read()
        [attempt] = wire.worker_events_from_pb(await stream.read())
        report = wire.report_request(attempt.token, attempt.lease_id, wire.ReportSuccess(b"y"))
        await workers.Report(report)
        info = await tasks.Wait(wire.wait_request(sub.task_id, 10, include_output=True))
        print("status", info.status, info.output)
        stream.cancel()

asyncio.run(main())
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs root")
def test_serve_with_no_configuration_serves_the_embedded_default(tmp_path: Path) -> None:
    """No configuration at all: gRPC on 127.0.0.1:50051, HTTP on 127.0.0.1:8080, ./cronoq.db.
    In a network namespace of its own, so those fixed ports are surely free."""
    client = tmp_path / "client.py"
    client.write_text(_NO_CONFIG_CLIENT)
    script = textwrap.dedent(
        f"""
        ip link set lo up
        {sys.executable} -m cronoq_server serve 2> server.log &
        server=$!
        {sys.executable} {client}
        status=$?
        python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/readyz').read().decode())"
        kill -TERM $server
        wait $server
        echo "exit $? client $status"
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    result = subprocess.run(
        ["unshare", "--net", "sh", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    log = (tmp_path / "server.log").read_text()
    assert "exit 0 client 0" in result.stdout, (result.stdout, result.stderr, log)
    assert "status 6 b'y'" in result.stdout  # STATUS_SUCCEEDED, the worker's output
    assert '"ready": true' in result.stdout
    assert "grpc_port=50051 http_port=8080" in log
    assert (tmp_path / "cronoq.db").exists()


async def test_sigterm_drains_a_running_remote_attempt(tmp_path: Path) -> None:
    async with running_server(tmp_path, config_toml(MEMORY)) as server:
        await server.leading()
        async with grpc.aio.insecure_channel(server.target) as channel:
            tasks = pb_grpc.SchedulerServiceStub(channel)
            workers = pb_grpc.WorkerServiceStub(channel)
            _stream, attempt = await _one_leased(tasks, workers)  # kept open while draining
            server.signal(15)
            await server.wait_for("draining")
            # Draining: no new call is taken, but the running attempt may heartbeat and report.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await tasks.Submit(wire.submit_request(TaskRequest("late", b""), BytesCodec()))
            assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
            assert wire.outcome(refused.value) is wire.Outcome.NOT_APPLIED
            await workers.Heartbeat(wire.heartbeat_request(attempt.token, attempt.lease_id))
            await workers.Report(
                wire.report_request(attempt.token, attempt.lease_id, wire.ReportSuccess(b"done"))
            )
            assert await server.wait_exit(10) == 0
        assert server.events("stepped_down")


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_tls_serves_a_client_that_trusts_the_certificate(
    tmp_path: Path, certificate: tuple[Path, Path]
) -> None:
    cert, key = certificate
    tls = f'[tls]\ncert = "{cert}"\nkey = "{key}"\n'
    async with running_server(tmp_path, config_toml(MEMORY, tables=tls)) as server:
        await server.leading()
        trusted = grpc.ssl_channel_credentials(cert.read_bytes())
        async with AsyncClient(server.target, tls=trusted, timeout=10) as client:
            task_id = await client.submit("job", b"x", key="tls")
            assert (await client.get(task_id)).payload == b"x"
        # A plaintext client gets no answer from a TLS port.
        async with AsyncClient(server.target, timeout=1) as plain:
            with pytest.raises(SchedulerError):
                await plain.get(task_id)


async def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    """The drain waits up to drain_timeout_s (5 s here) for an attempt that never reports;
    a second SIGTERM ends it at once."""
    async with running_server(tmp_path, config_toml(MEMORY)) as server:
        await server.leading()
        async with grpc.aio.insecure_channel(server.target) as channel:
            tasks = pb_grpc.SchedulerServiceStub(channel)
            workers = pb_grpc.WorkerServiceStub(channel)
            await _one_leased(tasks, workers)  # held, never reported
            server.signal(15)
            await server.wait_for("draining")
            started = time.monotonic()
            server.signal(15)
            await server.wait_exit(5)
            assert time.monotonic() - started < 2.0
        assert server.events("shutdown_forced")
