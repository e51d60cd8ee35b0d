"""The worker links a server holds, to list them (``ListWorkers``), and bounds on its Attach
streams: each is a worker link the scheduler offers its
slots to at every step, and a stream's memory, so a client must not open them without end.

- ``MAX_STREAMS_PER_CONNECTION``: Attach streams on one connection (gRPC's peer address is
  the connection's). A worker holds one; several ``Worker`` objects of a process may share a
  connection.
- ``MAX_LINKS_PER_POOL``: workers attached to one pool, over all connections.

A stream past either is refused ``RESOURCE_EXHAUSTED`` (``ADMISSION_REJECTED``), which a
``Worker`` retries with backoff. (A worker's slots are bounded as the request is decoded:
``cronoq_client.protocol.MAX_WORKER_SLOTS``.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from cronoq import Scheduler, WorkerInfo, WorkerLink
from cronoq.errors import AdmissionRejected

__all__ = ["MAX_LINKS_PER_POOL", "MAX_STREAMS_PER_CONNECTION", "Links"]

MAX_STREAMS_PER_CONNECTION = 32
MAX_LINKS_PER_POOL = 1_000


class Links:
    """The worker links of one server object, counted by connection and by pool."""

    def __init__(self) -> None:
        self._by_peer: Counter[str] = Counter()
        self._by_pool: Counter[str] = Counter()
        self._held: dict[int, tuple[str, frozenset[str]]] = {}
        self._named: dict[int, tuple[WorkerLink, str, str | None]] = {}

    def attach(
        self,
        sched: Scheduler,
        peer: str,
        options: Mapping[str, Any],
        worker_id: str = "",
        identity: str | None = None,
    ) -> WorkerLink:
        """``sched.attach(**options)`` if the bounds allow another link for ``peer``; it
        counts, and is listed under ``worker_id`` and the ``identity`` its connection
        authenticated as, until ``detach``."""
        if self._by_peer[peer] >= MAX_STREAMS_PER_CONNECTION:
            raise AdmissionRejected(
                f"this connection already holds {MAX_STREAMS_PER_CONNECTION} Attach streams, "
                "the limit: attach further workers on connections of their own"
            )
        pools = frozenset(options["pools"])
        for pool in sorted(pools):
            if self._by_pool[pool] >= MAX_LINKS_PER_POOL:
                raise AdmissionRejected(
                    f"pool {pool[:255]!r} already has {MAX_LINKS_PER_POOL} workers attached, "
                    "the limit: give the workers more slots each instead"
                )
        link = sched.attach(**options)
        self._by_peer[peer] += 1
        self._by_pool.update(pools)
        self._held[id(link)] = (peer, pools)
        self._named[id(link)] = (link, worker_id, identity)
        return link

    def workers(self) -> list[WorkerInfo]:
        """The links attached now, oldest first."""
        return [
            WorkerInfo(
                worker_id,
                self._held[key][0],
                tuple(sorted(link.pools)),
                link.slots,
                link.in_flight,
                link.attached_at,
                link.last_heard_at,
                identity,
            )
            for key, (link, worker_id, identity) in self._named.items()
        ]

    def detach(self, link: WorkerLink) -> None:
        del self._named[id(link)]
        peer, pools = self._held.pop(id(link))
        _release(self._by_peer, peer)
        for pool in pools:
            _release(self._by_pool, pool)


def _release(counts: Counter[str], key: str) -> None:
    # A key at zero is dropped, so that the memory follows the live links.
    counts[key] -= 1
    if not counts[key]:
        del counts[key]
