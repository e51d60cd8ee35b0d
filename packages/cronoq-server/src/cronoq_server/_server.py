"""``cronoq-server serve``: a replica, its gRPC server and its HTTP endpoints, in one process.

gRPC's Python server cannot close one connection, so the replica's role picks the server
object: a standby (and a leader that stepped down) serves from a server built with
``grpc.max_connection_age_ms`` of one second, which sends every connection a GOAWAY about a
second after it opened, so that a retrying client reconnects and a balancer picks a replica
again; the leader serves from one without that limit. A role change starts the new server on
the same port (SO_REUSEPORT, gRPC's default on Linux) before the old one stops. Only this
process's server objects may share the port: another process there is refused (``_ports``).

A server object is never stopped under a call it could still answer: the standby's refuses
every call (even once the replica leads, see ``_service``), and the leader's is stopped only
once its scheduler stopped, which answers every call it holds, with a grace period for those
answers to leave. A call cut off by a stop is CANCELLED, which a client must take for an
unknown outcome; these are answered instead, UNAVAILABLE with a not-applied reason when
nothing was applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cronoq import WorkerInfo
from cronoq.errors import PermissionDenied, Unauthenticated
from cronoq_client.protocol import SERVICE_NAMES
from cronoq_server._auth import AuthCollector, AuthInterceptor, Guard
from cronoq_server._config import (
    Address,
    ServerConfig,
    has_outbox,
    loopback,
    open_store,
    remote_pools,
    task_limits,
)
from cronoq_server._credentials import CredentialFiles, CredentialsError
from cronoq_server._exits import EXIT_CANNOT_LISTEN, EXIT_FAILED, EXIT_INVALID, EXIT_OK, forced_exit
from cronoq_server._grpc_metrics import GrpcMetrics, MetricsInterceptor
from cronoq_server._http import HttpServer, Readiness
from cronoq_server._links import Links
from cronoq_server._logging import configure_logging, lifecycle
from cronoq_server._metrics import SchedulerCollector, metrics_registry
from cronoq_server._ports import cannot_listen, check_alone, listen_error
from cronoq_server._replica import Replica, Role, StoreFailed
from cronoq_server._service import Arrivals, SchedulerService, WorkerService, add_services
from cronoq_server._ui import Dashboard

__all__ = ["GrpcEndpoint", "run"]

log = logging.getLogger("cronoq.server")

_GRPC_SETTING = "listen.grpc"
_HTTP_SETTING = "listen.http"
STANDBY_CONNECTION_AGE_MS = 1000
"""How long a standby keeps a connection: about a second, then GOAWAY (gRPC adds +-10%)."""
_STANDBY_GRACE_MS = 200
_STOP_GRACE_S = 5.0
"""How long the leader's server object, once its scheduler stopped (stepped down, drained or
aborted), lets its calls send the answers they hold before it closes connections. Every call
then has its answer, so the stop returns as soon as they left; the bound is for a stuck peer."""
_QUIET_S = 0.1
"""A server object is stopped once no call reached it for this long (see ``Arrivals``): every
client that called was refused and went elsewhere, or has its answer."""
_STOP_QUIET_LIMIT_S = 2.0
"""The longest a leader's server object that stepped down or drained waits for that."""
_STANDBY_QUIET_LIMIT_S = 1.0
"""The longest a standby's server object waits for that once the replica leads (its
connections end within a second anyway); the leader is ready only after it stopped."""


@dataclass(frozen=True, slots=True)
class _Options:
    host: str
    max_message_bytes: int
    credentials: Callable[[], grpc.ServerCredentials | None]
    """Credentials for each server object (None: plaintext); see ``_credentials``."""
    interceptors: tuple[grpc.aio.ServerInterceptor, ...] = ()


