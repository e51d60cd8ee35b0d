"""PgStoreConfig: the schema a cluster lives in, timings and pool size, validated."""

from __future__ import annotations

import math
from dataclasses import dataclass

from cronoq.errors import InvalidArgument

__all__ = ["MIGRATE_MODES", "PgStoreConfig"]

MIGRATE_MODES = ("auto", "never")


@dataclass(frozen=True, slots=True)
class PgStoreConfig:
    schema: str = "public"
    """Every table, and the advisory lock key, derive from it: schemas are separate clusters."""
    lock_poll: float = 0.5
    """Seconds between a standby's tries of the advisory lock."""
    keepalive: float = 1.0
    """Seconds between the leader's checks of its lock session."""
    session_timeout: float = 10.0
    """Seconds the lock session may stay unresponsive before the leader steps down; also the
    server's ``idle_session_timeout`` and ``tcp_user_timeout`` for that session, so the server
    frees a frozen or vanished leader's lock."""
    command_timeout: float = 30.0
    """Seconds any one statement may take before it counts as ``Unavailable``."""
    lock_timeout: float = 5.0
    """Seconds a commit waits for a row lock before it counts as ``Unavailable``."""
    keep_finished: float = 7 * 24 * 3600.0
    prune_interval: float = 60.0
    prune_batch: int = 1000
    pool_size: int = 4
    migrate: str = "auto"
    """``"auto"``: ``connect`` creates or upgrades a schema that is missing or older than this
    build (only then does the role need to own the schema); ``"never"``: ``connect`` only
    checks that the schema is at this build's version, and refuses with what to do if not.
    ``PgStore.migrate`` (``cronoq-server migrate``), run as the owner, is then the deploy
    step, and the replicas need only read and write (docs/stores/postgres.md)."""

    outbox: bool = True
    """Ingest the schema's outbox (docs/outbox.md) while leading: one more connection, to
    LISTEN, and a read of the outbox every ``outbox_poll`` seconds when idle."""
    outbox_poll: float = 1.0
    """Seconds between the leader's reads of an outbox that sent no notification."""

    def __post_init__(self) -> None:
        if not isinstance(self.schema, str) or not self.schema or "\x00" in self.schema:
            raise InvalidArgument(f"schema must be a non-empty str without NUL: {self.schema!r}")
        if len(self.schema.encode()) > 63:
            raise InvalidArgument(f"schema {self.schema!r} is longer than PostgreSQL's 63 bytes")
        for name in ("lock_poll", "keepalive", "session_timeout", "command_timeout",
                     "lock_timeout", "keep_finished", "prune_interval", "outbox_poll"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise InvalidArgument(f"{name} must be a positive number of seconds, got {value!r}")
        if self.keepalive >= self.session_timeout:
            raise InvalidArgument(
                f"keepalive ({self.keepalive}s) must be shorter than session_timeout "
                f"({self.session_timeout}s)"
            )
        if not isinstance(self.outbox, bool):
            raise InvalidArgument(f"outbox must be True or False, got {self.outbox!r}")
        if self.migrate not in MIGRATE_MODES:
            raise InvalidArgument(f"migrate must be 'auto' or 'never', got {self.migrate!r}")
        for name in ("prune_batch", "pool_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InvalidArgument(f"{name} must be a positive int, got {value!r}")
