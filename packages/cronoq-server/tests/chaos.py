"""The chaos harness of issue 19: replicas of ``cronoq-server`` on one store behind the test
balancer, remote workers in processes of their own running tasks longer than a failover,
submitters with and without keys, and a fault on the leader every few seconds (SIGKILL,
SIGTERM, SIGSTOP past the lease then SIGCONT, and on PostgreSQL ``pg_terminate_backend`` of the
leader's sessions). What happened is gathered into :class:`chaos_checker.Records`.

It runs in the configuration the Helm chart deploys (issue 29): TLS, a bearer token per
identity (submitters as ``app``, workers as ``worker`` limited to their pool), and half the
clients and workers listing every replica while the others go through the balancer. A replaced
replica comes back on its predecessor's port, so that the lists stay true. A probe submitter
sends a short keyed task every tenth of a second, so that the time from each fault to the first
acknowledgement of a submission sent after it is measured finely (the checker's
``unavailable``).

Each worker process appends a JSON line to its own sink file when a task function starts and
when it ends (the file survives the process), so executions are known from inside the
function, not from what the server believes. ``python chaos.py worker TARGET SINK SLOTS
LEASE_S`` is that process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import random
import secrets
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from chaos_checker import (
    Applied,
    Execution,
    Fault,
    FinalTask,
    Records,
    Submission,
    WorkerLife,
    executions_from_lines,
)
from server_cluster import Balancer, log_time, pg_store, sqlite_store
from server_pg import PG_DSN, pg_connect
from server_process import ServerProcess, config_toml, start_server
from tls_material import Authority

from cronoq import RetryPolicy, SchedulerError, TaskContext, TaskError
from cronoq_client import AsyncClient, Tls, Worker

POOL = "default"
RETRY = RetryPolicy(max_attempts=20, initial_ns=200_000_000, jitter=0.0)
"""Lost attempts are retried soon and a task is not dead-lettered by a run of faults."""


@dataclass(frozen=True)
class Profile:
    name: str
    duration_s: float
    """How long faults are injected (submitters run as long)."""
    fault_every_s: tuple[float, float]
    replicas: int = 3
    workers: int = 2
    slots: int = 8
    keyed_submitters: int = 2
    unkeyed_submitters: int = 2
    submit_pause_s: float = 1.5
    task_s: tuple[float, float] = (2.0, 8.0)
    """How long a task function runs: longer than a failover."""
    fail_first: float = 0.1
    """The share of tasks whose first attempt raises on purpose (a legitimate re-run)."""
    lease_s: float = 3.0
    """The pool's lease: short, so a SIGSTOP outlasts it."""
    sqlite_lease_ttl_s: float = 2.0
    stop_s: float = 5.0
    """How long a SIGSTOP lasts: past the lease and the store's takeover."""
    settle_s: float = 60.0
    """The longest wait for acknowledged tasks to finish once the faults stopped."""
    client_timeout_s: float = 10.0
    stall_timeout_s: float = 1.0
    """The clients' and workers' stall timeout: a frozen leader is left within it."""
    probe_pause_s: float = 0.1
    drain_timeout_s: float = 5.0
    """The servers' drain on SIGTERM (``config_toml``'s): submissions wait it out."""
    store_lease_s: float = 2.0
    """How long a store keeps a vanished leader's leadership: the SQLite lease's ttl, the
    PostgreSQL session timeout (``server_cluster.pg_store``)."""

    def availability_limits(self, store_kind: str) -> dict[str, float]:
        """The longest each fault kind may keep new submissions unacknowledged: the store's
        lease and 2 s when the leader vanishes or freezes; the drain and 2 s for a SIGTERM.
        Not a SIGSTOP on SQLite: a leader frozen inside a commit holds the file's write lock,
        and no replica can lead until it resumes (docs/stores/sqlite.md, "Limits"); the
        clients' share (``client_share_s``) still holds there."""
        vanished = self.store_lease_s + 2.0
        limits = {
            "sigkill": vanished,
            "sigstop": vanished,
            "pg_terminate": vanished,
            "sigterm": self.drain_timeout_s + 2.0,
        }
        if store_kind == "sqlite":
            del limits["sigstop"]
        return limits

    @property
    def client_share_s(self) -> float:
        """What the clients may add to a failover: leave a stalled connection, then a retry
        pause and a new connection or two while the new leader's server takes its port."""
        return self.stall_timeout_s + 2.0


