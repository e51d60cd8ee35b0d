"""The cronoq-server service.

Will hold the gRPC services, the HTTP endpoints (`/healthz`, `/readyz`, `/metrics`), the
configuration and the `cronoq-server` CLI; not implemented yet.
"""

__all__: list[str] = []
