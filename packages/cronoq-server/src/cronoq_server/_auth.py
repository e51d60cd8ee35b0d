"""Who may do what: the caller's identity from a bearer token or a client certificate, and its
permissions, checked on every call by one server interceptor.

The interceptor authenticates the call and checks the permission its method needs (the table
``METHOD_PERMISSIONS``); a check that needs the request's content (the pool and kind of a
submitted task, the pools of an Attach, the pool of a reported attempt) is the service's, through
``authorize_pool()`` and ``authorize_attempt()``, which read the caller that the interceptor
put in a context variable (each call runs in its own asyncio task, so the variable is the call's).
Without authentication configured no interceptor is installed and both helpers allow everything.

Every refusal of credentials has the same answer, whatever was wrong with them: a client cannot
learn whether a token exists. Tokens are compared as SHA-256 digests, against every known digest
without an early exit (``hmac.compare_digest``), and are never logged.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from cronoq import AttemptToken, Scheduler
from cronoq.errors import PermissionDenied, Unauthenticated
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb
from cronoq_server._config import AuthSettings, IdentitySettings
from cronoq_server._grpc_metrics import WrappedHandlers

__all__ = [
    "METHOD_PERMISSIONS",
    "AuthCollector",
    "AuthInterceptor",
    "Grant",
    "Guard",
    "TokenTable",
    "authorize_attempt",
    "authorize_pool",
    "authorize_tasks",
    "caller_identity",
    "key_refused",
    "key_scope",
    "parse_tokens_file",
    "refusals_tallied",
]

log = logging.getLogger("cronoq.server.auth")

AUTHENTICATED = ""
"""The rule of a method that any authenticated identity may call (reflection)."""
_OPEN = None


def _methods() -> dict[str, str | None]:
    scheduler = {
        "Submit": "submit",
        "SubmitMany": "submit",
        "SubmitEach": "submit",
        "Get": "read",
        "GetByKey": "read",
        "GetTaskData": "read",
        "List": "read",
        "Wait": "read",
        "ListSchedules": "read",
        "PreviewSchedule": "read",
        "ListPools": "read",
        "ListWorkers": "read",
        # Limits' bounds and use, with their busiest keys (tenants, accounts): what a reader
        # sees of any task's limits already.
        "ListLimits": "read",
        # The outbox's figures and quarantined rows (their kinds, reasons and payloads' first
        # KiB): what a reader sees of any task already.
        "OutboxStatus": "read",
        "ListOutboxQuarantine": "read",
        # Why a task is where it is, a schedule's ledger, a task's attempts and dependants
        # (issue 32): what Get and List show of any task already.
        "Explain": "read",
        "ListOccurrences": "read",
        "GetAttempts": "read",
        "GetDependants": "read",
        "Cancel": "cancel",
        "AddSchedule": "schedules",
        "PauseSchedule": "schedules",
        "ResumeSchedule": "schedules",
        "RemoveSchedule": "schedules",
        # An operator's calls act on every task of a pool, or outside any caller's own
        # submissions: admin only (issue 21), as an unlisted method would be, but said.
        "PausePool": "admin",
        "ResumePool": "admin",
        "Retry": "admin",
        # A rerun makes a new task of anyone's finished task, payload and key included, as a
        # retry revives one: the same permission, and so no pool scope (an admin has none).
        "Rerun": "admin",
        "TriggerSchedule": "admin",
        # A requeue makes tasks of rows no submitter of this server wrote, a discard loses
        # them for good: operator calls, as those above.
        "RequeueOutbox": "admin",
        "DiscardOutbox": "admin",
    }
    worker = dict.fromkeys(("Attach", "Heartbeat", "HeartbeatMany", "Report", "ReportMany"), "work")
    rules: dict[str, str | None] = {}
    for service, methods in (("SchedulerService", scheduler), ("WorkerService", worker)):
        full = pb.DESCRIPTOR.services_by_name[service].full_name
        rules.update({f"/{full}/{name}": permission for name, permission in methods.items()})
    # Probes (Kubernetes' gRPC probe, a balancer's health check) need no credentials.
    rules.update({f"/{health.SERVICE_NAME}/{name}": _OPEN for name in ("Check", "Watch")})
    rules[f"/{reflection.SERVICE_NAME}/ServerReflectionInfo"] = AUTHENTICATED
    return rules


METHOD_PERMISSIONS: Mapping[str, str | None] = _methods()
"""The permission each method needs: a name, ``AUTHENTICATED`` (any identity) or None (open).
A method not listed (one a later release adds) needs ``admin``."""

_REFUSED = "the credentials were not accepted"
_MISSING = (
    "this server requires authentication: send a bearer token in the 'authorization' metadata "
    "or a client certificate"
)


@dataclass(frozen=True, slots=True)
class Grant:
    """An authenticated caller and what it may do (an identity of the configuration, or a
    certificate's name that none has: it may do nothing)."""

    name: str
    permissions: frozenset[str] = frozenset()
    submit_pools: frozenset[str] | None = None
    submit_kinds: frozenset[str] | None = None
    work_pools: frozenset[str] = frozenset()

    @classmethod
    def of(cls, identity: IdentitySettings) -> Grant:
        return cls(
            identity.name,
            identity.permissions,
            identity.submit_pools,
            identity.submit_kinds,
            identity.work_pools,
        )

    def allows(self, permission: str) -> bool:
        return "admin" in self.permissions or permission in self.permissions

    def check(self, permission: str) -> None:
        if not self.allows(permission):
            raise PermissionDenied(
                f"identity {self.name!r} lacks the permission {permission!r}", permission
            )

    def check_pool(self, permission: str, pool: str, kind: str | None = None) -> None:
        """``permission`` on ``pool`` (and, to submit, ``kind``)."""
        self.check(permission)
        if "admin" in self.permissions:
            return
        pools = self.work_pools if permission == "work" else self.submit_pools
        if pools is not None and pool not in pools:
            raise PermissionDenied(
                f"identity {self.name!r} lacks the permission {permission!r} on pool {pool!r}",
                permission,
            )
        if kind is not None and self.submit_kinds is not None and kind not in self.submit_kinds:
            raise PermissionDenied(
                f"identity {self.name!r} lacks the permission 'submit' for kind {kind!r}",
                permission,
            )


@dataclass(frozen=True, slots=True)
class _Caller:
    grant: Grant
    guard: Guard
    method: str


_caller: ContextVar[_Caller | None] = ContextVar("cronoq_caller", default=None)


def caller_identity() -> str | None:
    """The identity the current call authenticated as; None when authentication is off."""
    caller = _caller.get()
    return None if caller is None else caller.grant.name


def authorize_pool(permission: str, pool: str, kind: str | None = None) -> None:
    """Raise PermissionDenied unless the current call's identity has ``permission`` on
    ``pool`` (and ``kind``); allow everything when authentication is off."""
    caller = _caller.get()
    if caller is None:
        return
    try:
        caller.grant.check_pool(permission, pool, kind)
    except PermissionDenied as exc:
        caller.guard.deny(exc, caller.grant, caller.method)
        raise


def authorize_tasks(tasks: Iterable[tuple[str, str]], copies: int = 1) -> None:
    """A SubmitMany's tasks, as (pool, kind) pairs (each standing for ``copies`` tasks: the
    compact form's common request stands for its payloads): refused whole, with the first
    refusal, if one is outside the grant. One refusal: counted once, logged in one line with
    the number of tasks outside the grant."""
    caller = _caller.get()
    if caller is None:
        return
    first: PermissionDenied | None = None
    refused = 0
    for (pool, kind), count in Counter(tasks).items():
        try:
            caller.grant.check_pool("submit", pool, kind)
        except PermissionDenied as exc:
            first = first or exc
            refused += count * copies
    if first is not None:
        caller.guard.deny(first, caller.grant, caller.method, refused=refused)
        raise first


def key_scope() -> dict[str, frozenset[str] | None]:
    """The arguments of ``Scheduler.submit_specs`` that keep a submission's key from
    answering with a task outside the caller's grant (its submit pools and kinds): none for
    an admin, an unrestricted identity, or when authentication is off."""
    caller = _caller.get()
    grant = None if caller is None else caller.grant
    if grant is None or "admin" in grant.permissions:
        return {}
    if grant.submit_pools is None and grant.submit_kinds is None:
        return {}
    return {"key_pools": grant.submit_pools, "key_kinds": grant.submit_kinds}


def key_refused(exc: PermissionDenied) -> PermissionDenied:
    """The scheduler's refusal of a key held by a task outside ``key_scope()``, as the
    caller's: naming its identity (never the task), counted and logged as a refusal."""
    caller = _caller.get()
    if caller is None:  # no scope was given: the scheduler does not refuse a key then
        return exc
    refused = PermissionDenied(
        f"identity {caller.grant.name!r} may not submit with this key: {exc} (give each "
        "tenant keys of its own, with a prefix)",
        exc.permission,
    )
    caller.guard.deny(refused, caller.grant, caller.method)
    return refused


@dataclass(slots=True)
class _Tally:
    """The permission refusals of the items of one batch call (``refusals_tallied``)."""

    count: int = 0
    permission: str = ""


_tally: ContextVar[_Tally | None] = ContextVar("cronoq_refusals", default=None)


@contextlib.contextmanager
def refusals_tallied() -> Iterator[None]:
    """Around a batch call whose items are authorized one by one (SubmitEach, HeartbeatMany,
    ReportMany): the items refused are logged in one line with their count, however many
    there are, rather than a line each (a call of 1,000 refused items would write 1,000).
    Each still counts in ``cronoq_permission_denied_total``, as each is answered
    PERMISSION_DENIED. The items' own tasks (``asyncio.gather``'s) copy this context, and
    with it the tally."""
    caller = _caller.get()
    tally = _Tally()
    reset = _tally.set(tally)
    try:
        yield
    finally:
        _tally.reset(reset)
        if caller is not None and tally.count:
            caller.guard.logged(caller.grant, tally.permission, caller.method, tally.count)


def authorize_attempt(sched: Scheduler, token: AttemptToken, lease_id: bytes) -> None:
    """A heartbeat or report of an attempt of a pool the identity works on. The token names
    no pool: the attempt's, as the scheduler (or the leader it adopted the attempt from)
    leased it with that lease id, unless the identity is an admin. Any other caller is left to
    the scheduler, which answers StaleAttempt "unknown" and changes nothing, whatever the task
    is: a permission refusal would tell a guessed token's pool."""
    caller = _caller.get()
    if caller is None or "admin" in caller.grant.permissions:
        return
    pool = sched.remote_attempt_pool(token, lease_id=lease_id)
    if pool is not None:
        authorize_pool("work", pool)


# --- tokens ---------------------------------------------------------------------------------


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True, slots=True)
class TokenTable:
    """The known token digests and the identity each names."""

    entries: tuple[tuple[bytes, str], ...] = ()

    @classmethod
    def build(
        cls, identities: Iterable[IdentitySettings], extra: Iterable[tuple[str, str]]
    ) -> TokenTable:
        pairs = [(i.name, hexdigest) for i in identities for hexdigest in i.token_sha256]
        return cls(tuple((bytes.fromhex(h), name) for name, h in [*pairs, *extra]))

    def find(self, token: str) -> str | None:
        return self.find_digest(digest(token))

    def find_digest(self, presented: bytes) -> str | None:
        """The identity of a token known by its digest (a dashboard session keeps only that)."""
        # Every entry is compared, equal or not: the time taken says nothing of which matched.
        found = None
        for known, name in self.entries:
            if hmac.compare_digest(presented, known):
                found = name
        return found