class GrpcEndpoint:
    """The gRPC side of a replica: the server object its role calls for, on one port."""

    def __init__(self, replica: Replica, options: _Options, port: int) -> None:
        self._replica = replica
        self._options = options
        self.port = port
        self._health = health.aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._serving_as: Role | None = None
        self._swap = asyncio.Lock()
        self._arrivals: dict[grpc.aio.Server, Arrivals] = {}
        self._leader_links = Links()
        """The worker links of the leader's server object (the dashboard lists them)."""

    async def start(self) -> None:
        """Listen; ``OSError`` with a one-line message if the port is taken or not bindable."""
        # grpcio's health servicer starts out SERVING: a replica that never gets as far as a
        # role change (its store cannot be opened) would claim to serve.
        await self._set_health(self._replica.role)
        check_alone(_GRPC_SETTING, self._address(), bound=False)
        await self._serve(self._replica.role)
        try:
            # Again now that this process listens: another server that started at the same
            # instant passed the first check too (each then refuses the other).
            check_alone(_GRPC_SETTING, self._address(), bound=True)
        except OSError:
            await self.stop(0)
            raise

    def _address(self) -> Address:
        return Address(self._options.host, self.port)

    def _build(self, leader: bool) -> grpc.aio.Server:
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", self._options.max_message_bytes),
            ("grpc.max_send_message_length", self._options.max_message_bytes),
            ("grpc.so_reuseport", 1),
            # A worker whose host vanished without a FIN is noticed within seconds: its link
            # closes and its slots are no longer offered (else attempts would be written into
            # a dead connection and lost one lease after another). Clients ping as often.
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if not leader:
            options += [
                ("grpc.max_connection_age_ms", STANDBY_CONNECTION_AGE_MS),
                ("grpc.max_connection_age_grace_ms", _STANDBY_GRACE_MS),
            ]
        server = grpc.aio.server(options=options, interceptors=self._options.interceptors)
        arrivals = Arrivals()
        links = Links()  # the server object's workers: WorkerService holds, ListWorkers lists
        add_services(
            server,
            SchedulerService(
                self._replica,
                self._options.max_message_bytes,
                leader_server=leader,
                arrivals=arrivals,
                links=links,
            ),
            WorkerService(
                self._replica,
                self._options.max_message_bytes,
                leader_server=leader,
                arrivals=arrivals,
                links=links,
            ),
        )
        self._arrivals[server] = arrivals
        if leader:
            self._leader_links = links
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
        address = str(self._address())
        credentials = self._options.credentials()
        try:
            if credentials is None:
                bound = server.add_insecure_port(address)
            else:
                bound = server.add_secure_port(address, credentials)
        except RuntimeError:  # grpcio's word for any failed bind, without the reason
            bound = 0
        if bound == 0:
            check_alone(_GRPC_SETTING, self._address(), bound=False)  # taken: by whom
            raise cannot_listen(
                _GRPC_SETTING,
                self._address(),
                "the address is not one of this host's, or the port needs privileges",
            )
        self.port = bound  # port 0 picks one; the next server object takes the same
        return server

    async def role_changed(self, role: Role) -> None:
        await self._set_health(role)
        if role in (Role.LEADING, Role.STANDBY):
            await self._serve(role)
        # DRAINING keeps the leader's server: connections stay open for the last reports.

    async def _set_health(self, role: Role) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if role is Role.LEADING
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", *SERVICE_NAMES):
            await self._health.set(service, status)

    async def _serve(self, role: Role) -> None:
        async with self._swap:
            leader = role is Role.LEADING
            if self._serving_as is not None and (self._serving_as is Role.LEADING) == leader:
                return
            old = self._server
            self._server = self._build(leader)
            await self._server.start()
            if old is not None:
                if leader:  # the standby's: its calls were refused at once
                    await self._retire(old, _STANDBY_QUIET_LIMIT_S, _STANDBY_GRACE_MS / 1000)
                else:
                    await self._retire(old, _STOP_QUIET_LIMIT_S, _STOP_GRACE_S)
            # Only now does every new connection reach the server of this role.
            self._serving_as = role
            lifecycle("serving", role=role.value, grpc_port=self.port)

    def workers(self) -> list[WorkerInfo]:
        """The workers attached to the leader's server object, as ListWorkers lists them."""
        return self._leader_links.workers() if self.leading else []

    @property
    def leading(self) -> bool:
        """The leader's server took over the port (the standby's stopped)."""
        return self._serving_as is Role.LEADING

    async def _retire(self, server: grpc.aio.Server, quiet_limit: float, grace: float) -> None:
        """Stop a server object once calls stopped coming (see ``Arrivals``), letting those
        in flight send their answers for up to ``grace`` seconds."""
        arrivals = self._arrivals.pop(server)
        await arrivals.quiet(_QUIET_S, quiet_limit)
        await server.stop(grace)

    async def stop(self, grace: float, quiet_limit: float = 0.0) -> None:
        async with self._swap:
            if self._server is not None:
                await self._retire(self._server, quiet_limit, grace)
                self._server = None


