"""SQLite store for cronoq.

Will hold `SqliteStore` and `SqliteStoreConfig`; not implemented yet.
"""

__all__: list[str] = []
