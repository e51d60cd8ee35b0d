"""The traceback a failed attempt keeps: formatted once where the exception was caught, bounded,
and stored after the first line of the task's message (as Oban keeps an error with its
stacktrace), so that it needs no column of its own in any store or message on the wire but
the report's.

It holds what Python prints for an uncaught exception: each frame's file, line, function and
source line, and the types and messages of the exception and of those it chained. Never a
local variable or an argument: a payload value appears only where the worker's code put it
into an exception's message.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cronoq.errors import InvalidArgument, TaskError

__all__ = [
    "HEADER",
    "MAX_TRACEBACK",
    "Raised",
    "bound_traceback",
    "call_catching",
    "error_line",
    "escape_header",
    "format_traceback",
    "split_traceback",
    "stored_traceback",
    "with_traceback",
]

MAX_TRACEBACK = 8 * 1024
"""Characters kept of a traceback: its first lines and its last (where it was raised), with
what was left out said in between. A recursion's thousand frames would otherwise be stored on
every attempt of every failed task."""

HEADER = "Traceback (most recent call last):"

MAX_ERROR_LINE = 200
"""Characters of a message's first line that a task summary keeps (the list's error column)."""

_HEAD_SHARE = 4  # a quarter of the bound to the outermost frames, the rest to the innermost


def format_traceback(exc: BaseException, *, skip: int = 0) -> str:
    """The exception's traceback as Python prints it, its chained exceptions included,
    bounded to ``MAX_TRACEBACK`` characters; always starting with ``HEADER``. ``skip``: how
    many of its outermost frames to leave out (an executor's own, which caught it)."""
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise InvalidArgument(f"skip must be a non-negative int, got {skip!r}")
    if not isinstance(exc, BaseException):
        raise InvalidArgument(f"exc must be an exception, got {type(exc).__name__}")
    found = traceback.TracebackException.from_exception(exc)
    if skip:
        del found.stack[: min(skip, len(found.stack) - 1)]  # the frame that raised stays
    return stored_traceback("".join(found.format()))


@dataclass(frozen=True, slots=True)
class Raised:
    """What a task function raised, as an executor reports it: the exception, and its
    traceback formatted where it was caught ("" for a ``TaskError``: a failure it meant)."""

    error: Exception
    traceback: str

    @classmethod
    def of(cls, exc: Exception) -> Raised:
        """``exc``, caught in the calling frame, which its traceback leaves out."""
        return cls(exc, "" if isinstance(exc, TaskError) else format_traceback(exc, skip=1))


def call_catching(fn: Callable[[Any, Any], Any], ctx: Any, value: Any) -> Any:
    """``fn(ctx, value)``, or a ``Raised`` for what it raised. Run in the worker thread of a
    plain function, so that its traceback is formatted there: formatting takes 0.1 to 0.3 ms
    of CPU, which the event loop of every other attempt should not spend."""
    try:
        return fn(ctx, value)
    except Exception as exc:
        return Raised.of(exc)


def stored_traceback(text: str) -> str:
    """A traceback as a task's message keeps it: without trailing newlines, starting with
    ``HEADER`` (split_traceback finds it by that line), bounded; "" stays "" (none)."""
    text = text.rstrip("\n")
    if not text:
        return ""
    if not text.startswith(HEADER):  # its first chained exception was never raised
        text = f"{HEADER}\n{text}"
    return bound_traceback(text)


def bound_traceback(text: str, limit: int = MAX_TRACEBACK) -> str:
    """``text`` if it is at most ``limit`` characters; otherwise its first and last whole lines
    within the limit, joined by a line that says how many characters were left out."""
    if len(text) <= limit:
        return text
    budget = limit - 64  # the line that says what was left out
    head_end = text.rfind("\n", 0, budget // _HEAD_SHARE)
    head = text[: max(head_end, 0)]
    tail_from = len(text) - (budget - len(head))
    tail_start = text.find("\n", tail_from)
    # No line starts in the tail's share: its one long line (the exception's message), cut.
    tail = text[tail_start + 1 :] if tail_start >= 0 else text[tail_from:]
    left_out = len(text) - len(head) - len(tail)
    return f"{head}\n  ... {left_out} characters of the traceback left out ...\n{tail}"


def error_line(message: str) -> str:
    """The first line of a message, at most ``MAX_ERROR_LINE`` characters."""
    line = message.partition("\n")[0]
    return line if len(line) <= MAX_ERROR_LINE else line[: MAX_ERROR_LINE - 1] + "…"


def with_traceback(message: str, traceback: str) -> str:
    """A message as a row keeps it: the traceback, if any, on the lines after it."""
    return f"{message}\n{traceback}" if traceback else message


def escape_header(text: str) -> str:
    """``text`` with any line that ``split_traceback`` would take for the start of a kept
    traceback indented by one space: an exception's own message may quote another process's
    traceback, and must not be cut there."""
    return text.replace(f"\n{HEADER}\n", f"\n {HEADER}\n")


def split_traceback(message: str) -> tuple[str, str | None]:
    """A task's message as what happened and the traceback stored after it (None: none)."""
    at = message.find(f"\n{HEADER}\n")
    if at < 0:
        return message, None
    return message[:at], message[at + 1 :]