SHORT = Profile("short", duration_s=50.0, fault_every_s=(2.0, 4.0), settle_s=30.0)
LONG = Profile("long", duration_s=600.0, fault_every_s=(3.0, 10.0), settle_s=120.0)
PROFILES = {p.name: p for p in (SHORT, LONG)}


# --- the worker process --------------------------------------------------------------------


def _task_function(sink: Path) -> Callable[[TaskContext, bytes], object]:
    pid = os.getpid()
    out = sink.open("a", buffering=1)

    def record(ev: str, ctx: TaskContext, outcome: str | None = None) -> None:
        line = {"ev": ev, "task": ctx.task_id, "attempt": ctx.attempt, "pid": pid, "t": time.time()}
        if outcome is not None:
            line["outcome"] = outcome
        out.write(json.dumps(line) + "\n")
        out.flush()

    async def run(ctx: TaskContext, payload: bytes) -> bytes:
        spec = json.loads(payload)
        record("start", ctx)
        try:
            await asyncio.sleep(spec["s"])
        except asyncio.CancelledError:
            record("end", ctx, "cancelled")
            raise
        if spec["fail"] and ctx.attempt == 1:
            record("end", ctx, "raised")
            raise TaskError("failing the first attempt on purpose")
        record("end", ctx, "returned")
        return payload

    return run


async def _worker_main(targets: str, sink: str, slots: int) -> None:
    # Token and CA from CRONOQ_TOKEN and CRONOQ_TLS_CA, as a deployed worker takes them.
    worker = Worker(targets.split(","), {POOL: _task_function(Path(sink))}, slots=slots)
    await worker.run()  # SIGTERM drains it


# --- the deployed configuration ------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    """TLS and tokens as the Helm chart sets them up: a server certificate for ``localhost``
    and one token per identity (``app`` submits and reads, ``worker`` works its pool)."""

    ca: Path
    tokens: dict[str, str]
    tables: str
    """The servers' ``[tls]`` and ``[auth]`` sections."""

    @classmethod
    def make(cls, directory: Path) -> Access:
        authority = Authority("chaos CA")
        cert, key = authority.server().write(directory, "server")
        ca = directory / "ca.pem"
        ca.write_bytes(authority.pem)
        tokens = {name: secrets.token_urlsafe(32) for name in ("app", "worker")}
        digest = {n: hashlib.sha256(t.encode()).hexdigest() for n, t in tokens.items()}
        tables = (
            f"[tls]\ncert = {json.dumps(str(cert))}\nkey = {json.dumps(str(key))}\n"
            "[auth]\nreload_interval_s = 600\n"
            f'[[auth.identities]]\nname = "app"\npermissions = ["read", "submit"]\n'
            f'token_sha256 = ["{digest["app"]}"]\n'
            f'[[auth.identities]]\nname = "worker"\npermissions = ["work"]\n'
            f'work_pools = ["{POOL}"]\ntoken_sha256 = ["{digest["worker"]}"]\n'
        )
        return cls(ca, tokens, tables)

    def client(self, target: str | list[str], profile: Profile) -> AsyncClient:
        return AsyncClient(
            target,
            tls=Tls(ca=str(self.ca)),
            token=self.tokens["app"],
            timeout=profile.client_timeout_s,
            stall_timeout=profile.stall_timeout_s,
        )

    def worker_env(self) -> dict[str, str]:
        return {"CRONOQ_TOKEN": self.tokens["worker"], "CRONOQ_TLS_CA": str(self.ca)}


def _target(port: int) -> str:
    return f"localhost:{port}"  # the name the server's certificate holds


# --- the cluster ---------------------------------------------------------------------------


class DynamicBalancer(Balancer):
    """The test balancer, whose replica ports change as replicas are replaced."""

    def replace(self, old: int, new: int) -> None:
        self._ports = tuple(new if p == old else p for p in self._ports)


