"""Where the ``cronoq`` command connects, with which credentials and codec: from its flags, else
the environment, else the current context of its config file, else the defaults.

The config file (``--config``, ``CRONOQ_CONFIG``, else ``$XDG_CONFIG_HOME/cronoq/config.toml``,
``~/.config/cronoq/config.toml``) names contexts, as kubectl's does::

    current-context = "prod"

    [contexts.prod]
    target = ["cronoq-0.cronoq:50051", "cronoq-1.cronoq:50051"]
    token-file = "~/.config/cronoq/prod.token"
    tls-ca = "/etc/cronoq/ca.pem"

A secret is never written in it, only the file that holds it (``token-file``), so that the file
may be shared and shown.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cronoq import BytesCodec, Codec, JsonCodec
from cronoq_client._cli._errors import ConfigError
from cronoq_client._cli._imports import load_object
from cronoq_client._credentials import Tls

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_TARGET",
    "Flags",
    "Settings",
    "config_path",
    "resolve",
]

DEFAULT_TARGET = "127.0.0.1:50051"
"""cronoq-server's default gRPC address."""
DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 2.0
"""Seconds a command tries while no server answers at all (nothing listens at the target):
a person at a terminal learns that at once, not after the whole ``--timeout``. A refused
connection costs a millisecond, so this is about ten tries. ``cronoq worker`` does not use
it: a worker waits for its server as long as it takes (docs/cli.md)."""

_CONTEXT_KEYS = frozenset(
    {
        "target",
        "token-file",
        "tls",
        "tls-ca",
        "tls-cert",
        "tls-key",
        "timeout",
        "connect-timeout",
        "codec",
    }
)


@dataclass(frozen=True, slots=True)
class Flags:
    """The connection options of the command line (None: not given)."""

    config: str | None = None
    context: str | None = None
    target: tuple[str, ...] = ()
    token_file: str | None = None
    tls: bool | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    timeout: float | None = None
    codec: str | None = None
    connect_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Settings:
    """What a command connects with, resolved."""

    target: tuple[str, ...]
    tls: Tls | bool | None
    """None: AsyncClient reads ``CRONOQ_TLS_*`` (else plaintext)."""
    token: str | None
    """None: AsyncClient reads ``CRONOQ_TOKEN`` / ``CRONOQ_TOKEN_FILE`` (else none)."""
    timeout: float
    codec: Codec
    context: str | None
    """The context used, if any."""
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    """Seconds a call tries while no server answers (never more than ``timeout``)."""


