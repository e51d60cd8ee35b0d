"""SqliteStoreConfig: timings and durability settings, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cronoq.errors import InvalidArgument

__all__ = ["SqliteStoreConfig"]


@dataclass(frozen=True, slots=True)
class SqliteStoreConfig:
    full_sync: bool = True
    """Sync the WAL at every commit (``synchronous=FULL``). Off (``NORMAL``), a power loss may
    drop the last commits, though the file stays consistent."""
    lock_poll: float = 0.5
    """Seconds between a standby's looks at the lease."""
    lease_renew: float = 2.0
    """Seconds between the leader's renewals of its lease."""
    lease_ttl: float = 10.0
    """Seconds a lease lasts without renewal; a standby takes over after that."""
    busy_timeout: float = 5.0
    """Seconds a statement waits for SQLite's write lock before it is ``Unavailable``."""
    keep_finished: float = 7 * 24 * 3600.0
    """Seconds finished tasks stay in the file before pruning."""
    prune_interval: float = 60.0
    prune_batch: int = 500
    """Rows deleted per pruning transaction, so pruning never holds the lock for long."""
    journal_size_limit: int = 64 * 1024 * 1024
    """Bytes the WAL is truncated to after a checkpoint."""

    def __post_init__(self) -> None:
        for name in ("lock_poll", "lease_renew", "lease_ttl", "busy_timeout", "keep_finished",
                     "prune_interval"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise InvalidArgument(f"{name} must be a positive number of seconds, got {value!r}")
        if self.lease_renew >= self.lease_ttl:
            raise InvalidArgument(
                f"lease_renew ({self.lease_renew}s) must be shorter than lease_ttl "
                f"({self.lease_ttl}s), or the lease expires between renewals"
            )
        if not isinstance(self.full_sync, bool):
            raise InvalidArgument(f"full_sync must be a bool, got {self.full_sync!r}")
        for name in ("prune_batch", "journal_size_limit"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
