"""End-to-end payload encryption: ``EncryptedCodec`` encrypts payloads and outputs with
AES-GCM (``cryptography``) on the client and worker, so that a server and a database that are not
trusted store and forward only ciphertext. Install with ``pip install 'cronoq[crypto]'``.

Each value is encrypted with the codec's current key under a fresh random 96-bit nonce; the
stored bytes name the key that encrypted them, so a codec that knows several keys decrypts
values of any of them (rotation: add the new key, make it current, re-encrypt or let the old
values expire, then drop the old key).

Each value is bound to where it belongs: cronoq gives the codec a
``CodecContext`` (payload or output, the task's kind, pool and key, and an
output's task id), and the codec authenticates it with the ciphertext as AES-GCM associated
data. A value copied to another task's row, to another kind, pool or key, or from an output to a
payload, fails to decrypt with ``PayloadError``, as does a value altered in
any byte. ``encode``/``decode`` (no context) bind a value to "no context", which no task's value
has.

Format (``CQE2``): ``b"CQE2"``, the key id's length (1 byte) and the key id (UTF-8), the first
8 bytes of the SHA-256 of the context's ``to_bytes()`` (empty for no
context: it says which context a refused value belongs to without trying the key), the nonce
(12 bytes), then the ciphertext and its 16-byte tag. The associated data is everything before
the nonce followed by the context's bytes.

The former format (``CQE1``: no context digest, the associated data the header alone) is not
bound to any context: with ``accept_unbound=True`` (the default) such values still decode,
wherever they are; ``accept_unbound=False`` refuses them, once none is left (re-encrypted, or
expired with the tasks that held them). Nothing writes ``CQE1`` any more.

What it does not hide: the kind, key, tags, pool, name and timings of a task, and the length of
its payload (docs/security.md). A random nonce bounds one key to about 2**32 encryptions (NIST SP
800-38D): rotate well before.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from cronoq._codecs import BytesCodec, Codec, CodecContext, decode_with, encode_with
from cronoq.errors import InvalidArgument, PayloadError

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError(
        "cronoq.crypto needs the 'cryptography' package: pip install 'cronoq[crypto]'"
    ) from exc

__all__ = ["EncryptedCodec"]

_MAGIC = b"CQE2"
_UNBOUND_MAGIC = b"CQE1"
_DIGEST_BYTES = 8
_NONCE_BYTES = 12
_TAG_BYTES = 16
_KEY_BYTES = (16, 24, 32)
_NO_CONTEXT = b""
"""The context bytes of ``encode``/``decode``; no CodecContext encodes to nothing."""


class EncryptedCodec:
    """Encrypts what ``inner`` encodes (``BytesCodec`` by default) with AES-GCM, bound to the
    value's ``CodecContext``.

    ``keys`` maps key ids (1 to 255 bytes of UTF-8) to AES keys of 16, 24 or 32 bytes; values
    are encrypted with ``keys[current]`` and decrypted with whichever key they name. Every
    submitting client and every worker of the pools concerned uses the same keys.
    ``accept_unbound`` (default True) decodes values of the former ``CQE1`` format, which are
    bound to no context; set it False once none is left.
    """

    def __init__(
        self,
        keys: Mapping[str, bytes],
        current: str,
        inner: Codec | None = None,
        *,
        accept_unbound: bool = True,
    ):
        if not isinstance(keys, Mapping) or not keys:
            raise InvalidArgument("keys must map at least one key id to its key")
        self._ciphers: dict[str, AESGCM] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not 1 <= len(_utf8(key_id)) <= 255:
                shown = repr(key_id)
                shown = shown if len(shown) <= 80 else f"{shown[:60]}... ({len(shown)} characters)"
                raise InvalidArgument(f"a key id must be 1 to 255 bytes of text, got {shown}")
            if not isinstance(key, bytes) or len(key) not in _KEY_BYTES:
                raise InvalidArgument(
                    f"key {key_id!r} must be 16, 24 or 32 bytes (AES-128, -192, -256); "
                    "make one with EncryptedCodec.generate_key()"
                )
            self._ciphers[key_id] = AESGCM(key)
        if not isinstance(current, str) or current not in self._ciphers:
            shown = repr(current) if isinstance(current, str) else type(current).__name__
            raise InvalidArgument(f"current must be one of the key ids, got {shown[:80]}")
        if inner is not None and (
            isinstance(inner, type)  # JsonCodec instead of JsonCodec()
            or not (
                callable(getattr(inner, "encode", None))
                and callable(getattr(inner, "decode", None))
            )
        ):
            raise InvalidArgument(
                f"inner must be a codec (encode and decode), got {type(inner).__name__}"
            )
        if not isinstance(accept_unbound, bool):
            raise InvalidArgument(
                f"accept_unbound must be a bool, got {type(accept_unbound).__name__}"
            )
        self._current = current
        self._key_header = _key_header(_MAGIC, current)
        self._inner: Codec = BytesCodec() if inner is None else inner
        self._accept_unbound = accept_unbound

    @staticmethod
    def generate_key() -> bytes:
        """A new random 256-bit key."""
        return AESGCM.generate_key(bit_length=256)

    def __repr__(self) -> str:
        # Key ids only: the keys are never shown.
        return (
            f"EncryptedCodec(keys={sorted(self._ciphers)!r}, current={self._current!r}, "
            f"accept_unbound={self._accept_unbound!r})"
        )

    # --- bound to a task's payload or output (what cronoq calls) ----------------------------

    def encode_for(self, value: Any, context: CodecContext) -> bytes:
        """Encrypt ``value`` bound to ``context``: only ``decode_for()`` with an equal
        context decrypts it."""
        bound = _context_bytes(context)
        return self._seal(encode_with(self._inner, value, "value", context), bound)

    def decode_for(self, data: bytes, context: CodecContext) -> Any:
        """Decrypt a value encrypted for ``context``; PayloadError if it belongs to another
        context, was altered, or names a key this codec lacks."""
        plain = self._open(data, _context_bytes(context), context)
        return decode_with(self._inner, plain, "decrypted value", context)

    # --- no context ---------------------------------------------------------------------------

    def encode(self, value: Any) -> bytes:
        """Encrypt ``value`` bound to no context: for values outside any task. cronoq itself
        calls ``encode_for()``."""
        return self._seal(encode_with(self._inner, value, "value"), _NO_CONTEXT)

    def decode(self, data: bytes) -> Any:
        """Decrypt a value ``encode()`` made (or an unbound ``CQE1`` one); a value bound to a
        task's payload or output is refused."""
        return decode_with(self._inner, self._open(data, _NO_CONTEXT, None), "decrypted value")

    # --- the format -----------------------------------------------------------------------

    def _seal(self, plain: bytes, bound: bytes) -> bytes:
        header = self._key_header + _digest(bound)
        nonce = os.urandom(_NONCE_BYTES)
        return header + nonce + self._ciphers[self._current].encrypt(nonce, plain, header + bound)

    def _open(self, data: bytes, bound: bytes, context: CodecContext | None) -> bytes:
        if not isinstance(data, bytes) or len(data) < 5:
            raise PayloadError("not a value encrypted by EncryptedCodec (no CQE2 header)")
        magic = data[:4]
        if magic == _UNBOUND_MAGIC:
            return self._open_unbound(data)
        if magic != _MAGIC:
            raise PayloadError("not a value encrypted by EncryptedCodec (no CQE2 header)")
        end = 5 + data[4]
        header_end = end + _DIGEST_BYTES
        if len(data) < header_end + _NONCE_BYTES + _TAG_BYTES:
            raise PayloadError("an encrypted value cut short")
        key_id, cipher = self._cipher(data[5:end])
        if data[end:header_end] != _digest(bound):
            raise PayloadError(_elsewhere(context))
        nonce = data[header_end : header_end + _NONCE_BYTES]
        try:
            return cipher.decrypt(
                nonce, data[header_end + _NONCE_BYTES :], data[:header_end] + bound
            )
        except InvalidTag:
            raise PayloadError(_altered(key_id)) from None

    def _open_unbound(self, data: bytes) -> bytes:
        """A value of the former format, bound to no context."""
        if not self._accept_unbound:
            raise PayloadError(
                "an encrypted value in the former CQE1 format, which is bound to no task and "
                "which this codec refuses (accept_unbound=False)"
            )
        end = 5 + data[4]
        if len(data) < end + _NONCE_BYTES + _TAG_BYTES:
            raise PayloadError("an encrypted value cut short")
        key_id, cipher = self._cipher(data[5:end])
        nonce = data[end : end + _NONCE_BYTES]
        try:
            return cipher.decrypt(nonce, data[end + _NONCE_BYTES :], data[:end])
        except InvalidTag:
            raise PayloadError(_altered(key_id)) from None

    def _cipher(self, encoded_id: bytes) -> tuple[str, AESGCM]:
        try:
            key_id = encoded_id.decode()
        except UnicodeDecodeError:
            raise PayloadError("an encrypted value with a malformed key id") from None
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise PayloadError(
                f"encrypted with key {key_id!r}, which this codec does not have (it has "
                f"{sorted(self._ciphers)}): add that key to decrypt it"
            )
        return key_id, cipher


def _utf8(text: str) -> bytes:
    """``text`` in UTF-8, or b"" (refused as a key id) if it has a lone surrogate."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return b""


def _key_header(magic: bytes, key_id: str) -> bytes:
    encoded = key_id.encode()
    return magic + bytes([len(encoded)]) + encoded


def _context_bytes(context: object) -> bytes:
    if not isinstance(context, CodecContext):
        raise InvalidArgument(f"context must be a CodecContext, got {type(context).__name__}")
    return context.to_bytes()


def _digest(bound: bytes) -> bytes:
    return hashlib.sha256(bound).digest()[:_DIGEST_BYTES]


def _elsewhere(context: CodecContext | None) -> str:
    if context is None:
        return (
            "an encrypted value that belongs to another context: it was encrypted for a task's "
            "payload or output (decode_for with that context decrypts it), not for use "
            "without one"
        )
    return (
        "an encrypted value that belongs to another context: it was not encrypted for "
        f"{context.describe()}, but for another role, kind, pool, key or task (copied from "
        "where it belongs); refused"
    )


def _altered(key_id: str) -> str:
    return (
        f"an encrypted value failed authentication with key {key_id!r}: it was altered, or "
        "encrypted with another key under the same id"
    )