@dataclass
class Cluster:
    directory: Path
    config: str
    servers: list[ServerProcess]
    balancer: DynamicBalancer
    frozen: set[int] = field(default_factory=set)
    """Pids of replicas under SIGSTOP."""

    def alive(self) -> list[ServerProcess]:
        return [s for s in self.servers if s.process.returncode is None]

    def leader(self) -> ServerProcess | None:
        """The replica that says it serves as leader and has not stepped down since."""
        for server in self.alive():
            if server.process.pid in self.frozen:
                continue
            role = None
            for line in server.lines:
                if line.get("msg") == "serving":
                    role = line.get("role")
                elif line.get("msg") in ("stepping_down", "draining", "shutdown_requested"):
                    role = None
            if role == "leading":
                return server
        return None

    async def until(self, predicate: Callable[[], object], timeout: float) -> None:
        """Until ``predicate()`` holds, re-checked on every log line of any replica."""
        async with asyncio.timeout(timeout):
            while not predicate():
                waits = [asyncio.ensure_future(_next_line(s)) for s in self.alive()]
                if not waits:
                    raise AssertionError("no replica alive")
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                    await asyncio.gather(*waits, return_exceptions=True)

    def led_since(self, at: float) -> float | None:
        times = [
            log_time(line)
            for s in self.servers
            for line in s.events("leading")
            if log_time(line) >= at - 0.001
        ]
        return min(times) - at if times else None

    def has_led_since(self, at: float) -> bool:
        return self.led_since(at) is not None

    def targets(self) -> list[str]:
        """Every replica's address, as a client that lists them has it."""
        return [_target(s.grpc_port) for s in self.servers if s.process.returncode is None]

    async def replace(self, old: ServerProcess) -> None:
        """A new replica in place of ``old``, on its port (the clients' lists name it)."""
        await old.stop()
        config = self.config.replace('grpc = "127.0.0.1:0"', f'grpc = "127.0.0.1:{old.grpc_port}"')
        new = await start_server(self.directory, config)
        self.servers.append(new)
        self.balancer.replace(old.grpc_port, new.grpc_port)


async def _next_line(server: ServerProcess) -> None:
    changed = server._changed
    async with changed:
        await changed.wait()


# --- faults --------------------------------------------------------------------------------


def _pg_client_ports(pid: int) -> list[int]:
    """Local ports of the TCP connections process ``pid`` holds to PostgreSQL (Linux /proc)."""
    pg_port = int(PG_DSN.rsplit(":", 1)[1].split("/")[0])
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for row in f.readlines()[1:]:
                cols = row.split()
                if cols[9] in inodes and int(cols[2].rsplit(":", 1)[1], 16) == pg_port:
                    ports.append(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


async def _pg_terminate(server: ServerProcess) -> int:
    ports = _pg_client_ports(server.process.pid)
    conn = await pg_connect()
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE client_port = ANY($1::int[]) AND pid <> pg_backend_pid()",
            ports,
        )
    finally:
        await conn.close()
    return len(rows)


