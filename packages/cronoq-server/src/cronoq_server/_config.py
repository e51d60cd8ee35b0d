"""ServerConfig: the server's settings from a TOML file and ``CRONOQ_*`` environment variables.

Environment variables win over the file. ``CRONOQ_KEEP_FINISHED_S`` sets the top-level
``keep_finished_s``; ``CRONOQ_STORE__DSN`` sets ``dsn`` in ``[store]`` (sections and keys are
joined by a double underscore, names are case-insensitive). Pools come from the environment only
as one JSON list in ``CRONOQ_POOLS``, which replaces the file's ``[[pools]]`` as a whole, and
so do task limits (``[[task_limits]]``, docs/limits.md) in ``CRONOQ_TASK_LIMITS``.

Every key of the file is known or an error, and so is every key under a known section in the
environment. A ``CRONOQ_`` variable without a double underscore that names no top-level setting
is ignored (listed in ``ServerConfig.ignored_env``): Kubernetes defines ``CRONOQ_PORT``,
``CRONOQ_SERVICE_HOST`` ... in every pod of a namespace with a service called ``cronoq``, and a
server that refused to start on them would not run in its own Helm chart.

Every duration is in seconds and its key ends in ``_s``. The stores' own settings are the fields
of ``SqliteStoreConfig`` and ``PgStoreConfig``
(with ``_s`` on the durations), so a setting a store adds is configurable here at once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import ipaddress
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias, TypeVar, cast, get_args
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cronoq import Limit, MemoryStore, RemotePool
from cronoq.errors import InvalidArgument
from cronoq.store import Store
from cronoq_server._errors import ConfigError, ConfigIssue
from cronoq_store_postgres import PgStore, PgStoreConfig
from cronoq_store_sqlite import SqliteStore, SqliteStoreConfig

__all__ = [
    "NO_OUTBOX",
    "PERMISSIONS",
    "Address",
    "AuthSettings",
    "IdentitySettings",
    "LimitSettings",
    "ListenSettings",
    "LoggingSettings",
    "MemoryStoreSettings",
    "PoolSettings",
    "PostgresStoreSettings",
    "RuntimeSettings",
    "ServerConfig",
    "SqliteStoreSettings",
    "StoreSettings",
    "TaskLimitSettings",
    "TlsSettings",
    "has_outbox",
    "load_config",
    "loopback",
    "mask_dsn",
    "open_store",
    "remote_pools",
    "render_config",
    "task_limits",
]

MAX_SECONDS = 10 * 366 * 24 * 3600
"""Ten years, the bound cronoq puts on every duration: anything longer is a unit mistake."""
MAX_MESSAGE_BYTES = 2**31 - 1
"""gRPC's limit: message lengths are signed 32-bit."""
MIN_MESSAGE_BYTES = 1024
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
ENV_PREFIX = "CRONOQ_"
DEFAULT_SQLITE_PATH = "./cronoq.db"


# --- the settings ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemoryStoreSettings:
    """Nothing durable: every restart starts empty; no standby can take over."""

    keep_finished_s: float = 7 * 24 * 3600.0
    kind: Literal["memory"] = "memory"


@dataclass(frozen=True, slots=True)
class SqliteStoreSettings:
    path: str = DEFAULT_SQLITE_PATH
    """Relative paths are relative to the working directory of the process."""
    options: SqliteStoreConfig = field(default_factory=SqliteStoreConfig)
    """The store's settings; ``keep_finished`` is the top-level ``keep_finished_s``."""
    kind: Literal["sqlite"] = "sqlite"


@dataclass(frozen=True, slots=True, repr=False)
class PostgresStoreSettings:
    dsn: str
    """A ``postgresql://`` URI; shown masked everywhere (see ``mask_dsn()``)."""
    options: PgStoreConfig = field(default_factory=PgStoreConfig)
    """The store's settings (``schema`` among them); ``keep_finished`` is the top-level one."""
    kind: Literal["postgres"] = "postgres"

    def __repr__(self) -> str:
        # A config in a traceback or a log line must not carry the password.
        return (
            f"PostgresStoreSettings(dsn={mask_dsn(self.dsn)!r}, options={self.options!r}, "
            f"kind={self.kind!r})"
        )


StoreSettings: TypeAlias = MemoryStoreSettings | SqliteStoreSettings | PostgresStoreSettings


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """A pool run by remote workers (a ``cronoq.RemotePool``)."""

    name: str
    concurrency: int = 1000
    """Most attempts of this pool leased at once, over all workers."""
    max_live: int | None = None
    """Bound on live tasks in this pool; submissions beyond it are rejected."""
    lease_s: float = 30.0
    """Seconds without a heartbeat before an attempt counts as lost."""
    limits: tuple[str, ...] = ()
    """Names of the task limits (``[[task_limits]]``) every task of this pool takes; none of
    them per key."""


@dataclass(frozen=True, slots=True)
class TaskLimitSettings:
    """A limit tasks name and pools apply (a ``cronoq.Limit``, docs/limits.md). The TOML
    array is ``[[task_limits]]``: ``[limits]`` is the message size table."""

    name: str
    concurrency: int | None = None
    """Most running attempts (of each key, for a per-key limit)."""
    rate: int | None = None
    """Most attempt starts per ``per_s`` seconds."""
    per_s: float | None = None
    burst: int | None = None
    """How many of ``rate`` may start back to back (None: ``rate``)."""
    per_key: bool = False
    on_full: str = "queue"
    """queue, reject, cancel_running or keep_latest."""

    def limit(self) -> Limit:
        return Limit(
            self.name,
            concurrency=self.concurrency,
            rate=self.rate,
            per=self.per_s,
            burst=self.burst,
            per_key=self.per_key,
            on_full=self.on_full,
        )


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    """0: the OS picks a free port."""

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ListenSettings:
    grpc: Address = Address("127.0.0.1", 50051)
    http: Address = Address("127.0.0.1", 8080)


