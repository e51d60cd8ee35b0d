"""The exit codes of ``cronoq-server`` (docs/server.md lists them)."""

from __future__ import annotations

__all__ = ["EXIT_CANNOT_LISTEN", "EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "forced_exit"]

EXIT_OK = 0
"""Done: ``check-config``, ``migrate``, or ``serve`` stopped after a graceful drain."""
EXIT_FAILED = 1
"""The store failed: ``migrate`` could not open or upgrade it; ``serve`` gave up after
``runtime.store_fatal_attempts`` permanent errors in a row."""
EXIT_INVALID = 2
"""The command line or the configuration is invalid."""
EXIT_CANNOT_LISTEN = 3
"""``serve`` could not listen: a port is taken (by whom is in the message) or not bindable."""


def forced_exit(signum: int) -> int:
    """``serve`` stopped at once by a second signal: 128 + its number, as a shell reports a
    process that signal killed (130 for SIGINT, 143 for SIGTERM). Never 0: attempts that were
    running were abandoned."""
    return 128 + signum
