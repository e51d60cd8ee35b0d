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
POOLER_HINT = (
    "A connection pooler (PgBouncer, pgcat, Odyssey, RDS Proxy...) or a proxy that drops "
    "startup parameters seems to be between cronoq and PostgreSQL: through it the leader's "
    "advisory lock can outlive the leader on a pooled server connection, so that no standby "
    "ever leads, and the session settings that free a vanished leader's lock are lost. Point "
    "the store's DSN at PostgreSQL itself (a plain TCP proxy or load balancer that gives each "
    "client connection a server session of its own is fine); see docs/stores/postgres.md."
)

PRIVILEGE_HINT = (
    "The role lacks a privilege the store needs: the replicas' role needs USAGE on the schema "
    "and read and write on its tables, and creating or upgrading them needs the schema's owner "
    "(`cronoq-server migrate`, with store migrate = 'never' for the replicas); see "
    "docs/stores/postgres.md"
)

CLASSIFIED: tuple[type[BaseException], ...] = (*_TRANSIENT, asyncpg.PostgresError)
CLASSIFIED_OR_BAD_DSN: tuple[type[BaseException], ...] = (*CLASSIFIED, ValueError)


def rejects_startup_parameters(exc: BaseException) -> bool:
    """PgBouncer's answer to the session settings the store sends at connection: a connection
    error, but no retry will change the pooler's configuration."""
    return isinstance(exc, asyncpg.PostgresError) and (
        "unsupported startup parameter" in str(exc).lower()
    )


def classify(exc: BaseException, doing: str) -> StoreError:
    message = f"PostgreSQL failed while {doing}: {type(exc).__name__}: {exc}"
    if rejects_startup_parameters(exc):
        return StoreFatal(f"{message}. {POOLER_HINT}")
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return StoreFatal(f"{message}. {PRIVILEGE_HINT}")
    if isinstance(exc, _TRANSIENT):
        return Unavailable(message)
    return StoreFatal(message)
