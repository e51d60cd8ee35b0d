"""Two ``cronoq-server`` processes on one store (a SQLite file, a PostgreSQL schema): the HA
serving rules of the seed, through real processes, real gRPC channels, and a TCP balancer that
sends each new connection to the next replica."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import signal
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2
from server_cluster import (
    QUICK_RETRY,
    Balancer,
    Progress,
    channel_lifetime,
    echo,
    first_of,
    health,
    hold_http2,
    http_get,
    log_time,
    new_channel,
    pg_store,
    sqlite_store,
    submit_keyed,
)
from server_pg import pg_schema
from server_process import (
    AttachStream,
    ServerProcess,
    config_toml,
    running_server,
    start_server,
)

from cronoq import BytesCodec, LeasedAttempt, Status, TaskContext, TaskRequest, TaskSummary
from cronoq_client import AsyncClient, Worker
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb, pb_grpc

__all__ = ["pg_schema"]  # a fixture: requested by name

POOLS = '[[pools]]\nname = "default"\nlease_s = 5.0\n'
StoreSection = Callable[[float], str]
"""The ``[store]`` TOML of this test's own store, given the SQLite lease's ttl (the PostgreSQL
lock needs none: it goes with the leader's session, which ends with its process)."""


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSection:
    if request.param == "sqlite":
        path = str(tmp_path / "cluster.db")
        return lambda lease_ttl: sqlite_store(path, lease_ttl=lease_ttl)
    schema: str = request.getfixturevalue("pg_schema")
    return lambda lease_ttl: pg_store(schema)


@contextlib.asynccontextmanager
async def cluster(directory: Path, section: str) -> AsyncIterator[tuple[ServerProcess, ...]]:
    """Two servers on one store, started at once: (leader, standby) once one leads."""
    config = config_toml(section, pools=POOLS)
    servers = await asyncio.gather(
        start_server(directory, config), start_server(directory, config), return_exceptions=True
    )
    started = [s for s in servers if isinstance(s, ServerProcess)]
    try:
        for outcome in servers:
            if isinstance(outcome, BaseException):
                raise outcome
        leader = await first_of(started, lambda s: s.leading())
        [standby] = [s for s in started if s is not leader]
        await standby.wait_for("standby")
        yield leader, standby
    finally:
        await asyncio.gather(*(s.stop() for s in started))


# --- 1. exactly one serves; the standby refuses and closes its connections ------------------


async def test_one_replica_serves_and_the_standby_refuses_and_closes_connections(
    tmp_path: Path, store: StoreSection
) -> None:
    async with cluster(tmp_path, store(1.5)) as (leader, standby):
        ready = {"ready": True, "reason": "leading"}
        assert await http_get(f"{leader.http}/readyz") == (200, ready)
        assert await http_get(f"{standby.http}/readyz") == (
            503,
            {"ready": False, "reason": "standby"},
        )
        assert await health(leader.target) == health_pb2.HealthCheckResponse.SERVING
        assert await health(standby.target) == health_pb2.HealthCheckResponse.NOT_SERVING

        codec = BytesCodec()
        async with grpc.aio.insecure_channel(standby.target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.SchedulerServiceStub(channel).Submit(
                    wire.submit_request(TaskRequest("job", b"", key="on-standby"), codec)
                )
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
        assert _reason(refused.value) == wire.Reason.STANDBY
        assert wire.outcome(refused.value) is wire.Outcome.NOT_APPLIED
        async with grpc.aio.insecure_channel(leader.target) as channel:
            tasks = pb_grpc.SchedulerServiceStub(channel)
            assert not (await tasks.GetByKey(wire.get_by_key_request("on-standby"))).HasField(
                "task"
            )
            assert not (await tasks.List(wire.list_request())).tasks

        # The standby closes a connection about a second after accepting it; the leader keeps
        # its connections (measured side by side, so the leader's is held past the bound).
        on_standby, on_leader, lifetime = await asyncio.gather(
            hold_http2(standby.grpc_port, limit=5.0),
            hold_http2(leader.grpc_port, limit=3.0),
            channel_lifetime(standby.target, limit=5.0),
        )
        print(f"standby: raw HTTP/2 {on_standby}, channel connected {lifetime} s")
        assert on_standby.goaway is not None and 0.5 <= on_standby.goaway <= 2.5, on_standby
        assert on_standby.closed is not None and 0.5 <= on_standby.closed <= 2.5, on_standby
        assert lifetime is not None and 0.5 <= lifetime <= 2.5, lifetime
        assert on_leader == type(on_leader)(None, None), on_leader


async def test_a_replica_that_cannot_open_its_store_is_a_standby(tmp_path: Path) -> None:
    """It never led, so its role never changed: health must not be grpcio's initial SERVING."""
    unreachable = '[store]\nkind = "postgres"\ndsn = "postgresql://postgres@127.0.0.1:1/x"\n'
    async with running_server(tmp_path, config_toml(unreachable, pools=POOLS)) as server:
        await server.wait_for("listening")
        assert await health(server.target) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await http_get(f"{server.http}/readyz") == (
            503,
            {"ready": False, "reason": "standby"},
        )
        async with grpc.aio.insecure_channel(server.target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await pb_grpc.SchedulerServiceStub(channel).Submit(
                    wire.submit_request(TaskRequest("job", b""), BytesCodec())
                )
        assert _reason(refused.value) == wire.Reason.STANDBY
        assert not server.events("standby")  # it never got as far as waiting for leadership


# --- 2. the leader is killed under load -----------------------------------------------------


async def test_sigkill_of_the_leader_under_load_loses_no_acknowledged_submission(
    tmp_path: Path, store: StoreSection
) -> None:
    lease_ttl = 1.5
    async with (
        cluster(tmp_path, store(lease_ttl)) as (old, new),
        Balancer([old.grpc_port, new.grpc_port]) as balancer,
    ):
        progress, stop = Progress(), asyncio.Event()
        clients = [AsyncClient(balancer.target, timeout=20) for _ in range(3)]
        load = [
            asyncio.ensure_future(submit_keyed(client, f"c{i}", progress, 0.02, stop))
            for i, client in enumerate(clients)
        ]
        worker = Worker(balancer.target, {"default": echo(progress)}, slots=8)
        working = asyncio.ensure_future(worker.run())
        try:
            await progress.until(lambda p: len(p.acked) >= 60 and len(p.runs) >= 30, 20)
            before, connections = len(progress.acked), len(balancer.routed)
            progress.mark("kill")
            killed_at = time.time()
            old.signal(signal.SIGKILL)
            serving = await new.leading()
            await progress.until(lambda p: len(p.acked) >= before + 60, 20)
            stop.set()
            await asyncio.gather(*load)
            acked = dict(progress.acked)
            async with AsyncClient(new.target, timeout=30) as reader:
                finished = await asyncio.gather(
                    *(reader.wait(i, timeout=20) for i in acked.values())
                )
                present = await _all_tasks(reader)
        finally:
            for task in load:
                task.cancel()
            worker.stop()
            worker.stop()  # the second stop abandons what still runs (after a failure)
            await asyncio.gather(*load, working, return_exceptions=True)
            for client in clients:
                await client.close()
        reconnections = len(balancer.routed) - connections
    takeover = log_time(new.events("leading")[0]) - killed_at
    first_ack = progress.first_ack_after["kill"] - progress.marks["kill"]
    print(
        f"takeover: 'leading' {takeover:.3f} s after the SIGKILL, 'serving' "
        f"{log_time(serving) - killed_at:.3f} s, first acknowledgement of a submission begun "
        f"after it {first_ack:.3f} s; "
        f"acked {len(acked)} ({before} before the kill), present {len(present)}; balancer "
        f"connections after the kill {reconnections}; attempts run {len(progress.runs)} "
        f"({sum(t > progress.marks['kill'] for t in progress.runs)} after the kill)"
    )
    assert {t.task_id: t.key for t in present} == {i: k for k, i in acked.items()}
    assert {info.status for info in finished} == {Status.SUCCEEDED}
    assert all(i.output == i.payload == str(i.key).encode() for i in finished)
    assert takeover < lease_ttl + 3.0


async def _all_tasks(client: AsyncClient) -> list[TaskSummary]:
    found: list[TaskSummary] = []
    while page := await client.list(after=found[-1].task_id if found else None, limit=500):
        found.extend(page)
    return found


# --- 3. the leader is stopped while a remote attempt runs -----------------------------------


async def test_sigterm_of_the_leader_lets_the_running_attempt_report_then_hands_over_at_once(
    tmp_path: Path, store: StoreSection
) -> None:
    # A long lease: a takeover within it can only come from the leader's release.
    lease_ttl = 6.0
    async with cluster(tmp_path, store(lease_ttl)) as (old, new):
        async with Balancer([old.grpc_port, new.grpc_port]) as balancer:
            codec = BytesCodec()
            request = wire.submit_request(
                TaskRequest("held", b"in", key="held", retry=QUICK_RETRY), codec
            )
            async with grpc.aio.insecure_channel(old.target) as channel:
                submitted = await pb_grpc.SchedulerServiceStub(channel).Submit(request)
            channel, stream = await _attach(balancer.target)
            async with channel:
                event = await stream.event()
                assert isinstance(event, LeasedAttempt), event
                assert event.token.task_id == submitted.task_id
                workers = pb_grpc.WorkerServiceStub(channel)
                old.signal(signal.SIGTERM)
                await old.wait_for("draining")
                # Through the same connection: a draining leader keeps it open.
                await workers.Heartbeat(
                    wire.heartbeat_request(event.token, event.lease_id), timeout=2
                )
                await workers.Report(
                    wire.report_request(event.token, event.lease_id, wire.ReportSuccess(b"out")),
                    timeout=2,
                )
                assert await old.wait_exit(10) == 0
                stream.cancel()
        leading = await new.wait_for("leading", timeout=lease_ttl)
        # A raw stub does not retry: a call that reaches the standby's server object as it
        # stops is refused STANDBY (the client retries that; this test asks once the swap is
        # done).
        await new.leading(timeout=lease_ttl)
        async with grpc.aio.insecure_channel(new.target) as channel:
            done = await pb_grpc.SchedulerServiceStub(channel).Get(
                wire.get_request(submitted.task_id, include_output=True)
            )
    released = log_time(old.events("stepped_down")[0])
    exited = log_time(old.events("stopped")[0])
    handover = log_time(leading) - exited
    print(
        f"handover: 'leading' {handover:+.3f} s after the old leader's last line "
        f"({log_time(leading) - released:+.3f} s after it released leadership); "
        f"lease ttl {lease_ttl} s"
    )
    assert (done.status, done.output, done.attempt) == (pb.STATUS_SUCCEEDED, b"out", 1)
    # Well inside the lease ttl: the standby led because the old leader released, not because
    # the lease ran out (room left for a loaded machine's scheduling).
    assert handover < lease_ttl / 2


async def _attach(
    target: str,
) -> tuple[grpc.aio.Channel, AttachStream]:
    """Attach through the balancer, on a new connection each time, until the leader takes it."""
    async with asyncio.timeout(10):
        while True:
            channel = new_channel(target)
            stream = AttachStream(
                pb_grpc.WorkerServiceStub(channel).Attach(
                    wire.attach_request("holder", ["default"], 1)
                )
            )
            try:
                first = await stream.event()
            except grpc.aio.AioRpcError as exc:
                await channel.close()
                if exc.code() is not grpc.StatusCode.UNAVAILABLE:
                    raise
                continue
            assert isinstance(first, wire.Attached), first
            return channel, stream


def _reason(err: grpc.aio.AioRpcError) -> str | None:
    info = wire.error_info(err)
    return None if info is None or info.domain != wire.DOMAIN else info.reason


# --- 4. calls caught in a leader change --------------------------------------------------------


@dataclass
class Calls:
    """What un-keyed submits, each with a payload of its own, were answered."""

    acked: dict[bytes, int] = field(default_factory=dict)
    failed: dict[bytes, grpc.aio.AioRpcError] = field(default_factory=dict)
    progress: Progress = field(default_factory=Progress)


async def _submit_unkeyed(target: str, name: str, calls: Calls, stop: asyncio.Event) -> None:
    """Un-keyed submits through a raw stub (no retry of its own), one after another, until
    ``stop``; after a failure, on a new connection after a pause, as AsyncClient retries."""
    codec = BytesCodec()
    channel = new_channel(target)
    try:
        for n in itertools.count():
            if stop.is_set():
                return
            payload = f"{name}-{n}".encode()
            # The payload as a tag too, as List shows tags: what landed is found by it.
            task = TaskRequest("unkeyed", payload, tags=[payload.decode()])
            request = wire.submit_request(task, codec)
            try:
                reply = await pb_grpc.SchedulerServiceStub(channel).Submit(request, timeout=5)
            except grpc.aio.AioRpcError as err:
                calls.failed[payload] = err
                await channel.close()  # nothing else in flight on it
                channel = new_channel(target)
                await asyncio.sleep(random.uniform(0, 0.05))  # the client's first backoff
                continue
            calls.acked[payload] = reply.task_id
            await calls.progress.changed()
    finally:
        await channel.close()


async def test_calls_a_leader_did_not_apply_at_sigterm_are_unavailable_not_applied(
    tmp_path: Path, store: StoreSection
) -> None:
    """A graceful stop of the leader under un-keyed submits: every call is answered, either
    applied or UNAVAILABLE with a not-applied reason, or (on a loaded host) killed by gRPC
    core before any handler took it, which the client retries too; none is left with an
    unknown outcome (a handler cut off, a broken connection), since nothing the leader took
    was lost. The store shows that none of the failed ones landed."""
    async with cluster(tmp_path, store(6.0)) as (old, new):
        async with Balancer([old.grpc_port, new.grpc_port]) as balancer:
            calls, stop = Calls(), asyncio.Event()
            load = [
                asyncio.ensure_future(_submit_unkeyed(balancer.target, f"s{i}", calls, stop))
                for i in range(16)
            ]
            try:
                await calls.progress.until(lambda _: len(calls.acked) >= 200, 20)
                old.signal(signal.SIGTERM)
                assert await old.wait_exit(15) == 0
                await new.leading(timeout=15)
                before = len(calls.acked)
                await calls.progress.until(lambda _: len(calls.acked) >= before + 100, 20)
                stop.set()
                await asyncio.gather(*load)
            finally:
                for submitter in load:
                    submitter.cancel()
                await asyncio.gather(*load, return_exceptions=True)
        async with AsyncClient(new.target, timeout=10) as reader:
            present = {t.tags[0].encode(): t.task_id for t in await _all_tasks(reader)}
    failures = [_judged(e) for e in calls.failed.values()]
    print(f"acked {len(calls.acked)}, failed {len(failures)}: {sorted(set(failures))}")
    unknown = sorted(f for f in failures if f[2] == "UNKNOWN")
    assert not unknown, f"{len(unknown)} calls with an unknown outcome: {unknown}"
    assert {p: i for p, i in present.items() if p in calls.acked} == calls.acked
    assert present.keys() <= calls.acked.keys()  # nothing answered "not applied" landed


def _judged(err: grpc.aio.AioRpcError) -> tuple[str, str, str]:
    """Code, reason and outcome of a failed call, as the client judges it: a call that found
    no connection (the balancer's pick was the replica that exited) was never sent, and one
    the stopping server object killed before any handler took it applied nothing."""
    if wire.never_sent(err):
        return err.code().name, "-", "NEVER_SENT"
    if wire.never_handled(err):
        return err.code().name, "-", "NEVER_HANDLED"
    return err.code().name, _reason(err) or "-", wire.outcome(err).name


# --- 5. a failover adopts the remote attempts whose workers live on -------------------------


async def test_a_failover_adopts_a_running_remote_attempt_instead_of_running_it_again(
    tmp_path: Path, store: StoreSection
) -> None:
    # Issue 19, item 1: the new leader counted the previous epoch's running rows lost and
    # retried them after the backoff, while their workers still ran them inside their leases.
    async with (
        cluster(tmp_path, store(1.5)) as (old, new),
        Balancer([old.grpc_port, new.grpc_port]) as balancer,
    ):
        runs: list[int] = []
        started, release = asyncio.Event(), asyncio.Event()

        async def held(ctx: TaskContext, payload: bytes) -> bytes:
            runs.append(ctx.attempt)
            started.set()
            await release.wait()
            return b"ran once"

        worker = Worker(balancer.target, {"default": held}, slots=1)
        working = asyncio.ensure_future(worker.run())
        try:
            async with AsyncClient(old.target, timeout=10) as client:
                task_id = await client.submit("held", b"", retry=QUICK_RETRY)
            await asyncio.wait_for(started.wait(), 10)
            old.signal(signal.SIGKILL)
            await new.leading()
            async with AsyncClient(new.target, timeout=10) as client:
                # The new leader's recovery is committed before it serves: it adopted the
                # attempt (still running, attempt 1), not counted it lost and retried it.
                during = await client.get(task_id)
                release.set()
                done = await client.wait(task_id, timeout=20)
        finally:
            worker.stop()
            await asyncio.gather(working, return_exceptions=True)
    assert (during.status, during.attempt) == (Status.RUNNING, 1)
    assert runs == [1], f"attempts that ran: {runs}"
    assert (done.status, done.attempt, done.output) == (Status.SUCCEEDED, 1, b"ran once")
