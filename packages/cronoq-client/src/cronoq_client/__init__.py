"""Client for cronoq-server: ``AsyncClient``, the Scheduler's calls over gRPC.

The wire protocol is :mod:`cronoq_client.protocol`.
"""

from cronoq_client._client import AsyncClient

__all__ = ["AsyncClient"]