async def _inject(
    cluster: Cluster,
    profile: Profile,
    kinds: Sequence[str],
    rng: random.Random,
    faults: list[Fault],
    stop: asyncio.Event,
) -> None:
    cycle: list[str] = []
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(rng.uniform(*profile.fault_every_s)):
                await stop.wait()  # timed injection: the pause between faults
        if stop.is_set():
            return
        await cluster.until(cluster.leader, 30)
        leader = cluster.leader()
        assert leader is not None
        if not cycle:  # every kind once per cycle, in a random order
            cycle = rng.sample(list(kinds), len(kinds))
        kind = cycle.pop()
        at = time.time()
        until = at
        if kind == "sigkill":
            leader.signal(signal.SIGKILL)
            await cluster.replace(leader)
        elif kind == "sigterm":
            leader.signal(signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await leader.wait_exit(15)
            await cluster.replace(leader)
        elif kind == "sigstop":
            cluster.frozen.add(leader.process.pid)
            leader.signal(signal.SIGSTOP)
            await asyncio.sleep(profile.stop_s)  # timed: the fault lasts past the lease
            leader.signal(signal.SIGCONT)
            cluster.frozen.discard(leader.process.pid)
            until = time.time()
        elif kind == "pg_terminate":
            await _pg_terminate(leader)
        with contextlib.suppress(TimeoutError):
            await cluster.until(functools.partial(cluster.has_led_since, at), 30)
        faults.append(Fault(kind, at, until, cluster.led_since(at)))


# --- submitters ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Load:
    """What one submitter sends: how often, and tasks of how long."""

    pause_s: float
    task_s: tuple[float, float]
    fail_first: float

    @classmethod
    def of(cls, profile: Profile) -> _Load:
        return cls(profile.submit_pause_s, profile.task_s, profile.fail_first)


async def _submit(
    client: AsyncClient,
    name: str,
    keyed: bool,
    load: _Load,
    rng: random.Random,
    out: list[Submission],
    stop: asyncio.Event,
) -> None:
    n = 0
    while not stop.is_set():
        tag = f"{name}-{n}"
        n += 1
        spec = {
            "s": round(rng.uniform(*load.task_s), 3),
            "fail": rng.random() < load.fail_first,
        }
        payload = json.dumps(spec).encode()
        while True:
            begun = time.time()
            try:
                task_id = await client.submit(
                    "chaos", payload, key=tag if keyed else None, tags=[tag], retry=RETRY
                )
            except SchedulerError as err:
                applied: Applied = "not_applied" if err.applied is False else "unknown"
                out.append(
                    Submission(
                        name,
                        tag,
                        keyed,
                        begun,
                        time.time(),
                        None,
                        f"{type(err).__name__}: {err}"[:300],
                        applied,
                    )
                )
                if keyed and not stop.is_set():
                    continue  # idempotent with its key: the same task again
                break
            out.append(Submission(name, tag, keyed, begun, time.time(), task_id))
            break
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(load.pause_s):
                await stop.wait()


# --- the run -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _cluster(
    directory: Path, store: str, profile: Profile, access: Access
) -> AsyncIterator[Cluster]:
    pools = f'[[pools]]\nname = "{POOL}"\nlease_s = {profile.lease_s}\n'
    config = config_toml(store, pools=pools, tables=access.tables)
    started = await asyncio.gather(
        *(start_server(directory, config) for _ in range(profile.replicas)),
        return_exceptions=True,
    )
    servers = [s for s in started if isinstance(s, ServerProcess)]
    frozen: set[int] = set()
    try:
        for outcome in started:
            if isinstance(outcome, BaseException):
                raise outcome
        balancer = DynamicBalancer([s.grpc_port for s in servers])
        async with balancer:
            # The cluster appends replacements to ``servers``: all of them are stopped below.
            cluster = Cluster(directory, config, servers, balancer, frozen)
            await cluster.until(cluster.leader, 30)
            yield cluster
    finally:
        for s in servers:
            if s.process.pid in frozen:
                s.signal(signal.SIGCONT)
        await asyncio.gather(*(s.stop() for s in servers))


@dataclass
class _WorkerProcess:
    process: asyncio.subprocess.Process
    sink: Path
    started: float
    died: float | None = None


async def _start_worker(
    directory: Path, targets: list[str], slots: int, n: int, env: dict[str, str]
) -> _WorkerProcess:
    sink = directory / f"worker-{n}.jsonl"
    sink.touch()
    log = (directory / f"worker-{n}.log").open("ab")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__)),
        "worker",
        ",".join(targets),
        str(sink),
        str(slots),
        stdout=log,
        stderr=log,
        cwd=directory,
        env={**os.environ, **env},
    )
    log.close()
    return _WorkerProcess(process, sink, time.time())


