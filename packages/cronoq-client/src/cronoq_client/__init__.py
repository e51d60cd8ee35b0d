"""Client for cronoq-server.

Will hold the wire protocol (generated from the `.proto` files), the async and sync clients, the
remote worker runtime and the `cronoq` CLI; not implemented yet.
"""

__all__: list[str] = []