@dataclass(frozen=True, slots=True)
class LimitSettings:
    max_message_bytes: int = 4 * 1024 * 1024
    """Largest gRPC message either way; also bounds payloads and outputs."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    cert: str
    """PEM certificate chain file."""
    key: str
    """PEM private key file."""
    client_ca: str | None = None
    """PEM bundle of the CAs whose client certificates are accepted (mTLS)."""
    require_client_auth: bool = False
    """Every client must present a certificate signed by ``client_ca``. gRPC Python requests a
    client certificate only when it requires one, so this is set exactly when ``client_ca`` is."""


PERMISSIONS = ("read", "submit", "cancel", "schedules", "work", "metrics", "admin")
"""The permissions an identity can be granted; docs/security.md says what each allows."""


@dataclass(frozen=True, slots=True)
class IdentitySettings:
    """A caller the server knows: what it may do, and the hashes of its bearer tokens. A client
    certificate names it by a SAN or its CN (see docs/security.md)."""

    name: str
    permissions: frozenset[str]
    """Names from ``PERMISSIONS``."""
    submit_pools: frozenset[str] | None = None
    """With ``submit``: the pools it may submit to (None: any)."""
    submit_kinds: frozenset[str] | None = None
    """With ``submit``: the kinds it may submit (None: any)."""
    work_pools: frozenset[str] = frozenset()
    """With ``work``: the pools whose attempts it may receive, heartbeat and report."""
    token_sha256: tuple[str, ...] = field(default=(), repr=False)
    """Hex SHA-256 digests of its tokens (never the tokens); more than one during a rotation."""


@dataclass(frozen=True, slots=True)
class AuthSettings:
    identities: tuple[IdentitySettings, ...] = ()
    """Authentication is on when at least one identity is configured."""
    tokens_file: str | None = None
    """More token hashes, one ``IDENTITY SHA256HEX`` a line; reloaded when it changes."""
    insecure: bool = False
    """Serve gRPC on a non-loopback address without authentication (or tokens without TLS)."""
    open_metrics: bool = False
    """With authentication on, ``/metrics`` without a token of the ``metrics`` permission."""
    reload_interval_s: float = 10.0
    """How often the certificate, CA and token files are checked for a change (and SIGHUP)."""

    @property
    def enabled(self) -> bool:
        return bool(self.identities)


LogFormat: TypeAlias = Literal["keyvalue", "json"]
EventLoop: TypeAlias = Literal["auto", "uvloop", "asyncio"]


@dataclass(frozen=True, slots=True)
class LoggingSettings:
    format: LogFormat = "keyvalue"
    level: str = "info"
    """One of ``LOG_LEVELS``."""


@dataclass(frozen=True, slots=True)
class RuntimeSettings:
    event_loop: EventLoop = "auto"
    """``auto``: uvloop where it is installed (a dependency on Linux and macOS), else asyncio's
    own loop; ``uvloop`` requires it."""
    store_fatal_attempts: int = 5
    """``serve`` exits (code 1) once its store failed this many times in a row with an error
    that does not pass by itself (wrong role, permission denied, damaged file)."""


@dataclass(frozen=True, slots=True)
class TracingSettings:
    enabled: bool = False
    """OpenTelemetry spans of the server's calls and of its scheduler's submissions, commits
    and dispatches, made with the global tracer provider (``opentelemetry-instrument`` sets it
    up from the ``OTEL_*`` variables); needs ``cronoq-server[otel]``. See docs/tracing.md. The
    trace context clients send is stored with their tasks whether or not this is on."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``cronoq-server`` is configured with; ``load_config()`` builds it."""

    store: StoreSettings = SqliteStoreSettings()
    pools: tuple[PoolSettings, ...] = (PoolSettings("default"),)
    task_limits: tuple[TaskLimitSettings, ...] = ()
    """The limits tasks may name and pools apply (docs/limits.md)."""
    keep_finished_s: float = 7 * 24 * 3600.0
    """Finished tasks are pruned from the store this long after they finished."""
    retention_s: float = 3600.0
    """Recovery loads the tasks finished this recently (key deduplication, dependencies)."""
    commit_timeout_s: float = 30.0
    """A commit failing for this long makes its callers' operations fail (UNAVAILABLE)."""
    drain_timeout_s: float = 30.0
    """Graceful shutdown: how long running attempts get to finish and report."""
    listen: ListenSettings = ListenSettings()
    limits: LimitSettings = LimitSettings()
    tls: TlsSettings | None = None
    auth: AuthSettings = AuthSettings()
    logging: LoggingSettings = LoggingSettings()
    runtime: RuntimeSettings = RuntimeSettings()
    tracing: TracingSettings = TracingSettings()
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Where each setting came from, by dotted key: a file path, ``env NAME`` or ``default``."""
    ignored_env: tuple[str, ...] = field(default=(), compare=False, repr=False)
    """``CRONOQ_`` variables that name no setting (see the module docstring)."""


# --- parsing one value ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Raw:
    value: object
    source: str
    text: bool
    """The value is an environment variable's string, to be parsed strictly."""


class _Invalid(Exception):
    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


_T = TypeVar("_T")
_Parser: TypeAlias = Callable[[_Raw], _T]

_INT = re.compile(r"[+-]?[0-9]{1,30}")
_FLOAT = re.compile(r"[+-]?([0-9]{1,30}(\.[0-9]{0,30})?|\.[0-9]{1,30})([eE][+-]?[0-9]{1,3})?")


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"  # as TOML and JSON write it
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"
    text = repr(value)
    # Long enough for a deep path, short enough to keep a pasted blob from filling the screen.
    return text if len(text) <= 240 else f"{text[:60]}... ({len(text)} characters)"


def _integer(low: int, high: int) -> _Parser[int]:
    expected = f"must be an integer from {low} to {high}"

    def parse(raw: _Raw) -> int:
        value = raw.value
        if raw.text:
            assert isinstance(value, str)
            if not _INT.fullmatch(value):
                raise _Invalid(expected)
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(expected)
        return value

    return parse


def _seconds(*, allow_zero: bool) -> _Parser[float]:
    bound = ">= 0" if allow_zero else "> 0"
    expected = f"must be a number of seconds {bound} and at most {MAX_SECONDS} (ten years)"

    def parse(raw: _Raw) -> float:
        value = raw.value
        if raw.text:
            assert isinstance(value, str)
            if not _FLOAT.fullmatch(value):
                raise _Invalid(expected)
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Invalid(expected)
        # Compared before float(): float(10**400) raises OverflowError.
        if not (value >= 0 if allow_zero else value > 0) or not value <= MAX_SECONDS:
            raise _Invalid(expected)  # also NaN, which fails every comparison
        return float(value)

    return parse


