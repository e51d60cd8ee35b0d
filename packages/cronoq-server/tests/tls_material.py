"""Certificates made in the test with ``cryptography``: a CA, certificates it signs (a server's
for ``localhost``, a client's with a SAN or a CN), an expired one; written as PEM files."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True, slots=True)
class Pem:
    cert: bytes
    key: bytes

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
        cert.write_bytes(self.cert)
        key.write_bytes(self.key)
        return cert, key


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


class Authority:
    """A CA that signs leaf certificates."""

    def __init__(self, name: str = "cronoq test CA") -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(self, common_name: str, sans: tuple[str, ...] = (), *, expired: bool = False) -> Pem:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        start, end = (
            (now - dt.timedelta(days=3), now - dt.timedelta(days=2))
            if expired
            else (now - dt.timedelta(days=1), now + dt.timedelta(days=30))
        )
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
        )
        if sans:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.DNSName(san) for san in sans]), critical=False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        return Pem(
            cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    def server(self) -> Pem:
        return self.issue("localhost", ("localhost",))
