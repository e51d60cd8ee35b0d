"""The drivers and frameworks an application may hold, each running one transaction as the
application would: an order written through the framework's own API, and outbox rows written
by a helper (``enqueue``, ``enqueue_many``) on the driver connection of that same transaction.

Each also reads ``txid_current()`` both ways, so that a test sees the two are one transaction,
and may roll it back (by raising ``Rollback`` inside it, as an application's error would).
The sync ones (psycopg, SQLAlchemy with psycopg, Django) run in a thread of their own: the
scheduler that ingests the outbox runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import psycopg
from pg_harness import DSN
from psycopg.conninfo import conninfo_to_dict

from cronoq_store_postgres._schema import quote_ident

__all__ = [
    "DRIVERS",
    "Done",
    "Driver",
    "Rollback",
    "Write",
    "configure_django",
    "open_driver",
    "sqlalchemy_url",
]

DRIVERS = ("asyncpg", "psycopg", "psycopg-async", "sqlalchemy", "sqlalchemy-async", "django")

Write = Callable[[Any], Any]
"""Given the driver connection of the transaction, the helper's call (its result, awaitable on
an async driver)."""


class Rollback(Exception):
    """Raised inside a transaction: the framework rolls it back."""


@dataclass(frozen=True, slots=True)
class Done:
    result: Any
    """What the helper returned (awaited)."""
    app_txid: int
    """``txid_current()`` through the framework's own API, in the transaction."""
    driver_txid: int
    """``txid_current()`` through the driver connection given to the helper."""


class Driver:
    """One driver or framework. ``transact`` runs a transaction writing the order ``item``
    and calling ``write`` (after the order, or before it with ``write_first``)."""

    name: str

    async def transact(
        self, schema: str, item: str, write: Write, *, rollback: bool = False,
        write_first: bool = False,
    ) -> Done:  # fmt: skip
        raise NotImplementedError

    async def close(self) -> None:
        return None


def _order(schema: str, marker: str) -> str:
    return (
        f"INSERT INTO {quote_ident(schema)}.orders (item) VALUES ({marker}) "
        "RETURNING txid_current()"
    )


_TXID = "SELECT txid_current()"


class _Asyncpg(Driver):
    name = "asyncpg"

    async def transact(
        self, schema: str, item: str, write: Write, *, rollback: bool = False,
        write_first: bool = False,
    ) -> Done:  # fmt: skip
        conn = await asyncpg.connect(DSN)
        try:
            result: Any = None
            with contextlib.suppress(Rollback):
                async with conn.transaction():
                    if write_first:
                        result = await write(conn)
                    app_txid = await conn.fetchval(_order(schema, "$1"), item)
                    if not write_first:
                        result = await write(conn)
                    done = Done(result, app_txid, await conn.fetchval(_TXID))
                    if rollback:
                        raise Rollback
            return done
        finally:
            await conn.close()


class _Psycopg(Driver):
    name = "psycopg"

    async def transact(
        self, schema: str, item: str, write: Write, *, rollback: bool = False,
        write_first: bool = False,
    ) -> Done:  # fmt: skip
        return await asyncio.to_thread(self._transact, schema, item, write, rollback, write_first)

    def _transact(
        self, schema: str, item: str, write: Write, rollback: bool, write_first: bool
    ) -> Done:
        with psycopg.connect(DSN) as conn:
            result: Any = None
            with contextlib.suppress(Rollback), conn.transaction():
                if write_first:
                    result = write(conn)
                app_txid = _one(conn.execute(_order(schema, "%s"), (item,)).fetchone())
                if not write_first:
                    result = write(conn)
                done = Done(result, app_txid, _one(conn.execute(_TXID).fetchone()))
                if rollback:
                    raise Rollback
            return done


class _PsycopgAsync(Driver):
    name = "psycopg-async"

    async def transact(
        self, schema: str, item: str, write: Write, *, rollback: bool = False,
        write_first: bool = False,
    ) -> Done:  # fmt: skip
        async with await psycopg.AsyncConnection.connect(DSN) as conn:
            result: Any = None
            with contextlib.suppress(Rollback):
                async with conn.transaction():
                    if write_first:
                        result = await write(conn)
                    cursor = await conn.execute(_order(schema, "%s"), (item,))
                    app_txid = _one(await cursor.fetchone())
                    if not write_first:
                        result = await write(conn)
                    cursor = await conn.execute(_TXID)
                    done = Done(result, app_txid, _one(await cursor.fetchone()))
                    if rollback:
                        raise Rollback
            return done


def _one(row: tuple[Any, ...] | None) -> Any:
    assert row is not None
    return row[0]


def sqlalchemy_url(driver: str) -> Any:
    """The test DSN as SQLAlchemy's URL with this driver (``psycopg``, ``asyncpg``)."""
    from sqlalchemy.engine import make_url

    return make_url(DSN).set(drivername=f"postgresql+{driver}")