def _boolean(raw: _Raw) -> bool:
    value = raw.value
    if raw.text:
        assert isinstance(value, str)
        value = {"true": True, "false": False}.get(value.lower(), value)
    if not isinstance(value, bool):
        raise _Invalid("must be true or false")
    return value


def _text(raw: _Raw) -> str:
    value = raw.value
    if not isinstance(value, str) or not value or "\x00" in value:
        raise _Invalid("must be a non-empty string without NUL characters")
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate, from a JSON "\ud800"
        raise _Invalid("must be valid Unicode (it has a lone surrogate)") from None
    return value


def _choice(*options: str, fold_case: bool = False) -> _Parser[str]:
    expected = "must be one of " + ", ".join(repr(o) for o in options)

    def parse(raw: _Raw) -> str:
        value = raw.value
        if isinstance(value, str) and fold_case:
            value = value.lower()
        if value not in options:
            raise _Invalid(expected)
        assert isinstance(value, str)
        return value

    return parse


_HOST = re.compile(r"\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9._-]+)")


def _address(raw: _Raw) -> Address:
    expected = "must be HOST:PORT with a port from 0 (any free port) to 65535, e.g. 0.0.0.0:8080"
    value = _text(raw)
    host, sep, port = value.rpartition(":")
    match = _HOST.fullmatch(host)
    if not sep or match is None or not port.isdigit() or len(port) > 5 or int(port) > 65535:
        raise _Invalid(expected)
    return Address(match["v6"] or match["name"], int(port))


