"""cronoq-store-sqlite: durable cronoq state in one local SQLite file, with standbys.

Several processes on one host may open the same file: one leads through a lease row that it
renews, the others wait and take over when the lease runs out (at once on a clean shutdown).
"""

from cronoq_store_sqlite._config import SqliteStoreConfig
from cronoq_store_sqlite._store import SqliteStore

__all__ = ["SqliteStore", "SqliteStoreConfig"]
