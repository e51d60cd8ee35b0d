"""The HTTP side of the server: ``GET /healthz``, ``GET /readyz`` and ``GET /metrics``, on aiohttp
(and the dashboard under ``/ui``, which ``_ui`` adds).

aiohttp parses the requests, keeps connections alive, and closes one that stays idle for
``idle_timeout`` seconds, from the moment it opens as after each response, so that a client
that connects and says nothing holds a file descriptor for that long and nothing else: there
is no cap on connections for idle ones to fill, so probes are never starved of one. Why
aiohttp rather than Starlette on uvicorn is in docs/server.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cronoq.errors import PermissionDenied, Unauthenticated
from cronoq_server._config import Address

__all__ = ["IDLE_TIMEOUT_S", "HttpServer", "Readiness"]

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 5.0
"""How long a connection may stay open without a request in progress."""
_SHUTDOWN_TIMEOUT_S = 1.0
"""How long ``close()`` lets requests in progress finish (each answers at once)."""


@dataclass(frozen=True, slots=True)
class Readiness:
    """What ``/readyz`` answers: 200 when ``ready``, else 503; ``reason`` says why, in a word
    (``leading``, ``standby``, ``draining``, ``stopped``, ``store_failed``), and ``cause``,
    when there is something to fix, what it is."""

    ready: bool
    reason: str
    cause: str | None = None


_JSON = "application/json"
_ALIVE = b'{"status":"alive"}'  # byte for byte what probes configured on it have always seen
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpServer:
    """``async with HttpServer(address, readiness=..., registry=...) as http:`` serves until
    the block ends; ``port`` is the bound port (useful with port 0)."""

    def __init__(
        self,
        address: Address,
        *,
        readiness: Callable[[], Readiness],
        registry: CollectorRegistry,
        idle_timeout: float = IDLE_TIMEOUT_S,
        metrics_auth: Callable[[str], Unauthenticated | PermissionDenied | None] | None = None,
        routes: Callable[[web.Application], None] | None = None,
        before_scrape: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``routes`` adds more to the application (the dashboard, ``_ui``);
        ``before_scrape`` reads what the collectors need from async calls."""
        self._before_scrape = before_scrape
        self._address = address
        self._readiness = readiness
        self._registry = registry
        self._idle_timeout = idle_timeout
        self._metrics_auth = metrics_auth
        """None: /metrics is open; else it judges the Authorization header's value (None:
        allowed; else why not)."""
        self._routes = routes
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Listen; ``OSError`` if the address cannot be bound (the runner is cleaned up)."""
        app = web.Application(middlewares=[_json_errors])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        if self._routes is not None:
            self._routes(app)
        runner = web.AppRunner(
            app,
            access_log=None,  # a line per probe and scrape would drown the server's own
            logger=_SERVER_LOG,
            keepalive_timeout=self._idle_timeout,
            shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self._address.host, self._address.port).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    @property
    def port(self) -> int:
        """The port of the first listening socket (``localhost`` may bind two, IPv4 and 6)."""
        assert self._runner is not None, "start() first"
        port: int = self._runner.addresses[0][1]
        return port

    async def close(self) -> None:
        """Stop listening and end the connections still open."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> HttpServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _healthz(self, _: web.Request) -> web.Response:
        return web.Response(body=_ALIVE, content_type=_JSON, headers={"Cache-Control": "no-store"})

    async def _readyz(self, _: web.Request) -> web.Response:
        try:
            readiness = self._readiness()
        except Exception:
            log.exception("the readiness callback failed")
            readiness = Readiness(False, "error")
        body: dict[str, object] = {"ready": readiness.ready, "reason": readiness.reason}
        if readiness.cause is not None:
            body["cause"] = readiness.cause
        return _json(200 if readiness.ready else 503, body)

    async def _metrics(self, request: web.Request) -> web.Response:
        refusal = (
            None
            if self._metrics_auth is None
            else self._metrics_auth(request.headers.get("Authorization", ""))
        )
        if isinstance(refusal, PermissionDenied):
            # Authenticated, lacking the permission: 403 names it, as gRPC's PERMISSION_DENIED
            # does (a 401 would send the scraper's owner looking for a wrong token).
            return _json(403, {"error": str(refusal), "permission": refusal.permission})
        if refusal is not None:
            response = _json(
                401,
                {"error": f"{refusal}; /metrics needs a bearer token of the metrics permission"},
            )
            response.headers["WWW-Authenticate"] = 'Bearer realm="cronoq"'
            return response
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        try:
            if self._before_scrape is not None:
                await self._before_scrape()
            body = encoder(self._registry)
        except Exception:
            log.exception("collecting the metrics failed")
            return _json(500, {"error": "collecting the metrics failed"})
        # aiohttp's content_type takes no parameters: the header is set whole.
        return web.Response(
            body=body, headers={"Content-Type": content_type, "Cache-Control": "no-store"}
        )


class _ServerLog(logging.Logger):
    """aiohttp's log of what went wrong with a connection. A request the client got wrong
    (malformed, headers too large) is answered 400 and is the client's fault: one DEBUG line,
    so that no client can fill the log with tracebacks. Anything else stays an ERROR with its
    traceback: a bug of ours."""

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if isinstance(error, HttpProcessingError):
            self.debug("%s: %s", str(msg) % args, error.message)
        else:
            super().exception(msg, *args, **kwargs)


_SERVER_LOG = _ServerLog(f"{__name__}.server")
_SERVER_LOG.parent = log  # made outside logging's registry: propagate to the server's loggers


def _json(status: int, body: dict[str, object]) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type=_JSON,
        headers={"Cache-Control": "no-store"},
    )


@web.middleware
async def _json_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """aiohttp's own 404 and 405 (with its ``Allow``) as JSON, as every other answer."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _json(exc.status, {"error": (exc.reason or "error").lower()})
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
