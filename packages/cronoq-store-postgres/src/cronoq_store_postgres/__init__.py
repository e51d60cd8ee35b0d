"""PostgreSQL store for cronoq.

Will hold `PgStore` and `PgStoreConfig`; not implemented yet.
"""

__all__: list[str] = []
