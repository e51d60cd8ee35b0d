"""cronoq-store-postgres: replicas sharing one PostgreSQL schema, one of them leading.

Leadership is a session-level advisory lock derived from the schema, held on a dedicated
connection; taking it bumps a fencing epoch that every commit re-checks in its transaction.
"""

from cronoq_store_postgres._config import PgStoreConfig
from cronoq_store_postgres._enqueue import enqueue, enqueue_many
from cronoq_store_postgres._outbox import PgOutbox
from cronoq_store_postgres._schema import SCHEMA_VERSION, SchemaMigration
from cronoq_store_postgres._store import PgStore

__all__ = [
    "SCHEMA_VERSION",
    "PgOutbox",
    "PgStore",
    "PgStoreConfig",
    "SchemaMigration",
    "enqueue",
    "enqueue_many",
]
