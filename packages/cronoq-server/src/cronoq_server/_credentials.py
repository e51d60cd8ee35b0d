"""The files the server's credentials come from: its TLS certificate and key, the CA bundle of
client certificates, and the tokens file. They reload without a restart, on SIGHUP or when a
file changes (checked every ``auth.reload_interval_s``), so that cert-manager style rotation
works: a new set is read and checked whole, and replaces the old one only if it is valid (else
the server keeps serving with the old one and logs why, in one line).

gRPC takes new TLS files through ``grpc.dynamic_ssl_server_credentials``: before each TLS
handshake it asks a fetcher for a new configuration. The server builds a server object per role
change (see ``_server``), each with its own credentials and so its own fetcher, which tracks the
version it last handed out. Connections already open keep the certificate they shook hands with.
"""

from __future__ import annotations

import logging
import os
import ssl
import stat
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import grpc

from cronoq_server._auth import TokenTable, parse_tokens_file
from cronoq_server._config import AuthSettings, TlsSettings
from cronoq_server._errors import CronoqServerError
from cronoq_server._logging import lifecycle

__all__ = ["CredentialFiles", "CredentialsError"]

log = logging.getLogger("cronoq.server.auth")


class CredentialsError(CronoqServerError):
    """A credentials file is unreadable or invalid (the message names it, never its content)."""


@dataclass(frozen=True, slots=True)
class _Loaded:
    key: bytes
    cert: bytes
    client_ca: bytes | None
    tokens: TokenTable


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise CredentialsError(f"{what} {path}: cannot read it: {exc.strerror}") from None


def _check_private(path: str, what: str) -> None:
    """One warning line if a secret file (the tokens file, the TLS private key) can be read
    by users other than the server's. A file the server's user owns should be mode 600 (its
    group needs no access); a file of another owner (a Kubernetes Secret volume: root's,
    shared with the pod's fsGroup) may be read through its group, but never by every user."""
    try:
        info = os.stat(path)
    except OSError:
        return  # reading it says why
    mode = stat.S_IMODE(info.st_mode)
    owned = info.st_uid == os.geteuid()
    if owned and mode & 0o077:
        who, fix = "its group or other users", f"chmod 600 {path}"
    elif not owned and mode & 0o007:
        who = "every user"
        fix = (
            f"chmod 600 {path} (or 640 if the server reads it through its group; for a "
            "Kubernetes Secret volume, defaultMode: 0440)"
        )
    else:
        return
    log.warning(
        "a credentials file is readable by others",
        extra={"setting": what, "file": path, "mode": f"{mode:04o}", "readable_by": who,
               "fix": fix},
    )  # fmt: skip


def _signature(path: str) -> tuple[int, int, int] | None:
    """What changes when a file is replaced (Kubernetes swaps a symlink: a new inode)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


class CredentialFiles:
    """The current credentials, read from their files; ``reload()`` reads them again."""

    def __init__(self, tls: TlsSettings | None, auth: AuthSettings) -> None:
        self._tls = tls
        self._auth = auth
        self._paths = [
            path
            for path in (
                tls and tls.cert,
                tls and tls.key,
                tls and tls.client_ca,
                auth.tokens_file,
            )
            if path
        ]
        self._signatures = self._sign()
        self.version = 0
        self.current = self._load(reloading=False)

    def _sign(self) -> list[tuple[int, int, int] | None]:
        return [_signature(path) for path in self._paths]

    def _load(self, *, reloading: bool) -> _Loaded:
        tls = self._tls
        extra: list[tuple[str, str]] = []
        tokens_file = self._auth.tokens_file
        if tokens_file is not None:
            _check_private(tokens_file, "auth.tokens_file")
            text = _read(tokens_file, "auth.tokens_file").decode("utf-8", "replace")
            if reloading and not text.strip():
                # Most likely caught mid-write (an editor that truncates, then writes): taken
                # at its word, it would revoke every token it held. A deliberate "no tokens"
                # is a file with a comment in it.
                raise CredentialsError(
                    f"auth.tokens_file {tokens_file} is empty, as a file caught in the middle "
                    "of a write is: write the whole file and rename it into place (to revoke "
                    "every token it held, leave a comment line in it)"
                )
            names = [identity.name for identity in self._auth.identities]
            try:
                extra = parse_tokens_file(text, names)
            except ValueError as exc:
                raise CredentialsError(
                    f"auth.tokens_file {self._auth.tokens_file}: {exc}"
                ) from None
        tokens = TokenTable.build(self._auth.identities, extra)
        if tls is None:
            return _Loaded(b"", b"", None, tokens)
        _check_private(tls.key, "tls.key")
        cert, key = _read(tls.cert, "tls.cert"), _read(tls.key, "tls.key")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(tls.cert, tls.key)
        except (ssl.SSLError, OSError) as exc:
            raise CredentialsError(
                f"tls.cert {tls.cert} and tls.key {tls.key}: not a PEM certificate chain and its "
                f"private key ({exc.__class__.__name__}: {exc.args[-1]})"
            ) from None
        client_ca = None
        if tls.client_ca is not None:
            client_ca = _read(tls.client_ca, "tls.client_ca")
            try:
                context.load_verify_locations(cadata=client_ca.decode("ascii"))
            except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
                raise CredentialsError(
                    f"tls.client_ca {tls.client_ca}: not a bundle of PEM CA certificates ({exc})"
                ) from None
        return _Loaded(key, cert, client_ca, tokens)

    def reload(self, why: str) -> bool:
        """Read every file again; keep the old set if the new one is invalid. True if the
        credentials changed."""
        signatures = self._sign()
        try:
            loaded = self._load(reloading=True)
        except CredentialsError as exc:
            self._signatures = signatures  # judged: not retried until it changes again
            lifecycle(
                "credentials_reload_failed",
                why=why,
                error=str(exc),
                kept="the previous credentials keep serving: fix the file (it is read again "
                "when it changes, and on SIGHUP)",
            )
            return False
        self._signatures = signatures
        self.current = loaded
        self.version += 1
        lifecycle("credentials_reloaded", why=why, version=self.version)
        return True

    def changed(self) -> bool:
        """A file changed since it was last read (or last failed to load)."""
        return self._sign() != self._signatures

    def _certificate_configuration(self) -> grpc.ServerCertificateConfiguration:
        loaded = self.current
        return grpc.ssl_server_certificate_configuration(
            [(loaded.key, loaded.cert)], root_certificates=loaded.client_ca
        )

    def server_credentials(self) -> grpc.ServerCredentials | None:
        """Credentials for one server object (None: plaintext), following reloads."""
        if self._tls is None:
            return None
        delivered = self.version

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            nonlocal delivered
            version = self.version
            if version == delivered:
                return None  # unchanged: gRPC keeps the configuration it has
            delivered = version
            return self._certificate_configuration()

        return grpc.dynamic_ssl_server_credentials(
            self._certificate_configuration(),
            # grpcio's stubs omit the None that means "unchanged" (grpc/__init__.py says so).
            cast(Callable[[], grpc.ServerCertificateConfiguration], fetch),
            require_client_authentication=self._tls.require_client_auth,
        )
