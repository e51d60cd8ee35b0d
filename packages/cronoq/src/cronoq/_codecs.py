"""Codecs turn payloads and outputs into the bytes a store keeps, and back.

"No payload" is the same for every codec: ``None`` is stored as ``b""`` without calling the
codec, and a stored ``b""`` payload reaches the task function (and ``TaskInfo.payload``) as
``None``. So ``submit("kind")`` works with any codec, and JSON's ``null`` costs no bytes. With
``BytesCodec`` this makes an empty ``b""`` payload arrive as ``None`` too: an empty payload is
no payload. Outputs have their own "none" (a function that returns ``None`` stores no output),
so they always go through the codec.

A codec may also bind a value to where it belongs: one with ``encode_for(value, context)`` and
``decode_for(data, context)`` (a ``ContextCodec``) is given a ``CodecContext`` (payload
or output, the task's kind, pool and key, and an output's task id) wherever cronoq encodes or
decodes a payload or an output, and may refuse a value made for another context (``EncryptedCodec``
authenticates it). Every other codec keeps its plain ``encode`` and ``decode``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeGuard, runtime_checkable

from cronoq.errors import InvalidArgument, PayloadError

__all__ = ["BytesCodec", "Codec", "CodecContext", "ContextCodec", "JsonCodec"]

NO_PAYLOAD = b""
"""How every codec's "no payload" (``None``) is stored."""


@runtime_checkable
class Codec(Protocol):
    """Encode values to bytes and back. Raise anything on bad input: it becomes PayloadError."""

    def encode(self, value: Any) -> bytes: ...

    def decode(self, data: bytes) -> Any: ...


_ROLES = {"payload": b"P", "output": b"O"}
_CONTEXT_VERSION = b"\x01"


def _context_text(value: object, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        kind = "a str or None" if optional else "a str"
        raise InvalidArgument(f"CodecContext {what} must be {kind}, got {type(value).__name__}")
    if not value:
        raise InvalidArgument(f"CodecContext {what} must not be empty")
    if "\x00" in value:
        raise InvalidArgument(f"CodecContext {what} must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise InvalidArgument(
                f"CodecContext {what} must be valid Unicode, but has a lone surrogate at index "
                f"{exc.start}"
            ) from None


@dataclass(frozen=True, slots=True)
class CodecContext:
    """Where an encoded value belongs, for a codec that binds values to it (``encode_for`` and
    ``decode_for``): a task's payload, or the output of one task.

    A payload's context is its role, the task's kind and pool, and its key (None without one):
    what the submitter knows before the server gives the task its id. An output's context adds
    the task's id, which the worker that produces it knows. cronoq makes these wherever it
    encodes or decodes a payload or an output (submit, add_schedule, the executor or worker
    running an attempt, get/wait), so the same fields reach ``encode_for`` and ``decode_for``.
    """

    role: Literal["payload", "output"]
    kind: str
    pool: str
    key: str | None = None
    task_id: int | None = None
    """The output's task; None for a payload (whose id does not exist when it is encoded)."""

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or self.role not in _ROLES:
            shown = repr(self.role) if isinstance(self.role, str) else type(self.role).__name__
            raise InvalidArgument(
                f"CodecContext role must be 'payload' or 'output', got {shown[:80]}"
            )
        _context_text(self.kind, "kind")
        _context_text(self.pool, "pool")
        _context_text(self.key, "key", optional=True)
        task_id = self.task_id
        if self.role == "payload":
            if task_id is not None:
                raise InvalidArgument(
                    "a payload's CodecContext has no task_id: the task has no id yet when its "
                    "payload is encoded"
                )
        elif type(task_id) is not int or not 1 <= task_id <= 2**63 - 1:
            got = type(task_id).__name__ if type(task_id) is not int else "out of range"
            raise InvalidArgument(
                f"an output's CodecContext needs its task_id, an int from 1 to 2**63 - 1 "
                f"(got {got})"
            )

    def to_bytes(self) -> bytes:
        """The context as bytes, for a codec to authenticate (AES-GCM's associated data, an
        HMAC's message): one encoding per context, and two contexts never share one.

        A version byte, the role (``P`` or ``O``), then the kind and the pool, each as a
        4-byte big-endian length and its UTF-8; the key as ``00`` (none) or ``01``, its
        length and UTF-8; the task id as ``00`` (none) or ``01`` and 8 bytes big-endian.
        """
        parts = [_CONTEXT_VERSION, _ROLES[self.role], _field(self.kind), _field(self.pool)]
        parts.append(b"\x00" if self.key is None else b"\x01" + _field(self.key))
        task_id = self.task_id
        parts.append(b"\x00" if task_id is None else b"\x01" + task_id.to_bytes(8, "big"))
        return b"".join(parts)

    def describe(self) -> str:
        """The context in words, for error messages: role, kind, pool and task (not the key,
        which may be long)."""
        where = f"kind {self.kind[:80]!r} in pool {self.pool[:80]!r}"
        if self.task_id is None:
            return f"the {self.role} of a task of {where}"
        return f"the {self.role} of task {self.task_id} ({where})"


def _field(text: str) -> bytes:
    data = text.encode()
    return len(data).to_bytes(4, "big") + data


@runtime_checkable
class ContextCodec(Codec, Protocol):
    """A codec that binds each value to its ``CodecContext``: cronoq calls ``encode_for``
    and ``decode_for`` instead of ``encode`` and ``decode`` where it knows the context (every
    payload and output of a task). ``decode_for`` should refuse (raise) a value made for
    another context. ``encode`` and ``decode`` remain for values outside any task."""

    def encode_for(self, value: Any, context: CodecContext) -> bytes: ...

    def decode_for(self, data: bytes, context: CodecContext) -> Any: ...


def binds_context(codec: object) -> TypeGuard[ContextCodec]:
    """Whether ``codec`` has ``encode_for`` and ``decode_for``: then cronoq passes it the
    context of each value (a quick check, for callers that make a context only when it is
    used)."""
    return callable(getattr(codec, "encode_for", None)) and callable(
        getattr(codec, "decode_for", None)
    )


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


def encode_with(codec: Codec, value: Any, what: str, context: CodecContext | None = None) -> bytes:
    """Encode through a user codec; whatever it raises becomes a PayloadError naming ``what``.

    With a ``context``, a codec that binds values to it (``encode_for``) is given it; other
    codecs encode as without one.
    """
    try:
        if context is not None and binds_context(codec):
            data = codec.encode_for(value, context)
        else:
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


def encode_payload(codec: Codec, value: Any, context: CodecContext | None = None) -> bytes:
    """A payload as stored: ``None`` (no payload) is ``b""`` whatever the codec."""
    return NO_PAYLOAD if value is None else encode_with(codec, value, "payload", context)


def decode_with(codec: Codec, data: bytes, what: str, context: CodecContext | None = None) -> Any:
    """Decode through a user codec; whatever it raises becomes a PayloadError naming ``what``.

    With a ``context``, a codec that binds values to it (``decode_for``) is given it, and may
    refuse a value made for another; other codecs decode as without one.
    """
    try:
        if context is not None and binds_context(codec):
            return codec.decode_for(data, context)
        return codec.decode(data)
    except PayloadError:
        raise
    except Exception as exc:
        raise PayloadError(
            f"{type(codec).__name__} cannot decode the {what} ({len(data)} bytes): {exc!r}"
        ) from exc


def decode_payload(codec: Codec, data: bytes, context: CodecContext | None = None) -> Any:
    """A stored payload as the task function sees it: ``b""`` is ``None`` whatever the codec."""
    return None if data == NO_PAYLOAD else decode_with(codec, data, "payload", context)
