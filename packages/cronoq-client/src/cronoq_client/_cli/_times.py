"""Times given on the command line: ISO 8601 with a UTC offset, never guessed."""

from __future__ import annotations

from datetime import datetime

from cronoq_client._cli._errors import CommandFailed, ExitCode

__all__ = ["iso_time"]


def iso_time(text: str, where: str) -> datetime:
    """``text`` as an aware datetime; a time without an offset is refused (exit 2) rather
    than read in the machine's zone, which a command run elsewhere would read otherwise."""
    try:
        found = datetime.fromisoformat(text)
    except ValueError:
        raise CommandFailed(
            f"{where}: {text!r} is not an ISO 8601 time (2026-05-01T09:00:00+02:00)",
            ExitCode.USAGE,
        ) from None
    if found.tzinfo is None:
        raise CommandFailed(
            f"{where}: {text!r} has no UTC offset (add Z or +HH:MM)", ExitCode.USAGE
        )
    return found