async def run_chaos(
    directory: Path,
    store_kind: str,
    profile: Profile,
    schema: str | None = None,
    seed: int | None = None,
) -> Records:
    """Run the profile on ``store_kind`` (``sqlite``, or ``postgres`` on ``schema``) and return
    what was recorded, the store's final contents included."""
    seed = random.randrange(2**32) if seed is None else seed
    print(f"chaos {profile.name} on {store_kind}: seed {seed}, in {directory}")
    rng = random.Random(seed)
    if store_kind == "sqlite":
        store = sqlite_store(str(directory / "chaos.db"), lease_ttl=profile.sqlite_lease_ttl_s)
        kinds = ["sigkill", "sigterm", "sigstop"]
    else:
        assert schema is not None
        store = pg_store(schema)
        kinds = ["sigkill", "sigterm", "sigstop", "pg_terminate"]
    faults: list[Fault] = []
    submissions: list[Submission] = []
    workers: list[_WorkerProcess] = []
    access = Access.make(directory)
    async with _cluster(directory, store, profile, access) as cluster:
        balanced = _target(cluster.balancer.port)
        # Every other client and worker lists the replicas; the rest go through the balancer.
        routes = [cluster.targets(), [balanced]]
        try:
            for n in range(profile.workers):
                workers.append(
                    await _start_worker(
                        directory, routes[n % 2], profile.slots, n, access.worker_env()
                    )
                )
            stop = asyncio.Event()
            submitters = profile.keyed_submitters + profile.unkeyed_submitters
            clients = [access.client(routes[i % 2], profile) for i in range(submitters + 1)]
            probe = _Load(profile.probe_pause_s, (0.0, 0.05), 0.0)
            load = [
                asyncio.ensure_future(
                    _submit(
                        client,
                        f"{'k' if i < profile.keyed_submitters else 'u'}{i}",
                        i < profile.keyed_submitters,
                        _Load.of(profile),
                        random.Random(rng.random()),
                        submissions,
                        stop,
                    )
                )
                for i, client in enumerate(clients[:submitters])
            ]
            load.append(
                asyncio.ensure_future(
                    _submit(
                        clients[submitters],
                        "probe",
                        True,
                        probe,
                        random.Random(rng.random()),
                        submissions,
                        stop,
                    )
                )
            )
            injector = asyncio.ensure_future(_inject(cluster, profile, kinds, rng, faults, stop))
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(profile.duration_s):
                        await asyncio.shield(injector)  # it only ends by failing
                stop.set()
                await asyncio.gather(injector, *load)
            finally:
                stop.set()
                for task in (injector, *load):
                    task.cancel()
                await asyncio.gather(injector, *load, return_exceptions=True)
                for client in clients:
                    await client.close()
            final = await _settle_and_read(access.client(balanced, profile), submissions, profile)
        finally:
            for w in workers:
                if w.process.returncode is not None and w.died is None:
                    w.died = time.time()  # it died during the run (noticed late)
            await _stop_workers(workers)
    executions: list[Execution] = []
    for w in workers:
        lines = [json.loads(line) for line in w.sink.read_text().splitlines() if line.strip()]
        executions.extend(executions_from_lines(lines))
    return Records(
        executions=tuple(executions),
        workers=tuple(WorkerLife(w.process.pid, w.started, w.died) for w in workers),
        submissions=tuple(submissions),
        faults=tuple(faults),
        final=final,
        availability_limits=profile.availability_limits(store_kind),
        client_share_limit=profile.client_share_s,
    )


async def _settle_and_read(
    client: AsyncClient, submissions: Sequence[Submission], profile: Profile
) -> tuple[FinalTask, ...]:
    """Wait (bounded) for every acknowledged task to finish, then read every task."""
    acked = [s.task_id for s in submissions if s.task_id is not None]
    async with client:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(profile.settle_s):
                for task_id in acked:
                    while True:
                        try:
                            await client.wait(task_id, timeout=profile.settle_s)
                            break
                        except SchedulerError:
                            continue  # a standby's answer: the client's own retries ran out
                        except Exception:
                            break  # WaitTimedOut, TaskNotFound: the checker tells
        found: list[FinalTask] = []
        after: int | None = None
        while page := await client.list(after=after, limit=500):
            for t in page:
                message = ""
                if t.status.value != "succeeded":
                    message = (await client.get(t.task_id)).message
                found.append(FinalTask(t.task_id, t.status.value, t.attempt, message, t.tags))
            after = page[-1].task_id
    return tuple(found)


async def _stop_workers(workers: Sequence[_WorkerProcess]) -> None:
    for w in workers:
        if w.process.returncode is None:
            w.process.send_signal(signal.SIGTERM)
            w.process.send_signal(signal.SIGTERM)  # the second stop abandons what still runs
    for w in workers:
        try:
            async with asyncio.timeout(10):
                await w.process.wait()
        except TimeoutError:
            w.process.kill()
            await w.process.wait()


if __name__ == "__main__":
    _, role, target_, sink_, slots_ = sys.argv
    assert role == "worker", sys.argv
    asyncio.run(_worker_main(target_, sink_, int(slots_)))
