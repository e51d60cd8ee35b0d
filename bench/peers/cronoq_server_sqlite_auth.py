"""cronoq-server on SQLite as ``cronoq_server_sqlite``, with bearer tokens on (issue 23 measures
the service path with authentication off and on): the enqueuer may read and submit to the pool,
the worker may work on it."""

from __future__ import annotations

from ._server import ServerSystem
from .cronoq_server_sqlite import store_section

SYSTEM = ServerSystem("cronoq-server-sqlite-auth", store_section, auth=True)
