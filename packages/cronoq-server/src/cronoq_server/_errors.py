"""The exceptions of cronoq-server, all rooted in ``CronoqServerError``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ConfigError", "ConfigIssue", "CronoqServerError"]


class CronoqServerError(Exception):
    """Root of every exception cronoq-server raises."""


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One bad setting: where it came from, what it was, and what is allowed."""

    key: str
    """Dotted key, as in the TOML file: ``store.dsn``, ``pools[1].name``."""
    source: str
    """The file's path, ``env CRONOQ_...``, or empty for a required key that is missing."""
    value: str
    """The bad value as shown to the user (secrets masked); empty when nothing was set."""
    problem: str
    """What is wrong and what is allowed."""

    def __str__(self) -> str:
        shown = f" = {self.value}" if self.value else ""
        source = f"from {self.source}" if self.source else "not set"
        return f"{self.key}{shown} ({source}): {self.problem}"


class ConfigError(CronoqServerError, ValueError):
    """The configuration is invalid; ``issues`` lists every problem found, not only the first."""

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))