@dataclass(frozen=True, slots=True)
class _Security:
    files: CredentialFiles
    guard: Guard | None
    """None: authentication is off (loopback only, or explicitly insecure)."""
    collector: AuthCollector

    @property
    def interceptors(self) -> tuple[grpc.aio.ServerInterceptor, ...]:
        return () if self.guard is None else (AuthInterceptor(self.guard),)

    def metrics_auth(
        self, open_metrics: bool
    ) -> Callable[[str], Unauthenticated | PermissionDenied | None] | None:
        """Who may read /metrics: everyone, or the holders of a ``metrics`` token."""
        if self.guard is None or open_metrics:
            return None
        return self.guard.metrics_refusal

    def reload(self, why: str) -> None:
        if self.files.reload(why) and self.guard is not None:
            self.guard.tokens = self.files.current.tokens


def _security(config: ServerConfig) -> _Security:
    """The credentials and the guard of the configuration; CredentialsError if a file is bad."""
    files = CredentialFiles(config.tls, config.auth)
    collector = AuthCollector()
    guard = Guard(config.auth, files.current.tokens, collector) if config.auth.enabled else None
    return _Security(files, guard, collector)


def _install_reload(security: _Security, interval: float) -> asyncio.Task[None]:
    """Reload the credential files on SIGHUP and when one changes."""
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, security.reload, "SIGHUP")

    async def watch() -> None:
        while True:
            await asyncio.sleep(interval)
            if security.files.changed():
                security.reload("a file changed")

    return asyncio.get_running_loop().create_task(watch(), name="cronoq-credentials-watch")


def make_replica(config: ServerConfig) -> Replica:
    return Replica(
        lambda: open_store(config),
        remote_pools(config),
        commit_timeout=config.commit_timeout_s,
        retention=config.retention_s,
        drain_timeout=config.drain_timeout_s,
        max_payload_bytes=config.limits.max_message_bytes,
        fatal_attempts=config.runtime.store_fatal_attempts,
        tracing=config.tracing.enabled,
        limits=task_limits(config),
    )


def _tracing_interceptor() -> grpc.aio.ServerInterceptor:
    # Imported only when enabled: OpenTelemetry is the otel extra's.
    from cronoq.tracing import Tracing
    from cronoq_server._grpc_tracing import TracingInterceptor

    tracing = Tracing.of(True, "tracing.enabled")
    assert tracing is not None
    return TracingInterceptor(tracing)


def _readiness(replica: Replica, endpoint: GrpcEndpoint) -> Readiness:
    # Ready once the leader's server alone holds the port, so that a balancer routing on
    # readiness never reaches the standby's server in its last moments.
    if replica.ready and endpoint.leading:
        return Readiness(True, replica.role.value)
    if replica.store_problem is not None:
        return Readiness(False, "store_failed", replica.store_problem)
    return Readiness(False, replica.role.value)


def _dashboard_closed(config: ServerConfig) -> str | None:
    """Why the dashboard must serve nothing: without authentication it lets anyone who reaches
    it cancel tasks and pause pools, so it opens only where gRPC would (loopback, or insecure)."""
    if config.auth.enabled or config.auth.insecure or loopback(config.listen.http.host):
        return None
    return (
        "the dashboard is off: authentication is not configured and the HTTP port is not on a "
        "loopback address, so anyone who reaches it could act on every task. Configure "
        "[[auth.identities]] (docs/security.md), or set auth.insecure = true"
    )


