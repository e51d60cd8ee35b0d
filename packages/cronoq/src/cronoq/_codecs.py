"""Codecs turn payloads and outputs into the bytes a store keeps, and back."""

from __future__ import annotations

import json
from typing import Any, Protocol, runtime_checkable

from cronoq.errors import PayloadError

__all__ = ["BytesCodec", "Codec", "JsonCodec"]


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
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"JsonCodec cannot encode this value: {exc}") from exc

    def decode(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except ValueError as exc:
            raise PayloadError(f"JsonCodec cannot decode {len(data)} bytes: {exc}") from exc


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
