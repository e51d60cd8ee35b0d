"""Conformance kit for cronoq stores.

Will hold the pytest suites (`StoreSuite`, `EngineSuite`) that every implementation of the cronoq
`Store` protocol must pass; not implemented yet.
"""

__all__: list[str] = []
