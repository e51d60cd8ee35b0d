"""Client for cronoq-server: ``AsyncClient`` (the Scheduler's calls over gRPC), ``Client`` (the
same calls for synchronous code) and ``Worker`` (runs remote attempts with the same executor
contract as a local Pool). The ``cronoq`` command is ``cronoq_client._cli``.

The wire protocol is ``cronoq_client.protocol``.
"""

from cronoq_client._client import AsyncClient
from cronoq_client._credentials import Tls
from cronoq_client._outbox import OutboxStatus, QuarantinedOutboxRow
from cronoq_client._sync import Client
from cronoq_client._worker import Worker

__all__ = ["AsyncClient", "Client", "OutboxStatus", "QuarantinedOutboxRow", "Tls", "Worker"]
