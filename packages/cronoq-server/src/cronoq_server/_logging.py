"""The server's logs: one line per record, as ``key=value`` pairs or as a JSON object.

``logger.info("msg", extra={"k": v})`` puts ``k=v`` on the line. Lifecycle events (the server
leads, waits as a standby, steps down, drains) go through ``lifecycle()``, one line each, on
the logger ``cronoq_server.lifecycle``, with the event as the message::

    ts=2025-01-31T12:00:00.123Z level=info logger=cronoq_server.lifecycle msg="leading" epoch=7
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import TextIO

from cronoq_server._config import LoggingSettings

__all__ = ["JsonFormatter", "KeyValueFormatter", "configure_logging", "lifecycle"]

LIFECYCLE_LOGGER = "cronoq_server.lifecycle"

# Attributes every LogRecord has: whatever else a record carries came through ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",  # Python 3.12+
}
_RESERVED = ("ts", "level", "logger", "msg", "exc")
_BARE = re.compile(r"[A-Za-z0-9_.:/@+\-]+")


def _fields(record: logging.LogRecord) -> dict[str, object]:
    """The record's line: the fixed fields first, then the extras (one that would shadow a
    fixed field gets a leading underscore), then the traceback, if any."""
    fields: dict[str, object] = {
        "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6]
        + "Z",
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    for name, value in record.__dict__.items():
        if name not in _STANDARD:
            fields[f"_{name}" if name in _RESERVED else name] = value
    if record.exc_info:
        fields["exc"] = logging.Formatter().formatException(record.exc_info)
    elif record.exc_text:
        fields["exc"] = record.exc_text
    return fields


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... msg="..." k=v``; values with spaces, quotes, ``=`` or
    control characters are quoted, with newlines escaped, so a record is always one line."""

    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_kv_value(key, value)}" for key, value in _fields(record).items())


def _kv_value(key: str, value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if key != "msg" and _BARE.fullmatch(text):
        return text
    return json.dumps(text, ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; extras that JSON cannot hold are written as their ``str``."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(_fields(record), ensure_ascii=False, default=str)


def configure_logging(settings: LoggingSettings, stream: TextIO | None = None) -> None:
    """Make the root logger write ``settings``' format at its level to ``stream`` (stderr);
    the handlers installed before are replaced, the process's logs are the server's."""
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter() if settings.format == "json" else KeyValueFormatter())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level.upper())


def lifecycle(event: str, **fields: object) -> None:
    """Log one lifecycle event at INFO, e.g. ``lifecycle("leading", epoch=7)`` or
    ``lifecycle("stepping_down", reason="fenced")``."""
    # A field named like a LogRecord attribute (name, msg, ...) would make logging raise
    # KeyError, on a path (stepping down, say) that must not fail for a log line.
    extra = {f"{key}_" if key in _STANDARD else key: value for key, value in fields.items()}
    logging.getLogger(LIFECYCLE_LOGGER).info(event, extra=extra)