class _SqlAlchemy(Driver):
    """A sync engine on psycopg, and an ORM ``Session`` in ``session.begin()``."""

    name = "sqlalchemy"

    def __init__(self) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(sqlalchemy_url("psycopg"))

    async def transact(
        self, schema: str, item: str, write: Write, *, rollback: bool = False,
        write_first: bool = False,
    ) -> Done:  # fmt: skip
        return await asyncio.to_thread(self._transact, schema, item, write, rollback, write_first)

    def _transact(
        self, schema: str, item: str, write: Write, rollback: bool, write_first: bool
    ) -> Done:
        from sqlalchemy import text
        from sqlalchemy.orm import Session

        order = text(_order(schema, ":item"))
        with Session(self.engine) as session:
            result: Any = None
            with contextlib.suppress(Rollback), session.begin():
                # The psycopg connection of the session's current transaction.
                raw = session.connection().connection.driver_connection
                assert isinstance(raw, psycopg.Connection)
                if write_first:
                    result = write(raw)
                app_txid = session.execute(order, {"item": item}).scalar_one()
                if not write_first:
                    result = write(raw)
                done = Done(result, app_txid, _one(raw.execute(_TXID).fetchone()))
                if rollback:
                    raise Rollback
            return done

    async def close(self) -> None:
        await asyncio.to_thread(self.engine.dispose)


class _SqlAlchemyAsync(Driver):
    """An async engine on asyncpg, and an ``AsyncSession`` in ``session.begin()``."""

    name = "sqlalchemy-async"

    def __init__(self) -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        self.engine = create_async_engine(sqlalchemy_url("asyncpg"))

    async def transact(
        self, schema: str, item: str, write: Write, *, rollback: bool = False,
        write_first: bool = False,
    ) -> Done:  # fmt: skip
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import AsyncSession

        order = text(_order(schema, ":item"))
        async with AsyncSession(self.engine) as session:
            result: Any = None
            with contextlib.suppress(Rollback):
                async with session.begin():
                    conn = await session.connection()
                    raw = (await conn.get_raw_connection()).driver_connection
                    assert isinstance(raw, asyncpg.Connection)
                    if write_first:
                        result = await write(raw)
                    app_txid = (await session.execute(order, {"item": item})).scalar_one()
                    if not write_first:
                        result = await write(raw)
                    done = Done(result, app_txid, await raw.fetchval(_TXID))
                    if rollback:
                        raise Rollback
            return done

    async def close(self) -> None:
        await self.engine.dispose()


def configure_django() -> None:
    """Django's settings, once per process: the test database, on the psycopg (3) backend."""
    import django
    from django.conf import settings

    if settings.configured:
        return
    info = conninfo_to_dict(DSN)
    settings.configure(
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": info.get("dbname", ""),
                "USER": info.get("user", ""),
                "PASSWORD": info.get("password", ""),
                "HOST": info.get("host", ""),
                "PORT": str(info.get("port", "")),
            }
        },
    )
    django.setup()


class _Django(Driver):
    """``transaction.atomic()`` and the connection's cursor, on a thread of its own (Django's
    connections belong to the thread that opened them)."""

    name = "django"

    def __init__(self) -> None:
        configure_django()
        self.thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="django")

    async def _in_thread(self, call: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.thread, call)

    async def transact(
        self, schema: str, item: str, write: Write, *, rollback: bool = False,
        write_first: bool = False,
    ) -> Done:  # fmt: skip
        call = functools.partial(self._transact, schema, item, write, rollback, write_first)
        done: Done = await self._in_thread(call)
        return done

    def _transact(
        self, schema: str, item: str, write: Write, rollback: bool, write_first: bool
    ) -> Done:
        from django.db import connection, transaction

        result: Any = None
        with contextlib.suppress(Rollback), transaction.atomic():
            raw = connection.connection
            assert isinstance(raw, psycopg.Connection), type(raw)
            if write_first:
                result = write(raw)
            with connection.cursor() as cursor:
                cursor.execute(_order(schema, "%s"), [item])
                app_txid = cursor.fetchone()[0]
            if not write_first:
                result = write(raw)
            done = Done(result, app_txid, _one(raw.execute(_TXID).fetchone()))
            if rollback:
                raise Rollback
        return done

    async def close(self) -> None:
        from django.db import connection

        # The thread's own connection: ``connection`` resolves per thread when used.
        await self._in_thread(lambda: connection.close())
        self.thread.shutdown()


_CLASSES: dict[str, Callable[[], Driver]] = {
    "asyncpg": _Asyncpg,
    "psycopg": _Psycopg,
    "psycopg-async": _PsycopgAsync,
    "sqlalchemy": _SqlAlchemy,
    "sqlalchemy-async": _SqlAlchemyAsync,
    "django": _Django,
}


def open_driver(name: str) -> Driver:
    return _CLASSES[name]()
