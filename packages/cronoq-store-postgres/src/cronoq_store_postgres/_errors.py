"""How asyncpg errors map onto the store's three error kinds."""

from __future__ import annotations

import asyncpg

from cronoq.errors import StoreError, StoreFatal, Unavailable

# Transient: the connection or server went away, a timeout, contention, a restart.
_TRANSIENT: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    # A connection the server ended (a FATAL ErrorResponse) between two of our statements is
    # left in a state asyncpg refuses to use, and says so with this error: e.g. when the pool
    # resets it on release, right after the statement that committed a batch.
    asyncpg.InternalClientError,
    asyncpg.SerializationError,
    asyncpg.DeadlockDetectedError,
    asyncpg.LockNotAvailableError,
    asyncpg.QueryCanceledError,
    asyncpg.AdminShutdownError,
    asyncpg.CannotConnectNowError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
)
CLASSIFIED: tuple[type[BaseException], ...] = (*_TRANSIENT, asyncpg.PostgresError)
CLASSIFIED_OR_BAD_DSN: tuple[type[BaseException], ...] = (*CLASSIFIED, ValueError)


def classify(exc: BaseException, doing: str) -> StoreError:
    message = f"PostgreSQL failed while {doing}: {type(exc).__name__}: {exc}"
    if isinstance(exc, _TRANSIENT):
        return Unavailable(message)
    return StoreFatal(message)
