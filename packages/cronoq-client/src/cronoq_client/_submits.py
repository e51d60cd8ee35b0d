"""A client's submissions, sent together while one is in flight.

A submit when none of this client's submission calls is in flight leaves at once as a plain
Submit: at low load nothing waits. Those that arrive while one is in flight wait and leave
together in one SubmitEach when it returns, as a Kafka producer or a worker's reports
(``_reports``) batch: 100 concurrent submitters cost the server a few calls, not 100.

Each submission gets what its own Submit would have got: its task id, or its own failure as a
gRPC error (the server's per-submission refusal rebuilt as the status that Submit would have
carried, or the failure of the whole call), which the client's retry loop judges for that
submission alone, as it judges a failed Submit. Each caller's deadline bounds its own wait; a
caller that gives up before its submission left takes it out of the queue (nothing is sent).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque
from dataclasses import dataclass, field

import grpc
from grpc import aio

from cronoq_client._channel import closed_under_call
from cronoq_client._proto import cronoq_pb2 as pb
from cronoq_client._proto import cronoq_pb2_grpc as pb_grpc
from cronoq_client._status import Reason, request_too_large, rpc_error_of, too_large
from cronoq_client._wire import MAX_SUBMIT_EACH, MAX_SUBMIT_MANY_REFERENCES

__all__ = ["Submits"]

_FRAMING_BYTES = 16
"""Beyond a submission's own size: its tag and length in the request, and the call's framing."""
_RESULT_BYTES = 2048
"""The most one submission's result takes in the answer: a refusal's message is cut to
``_status.MAX_MESSAGE_BYTES`` (1,024), with its reason and metadata. A call carries no more
submissions than this client can receive the results of."""


@dataclass(slots=True)
class _Pending:
    stub: pb_grpc.SchedulerServiceAsyncStub
    request: pb.SubmitRequest
    deadline: float | None
    """Loop time at which its caller gives up (None: never)."""
    sent: bool = False
    answer: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Submits:
    """Sends a client's Submit calls, coalescing those that overlap into SubmitEach calls."""

    def __init__(self, max_message_bytes: int) -> None:
        self._max_bytes = max_message_bytes
        self._max_results = max(1, min(MAX_SUBMIT_EACH, max_message_bytes // _RESULT_BYTES))
        self._pending: deque[_Pending] = deque()
        self._busy = False
        """A submission call (a lone Submit, or the sender's) is in flight."""
        self._sender: asyncio.Task[None] | None = None
        self._closed = False
        self._unary_only: weakref.WeakSet[pb_grpc.SchedulerServiceAsyncStub] = weakref.WeakSet()
        """Connections to a server that answered SubmitEach UNIMPLEMENTED (an older release)."""

    async def submit(
        self,
        stub: pb_grpc.SchedulerServiceAsyncStub,
        request: pb.SubmitRequest,
        timeout: float | None,
    ) -> int:
        """The task id, or raises what a Submit of ``request`` on ``stub`` would raise within
        ``timeout`` seconds: an ``aio.AioRpcError`` for the client's retry loop to judge."""
        if self._closed:
            raise aio.UsageError("the client is closed")
        if not self._busy or stub in self._unary_only:
            return await self._alone(stub, request, timeout)
        loop = asyncio.get_running_loop()
        pending = _Pending(stub, request, None if timeout is None else loop.time() + timeout)
        self._pending.append(pending)
        try:
            async with asyncio.timeout(timeout):
                # Cancelled with its caller: the sender skips it if it has not left.
                return await pending.answer
        except TimeoutError:
            if not pending.sent:
                raise _not_sent() from None
            raise _deadline_exceeded() from None

    async def _alone(
        self,
        stub: pb_grpc.SchedulerServiceAsyncStub,
        request: pb.SubmitRequest,
        timeout: float | None,
    ) -> int:
        busy, self._busy = self._busy, True
        try:
            reply = await stub.Submit(request, timeout=timeout)
        finally:
            if not busy:  # this call held the turn: those that queued meanwhile leave now
                self._busy = False
                self._start()
        return reply.task_id

    def _start(self) -> None:
        if self._pending and not self._busy and not self._closed:
            self._busy = True
            self._sender = asyncio.get_running_loop().create_task(
                self._send_all(), name="cronoq-client-submits"
            )

    async def close(self) -> None:
        """Submissions in flight end as their Submit would when the channel closes under it
        (an unknown outcome); those that never left, as a call on a closed client."""
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            await asyncio.gather(self._sender, return_exceptions=True)
        for pending in self._pending:
            if not pending.answer.done():
                pending.answer.set_exception(aio.UsageError("the client is closed"))
        self._pending.clear()

    def _batch(self) -> list[_Pending]:
        """The next call's submissions: the oldest waiting and those after it on the same
        connection, within the server's bounds of a call and the message size."""
        batch: list[_Pending] = []
        others: list[_Pending] = []
        size = after = tags = 0
        while self._pending and len(batch) < self._max_results:
            pending = self._pending.popleft()
            if pending.answer.done():  # its caller gave up before it left
                continue
            if batch and pending.stub is not batch[0].stub:
                others.append(pending)  # another connection's: a later call takes it
                continue
            task = pending.request.task
            size += pending.request.ByteSize() + _FRAMING_BYTES
            after += len(task.after)
            tags += len(task.tags)
            if batch and (
                size > self._max_bytes
                or after > MAX_SUBMIT_MANY_REFERENCES
                or tags > MAX_SUBMIT_MANY_REFERENCES
            ):
                self._pending.appendleft(pending)  # the next call takes it
                break
            batch.append(pending)
        self._pending.extendleft(reversed(others))
        return batch

    async def _send_all(self) -> None:
        try:
            while batch := self._batch():
                for pending in batch:
                    pending.sent = True
                try:
                    answers = await self._send(batch)
                except asyncio.CancelledError:
                    for pending in batch:  # close(): nobody waits for these any more
                        pending.answer.cancel()
                    raise
                if answers is None:
                    for pending in batch:
                        pending.sent = False
                    self._pending.extendleft(reversed(batch))  # again, in smaller calls
                    continue
                for pending, answer in zip(batch, answers, strict=True):
                    if pending.answer.done():  # its caller gave up meanwhile
                        continue
                    if isinstance(answer, int):
                        pending.answer.set_result(answer)
                    elif answer is None:
                        # The channel was closed under the call: to each caller (not
                        # cancelled itself) a connection broken mid-call, as for its Submit.
                        pending.answer.cancel()
                    else:
                        pending.answer.set_exception(answer)
                # The callers just answered run before the next batch is taken: a caller that
                # submits again at once (a loop of submits) joins it, instead of finding the
                # turn free and sending its submission alone ahead of the others.
                await asyncio.sleep(0)
        finally:
            self._busy = False
            self._start()

    async def _send(self, batch: list[_Pending]) -> list[int | BaseException | None] | None:
        """One call for the batch: each submission's task id or failure (None: the channel
        was closed under the call), or None to send them again in smaller calls."""
        stub = batch[0].stub
        loop = asyncio.get_running_loop()
        deadlines = [p.deadline for p in batch if p.deadline is not None]
        # As long as the most patient caller waits: each caller enforces its own deadline.
        timeout = max(0.0, max(deadlines) - loop.time()) if len(deadlines) == len(batch) else None
        if len(batch) == 1 or stub in self._unary_only:
            return list(await asyncio.gather(*(self._unary(p, timeout) for p in batch)))
        request = pb.SubmitEachRequest(submissions=[p.request for p in batch])
        try:
            reply = await stub.SubmitEach(request, timeout=timeout)
        except aio.AioRpcError as err:
            if err.code() is grpc.StatusCode.UNIMPLEMENTED:
                # A server of an older release, which took none of them: Submit calls from now
                # on, on this connection.
                self._unary_only.add(stub)
                return None
            if request_too_large(err):
                # The server's limit is below this client's: refused whole, it says nothing of
                # any one submission (alone, at worst, the refusal is the submission's).
                self._max_bytes = max(request.ByteSize() // 2, 1)
                return None
            if too_large(err):
                # The answer was over a limit on its way back: the submissions were handled,
                # and any may have been applied. Never sent again blindly.
                self._max_results = max(len(batch) // 2, 1)
                unknown = _unknown(f"the answer was too large to receive: {err.details()}")
                return [unknown] * len(batch)
            return [err] * len(batch)
        except asyncio.CancelledError:
            if not closed_under_call():
                raise
            return [None] * len(batch)
        except Exception as exc:  # the channel closed (UsageError), or a bug below us: still
            return [exc] * len(batch)  # each caller's answer, never a stranded submission
        if len(reply.results) != len(batch):
            # A server that does not keep the protocol: nothing is known of these submissions.
            unknown = _unknown(
                f"the server answered {len(reply.results)} results for {len(batch)} submissions"
            )
            return [unknown] * len(batch)
        return [_answer(result) for result in reply.results]

    @staticmethod
    async def _unary(pending: _Pending, timeout: float | None) -> int | BaseException | None:
        try:
            reply = await pending.stub.Submit(pending.request, timeout=timeout)
        except Exception as exc:  # judged by its caller, as its own Submit's failure
            return exc
        except asyncio.CancelledError:
            if not closed_under_call():
                raise
            return None
        return reply.task_id


def _answer(result: pb.SubmitResult) -> int | grpc.RpcError:
    which = result.WhichOneof("result")
    if which == "task_id":
        return result.task_id
    if which == "refused" and result.refused.reason:
        return rpc_error_of(result.refused)
    return _unknown("the server answered a submission with no result")


def _unknown(message: str) -> aio.AioRpcError:
    """A server that does not keep the protocol: the submission may have been applied."""
    return rpc_error_of(pb.ReportResult(reason=Reason.INTERNAL, message=message))


def _not_sent() -> aio.AioRpcError:
    """A caller's deadline passed while its submission waited: it never left this process."""
    return rpc_error_of(
        pb.ReportResult(
            reason=Reason.NOT_APPLIED,
            message="the call's deadline passed before it was sent (other submissions of "
            "this client were in flight)",
        )
    )


def _deadline_exceeded() -> aio.AioRpcError:
    """A caller's deadline passed while its submission was in flight: what its own Submit
    would have ended with (the outcome is unknown)."""
    return aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED, aio.Metadata(), aio.Metadata(), "Deadline Exceeded"
    )
