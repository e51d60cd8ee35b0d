"""The server's log lines: one per record, key=value or JSON, with the extras of each call."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from cronoq_server import LoggingSettings
from cronoq_server._logging import configure_logging, lifecycle

_PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def keyvalue(line: str) -> dict[str, str]:
    """Parse a key=value line (quoted values are JSON strings), checking nothing is left over."""
    pairs = _PAIR.findall(line)
    assert " ".join(f"{k}={v}" for k, v in pairs) == line
    return {k: json.loads(v) if v.startswith('"') else v for k, v in pairs}


def lines_of(stream: io.StringIO) -> list[str]:
    text = stream.getvalue()
    assert text.endswith("\n")
    return text[:-1].split("\n")


@pytest.mark.usefixtures("restore_root")
def test_lifecycle_events_as_key_value() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings("keyvalue", "info"), stream)
    lifecycle("leading", epoch=7)
    lifecycle("standby")
    lifecycle("stepping_down", reason="lost the lock: session timed out")
    lifecycle("draining", timeout_s=30.0, attempts=2)
    records = [keyvalue(line) for line in lines_of(stream)]
    for record in records:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", record.pop("ts"))
        assert record.pop("level") == "info"
        assert record.pop("logger") == "cronoq_server.lifecycle"
    assert records == [
        {"msg": "leading", "epoch": "7"},
        {"msg": "standby"},
        {"msg": "stepping_down", "reason": "lost the lock: session timed out"},
        {"msg": "draining", "timeout_s": "30.0", "attempts": "2"},
    ]
    assert lines_of(stream)[0].split(" ", 1)[1] == (
        'level=info logger=cronoq_server.lifecycle msg="leading" epoch=7'
    )


@pytest.mark.usefixtures("restore_root")
def test_json_lines() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings("json", "debug"), stream)
    lifecycle("leading", epoch=3)
    logging.getLogger("cronoq_server.grpc").debug(
        "worker %s attached", "w1", extra={"pools": ["a", "b"], "obj": object()}
    )
    first, second = (json.loads(line) for line in lines_of(stream))
    assert first.keys() == {"ts", "level", "logger", "msg", "epoch"}
    assert (first["msg"], first["epoch"], first["level"]) == ("leading", 3, "info")
    assert second["msg"] == "worker w1 attached"
    assert second["logger"] == "cronoq_server.grpc"
    assert second["pools"] == ["a", "b"]
    assert second["obj"].startswith("<object object at")


@pytest.mark.usefixtures("restore_root")
@pytest.mark.parametrize("log_format", ["keyvalue", "json"])
def test_one_line_per_record_whatever_it_holds(log_format: str) -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings(log_format, "info"), stream)  # type: ignore[arg-type]
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        logging.getLogger("x").exception(
            'two\nlines "quoted" = here', extra={"path": "a b=c", "level": "shadowed"}
        )
    (line,) = lines_of(stream)
    record = keyvalue(line) if log_format == "keyvalue" else json.loads(line)
    assert record["msg"] == 'two\nlines "quoted" = here'
    assert record["path"] == "a b=c"
    assert (record["level"], record["_level"]) == ("error", "shadowed")
    assert record["exc"].startswith("Traceback (most recent call last):")
    assert record["exc"].endswith("ValueError: bad\nvalue")


@pytest.mark.usefixtures("restore_root")
def test_the_level_filters_and_replaces_earlier_handlers() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging(LoggingSettings("keyvalue", "debug"), first)
    configure_logging(LoggingSettings("keyvalue", "warning"), second)
    logging.getLogger("x").info("hidden")
    logging.getLogger("x").warning("shown")
    assert first.getvalue() == ""
    assert [keyvalue(line)["msg"] for line in lines_of(second)] == ["shown"]


@pytest.mark.usefixtures("restore_root")
def test_lifecycle_fields_named_like_record_attributes() -> None:
    stream = io.StringIO()
    configure_logging(LoggingSettings("keyvalue", "info"), stream)
    lifecycle("stepping_down", name="replica-a", msg="fenced")
    record = keyvalue(lines_of(stream)[0])
    assert (record["msg"], record["name_"], record["msg_"]) == (
        "stepping_down",
        "replica-a",
        "fenced",
    )
