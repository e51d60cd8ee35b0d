"""enqueue and enqueue_many: add tasks to the outbox inside the caller's own transaction.

They take the application's open connection (asyncpg, or psycopg 3, sync or async) and write
outbox rows on it, so the tasks exist exactly when the caller's transaction commits. Every
option is checked as ``Scheduler.submit`` checks it, before anything is written; what only the
scheduler knows (whether the pool exists) is decided at ingest (a row it refuses is
quarantined with the reason). The caller's role needs INSERT on the outbox and SELECT on its
``id`` column (``RETURNING id`` needs it), nothing more (docs/outbox.md, "Privileges").
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable
from typing import Any

from cronoq import Codec, TaskRequest
from cronoq import _validate as check
from cronoq._codecs import CodecContext, binds_context
from cronoq._model import MissPolicy
from cronoq.errors import InvalidArgument
from cronoq.store import encode_outbox_options
from cronoq_store_postgres._config import PgStoreConfig
from cronoq_store_postgres._schema import quote_ident

__all__ = ["enqueue", "enqueue_many"]

_DEFAULTS = TaskRequest("")


def enqueue(
    conn: Any,
    kind: str,
    payload: Any = None,
    *,
    schema: str = "public",
    codec: Codec | None = None,
    **options: Any,
) -> Any:
    """Add one task to the outbox of ``schema`` in ``conn``'s current transaction; return the
    row's id (awaitable for an asyncpg or psycopg ``AsyncConnection``).

    ``payload``: bytes (None for none), or any value ``codec`` encodes: the scheduler's codec,
    so that it decodes what this writes. ``options``: those of ``submit`` but ``after`` (pool,
    key, tags, name, priority, retry, start_at, deadline, timeout, miss_policy, grace); a
    ``timedelta`` start or deadline counts from now, on this process's clock.
    """
    row = _row(kind, payload, options, _codec(codec), time.time_ns())
    return _insert(conn, schema, [row], single=True)


def enqueue_many(
    conn: Any,
    requests: Iterable[TaskRequest],
    *,
    schema: str = "public",
    codec: Codec | None = None,
) -> Any:
    """Add several tasks (``TaskRequest``, without ``after`` or ``trace_context``) in one
    statement of ``conn``'s current transaction; return their row ids in order (awaitable
    for an async connection). All are checked before any is written; at most ``MAX_BATCH``."""
    now = time.time_ns()
    codec = _codec(codec)
    rows = check.bounded(
        requests,
        "enqueue_many requests",
        "an iterable of TaskRequest",
        check.MAX_BATCH,
        lambda request: _request_row(request, codec, now),
    )
    return _insert(conn, schema, rows, single=False)


def _request_row(request: object, codec: Codec | None, now_ns: int) -> tuple[str, bytes, str]:
    if not isinstance(request, TaskRequest):
        raise InvalidArgument(f"expected a TaskRequest, got {type(request).__name__}")
    if request.trace_context is not None or _has_items(request.after):
        raise InvalidArgument("an outbox row takes neither after nor trace_context")
    options = {
        name: getattr(request, name)
        for name in ("pool", "key", "tags", "name", "priority", "retry", "start_at",
                     "deadline", "timeout")
    }  # fmt: skip
    # These two are written only when they differ from submit's defaults (the others only
    # when set: encode_outbox_options leaves out what is None or empty).
    if request.miss_policy != MissPolicy.RUN_LATE:
        options["miss_policy"] = request.miss_policy
    if request.grace is not _DEFAULTS.grace:
        options["grace"] = request.grace
    return _row(request.kind, request.payload, options, codec, now_ns)


_NO_ITEM = object()


def _has_items(after: object) -> bool:
    """Whether ``after`` names any dependency; read one item at most (it may be endless)."""
    if type(after) is tuple and not after:
        return False  # the default
    return next(check._iterate(after, "after", "a list of task ids"), _NO_ITEM) is not _NO_ITEM


def _codec(codec: object) -> Codec | None:
    """The codec, checked as ``Scheduler`` checks its own: one that could not encode (a class,
    a str) is refused even when no payload needs it."""
    if codec is None:
        return None
    if (
        isinstance(codec, type)
        or not isinstance(codec, Codec)
        or not (callable(codec.encode) and callable(codec.decode))
    ):
        raise InvalidArgument(
            f"codec must have encode(value) -> bytes and decode(bytes), got {type(codec).__name__}"
        )
    return codec


def _row(
    kind: object, payload: object, options: dict[str, Any], codec: Codec | None, now_ns: int
) -> tuple[str, bytes, str]:
    kind = check.text(kind, "kind")
    encoded = encode_outbox_options(options, now_ns)
    if codec is None:
        if payload is None:
            data = b""
        elif isinstance(payload, bytes | bytearray | memoryview):
            data = bytes(payload)
        else:
            raise InvalidArgument(
                f"payload must be bytes without a codec, got {type(payload).__name__}: pass "
                "the scheduler's codec (codec=JsonCodec()) to encode other values"
            )
        if len(data) > check.DEFAULT_MAX_PAYLOAD_BYTES:
            raise InvalidArgument(
                f"payload is {len(data)} bytes, over {check.DEFAULT_MAX_PAYLOAD_BYTES}"
            )
    else:
        context = None
        if binds_context(codec):
            pool = options.get("pool") or "default"
            context = CodecContext("payload", kind, pool, options.get("key"))
        data = check.payload(codec, payload, check.DEFAULT_MAX_PAYLOAD_BYTES, context)
    return kind, data, encoded


@functools.lru_cache(maxsize=64)
def _statements(schema: str, dollar: bool) -> tuple[str, str]:
    """(one row, many rows) for the schema, with asyncpg's ($n) or psycopg's (%s) markers.
    The options are bound as text and cast by the server: an application's own jsonb codec on
    its connection (asyncpg's set_type_codec, psycopg's loaders) would encode them again."""
    s = quote_ident(PgStoreConfig(schema=schema).schema)
    a, b, c = ("$1", "$2", "$3") if dollar else ("%s", "%s", "%s")
    return (
        f"INSERT INTO {s}.cronoq_outbox (kind, payload, options) "
        f"VALUES ({a}, {b}, {c}::text::jsonb) RETURNING id",
        f"INSERT INTO {s}.cronoq_outbox (kind, payload, options) "
        f"SELECT k, p, o::jsonb FROM unnest({a}::text[], {b}::bytea[], {c}::text[]) AS u(k, p, o) "
        "RETURNING id",
    )


def _insert(conn: Any, schema: object, rows: list[tuple[str, bytes, str]], *, single: bool) -> Any:
    # Text first (a lone surrogate would fail PgStoreConfig's byte count with a UnicodeError).
    schema = check.text(schema, "schema")
    driver = _driver(conn)
    one, many = _statements(schema, dollar=driver == "asyncpg")
    if driver == "asyncpg":
        return _asyncpg(conn, one, many, rows, single)
    if driver == "psycopg-async":
        return _psycopg_async(conn, one, many, rows, single)
    if not rows:
        return []
    from psycopg.rows import tuple_row

    # Rows as tuples, whatever row factory the application gave its connection.
    with conn.cursor(row_factory=tuple_row) as cursor:
        if single:
            cursor.execute(one, rows[0])
            return int(cursor.fetchone()[0])
        cursor.execute(many, _columns(rows))
        return sorted(int(row[0]) for row in cursor.fetchall())


async def _asyncpg(
    conn: Any, one: str, many: str, rows: list[tuple[str, bytes, str]], single: bool
) -> Any:
    if single:
        return int(await conn.fetchval(one, *rows[0]))
    if not rows:
        return []
    return sorted(int(row[0]) for row in await conn.fetch(many, *_columns(rows)))


async def _psycopg_async(
    conn: Any, one: str, many: str, rows: list[tuple[str, bytes, str]], single: bool
) -> Any:
    from psycopg.rows import tuple_row

    if not rows:
        return []
    async with conn.cursor(row_factory=tuple_row) as cursor:
        if single:
            await cursor.execute(one, rows[0])
            return int((await cursor.fetchone())[0])
        await cursor.execute(many, _columns(rows))
        return sorted(int(row[0]) for row in await cursor.fetchall())


def _columns(rows: list[tuple[str, bytes, str]]) -> tuple[list[str], list[bytes], list[str]]:
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _driver(conn: object) -> str:
    """Which kind of connection: asyncpg's, or psycopg 3's sync or async one (imported only
    if the caller uses it: neither is needed by the other)."""
    # By the modules of its classes: a subclass of the driver's connection is one too (asyncpg's
    # connect(connection_class=...)), and a driver the caller does not use is never imported.
    modules = {cls.__module__.partition(".")[0] for cls in type(conn).__mro__}
    if "asyncpg" in modules:
        import asyncpg
        from asyncpg.pool import PoolConnectionProxy

        if isinstance(conn, asyncpg.Connection | PoolConnectionProxy):
            return "asyncpg"
    elif "psycopg" in modules:
        import psycopg

        if isinstance(conn, psycopg.AsyncConnection):
            return "psycopg-async"
        if isinstance(conn, psycopg.Connection):
            return "psycopg"
    raise InvalidArgument(
        "conn must be an open asyncpg or psycopg 3 connection, got "
        f"{type(conn).__module__}.{type(conn).__qualname__} (from SQLAlchemy or Django, pass "
        "its driver connection: docs/outbox.md)"
    )
