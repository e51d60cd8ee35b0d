"""Payloads from the command line: JSON text, given to the codec as the value it parses to;
with the bytes codec, the text itself as UTF-8 bytes."""

from __future__ import annotations

import json
from typing import Any

from cronoq import BytesCodec, Codec
from cronoq_client._cli._errors import CommandFailed, ExitCode

__all__ = ["parse_payload", "payload_value"]


def parse_payload(text: str | None, codec: Codec, where: str = "--payload") -> Any:
    if text is None:
        return None
    if isinstance(codec, BytesCodec):
        return text.encode()
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandFailed(
            f"{where} is not JSON ({exc}); quote a string as '\"text\"', or use --codec bytes",
            ExitCode.USAGE,
        ) from None


def payload_value(value: Any, codec: Codec, where: str) -> Any:
    """A payload read from a JSON Lines file (already parsed)."""
    if isinstance(codec, BytesCodec) and value is not None:
        if not isinstance(value, str):
            raise CommandFailed(
                f"{where}: with --codec bytes a payload is a string", ExitCode.USAGE
            )
        return value.encode()
    return value