def parse_tokens_file(text: str, identities: Iterable[str]) -> list[tuple[str, str]]:
    """``IDENTITY SHA256HEX`` lines (blank lines and ``#`` comments skipped). Raises ValueError
    naming the line (never its content, which may be a token pasted by mistake)."""
    known = set(identities)
    pairs: list[tuple[str, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2 or len(words[1]) != 64 or words[1].strip("0123456789abcdef"):
            raise ValueError(
                f"line {number} is not 'IDENTITY SHA256HEX' (the hex SHA-256 digest of a token, "
                "64 lowercase characters)"
            )
        if words[0] not in known:
            raise ValueError(
                f"line {number} names identity {words[0]!r}, which [[auth.identities]] lacks"
            )
        pairs.append((words[0], words[1]))
    return pairs


# --- the interceptor ------------------------------------------------------------------------


class AuthCollector(Collector):
    """``cronoq_auth_failures_total{reason}`` (credentials refused: ``missing``, ``invalid``)
    and ``cronoq_permission_denied_total{permission}``."""

    def __init__(self) -> None:
        self.failures: dict[str, int] = {"missing": 0, "invalid": 0}
        self.denied: dict[str, int] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        failures = CounterMetricFamily(
            "cronoq_auth_failures",
            "Calls refused UNAUTHENTICATED, by reason (missing or invalid credentials).",
            labels=["reason"],
        )
        for reason, count in sorted(self.failures.items()):
            failures.add_metric([reason], count)
        yield failures
        denied = CounterMetricFamily(
            "cronoq_permission_denied",
            "Calls refused PERMISSION_DENIED, by the permission that was lacking.",
            labels=["permission"],
        )
        for permission, count in sorted(self.denied.items()):
            denied.add_metric([permission], count)
        yield denied


def _first(values: Mapping[str, Iterable[bytes]], key: str) -> list[str]:
    return [v.decode("utf-8", "replace") for v in values.get(key, ())]


class Guard:
    """Authenticates calls. The token table is replaced whole on a reload of the tokens file;
    the identities and their permissions are the configuration's, fixed until a restart."""

    def __init__(self, settings: AuthSettings, tokens: TokenTable, collector: AuthCollector):
        self._grants = {identity.name: Grant.of(identity) for identity in settings.identities}
        self.tokens = tokens
        self.collector = collector

    def refuse(self, reason: str, method: str, peer: str) -> Unauthenticated:
        self.collector.failures[reason] += 1
        log.warning(
            "authentication failed", extra={"reason": reason, "method": method, "peer": peer}
        )
        return Unauthenticated(_MISSING if reason == "missing" else _REFUSED)

    def deny(
        self, exc: PermissionDenied, grant: Grant, method: str, *, refused: int | None = None
    ) -> None:
        """Count a refusal and log it, or leave the line to the batch call it is an item of
        (``refusals_tallied``). ``refused``: how many items of the call it refuses."""
        self.collector.denied[exc.permission] = self.collector.denied.get(exc.permission, 0) + 1
        tally = _tally.get()
        if tally is not None:
            tally.count += 1
            tally.permission = tally.permission or exc.permission
            return
        self.logged(grant, exc.permission, method, refused)

    def logged(self, grant: Grant, permission: str, method: str, refused: int | None) -> None:
        """The one log line of a refused call (``refused``: the items it refused, if a batch)."""
        extra: dict[str, object] = {
            "identity": grant.name,
            "permission": permission,
            "method": method,
        }
        if refused is not None:
            extra["refused"] = refused
        log.warning("permission denied", extra=extra)

    def authenticate(
        self, authorization: str | None, certificate: Mapping[str, Iterable[bytes]], method: str,
        peer: str,
    ) -> Grant:  # fmt: skip
        """The caller: its bearer token decides when it sent one, else its client certificate
        (verified by the TLS handshake: gRPC puts only a verified one in the auth context)."""
        if authorization is not None:
            scheme, _, token = authorization.partition(" ")
            name = self.tokens.find(token.strip()) if scheme.lower() == "bearer" else None
            if name is None:
                raise self.refuse("invalid", method, peer)
            return self._grants[name]
        names = [
            *_first(certificate, "x509_subject_alternative_name"),
            *_first(certificate, "x509_common_name"),
        ]
        if not names:
            raise self.refuse("missing", method, peer)
        for name in names:
            if name in self._grants:
                return self._grants[name]
        return Grant(names[0])  # a certificate of the trusted CA that no identity claims

    def sign_in(self, token: str, peer: str) -> tuple[Grant, bytes]:
        """The grant of a bearer token typed into the dashboard's sign-in form, and the
        token's digest (what its session keeps); Unauthenticated, counted and logged as a
        refused call is, if the token is unknown."""
        grant = self.authenticate(f"Bearer {token}", {}, "/ui/signin", peer)
        return grant, digest(token.strip())

    def grant_of(self, token_digest: bytes) -> Grant | None:
        """The grant of a token known by its digest, None once a reload revoked it."""
        name = self.tokens.find_digest(token_digest)
        return None if name is None else self._grants[name]

    def metrics_refusal(self, authorization: str) -> Unauthenticated | PermissionDenied | None:
        """Why the ``Authorization`` header may not read /metrics, as a call would be refused:
        ``Unauthenticated`` (no bearer token, or one nobody holds), ``PermissionDenied``
        naming the ``metrics`` permission (a valid token without it); None: it may."""
        if not authorization.strip():
            return Unauthenticated(_MISSING)
        scheme, _, token = authorization.partition(" ")
        name = self.tokens.find(token.strip()) if scheme.lower() == "bearer" else None
        if name is None:
            return Unauthenticated(_REFUSED)
        try:
            self._grants[name].check("metrics")
        except PermissionDenied as exc:
            return exc
        return None

    async def admit(
        self, rule: str, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Authenticate the call and check ``rule``; abort it otherwise. Sets the caller."""
        authorization = None
        for key, value in context.invocation_metadata() or ():
            if key == "authorization" and isinstance(value, str):
                authorization = value
        try:
            grant = self.authenticate(authorization, context.auth_context(), method, context.peer())
            if rule:
                try:
                    grant.check(rule)
                except PermissionDenied as exc:
                    self.deny(exc, grant, method)
                    raise
        except (Unauthenticated, PermissionDenied) as exc:
            await context.abort_with_status(wire.status_for(exc))
        _caller.set(_Caller(grant, self, method))


_Behaviour = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Any]


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every method's handler so that it first admits the call (``Guard.admit``)."""

    def __init__(self, guard: Guard) -> None:
        self._guard = guard
        self._wrapped = WrappedHandlers()

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        rule = METHOD_PERMISSIONS.get(method, "admin")
        handler = await continuation(handler_call_details)
        if handler is None or rule is _OPEN:
            return handler
        return self._wrapped.get(method, handler, lambda: _wrap(handler, self._guard, rule, method))


def _wrap(
    handler: grpc.RpcMethodHandler[Any, Any], guard: Guard, rule: str, method: str
) -> grpc.RpcMethodHandler[Any, Any]:
    def guarded(inner: _Behaviour) -> _Behaviour:
        if inspect.isasyncgenfunction(inner):

            async def stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await guard.admit(rule, method, context)
                async for response in inner(request, context):
                    yield response

            return stream

        async def call(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            await guard.admit(rule, method, context)
            return await inner(request, context)

        return call

    kinds = (
        ("unary_unary", grpc.unary_unary_rpc_method_handler),
        ("unary_stream", grpc.unary_stream_rpc_method_handler),
        ("stream_unary", grpc.stream_unary_rpc_method_handler),
        ("stream_stream", grpc.stream_stream_rpc_method_handler),
    )
    for attribute, make in kinds:
        inner = getattr(handler, attribute)
        if inner is not None:
            return make(
                guarded(inner),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    raise AssertionError(f"a handler of no known kind for {method}")
