"""A remote worker's reports, sent in batches.

One ReportMany call is in flight at a time; the reports that finish meanwhile wait and leave
together in the next call, as a group commit does. An idle worker's report leaves at once, a
busy worker makes one call per batch instead of one per attempt. Each report learns what became
of it alone: accepted, refused for good (a stale token, an output the server refuses), or the
call's failure, which the worker judges as it would a failed Report.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from cronoq.errors import CronoqError, SchedulerError
from cronoq_client._channel import CLOSED_UNDER_CALL, Connection, closed_under_call
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._proto import cronoq_pb2_grpc as pb_grpc
from cronoq_client._status import error_from_report_result, too_large
from cronoq_client._wire import MAX_REPORTS_PER_CALL

__all__ = ["Answer", "Reports"]

log = logging.getLogger("cronoq_client.worker")

Answer = CronoqError | grpc.RpcError | None
"""None: accepted. An RpcError: the call failed as a whole. A CronoqError: refused for good,
but a SchedulerError, which says nothing is known (the call failed in another way, or a server
answered a reason a refusal never has): the worker retries those while the lease lasts."""

CALL_TIMEOUT_S = 10.0
_MIN_CALL_TIMEOUT_S = 0.05
_FRAMING_BYTES = 16
"""Beyond a report's own size: its tag and length in the request, and the call's framing."""


@dataclass(slots=True)
class _Pending:
    request: pb.ReportRequest
    deadline: float
    """Loop time until which this report is worth sending (its lease)."""
    answer: asyncio.Future[tuple[Connection, Answer]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Reports:
    """Batches reports into ReportMany calls on the worker's current connection."""

    def __init__(
        self,
        current: Callable[[], tuple[Connection, pb_grpc.WorkerServiceAsyncStub]],
        max_message_bytes: int,
    ) -> None:
        self._current = current
        self._max_bytes = max_message_bytes
        self._pending: deque[_Pending] = deque()
        self._sender: asyncio.Task[None] | None = None

    async def send(self, request: pb.ReportRequest, deadline: float) -> tuple[Connection, Answer]:
        """What became of this report, and the connection that carried it."""
        pending = _Pending(request, deadline)
        self._pending.append(pending)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(
                self._send_all(), name="cronoq-worker-reports"
            )
        return await pending.answer

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for pending in self._pending:
            pending.answer.cancel()
        self._pending.clear()

    def _batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        size = 0
        while self._pending and len(batch) < MAX_REPORTS_PER_CALL:
            pending = self._pending[0]
            if pending.answer.done():  # its caller gave up (cancelled)
                self._pending.popleft()
                continue
            size += pending.request.ByteSize() + _FRAMING_BYTES
            if batch and size > self._max_bytes:
                break  # the next call takes it (alone, if it is too large by itself)
            batch.append(self._pending.popleft())
        return batch

    async def _send_all(self) -> None:
        while self._pending:
            batch = self._batch()
            if not batch:
                return
            try:
                outcome = await self._send(batch)
            except asyncio.CancelledError:
                for pending in batch:  # close(): nobody waits for these any more
                    pending.answer.cancel()
                raise
            if outcome is None:
                self._pending.extendleft(reversed(batch))  # again, in smaller calls
                continue
            connection, answers = outcome
            for pending, answer in zip(batch, answers, strict=True):
                if not pending.answer.done():
                    pending.answer.set_result((connection, answer))

    async def _send(self, batch: list[_Pending]) -> tuple[Connection, list[Answer]] | None:
        """One ReportMany call: an answer for each report, or None to send them again in
        smaller calls. Any failure of the call is every report's answer, so that each is
        judged and retried by its own lease: this sender never dies with reports waiting."""
        connection, stub = self._current()
        left = max(p.deadline for p in batch) - asyncio.get_running_loop().time()
        timeout = min(max(left, _MIN_CALL_TIMEOUT_S), CALL_TIMEOUT_S)
        request = pb.ReportManyRequest(reports=[p.request for p in batch])
        try:
            reply = await stub.ReportMany(request, timeout=timeout)
        except grpc.RpcError as err:
            if too_large(err) and len(batch) > 1:
                # The server's limit is below this worker's: the batch was refused whole, and
                # says nothing of any one report (alone, at worst, a refusal is the report's).
                self._max_bytes = max(request.ByteSize() // 2, 1)
                return None
            return connection, [err] * len(batch)
        except asyncio.CancelledError:
            if not closed_under_call():
                raise
            failure = SchedulerError(CLOSED_UNDER_CALL, applied=None)
            return connection, [failure] * len(batch)
        except Exception as exc:  # a bug below us: still an answer, never a stranded report
            log.exception("ReportMany failed")
            failure = SchedulerError(f"the report call failed: {exc!r}", applied=None)
            return connection, [failure] * len(batch)
        return connection, self._answers(reply, len(batch))

    @staticmethod
    def _answers(reply: pb.ReportManyResponse, sent: int) -> list[Answer]:
        if len(reply.results) != sent:
            # A server that does not keep the protocol: nothing is known of these reports.
            log.error("ReportMany answered %d results for %d reports", len(reply.results), sent)
            error = SchedulerError(
                f"the server answered {len(reply.results)} results for {sent} reports",
                applied=None,
            )
            return [error] * sent
        return [error_from_report_result(result) for result in reply.results]
