"""Codecs turn payloads and outputs into the bytes a store keeps, and back.

"No payload" is the same for every codec: ``None`` is stored as ``b""`` without calling the
codec, and a stored ``b""`` payload reaches the task function (and ``TaskInfo.payload``) as
``None``. So ``submit("kind")`` works with any codec, and JSON's ``null`` costs no bytes. With
``BytesCodec`` this makes an empty ``b""`` payload arrive as ``None`` too: an empty payload is
no payload. Outputs have their own "none" (a function that returns ``None`` stores no output),
so they always go through the codec.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from cronoq.errors import PayloadError

__all__ = ["BytesCodec", "Codec", "JsonCodec"]

NO_PAYLOAD = b""
"""How every codec's "no payload" (``None``) is stored."""


@runtime_checkable
class Codec(Protocol):
    """Encode values to bytes and back. Raise anything on bad input: it becomes PayloadError."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


class BytesCodec:
    """The default: payloads and outputs are ``bytes`` (or ``bytearray``/``memoryview``)."""

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, bytearray | memoryview):
            return bytes(value)
        raise PayloadError(
            f"BytesCodec encodes bytes, got {type(value).__name__}; pass bytes or use JsonCodec"
        )

    def decode(self, data: bytes) -> bytes:
        return data


class JsonCodec:
    """JSON in UTF-8, compact; rejects NaN and infinities, which are not JSON."""

    def encode(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        # RecursionError: a value nested deeper than the interpreter's recursion limit.
        except (TypeError, ValueError, RecursionError) as exc:
            raise PayloadError(f"JsonCodec cannot encode this value: {exc}") from exc

    def decode(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        # TypeError: not bytes at all; RecursionError: "[[[[..." deeper than the stack.
        except (TypeError, ValueError, RecursionError) as exc:
            what = f"{len(data)} bytes" if isinstance(data, bytes) else type(data).__name__
            raise PayloadError(f"JsonCodec cannot decode {what}: {exc}") from exc


def encode_with(codec: Codec, value: Any, what: str) -> bytes:
    """Encode through a user codec; whatever it raises becomes a PayloadError naming ``what``."""
    try:
        data = codec.encode(value)
    except PayloadError:
        raise
    except Exception as exc:
        raise PayloadError(f"{type(codec).__name__} cannot encode the {what}: {exc!r}") from exc
    if not isinstance(data, bytes):
        raise PayloadError(
            f"{type(codec).__name__}.encode returned {type(data).__name__} for the {what}, "
            "not bytes"
        )
    return data


def encode_payload(codec: Codec, value: Any) -> bytes:
    """A payload as stored: ``None`` (no payload) is ``b""`` whatever the codec."""
    return NO_PAYLOAD if value is None else encode_with(codec, value, "payload")


def decode_with(codec: Codec, data: bytes, what: str) -> Any:
    """Decode through a user codec; whatever it raises becomes a PayloadError naming ``what``."""
    try:
        return codec.decode(data)
    except PayloadError:
        raise
    except Exception as exc:
        raise PayloadError(
            f"{type(codec).__name__} cannot decode the {what} ({len(data)} bytes): {exc!r}"
        ) from exc


def decode_payload(codec: Codec, data: bytes) -> Any:
    """A stored payload as the task function sees it: ``b""`` is ``None`` whatever the codec."""
    return None if data == NO_PAYLOAD else decode_with(codec, data, "payload")