def _sqlite_path(raw: _Raw) -> str:
    path = _text(raw)
    if path == ":memory:" or path.startswith("file:"):
        raise _Invalid("must be a file path; for a store in memory set store.kind = 'memory'")
    if os.path.isdir(path):
        raise _Invalid("is a directory; it must name the database file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise _Invalid(f"must be in an existing directory, and {parent} is none")
    return path


def _dsn(raw: _Raw) -> str:
    dsn = _text(raw)
    try:
        parts = urlsplit(dsn)
        parts.port  # noqa: B018 (parses the port, raising ValueError on a bad one)
    except ValueError as exc:
        raise _Invalid(f"is not a valid URI ({exc})") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise _Invalid("must be a URI postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
    return dsn


def _existing_file(raw: _Raw) -> str:
    path = _text(raw)
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise _Invalid(f"must be a readable file: {exc.strerror}") from None
    return path


# --- the keys -------------------------------------------------------------------------------

_POSITIVE_INT = _integer(1, 2**63 - 1)


def _store_option_keys(cls: type[Any]) -> dict[str, tuple[str, _Parser[Any]]]:
    """The keys of a store's config dataclass: key -> (field name, parser)."""
    keys: dict[str, tuple[str, _Parser[Any]]] = {}
    for f in dataclasses.fields(cls):
        if f.name == "keep_finished":
            continue  # the top-level keep_finished_s: pruning is a property of the server
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if kind == "float":
            keys[f"{f.name}_s"] = (f.name, _seconds(allow_zero=False))
        elif kind == "int":
            keys[f.name] = (f.name, _POSITIVE_INT)
        elif kind == "bool":
            keys[f.name] = (f.name, _boolean)
        elif kind == "str":
            keys[f.name] = (f.name, _text)
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no parser for a field of type {f.type}")
    return keys


_SQLITE_OPTIONS = _store_option_keys(SqliteStoreConfig)
_PG_OPTIONS = _store_option_keys(PgStoreConfig)
_STORE_KEYS: dict[str, frozenset[str]] = {
    "memory": frozenset({"kind"}),
    "sqlite": frozenset({"kind", "path", *_SQLITE_OPTIONS}),
    "postgres": frozenset({"kind", "dsn", *_PG_OPTIONS}),
}
_TOP_KEYS: dict[str, _Parser[float]] = {
    "keep_finished_s": _seconds(allow_zero=False),
    "retention_s": _seconds(allow_zero=False),
    "commit_timeout_s": _seconds(allow_zero=False),
    "drain_timeout_s": _seconds(allow_zero=True),
}
_SECTIONS: dict[str, frozenset[str]] = {
    "store": frozenset().union(*_STORE_KEYS.values()),
    "listen": frozenset({"grpc", "http"}),
    "limits": frozenset({"max_message_bytes"}),
    "tls": frozenset({"cert", "key", "client_ca", "require_client_auth"}),
    "auth": frozenset(
        {"identities", "tokens_file", "insecure", "open_metrics", "reload_interval_s"}
    ),
    "logging": frozenset({"format", "level"}),
    "runtime": frozenset({"event_loop", "store_fatal_attempts"}),
    "tracing": frozenset({"enabled"}),
}
_POOL_KEYS: dict[str, _Parser[Any]] = {
    "name": _text,
    "concurrency": _integer(1, 1_000_000),
    "max_live": _integer(1, 2**40),
    "lease_s": _seconds(allow_zero=False),
    "limits": lambda raw: _limit_names(raw),
}
_TASK_LIMIT_KEYS: dict[str, _Parser[Any]] = {
    "name": _text,
    "concurrency": _integer(1, 1_000_000),
    "rate": _integer(1, 1_000_000),
    "per_s": _seconds(allow_zero=False),
    "burst": _integer(1, 1_000_000),
    "per_key": _boolean,
    "on_full": _choice("queue", "reject", "cancel_running", "keep_latest"),
}
_MAX_TASK_LIMITS = 1000  # cronoq's bound on a scheduler's limits
_MAX_POOL_LIMITS = 16  # and on the limits one task takes
_MAX_NAME_LENGTH = 255  # cronoq's bound on pool names
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_IDENTITY_KEYS = frozenset(
    {"name", "permissions", "submit_pools", "submit_kinds", "work_pools", "token_sha256"}
)


def _limit_names(raw: _Raw) -> tuple[str, ...]:
    names = _names(raw.value)
    if names is None or len(names) > _MAX_POOL_LIMITS or len(set(names)) != len(names):
        raise _Invalid(
            f"must be a list of at most {_MAX_POOL_LIMITS} distinct task limit names, "
            'e.g. limits = ["stripe"]'
        )
    return tuple(names)


def _listed(keys: frozenset[str] | Mapping[str, object]) -> str:
    return ", ".join(sorted(keys))


# --- loading --------------------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> ServerConfig:
    """The configuration from the TOML file at ``path`` (none: defaults only) and ``environ``
    (default: ``os.environ``), validated; ``ConfigError`` lists every problem."""
    loader = _Loader()
    if path is not None:
        loader.read_file(Path(path))
    loader.read_env(os.environ if environ is None else environ)
    return loader.build()


class _Loader:
    def __init__(self) -> None:
        self.raw: dict[str, _Raw] = {}
        self.issues: list[ConfigIssue] = []
        self.ignored: list[str] = []
        self.origins: dict[str, str] = {}
        self.failed: set[str] = set()

    def issue(self, key: str, source: str, value: object, problem: str) -> None:
        shown = "" if value is _UNSET else _mask_value(key, value)
        self.issues.append(ConfigIssue(key, source, shown, problem))

    # --- reading the sources ----------------------------------------------------------------

    def read_file(self, path: Path) -> None:
        source = str(path)
        try:
            with path.open("rb") as file:
                document = tomllib.load(file)
        except OSError as exc:
            self.issue("--config", source, _UNSET, f"cannot read the file: {exc.strerror}")
            return
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            self.issue("--config", source, _UNSET, f"is not valid TOML: {exc}")
            return
        for key, value in document.items():
            if key in _TOP_KEYS or key in _TABLE_LISTS:
                self.raw[key] = _Raw(value, source, text=False)
            elif key in _SECTIONS:
                if not isinstance(value, dict):
                    self.issue(key, source, value, f"must be a table: [{key}]")
                    continue
                for sub, sub_value in value.items():
                    dotted = f"{key}.{sub}"
                    if sub in _SECTIONS[key]:
                        self.raw[dotted] = _Raw(sub_value, source, text=False)
                    else:
                        self.issue(dotted, source, sub_value, _unknown_in(key))
            else:
                self.issue(key, source, value, _UNKNOWN_TOP)

    def read_env(self, environ: Mapping[str, str]) -> None:
        for name in sorted(environ):
            if not name.startswith(ENV_PREFIX):
                continue
            value = environ[name]
            source = f"env {name}"
            parts = name[len(ENV_PREFIX) :].lower().split("__")
            section = parts[0]
            if section in _TABLE_LISTS:
                if len(parts) == 1:
                    self.raw[section] = _Raw(value, source, text=True)
                else:
                    self.issue(
                        section, source, value,
                        f"{section} come from the environment only as one JSON list in "
                        f"{ENV_PREFIX}{section.upper()}, e.g. {_TABLE_LISTS[section][1]}",
                    )  # fmt: skip
            elif section in _SECTIONS:
                if len(parts) == 2 and parts[1] in _SECTIONS[section]:
                    self.raw[f"{section}.{parts[1]}"] = _Raw(value, source, text=True)
                elif len(parts) == 1:
                    self.issue(
                        section, source, value,
                        f"is a table: set its keys as {ENV_PREFIX}{section.upper()}__KEY",
                    )  # fmt: skip
                else:
                    self.issue(".".join(parts), source, value, _unknown_in(section))
            elif len(parts) == 1 and section in _TOP_KEYS:
                self.raw[section] = _Raw(value, source, text=True)
            elif len(parts) > 1:
                self.issue(".".join(parts), source, value, _UNKNOWN_TOP)
            else:
                self.ignored.append(name)

    # --- building -------------------------------------------------------------------------

    def get(self, key: str, parse: _Parser[_T], default: _T) -> _T:
        """The parsed value of ``key``, or ``default`` when it is not set or is invalid (the
        issue is recorded, and ``key`` is in ``failed`` so that checks across keys skip it)."""
        raw = self.raw.get(key)
        if raw is None:
            self.origins[key] = "default"
            return default
        self.origins[key] = raw.source
        try:
            return parse(raw)
        except _Invalid as exc:
            self.issue(key, raw.source, raw.value, exc.problem)
            self.failed.add(key)
            return default

    def build(self) -> ServerConfig:
        defaults = ServerConfig()
        top = {
            key: self.get(key, parse, getattr(defaults, key)) for key, parse in _TOP_KEYS.items()
        }
        if (
            not {"keep_finished_s", "retention_s"} & self.failed
            and top["keep_finished_s"] < top["retention_s"]
        ):
            self.issue(
                "keep_finished_s", self.origins["keep_finished_s"], top["keep_finished_s"],
                f"must be at least retention_s = {top['retention_s']!r} (from "
                f"{self.origins['retention_s']}): recovery relies on finished tasks of the "
                "retention window still being in the store",
            )  # fmt: skip
        pools = self.pools()
        task_limits = self.task_limits(None if "retention_s" in self.failed else top["retention_s"])
        self.pool_limits(pools, task_limits)
        config = ServerConfig(
            store=self.store(top["keep_finished_s"]),
            pools=pools,
            task_limits=task_limits,
            listen=self.listen(),
            limits=LimitSettings(
                self.get(
                    "limits.max_message_bytes",
                    _integer(MIN_MESSAGE_BYTES, MAX_MESSAGE_BYTES),
                    defaults.limits.max_message_bytes,
                )
            ),
            tls=self.tls(),
            auth=self.auth(),
            logging=LoggingSettings(
                cast(
                    LogFormat, self.get("logging.format", _choice(*get_args(LogFormat)), "keyvalue")
                ),
                self.get("logging.level", _choice(*LOG_LEVELS, fold_case=True), "info"),
            ),
            runtime=RuntimeSettings(
                cast(
                    EventLoop,
                    self.get("runtime.event_loop", _choice(*get_args(EventLoop)), "auto"),
                ),
                self.get(
                    "runtime.store_fatal_attempts",
                    _integer(1, 1000),
                    defaults.runtime.store_fatal_attempts,
                ),
            ),
            tracing=self.tracing(),
            origins=dict(self.origins),
            ignored_env=tuple(self.ignored),
            **top,
        )
        if self.issues:
            raise ConfigError(self.issues)
        return config

    def tracing(self) -> TracingSettings:
        enabled = self.get("tracing.enabled", _boolean, TracingSettings().enabled)
        if enabled and importlib.util.find_spec("opentelemetry") is None:
            self.issue(
                "tracing.enabled", self.origins["tracing.enabled"], enabled,
                "needs OpenTelemetry's API, which is not installed: install cronoq-server[otel]",
            )  # fmt: skip
        return TracingSettings(enabled)

    def store(self, keep_finished: float) -> StoreSettings:
        kind = self.get("store.kind", _choice(*_STORE_KEYS), "sqlite")
        if "store.kind" in self.failed:
            return SqliteStoreSettings()
        for key in sorted(k for k in self.raw if k.startswith("store.")):
            if key.removeprefix("store.") not in _STORE_KEYS[kind]:
                kinds = [k for k, keys in _STORE_KEYS.items() if key[6:] in keys]
                raw = self.raw[key]
                self.issue(
                    key, raw.source, raw.value,
                    f"applies to store.kind = {' or '.join(map(repr, kinds))}, and store.kind = "
                    f"{kind!r} (from {self.origins['store.kind']}); the keys of that kind are: "
                    f"{_listed(_STORE_KEYS[kind])}",
                )  # fmt: skip
        if kind == "memory":
            return MemoryStoreSettings(keep_finished)
        if kind == "sqlite":
            path = self.get("store.path", _sqlite_path, DEFAULT_SQLITE_PATH)
            sqlite = self.store_options(SqliteStoreConfig, _SQLITE_OPTIONS, keep_finished)
            return SqliteStoreSettings(path, sqlite or SqliteStoreSettings().options)
        if "store.dsn" not in self.raw:
            self.issue(
                "store.dsn", "", _UNSET,
                "is required with store.kind = 'postgres': set dsn in [store], or "
                "CRONOQ_STORE__DSN, to postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE",
            )  # fmt: skip
        dsn = self.get("store.dsn", _dsn, "")
        pg = self.store_options(PgStoreConfig, _PG_OPTIONS, keep_finished)
        return PostgresStoreSettings(dsn, pg or PgStoreConfig())

    def store_options(
        self,
        cls: Callable[..., _T],
        keys: dict[str, tuple[str, _Parser[Any]]],
        keep_finished: float,
    ) -> _T | None:
        """The store's config object, or None after an issue was recorded."""
        values = {
            name: self.get(f"store.{key}", parse, None)
            for key, (name, parse) in keys.items()
            if f"store.{key}" in self.raw
        }
        if self.failed & ({f"store.{key}" for key in keys} | {"keep_finished_s"}):
            return None
        try:
            return cls(**values, keep_finished=keep_finished)
        except InvalidArgument as exc:
            # A rule across fields (lease_renew < lease_ttl, say), or one the parsers above do
            # not know: the store's own message, with the keys it names and their sources.
            message = str(exc)
            named = [
                f"store.{key}"
                for key, (name, _) in keys.items()
                if re.search(rf"\b{name}\b", message)
            ] or ["store"]
            self.issue(
                " and ".join(named),
                ", ".join(self.origins.get(key, "default") for key in named),
                self.raw[named[0]].value if named[0] in self.raw and len(named) == 1 else _UNSET,
                message,
            )  # fmt: skip
            return None

    def tables(self, key: str) -> tuple[_Raw, list[dict[str, Any]]] | None:
        """The tables of an array of tables (``[[pools]]``, or a JSON list of objects from the
        environment); None when it is not set, or not such a list (the issue recorded)."""
        raw = self.raw.get(key)
        if raw is None:
            self.origins[key] = "default"
            return None
        self.origins[key] = raw.source
        items: object = raw.value
        if raw.text:
            try:
                items = json.loads(raw.value)  # type: ignore[arg-type]
            except ValueError as exc:
                self.issue(key, raw.source, raw.value, f"is not valid JSON: {exc}")
                self.failed.add(key)
                return None
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            expected = (
                f"a JSON list of objects, e.g. {_TABLE_LISTS[key][0]}"
                if raw.text
                else f"an array of tables: [[{key}]] with name = ..."
            )
            self.issue(key, raw.source, raw.value, f"must be {expected}")
            self.failed.add(key)
            return None
        return raw, items

    def _named_entries(
        self,
        table: str,
        raw: _Raw,
        items: list[dict[str, Any]],
        keys: Mapping[str, Callable[[_Raw], Any]],
        nullable: tuple[str, ...] = (),
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """The entries of an array of tables whose every key parsed and whose name is given,
        not too long and not an earlier entry's: (``table[index]``, the parsed values). Every
        other entry is reported, and ``table`` marked failed. ``nullable``: keys whose null
        means "not set"."""
        what = {"pools": "pool", "task_limits": "task limit"}.get(table, table)
        first_of: dict[str, int] = {}
        for index, item in enumerate(items):
            prefix = f"{table}[{index}]"
            for key in item.keys() - keys.keys():
                self.issue(
                    f"{prefix}.{key}", raw.source, item[key],
                    f"unknown key; the keys of a {what} are: {_listed(keys)}",
                )  # fmt: skip
            if "name" not in item:
                required = f"is required: every {what} has one"
                self.issue(f"{prefix}.name", raw.source, _UNSET, required)
                self.failed.add(table)
                continue
            values: dict[str, Any] = {}
            bad = False
            for key, parse in keys.items():
                if key in item and not (key in nullable and item[key] is None):
                    try:
                        values[key] = parse(_Raw(item[key], raw.source, text=False))
                    except _Invalid as exc:
                        self.issue(f"{prefix}.{key}", raw.source, item[key], exc.problem)
                        bad = True
            name = values.get("name")
            if name is not None and len(name) > _MAX_NAME_LENGTH:
                self.issue(
                    f"{prefix}.name", raw.source, name,
                    f"must be at most {_MAX_NAME_LENGTH} characters",
                )  # fmt: skip
                bad = True
            elif name is not None and name in first_of:
                self.issue(
                    f"{prefix}.name", raw.source, name,
                    f"must be unique, and {table}[{first_of[name]}] has it too",
                )  # fmt: skip
                bad = True
            if name is not None:
                first_of.setdefault(name, index)
            if bad or name is None:
                self.failed.add(table)
                continue
            yield prefix, values

    def task_limits(self, retention_s: float | None) -> tuple[TaskLimitSettings, ...]:
        tables = self.tables("task_limits")
        if tables is None:
            return ()
        raw, items = tables
        if len(items) > _MAX_TASK_LIMITS:
            self.issue(
                "task_limits", raw.source, _UNSET,
                f"lists {len(items)} limits; a server takes at most {_MAX_TASK_LIMITS}",
            )  # fmt: skip
            self.failed.add("task_limits")
            return ()
        limits: list[TaskLimitSettings] = []
        for prefix, values in self._named_entries("task_limits", raw, items, _TASK_LIMIT_KEYS):
            settings = TaskLimitSettings(**values)
            try:
                limit = settings.limit()  # the rules across keys: cronoq's own message
            except InvalidArgument as exc:
                self.issue(prefix, raw.source, _UNSET, str(exc).replace(" per ", " per_s ", 1)
                           if "rate and per" in str(exc) else str(exc))  # fmt: skip
                self.failed.add("task_limits")
                continue
            if retention_s is not None and (limit.per_ns or 0) > retention_s * 1e9:
                self.issue(
                    f"{prefix}.per_s", raw.source, limit.per,
                    f"must be at most retention_s = {retention_s!r} (from "
                    f"{self.origins.get('retention_s', 'default')}): a new leader recounts a "
                    "window's starts from the tasks it recovers",
                )  # fmt: skip
                self.failed.add("task_limits")
            limits.append(settings)
        return tuple(limits)

    def pool_limits(
        self, pools: tuple[PoolSettings, ...], limits: tuple[TaskLimitSettings, ...]
    ) -> None:
        """Each pool's ``limits`` name configured limits, none per key."""
        # A limit whose entry had an issue is missing: a name is unknown only if none had.
        complete = "task_limits" not in self.failed
        by_name = {limit.name: limit for limit in limits}
        source = self.origins.get("pools", "default")
        for index, pool in enumerate(pools):
            for name in pool.limits:
                limit = by_name.get(name)
                if limit is None and complete:
                    shown = ", ".join(sorted(by_name)[:20]) or "none"
                    self.issue(
                        f"pools[{index}].limits", source, list(pool.limits),
                        f"names {name!r}, which is no [[task_limits]] entry (configured: {shown})",
                    )  # fmt: skip
                elif limit is not None and limit.per_key:
                    self.issue(
                        f"pools[{index}].limits", source, list(pool.limits),
                        f"names {name!r}, which is per key: a pool's limits hold for all its "
                        "tasks together; a per-key limit is named by each submission, with its key",
                    )  # fmt: skip

    def pools(self) -> tuple[PoolSettings, ...]:
        tables = self.tables("pools")
        if tables is None:
            return ServerConfig().pools
        raw, items = tables
        if not items:
            self.issue("pools", raw.source, raw.value, "must list at least one pool")
        pools: list[PoolSettings] = []
        for _, values in self._named_entries("pools", raw, items, _POOL_KEYS, ("max_live",)):
            pools.append(PoolSettings(**values))
        return tuple(pools)

    def listen(self) -> ListenSettings:
        defaults = ListenSettings()
        grpc = self.get("listen.grpc", _address, defaults.grpc)
        http = self.get("listen.http", _address, defaults.http)
        if grpc == http and grpc.port != 0 and not {"listen.grpc", "listen.http"} & self.failed:
            self.issue(
                "listen.http", self.origins["listen.http"], str(http),
                f"must differ from listen.grpc (from {self.origins['listen.grpc']}): "
                "the two servers cannot share a port",
            )  # fmt: skip
        return ListenSettings(grpc, http)

    def tls(self) -> TlsSettings | None:
        cert = self.get("tls.cert", _existing_file, "")
        key = self.get("tls.key", _existing_file, "")
        given = {name for name in ("cert", "key") if f"tls.{name}" in self.raw}
        if len(given) == 1:
            (present,) = given
            (missing,) = {"cert", "key"} - given
            self.issue(
                f"tls.{missing}", "", _UNSET,
                f"is required because tls.{present} is set (from "
                f"{self.origins[f'tls.{present}']}): set both tls.cert and tls.key, or neither",
            )  # fmt: skip
        client_ca = self.get("tls.client_ca", _existing_file, "") or None
        require = self.get("tls.require_client_auth", _boolean, client_ca is not None)
        if require != (client_ca is not None) and not {"tls.client_ca"} & self.failed:
            key = "tls.require_client_auth" if "tls.require_client_auth" in self.raw else ""
            self.issue(
                key or "tls.client_ca", self.origins.get(key, ""), require if key else _UNSET,
                "must be true exactly when tls.client_ca is set: gRPC requests a client "
                "certificate only when it requires one (set both, or neither)",
            )  # fmt: skip
        if client_ca is not None and given != {"cert", "key"}:
            self.issue(
                "tls.client_ca", self.origins["tls.client_ca"], client_ca,
                "needs tls.cert and tls.key: client certificates are verified only over TLS",
            )  # fmt: skip
        if given != {"cert", "key"}:
            return None
        return TlsSettings(cert, key, client_ca, require)

    def auth(self) -> AuthSettings:
        defaults = AuthSettings()
        settings = AuthSettings(
            self.identities(),
            self.get("auth.tokens_file", _existing_file, "") or None,
            self.get("auth.insecure", _boolean, defaults.insecure),
            self.get("auth.open_metrics", _boolean, defaults.open_metrics),
            self.get("auth.reload_interval_s", _seconds(allow_zero=False), 10.0),
        )
        tokens = settings.tokens_file is not None or any(
            identity.token_sha256 for identity in settings.identities
        )
        if settings.enabled and not tokens and "tls.client_ca" not in self.raw:
            self.issue(
                "auth.identities", self.origins["auth.identities"], _UNSET,
                "no identity can authenticate: give identities token_sha256, or set "
                "auth.tokens_file, or tls.client_ca for client certificates",
            )  # fmt: skip
        self.exposure(settings, tokens)
        return settings

    def identities(self) -> tuple[IdentitySettings, ...]:
        raw = self.raw.get("auth.identities")
        if raw is None:
            return ()
        self.origins["auth.identities"] = raw.source
        items: object = raw.value
        if raw.text:
            try:
                items = json.loads(raw.value)  # type: ignore[arg-type]
            except ValueError as exc:
                self.issue("auth.identities", raw.source, raw.value, f"is not valid JSON: {exc}")
                return ()
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            self.issue(
                "auth.identities", raw.source, raw.value,
                "must be a list of identities: [[auth.identities]] with name = ... and "
                "permissions = [...]",
            )  # fmt: skip
            return ()
        identities: list[IdentitySettings] = []
        for index, item in enumerate(items):
            identity = self.identity(f"auth.identities[{index}]", raw.source, item)
            if identity is None:
                continue
            if any(other.name == identity.name for other in identities):
                self.issue(
                    f"auth.identities[{index}].name", raw.source, identity.name,
                    "must be unique: another identity has it",
                )  # fmt: skip
            identities.append(identity)
        return tuple(identities)

    def identity(self, prefix: str, source: str, item: dict[str, Any]) -> IdentitySettings | None:
        def issue(key: str, problem: str) -> None:
            shown = "<hidden>" if key == "token_sha256" else item.get(key, _UNSET)
            self.issue(f"{prefix}.{key}", source, shown, problem)

        for key in item.keys() - _IDENTITY_KEYS:
            issue(key, f"unknown key; the keys of an identity are: {_listed(_IDENTITY_KEYS)}")
        names = {key: _names(item[key]) for key in item.keys() & _IDENTITY_KEYS - {"name"}}
        for key, value in names.items():
            if value is None:
                issue(key, "must be a list of non-empty strings")
        name = item.get("name")
        if not isinstance(name, str) or not name or len(name) > _MAX_NAME_LENGTH:
            issue("name", f"is required: a string of 1 to {_MAX_NAME_LENGTH} characters")
            return None
        permissions = frozenset(names.get("permissions") or ())
        if not permissions:
            issue("permissions", "must list at least one of: " + ", ".join(PERMISSIONS))
        for unknown in sorted(permissions - set(PERMISSIONS)):
            issue("permissions", f"{unknown!r} is not a permission; they are: "
                  + ", ".join(PERMISSIONS))  # fmt: skip
        for key, needs in (("submit_pools", "submit"), ("submit_kinds", "submit"),
                           ("work_pools", "work")):  # fmt: skip
            if key in item and needs not in permissions:
                issue(key, f"applies to the {needs!r} permission, which this identity lacks")
        work_pools = frozenset(names.get("work_pools") or ())
        if "work" in permissions and not work_pools:
            issue("work_pools", "is required with the 'work' permission: the pools it works on")
        digests = tuple(names.get("token_sha256") or ())
        if not all(_SHA256_HEX.fullmatch(digest) for digest in digests):
            issue("token_sha256", "must list SHA-256 digests of tokens, 64 lowercase hex "
                  "characters each (printf %s \"$TOKEN\" | sha256sum)")  # fmt: skip
        submit_pools, submit_kinds = names.get("submit_pools"), names.get("submit_kinds")
        return IdentitySettings(
            name,
            permissions,
            None if submit_pools is None else frozenset(submit_pools),
            None if submit_kinds is None else frozenset(submit_kinds),
            work_pools,
            digests,
        )

    def exposure(self, auth: AuthSettings, tokens: bool) -> None:
        """Refuse a configuration that would let anyone on the network in: gRPC on a
        non-loopback address without authentication, or bearer tokens crossing it in clear,
        unless ``auth.insecure`` says so explicitly."""
        if auth.insecure or "listen.grpc" in self.failed:
            return
        grpc = self.get("listen.grpc", _address, ListenSettings().grpc)
        if loopback(grpc.host):
            return
        if not auth.enabled:
            problem = (
                "is not a loopback address and no authentication is configured, so anyone "
                "who reaches it could submit, read and cancel every task and receive every "
                "payload: configure [[auth.identities]] (docs/security.md), or set "
                "auth.insecure = true if a network boundary you trust protects this port"
            )
        elif tokens and "tls.cert" not in self.raw:
            problem = (
                "is not a loopback address and bearer tokens are configured without [tls], "
                "so they would cross the network in clear: configure tls.cert and tls.key, or "
                "set auth.insecure = true if the network is encrypted otherwise (a mesh)"
            )
        else:
            return
        self.issue("listen.grpc", self.origins["listen.grpc"], str(grpc), problem)


def _names(value: object) -> list[str] | None:
    """A list of non-empty strings, or None if ``value`` is not one."""
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return None
    return value


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve to any address


class _Unset:
    pass


_UNSET: Any = _Unset()
_TASK_LIMITS_EXAMPLE = '[{"name": "tenant", "concurrency": 2, "per_key": true}]'
_TABLE_LISTS = {
    "pools": ('[{"name": "default"}]', '[{"name": "default", "concurrency": 100}]'),
    "task_limits": (_TASK_LIMITS_EXAMPLE, _TASK_LIMITS_EXAMPLE),
}
"""The arrays of tables, and examples of each as the environment gives it (JSON): the
shortest, and a fuller one."""
_UNKNOWN_TOP = (
    "unknown key; the top-level keys are: "
    + _listed(frozenset({*_TOP_KEYS, *_TABLE_LISTS}))
    + "; the sections: "
    + _listed(_SECTIONS)
)


def _unknown_in(section: str) -> str:
    return f"unknown key; the keys of [{section}] are: {_listed(_SECTIONS[section])}"


def _mask_value(key: str, value: object) -> str:
    if key == "store.dsn" and isinstance(value, str):
        return repr(mask_dsn(value))
    return _shown(value)


# --- secrets --------------------------------------------------------------------------------


def mask_dsn(dsn: str) -> str:
    """``dsn`` with its password (in the user info or a ``password`` parameter) as ``***``."""
    try:
        parts = urlsplit(dsn)
    except ValueError:
        return "***"  # unparseable: it may be anything, a password included
    netloc = parts.netloc
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:***@{hosts}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode(
            [(k, "***" if k.lower() == "password" else v) for k, v in pairs], safe="*"
        )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


# --- using the configuration ----------------------------------------------------------------


async def open_store(config: ServerConfig) -> Store:
    """Open the configured store; a durable one migrates its schema on the way."""
    store = config.store
    if isinstance(store, MemoryStoreSettings):
        return MemoryStore(keep_finished=store.keep_finished_s)
    if isinstance(store, SqliteStoreSettings):
        return await SqliteStore.open(store.path, store.options)
    return await PgStore.connect(store.dsn, store.options)


NO_OUTBOX = (
    "this server ingests no outbox: use a PostgreSQL store (store.kind = 'postgres') with "
    "store.outbox = true, its default (CRONOQ_STORE__OUTBOX); see docs/outbox.md"
)
"""Why a server's outbox calls (and its dashboard's outbox page) have nothing to act on."""


def has_outbox(config: ServerConfig) -> bool:
    """The configured store has an outbox that its leader ingests (docs/outbox.md): a
    PostgreSQL store's, unless ``store.outbox`` turns it off."""
    store = config.store
    return isinstance(store, PostgresStoreSettings) and store.options.outbox


def remote_pools(config: ServerConfig) -> list[RemotePool]:
    """The configured pools, as the Scheduler's ``cronoq.RemotePool`` list."""
    return [
        RemotePool(pool.name, pool.concurrency, pool.max_live, pool.lease_s, limits=pool.limits)
        for pool in config.pools
    ]


def task_limits(config: ServerConfig) -> list[Limit]:
    """The configured task limits, as the Scheduler's ``cronoq.Limit`` list."""
    return [settings.limit() for settings in config.task_limits]


# --- showing the configuration --------------------------------------------------------------


def render_config(config: ServerConfig) -> str:
    """The effective configuration as TOML, each setting annotated with its source; the
    DSN's password is masked (so the output reloads as it is unless a password was set)."""
    lines: list[str] = []
    origins = config.origins

    def put(key: str, value: object, dotted: str | None = None) -> None:
        origin = origins.get(dotted or key, "default")
        lines.append(f"{key} = {_toml_value(value)}  # {origin}")

    for key in _TOP_KEYS:
        put(key, getattr(config, key))
    store = config.store
    lines += ["", "[store]"]
    put("kind", store.kind, "store.kind")
    if isinstance(store, SqliteStoreSettings):
        put("path", store.path, "store.path")
        options: object = store.options
        keys = _SQLITE_OPTIONS
    elif isinstance(store, PostgresStoreSettings):
        put("dsn", mask_dsn(store.dsn), "store.dsn")
        options = store.options
        keys = _PG_OPTIONS
    else:
        keys = {}
    for key, (name, _) in keys.items():
        put(key, getattr(options, name), f"store.{key}")
    lines += ["", "[listen]"]
    put("grpc", str(config.listen.grpc), "listen.grpc")
    put("http", str(config.listen.http), "listen.http")
    lines += ["", "[limits]"]
    put("max_message_bytes", config.limits.max_message_bytes, "limits.max_message_bytes")
    lines.append("")
    if config.tls is None:
        lines.append("# [tls]: not configured, gRPC is served in plaintext")
    else:
        lines.append("[tls]")
        put("cert", config.tls.cert, "tls.cert")
        put("key", config.tls.key, "tls.key")
        if config.tls.client_ca is not None:
            put("client_ca", config.tls.client_ca, "tls.client_ca")
        put("require_client_auth", config.tls.require_client_auth, "tls.require_client_auth")
    lines += _render_auth(config.auth, origins)
    lines += ["", "[logging]"]
    put("format", config.logging.format, "logging.format")
    put("level", config.logging.level, "logging.level")
    lines += ["", "[runtime]"]
    put("event_loop", config.runtime.event_loop, "runtime.event_loop")
    put(
        "store_fatal_attempts",
        config.runtime.store_fatal_attempts,
        "runtime.store_fatal_attempts",
    )
    lines += ["", "[tracing]"]
    put("enabled", config.tracing.enabled, "tracing.enabled")
    for pool in config.pools:
        lines += ["", f"[[pools]]  # {origins.get('pools', 'default')}"]
        for f in dataclasses.fields(pool):
            value = getattr(pool, f.name)
            if f.name == "limits":
                if value:
                    lines.append(f"limits = {_toml_list(value, sort=False)}")
                continue
            lines.append(
                f"# {f.name}: not set (unbounded)"
                if value is None
                else f"{f.name} = {_toml_value(value)}"
            )
    for limit in config.task_limits:
        lines += ["", f"[[task_limits]]  # {origins.get('task_limits', 'default')}"]
        for f in dataclasses.fields(limit):
            value = getattr(limit, f.name)
            if value is not None:
                lines.append(f"{f.name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _render_auth(auth: AuthSettings, origins: Mapping[str, str]) -> list[str]:
    lines = ["", "[auth]"]
    if not auth.enabled:
        lines.append("# identities: none, authentication is off (loopback only, see insecure)")
    if auth.tokens_file is not None:
        lines.append(f"tokens_file = {_toml_value(auth.tokens_file)}")
    for key in ("insecure", "open_metrics", "reload_interval_s"):
        value = getattr(auth, key)
        lines.append(f"{key} = {_toml_value(value)}  # {origins.get(f'auth.{key}', 'default')}")
    for identity in auth.identities:
        lines += ["", f"[[auth.identities]]  # {origins.get('auth.identities', 'default')}"]
        lines.append(f"name = {_toml_value(identity.name)}")
        lines.append(f"permissions = {_toml_list(identity.permissions)}")
        for key in ("submit_pools", "submit_kinds", "work_pools", "token_sha256"):
            value = getattr(identity, key)
            if value:
                lines.append(f"{key} = {_toml_list(value)}")
    return lines


def _toml_list(values: Iterable[str], *, sort: bool = True) -> str:
    shown = sorted(values) if sort else list(values)
    return "[" + ", ".join(_toml_value(value) for value in shown) + "]"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        assert math.isfinite(value)
        return repr(value)
    assert isinstance(value, str)
    # A JSON string (not ASCII-escaped: TOML has no surrogate pairs) is a TOML basic string.
    return json.dumps(value, ensure_ascii=False)
