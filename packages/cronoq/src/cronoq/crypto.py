"""End-to-end payload encryption: :class:`EncryptedCodec` encrypts payloads and outputs with
AES-GCM (``cryptography``) on the client and worker, so that a server and a database that are not
trusted store and forward only ciphertext. Install with ``pip install 'cronoq[crypto]'``.

Each value is encrypted with the codec's current key under a fresh random 96-bit nonce; the
stored bytes name the key that encrypted them, so a codec that knows several keys decrypts
values of any of them (rotation: add the new key, make it current, re-encrypt or let the old
values expire, then drop the old key). The header (format version and key id) is authenticated
with the ciphertext: changing any byte fails decryption with :class:`~cronoq.errors.PayloadError`.

Format: ``b"CQE1"``, the key id's length (1 byte) and the key id (UTF-8), the nonce (12 bytes),
then the ciphertext and its 16-byte tag.

What it does not hide: the kind, key, tags, pool, name and timings of a task, and the length of
its payload (docs/security.md). A random nonce bounds one key to about 2**32 encryptions (NIST SP
800-38D): rotate well before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from cronoq._codecs import BytesCodec, Codec, decode_with, encode_with
from cronoq.errors import InvalidArgument, PayloadError

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "cronoq.crypto needs the 'cryptography' package: pip install 'cronoq[crypto]'"
    ) from exc

__all__ = ["EncryptedCodec"]

_MAGIC = b"CQE1"
_NONCE_BYTES = 12
_TAG_BYTES = 16
_KEY_BYTES = (16, 24, 32)


class EncryptedCodec:
    """Encrypts what ``inner`` encodes (``BytesCodec`` by default) with AES-GCM.

    ``keys`` maps key ids (1 to 255 bytes of UTF-8) to AES keys of 16, 24 or 32 bytes; values
    are encrypted with ``keys[current]`` and decrypted with whichever key they name. Every
    submitting client and every worker of the pools concerned uses the same keys.
    """

    def __init__(self, keys: Mapping[str, bytes], current: str, inner: Codec | None = None):
        if not isinstance(keys, Mapping) or not keys:
            raise InvalidArgument("keys must map at least one key id to its key")
        self._ciphers: dict[str, AESGCM] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not 1 <= len(key_id.encode()) <= 255:
                raise InvalidArgument(f"a key id must be 1 to 255 bytes of text, got {key_id!r}")
            if not isinstance(key, bytes) or len(key) not in _KEY_BYTES:
                raise InvalidArgument(
                    f"key {key_id!r} must be 16, 24 or 32 bytes (AES-128, -192, -256); "
                    "make one with EncryptedCodec.generate_key()"
                )
            self._ciphers[key_id] = AESGCM(key)
        if current not in self._ciphers:
            raise InvalidArgument(f"current must be one of the key ids, got {current!r}")
        self._current = current
        self._header = _header(current)
        self._inner: Codec = BytesCodec() if inner is None else inner

    @staticmethod
    def generate_key() -> bytes:
        """A new random 256-bit key."""
        return AESGCM.generate_key(bit_length=256)

    def __repr__(self) -> str:
        # Key ids only: the keys are never shown.
        return f"EncryptedCodec(keys={sorted(self._ciphers)!r}, current={self._current!r})"

    def encode(self, value: Any) -> bytes:
        plain = encode_with(self._inner, value, "value")
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[self._current].encrypt(nonce, plain, self._header)
        return self._header + nonce + sealed

    def decode(self, data: bytes) -> Any:
        if not isinstance(data, bytes) or not data.startswith(_MAGIC) or len(data) < 5:
            raise PayloadError("not a value encrypted by EncryptedCodec (no CQE1 header)")
        end = 5 + data[4]
        if len(data) < end + _NONCE_BYTES + _TAG_BYTES:
            raise PayloadError("an encrypted value cut short")
        try:
            key_id = data[5:end].decode()
        except UnicodeDecodeError:
            raise PayloadError("an encrypted value with a malformed key id") from None
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise PayloadError(
                f"encrypted with key {key_id!r}, which this codec does not have (it has "
                f"{sorted(self._ciphers)}): add that key to decrypt it"
            )
        nonce = data[end : end + _NONCE_BYTES]
        try:
            plain = cipher.decrypt(nonce, data[end + _NONCE_BYTES :], data[:end])
        except InvalidTag:
            raise PayloadError(
                f"an encrypted value failed authentication with key {key_id!r}: it was altered, "
                "or encrypted with another key under the same id"
            ) from None
        return decode_with(self._inner, plain, "decrypted value")


def _header(key_id: str) -> bytes:
    encoded = key_id.encode()
    return _MAGIC + bytes([len(encoded)]) + encoded
