"""The credentials of a client or worker: TLS (the server's CA, and a client certificate for
mTLS) and a bearer token, from the arguments or else from the environment.

=====================  ==========================================================
``CRONOQ_TOKEN``       the bearer token (``CRONOQ_TOKEN_FILE``: a file holding it)
``CRONOQ_TLS_CA``      PEM file of the CA that signed the server's certificate
``CRONOQ_TLS_CERT``    PEM client certificate (mTLS), with ``CRONOQ_TLS_KEY``
=====================  ==========================================================

Any ``CRONOQ_TLS_*`` variable turns TLS on when ``tls`` is not given; ``tls=False`` keeps
plaintext whatever the environment says. The token is sent in the ``authorization`` metadata of
every call, by a channel interceptor: over plaintext too, for a server on loopback or behind a
mesh that encrypts (the server refuses tokens in clear on any other address).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc import aio

from cronoq.errors import InvalidArgument

__all__ = ["Credentials", "Tls", "credentials"]


@dataclass(frozen=True, slots=True)
class Tls:
    """TLS from PEM files: ``ca`` (default: the system's roots) verifies the server; ``cert``
    and ``key`` are the client's certificate and key, for a server that requires them."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None

    def channel_credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument("tls: give both cert and key (the client certificate), or none")
        return grpc.ssl_channel_credentials(
            _read(self.ca, "tls.ca"), _read(self.key, "tls.key"), _read(self.cert, "tls.cert")
        )


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InvalidArgument(f"{what} {path}: cannot read it: {exc.strerror}") from None


@dataclass(frozen=True, slots=True)
class Credentials:
    channel: grpc.ChannelCredentials | None
    """None: plaintext."""
    interceptors: tuple[aio.ClientInterceptor, ...]


class _BearerToken:
    """Adds ``authorization: Bearer <token>`` to a call's metadata."""

    def __init__(self, token: str) -> None:
        self._header = ("authorization", f"Bearer {token}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<hidden>)"  # never the token, in a traceback or a log

    def _with_token(self, details: aio.ClientCallDetails) -> aio.ClientCallDetails:
        metadata = aio.Metadata(*(details.metadata or ()), self._header)
        return aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )


# Two classes: grpc.aio files an interceptor under the first kind it is an instance of, so one
# object of both kinds would never see a stream call (Attach).
class _UnaryToken(_BearerToken, aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:  # fmt: skip
        return await continuation(self._with_token(client_call_details), request)


class _StreamToken(_BearerToken, aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: aio.ClientCallDetails,
        request: Any,
    ) -> Any:  # fmt: skip
        return await continuation(self._with_token(client_call_details), request)


def _token(token: str | None, environ: Mapping[str, str]) -> str | None:
    if token is None:
        token = environ.get("CRONOQ_TOKEN") or None
        path = environ.get("CRONOQ_TOKEN_FILE")
        if token is None and path:
            token = (_read(path, "CRONOQ_TOKEN_FILE") or b"").decode().strip()
    if token is None:
        return None
    if not isinstance(token, str) or not token or not token.isprintable() or " " in token:
        raise InvalidArgument("token must be a non-empty string of printable characters")
    return token


def credentials(
    tls: grpc.ChannelCredentials | Tls | bool | None,
    token: str | None,
    environ: Mapping[str, str] | None = None,
) -> Credentials:
    """The credentials of ``tls`` and ``token``, each from the environment when None."""
    env = os.environ if environ is None else environ
    if tls is None:
        files = Tls(
            env.get("CRONOQ_TLS_CA") or None,
            env.get("CRONOQ_TLS_CERT") or None,
            env.get("CRONOQ_TLS_KEY") or None,
        )
        tls = files if files != Tls() else None
    if tls is True:
        channel: grpc.ChannelCredentials | None = grpc.ssl_channel_credentials()
    elif tls is None or tls is False:
        channel = None
    elif isinstance(tls, Tls):
        channel = tls.channel_credentials()
    elif isinstance(tls, grpc.ChannelCredentials):
        channel = tls
    else:
        raise InvalidArgument(
            f"tls must be None, a bool, cronoq_client.Tls or grpc.ChannelCredentials, got "
            f"{type(tls).__name__}"
        )
    found = _token(token, env)
    interceptors = () if found is None else (_UnaryToken(found), _StreamToken(found))
    return Credentials(channel, interceptors)