def config_path(flags: Flags, environ: Mapping[str, str]) -> Path:
    if flags.config:
        return Path(flags.config).expanduser()
    if environ.get("CRONOQ_CONFIG"):
        return Path(environ["CRONOQ_CONFIG"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "cronoq" / "config.toml"


def _read_config(path: Path, explicit: bool) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"config file {path} does not exist") from None
        return {}
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot read it: {exc.strerror}") from None
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    unknown = set(config) - {"current-context", "contexts"}
    if unknown:
        raise ConfigError(
            f"config file {path}: unknown keys {', '.join(sorted(unknown))} "
            "(expected current-context and [contexts.NAME] tables)"
        )
    return config


def _context(
    flags: Flags, environ: Mapping[str, str], path: Path, explicit: bool
) -> tuple[str | None, dict[str, Any]]:
    config = _read_config(path, explicit)
    contexts = config.get("contexts", {})
    if not isinstance(contexts, dict):
        raise ConfigError(f"config file {path}: contexts must be tables ([contexts.NAME])")
    name = flags.context or environ.get("CRONOQ_CONTEXT") or config.get("current-context")
    if name is None:
        return None, {}
    if not isinstance(name, str) or name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise ConfigError(f"no context {name!r} in config file {path} (it has: {known})")
    context = contexts[name]
    if not isinstance(context, dict):
        raise ConfigError(f"config file {path}: context {name!r} must be a table")
    unknown = set(context) - _CONTEXT_KEYS
    if unknown:
        raise ConfigError(
            f"config file {path}: context {name!r} has unknown keys "
            f"{', '.join(sorted(unknown))} (known: {', '.join(sorted(_CONTEXT_KEYS))})"
        )
    return name, context


def _typed(context: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    """The context's ``key`` if it is of ``kind`` (None if absent). bool is an int to Python,
    not to a config file: ``timeout = true`` is a mistake."""
    value = context.get(key)
    is_bool = isinstance(value, bool)
    if value is not None and (is_bool != (kind is bool) or not isinstance(value, kind)):
        raise ConfigError(f"config file {path}: {key} has the wrong type ({value!r})")
    return value


def _targets(value: Any, where: str) -> tuple[str, ...]:
    targets = (value,) if isinstance(value, str) else value
    if (
        not isinstance(targets, list | tuple)
        or not targets
        or not all(isinstance(t, str) and t.strip() for t in targets)
    ):
        raise ConfigError(f"{where}: target must be 'host:port' or a list of them")
    return tuple(t.strip() for t in targets)


def load_codec(name: str) -> Codec:
    """``json``, ``bytes``, or ``MODULE:OBJECT`` naming a codec instance (e.g. an
    EncryptedCodec made from a key in the environment)."""
    if name == "json":
        return JsonCodec()
    if name == "bytes":
        return BytesCodec()
    if ":" not in name:
        raise ConfigError(f"codec must be json, bytes or MODULE:OBJECT, got {name!r}")
    codec = load_object(name, "codec")
    if not (callable(getattr(codec, "encode", None)) and callable(getattr(codec, "decode", None))):
        raise ConfigError(f"codec {name} is {type(codec).__name__}, not a codec (encode, decode)")
    return codec  # type: ignore[no-any-return]


def _read_token(path: str, where: str) -> str:
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{where} {path}: cannot read it: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"{where} {path} is empty")
    return token


def resolve(flags: Flags, environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of a command: each from its flag, else the environment, else the context."""
    env = os.environ if environ is None else environ
    path = config_path(flags, env)
    explicit = bool(flags.config or env.get("CRONOQ_CONFIG"))
    name, context = _context(flags, env, path, explicit)
    where = f"context {name!r} of {path}"

    if flags.target:
        target = _targets([t for flag in flags.target for t in flag.split(",")], "--target")
    elif env.get("CRONOQ_TARGET"):
        target = _targets(env["CRONOQ_TARGET"].split(","), "CRONOQ_TARGET")
    elif "target" in context:
        target = _targets(context["target"], where)
    else:
        target = (DEFAULT_TARGET,)

    # The token: a flag, then AsyncClient's own variables (None lets it read them), then the
    # context's file.
    token: str | None = None
    if flags.token_file:
        token = _read_token(flags.token_file, "--token-file")
    elif not (env.get("CRONOQ_TOKEN") or env.get("CRONOQ_TOKEN_FILE")):
        token_file = _typed(context, "token-file", str, path)
        token = None if token_file is None else _read_token(token_file, f"token-file of {where}")

    # TLS: each file from its flag, its CRONOQ_TLS_* variable, or the context.
    def tls_file(key: str, given: str | None) -> str | None:
        found = (
            given
            or env.get(f"CRONOQ_TLS_{key.upper()}")
            or _typed(context, f"tls-{key}", str, path)
        )
        return None if found is None else str(Path(found).expanduser())

    files = Tls(
        tls_file("ca", flags.tls_ca),
        tls_file("cert", flags.tls_cert),
        tls_file("key", flags.tls_key),
    )
    switch = flags.tls if flags.tls is not None else _typed(context, "tls", bool, path)
    tls: Tls | bool | None
    if switch is False:
        tls = False
    elif files != Tls():
        tls = files
    else:
        tls = switch  # True: the system's roots; None: plaintext

    timeout = flags.timeout
    if timeout is None:
        timeout = _typed(context, "timeout", (int, float), path)
    if timeout is not None and not timeout > 0:
        raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
    connect_timeout = flags.connect_timeout
    if connect_timeout is None and env.get("CRONOQ_CONNECT_TIMEOUT"):
        text = env["CRONOQ_CONNECT_TIMEOUT"]
        try:
            connect_timeout = float(text)
        except ValueError:
            raise ConfigError(
                f"CRONOQ_CONNECT_TIMEOUT must be a number of seconds, got {text!r}"
            ) from None
    if connect_timeout is None:
        connect_timeout = _typed(context, "connect-timeout", (int, float), path)
    if connect_timeout is not None and not 0 < connect_timeout < 1e9:
        raise ConfigError(
            f"connect-timeout must be a positive number of seconds, got {connect_timeout!r}"
        )
    codec_name = flags.codec or env.get("CRONOQ_CODEC") or _typed(context, "codec", str, path)
    return Settings(
        target=target,
        tls=tls,
        token=token,
        timeout=DEFAULT_TIMEOUT if timeout is None else float(timeout),
        codec=load_codec(codec_name or "json"),
        context=name,
        connect_timeout=(
            DEFAULT_CONNECT_TIMEOUT if connect_timeout is None else float(connect_timeout)
        ),
    )