async def run(config: ServerConfig, *, ready: asyncio.Event | None = None) -> int:
    """Serve until SIGTERM or SIGINT: drain on the first, stop at once on a second. Returns
    the process's exit code (``_exits``)."""
    configure_logging(config.logging)
    try:
        security = _security(config)
    except CredentialsError as exc:
        lifecycle("credentials_invalid", error=str(exc))
        return EXIT_INVALID  # as an invalid configuration
    replica = make_replica(config)
    collector = SchedulerCollector(
        lambda: replica.scheduler.workers if replica.scheduler is not None else 0,
        [pool.name for pool in config.pools],
        outbox=has_outbox(config),
        limits=[limit.name for limit in config.task_limits],
    )
    registry = metrics_registry(collector)
    registry.register(security.collector)
    # Every call is counted, those that authentication refuses too.
    interceptors: tuple[grpc.aio.ServerInterceptor, ...] = (
        MetricsInterceptor(GrpcMetrics(registry)),
        *security.interceptors,
    )
    if config.tracing.enabled:  # first, so that its span covers the calls refused too
        interceptors = (_tracing_interceptor(), *interceptors)
    limit = config.limits.max_message_bytes
    options = _Options(
        config.listen.grpc.host, limit, security.files.server_credentials, interceptors
    )
    endpoint = GrpcEndpoint(replica, options, config.listen.grpc.port)
    dashboard = Dashboard(
        replica,
        readiness=lambda: _readiness(replica, endpoint),
        workers=endpoint.workers,
        guard=security.guard,
        closed=_dashboard_closed(config),
    )
    http = HttpServer(
        config.listen.http,
        readiness=lambda: _readiness(replica, endpoint),
        registry=registry,
        metrics_auth=security.metrics_auth(config.auth.open_metrics),
        routes=dashboard.install,
        before_scrape=collector.refresh,
    )
    pending: set[asyncio.Task[None]] = set()

    def changed(role: Role) -> None:
        # Counts of a scheduler that stopped are kept; the next one adds to them.
        collector.watch(replica.scheduler if role is Role.LEADING else None)
        task = asyncio.get_running_loop().create_task(endpoint.role_changed(role))
        pending.add(task)
        task.add_done_callback(pending.discard)

    replica.on_change(changed)
    try:
        await endpoint.start()
        try:
            await http.start()
        except OSError as exc:
            raise listen_error(_HTTP_SETTING, config.listen.http, exc) from None
    except OSError as exc:
        # The one line: what is taken (by whom) and what to do (strerror: without "[Errno N]").
        log.error("%s", exc.strerror or exc)
        await endpoint.stop(0)
        lifecycle("stopped", exit_code=EXIT_CANNOT_LISTEN)
        return EXIT_CANNOT_LISTEN
    loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # uvloop, asyncio
    lifecycle("listening", grpc_port=endpoint.port, http_port=http.port, event_loop=loop)
    signals = _install_signals(replica)
    watching = _install_reload(security, config.auth.reload_interval_s)
    if ready is not None:
        ready.set()
    code = EXIT_OK
    try:
        await replica.run()
    except StoreFailed:
        code = EXIT_FAILED  # the replica said why, once, with what to do
    finally:
        watching.cancel()
        await asyncio.gather(*pending, watching, return_exceptions=True)
        # The scheduler is closed: every call holds its answer (applied, or not applied),
        # which leaves before the connections close.
        await endpoint.stop(_STOP_GRACE_S, _STOP_QUIET_LIMIT_S)
        await http.close()
    if signals.forced is not None:
        code = forced_exit(signals.forced)
    lifecycle("stopped", exit_code=code)
    return code


@dataclass(slots=True)
class _Signals:
    received: list[int] = field(default_factory=list)

    @property
    def forced(self) -> int | None:
        """The signal that forced an immediate stop (the second one), if any."""
        return self.received[1] if len(self.received) > 1 else None


def _install_signals(replica: Replica) -> _Signals:
    loop = asyncio.get_running_loop()
    signals = _Signals()

    def on_signal(signum: int) -> None:
        signals.received.append(signum)
        if len(signals.received) == 1:
            lifecycle("shutdown_requested", signal=signal.Signals(signum).name)
            replica.shutdown()
        else:
            lifecycle("shutdown_forced", signal=signal.Signals(signum).name)
            replica.abort()

    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal, signum)
    return signals
