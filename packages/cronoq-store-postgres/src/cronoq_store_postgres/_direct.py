"""Refusing a connection that does not reach PostgreSQL directly.

A transaction (or statement) pooler hands each transaction whichever server session is free, so
a session-level advisory lock does not stay with its client, and outlives it on the pooled
server session when the client dies; PgBouncer in any mode also rejects the session settings
the store sends at startup, or drops them when told to ignore them. With a single idle client a
transaction pooler hands every transaction the same server session, so a check of stability
alone passes; what gives any pooler away is checked too:

- the server process named in the connection's BackendKeyData (asyncpg keeps its pid) is the
  one that answers: a pooler has to invent its own, since its clients share server sessions;
- every setting sent at startup is in force, and came from the client (``pg_settings.source``);
- a session-level marker set in one transaction reads back in a later one, on the same backend.

A plain TCP proxy or load balancer passes all of this through, and is accepted.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import asyncpg

from cronoq.errors import StoreFatal
from cronoq_store_postgres._errors import POOLER_HINT

__all__ = ["verify_direct"]

# One row per setting asked for, and the marker set for the session (not SET LOCAL).
_MARK = """
    SELECT n.name, s.setting, s.source, pg_backend_pid() AS pid,
        set_config('cronoq.session_marker', $2, false) AS marker
    FROM unnest($1::text[]) AS n(name) LEFT JOIN pg_settings AS s USING (name)"""
_READ_BACK = "SELECT pg_backend_pid(), current_setting('cronoq.session_marker', true)"


def _in_force(name: str, wanted: str, setting: str | None, source: str | None) -> bool:
    if source != "client":
        return False
    # Over a Unix socket, or on a platform without the socket option, a TCP setting reads 0.
    return setting == wanted or (name.startswith("tcp_") and setting == "0")


async def verify_direct(
    conn: asyncpg.Connection, settings: Mapping[str, str], session: str
) -> None:
    """Raise ``StoreFatal`` naming what gave a pooler away, unless ``conn`` has a PostgreSQL
    backend of its own with ``settings`` (sent at startup) in force."""
    marker = secrets.token_hex(8)
    rows = await conn.fetch(_MARK, list(settings), marker)
    pid = rows[0]["pid"]
    problems = []
    announced = conn.get_server_pid()
    if announced != pid:
        problems.append(
            f"the connection was opened for server process {announced}, but process {pid} "
            "answers its queries"
        )
    for row in rows:
        name, setting, source = row["name"], row["setting"], row["source"]
        if not _in_force(name, settings[name], setting, source):
            problems.append(
                f"{name} is {setting!r} (from {source or 'nowhere'}), not the "
                f"{settings[name]!r} asked for at connection"
            )
    back = await conn.fetchrow(_READ_BACK)
    assert back is not None
    again, read_back = back
    if again != pid or read_back != marker:
        problems.append(
            f"the next transaction ran in another session (process {again}, marker "
            f"{read_back!r}, after process {pid}, marker {marker!r})"
        )
    if problems:
        raise StoreFatal(
            f"{session} does not reach PostgreSQL directly: {'; '.join(problems)}. {POOLER_HINT}"
        )
