"""The gRPC services: each call is one call of the leading replica's ``Scheduler``.

Translation only: the request is decoded by the protocol's conversions (bad input is
``InvalidArgument`` there or in the Scheduler), the Scheduler decides, and its answer or
exception goes back through the protocol's status mapping. A replica that does not lead answers
``UNAVAILABLE`` with the reason ``STANDBY``, one that is shutting down with ``STOPPING``.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from cronoq import (
    CancelRequested,
    CheckedTask,
    LeasedAttempt,
    LeaseRenewed,
    Scheduler,
    TaskInfo,
    TaskRequest,
    TraceContext,
    WorkerLink,
    preview,
)
from cronoq.errors import (
    CronoqError,
    InvalidArgument,
    PayloadError,
    PermissionDenied,
    WaitTimedOut,
)
from cronoq_client import protocol as wire
from cronoq_client.protocol import pb, pb_grpc
from cronoq_server._auth import (
    authorize_attempt,
    authorize_pool,
    authorize_tasks,
    caller_identity,
    key_refused,
    key_scope,
    refusals_tallied,
)
from cronoq_server._config import NO_OUTBOX
from cronoq_server._links import Links
from cronoq_server._replica import NotServing, Replica

__all__ = ["Arrivals", "SchedulerService", "WorkerService", "add_services"]

log = logging.getLogger("cronoq.server")

_Request = TypeVar("_Request")
_Reply = TypeVar("_Reply")
_Outcome = TypeVar("_Outcome")


@dataclass(frozen=True, slots=True)
class _Undecodable:
    """What a handler receives for request bytes that are not its message."""

    error: InvalidArgument


def _decoder(message_type: type[Message]) -> Callable[[bytes], Message | _Undecodable]:
    # grpcio answers a request its deserializer refuses with UNKNOWN, before any handler runs:
    # the refusal is handed to the handler instead, which raises it as bad input.
    def decode(data: bytes) -> Message | _Undecodable:
        try:
            return wire.parse(message_type, data)
        except InvalidArgument as exc:
            return _Undecodable(exc)

    return decode


def _decoded(request: Any) -> None:
    if isinstance(request, _Undecodable):
        raise request.error


def add_services(
    server: grpc.aio.Server, scheduler: SchedulerService, worker: WorkerService
) -> None:
    """Both services on ``server``, as ``pb_grpc.add_*_to_server`` would add them but with
    deserializers that never fail (see ``_decoder``)."""
    for servicer, name in ((scheduler, "SchedulerService"), (worker, "WorkerService")):
        service = pb.DESCRIPTOR.services_by_name[name]
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
        for method in service.methods:
            make = (
                grpc.unary_stream_rpc_method_handler
                if method.server_streaming
                else grpc.unary_unary_rpc_method_handler
            )
            handlers[method.name] = make(
                getattr(servicer, method.name),
                request_deserializer=_decoder(getattr(pb, method.input_type.name)),
                response_serializer=getattr(pb, method.output_type.name).SerializeToString,
            )
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service.full_name, handlers),)
        )
        server.add_registered_method_handlers(service.full_name, handlers)


async def _abort(context: grpc.aio.ServicerContext[Any, Any], exc: BaseException) -> None:
    if isinstance(exc, NotServing):
        await context.abort_with_status(
            wire.rich_status(grpc.StatusCode.UNAVAILABLE, str(exc), exc.reason)
        )
    if not isinstance(exc, CronoqError):
        log.exception("internal error in a call", exc_info=exc)
    await context.abort_with_status(wire.status_for(exc))


def _unary(
    body: Callable[[Any, _Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[_Reply]],
) -> Callable[[Any, _Request, grpc.aio.ServicerContext[Any, Any]], Awaitable[_Reply]]:
    """Run a handler; map what it raises to a status. Bad input never becomes INTERNAL:
    every decoding error is InvalidArgument."""

    async def handler(
        self: Any, request: _Request, context: grpc.aio.ServicerContext[Any, Any]
    ) -> _Reply:
        self.arrivals.arrived()
        try:
            _decoded(request)
            return await body(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc)
            raise AssertionError("abort_with_status returns only by raising") from exc

    handler.__name__ = body.__name__
    handler.__doc__ = body.__doc__
    return handler


class Arrivals:
    """When the last call reached one server object. A server that stops kills the calls that
    reached it but no handler yet (gRPC core's pending calls), which their clients see as
    CANCELLED, an unknown outcome; so it is stopped once calls stopped coming: each was
    refused (``NotServing``) and its client went on a new connection."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def arrived(self) -> None:
        self._last = time.monotonic()

    async def quiet(self, period: float, limit: float) -> None:
        """Return once no call came for ``period`` seconds, or after ``limit`` seconds."""
        deadline = time.monotonic() + limit
        # A sleep to the end known so far: an arrival only pushes that end further.
        while True:
            end = min(self._last + period, deadline)
            now = time.monotonic()
            if now >= end:
                return
            await asyncio.sleep(end - now)


def _refuse_on_standby_server(replica: Replica, leader_server: bool) -> None:
    """A call that reached the server object of a standby is refused, even if the replica leads
    by now: that object is being stopped, and a call it took into the scheduler could outlast
    its grace period and be cancelled, an unknown outcome for a call the client must then not
    repeat. Refused, nothing is applied and the client retries on a new connection."""
    if not leader_server:
        raise NotServing(f"this replica is a standby ({replica.reason})", "STANDBY")


class SchedulerService(pb_grpc.SchedulerServiceServicer):
    """Every message it sends fits ``max_message_bytes``: a task is accepted only if its
    attempt fits (``check_attempts_fit``), a reply leaves out a payload or output that would
    not (``fitted_task_info``), and ``GetTaskData`` sends one alone."""

    def __init__(
        self,
        replica: Replica,
        max_message_bytes: int,
        *,
        leader_server: bool = True,
        arrivals: Arrivals | None = None,
        links: Links | None = None,
    ) -> None:
        """``links``: the worker links of this server object, shared with its WorkerService
        (ListWorkers lists them)."""
        self._replica = replica
        self._max_message_bytes = max_message_bytes
        self._leader_server = leader_server
        self.arrivals = Arrivals() if arrivals is None else arrivals
        self._links = Links() if links is None else links

    def _leader(self) -> Scheduler:
        _refuse_on_standby_server(self._replica, self._leader_server)
        return self._replica.leader()

    @_unary
    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        # Authorized before any field is checked: an UnknownPool would name the pools.
        authorize_pool("submit", *wire.pool_and_kind(request.task))
        sched = self._leader()
        # The client's trace context goes with the task (and counts in its attempt's size).
        trace = TraceContext.from_metadata(context.invocation_metadata())
        return pb.SubmitResponse(task_id=await self._submit(sched, request, trace))

    @_unary
    async def SubmitEach(
        self, request: pb.SubmitEachRequest, context: Any
    ) -> pb.SubmitEachResponse:
        submissions = wire.submit_each_requests(request)
        sched = self._leader()
        trace = TraceContext.from_metadata(context.invocation_metadata())
        # Each submission is a Scheduler call of its own, all queued before the driver's next
        # step runs: those accepted are applied in one step and committed together. Those
        # refused for their pool, kind or key are logged in one line, not one each.
        with refusals_tallied():
            outcomes = await asyncio.gather(
                *(self._authorized_submit(sched, s, trace) for s in submissions),
                return_exceptions=True,
            )
        # Every failure is that submission's own answer, not the call's: once one was applied
        # the call cannot fail as a whole without the client repeating it (a scheduler that
        # stops within the step may still refuse the next with STOPPING).
        for failure in outcomes:
            if isinstance(failure, BaseException) and not isinstance(failure, CronoqError):
                log.error("internal error in a submission", exc_info=failure)
        return pb.SubmitEachResponse(results=map(wire.submit_result, outcomes))

    async def _authorized_submit(
        self, sched: Scheduler, request: pb.SubmitRequest, trace: TraceContext | None
    ) -> int:
        authorize_pool("submit", *wire.pool_and_kind(request.task))
        return await self._submit(sched, request, trace)

    async def _submit(
        self, sched: Scheduler, request: pb.SubmitRequest, trace: TraceContext | None
    ) -> int:
        """A Submit's task, decoded, checked and submitted: its id."""
        task = wire.task_spec_from_pb(request.task, sched, time.time_ns(), trace)
        wire.check_attempts_fit(request, [task.spec], self._max_message_bytes)
        [task_id] = await _submit_specs(sched, [task])
        return task_id

    @_unary
    async def SubmitMany(
        self, request: pb.SubmitManyRequest, context: Any
    ) -> pb.SubmitManyResponse:
        tasks = wire.submit_many_tasks(request)
        # The compact form's one common request stands for each of its payloads.
        copies = max(1, len(request.payloads)) if request.HasField("common") else 1
        authorize_tasks(map(wire.pool_and_kind, tasks), copies)
        sched = self._leader()
        trace = TraceContext.from_metadata(context.invocation_metadata())
        specs = wire.submit_many_specs(request, sched, time.time_ns(), trace)
        wire.check_attempts_fit(request, [t.spec for t in specs], self._max_message_bytes)
        return pb.SubmitManyResponse(task_ids=await _submit_specs(sched, specs))

    def _task(
        self, info: TaskInfo, request: pb.GetRequest | pb.GetByKeyRequest | pb.WaitRequest
    ) -> pb.TaskInfo:
        return wire.fitted_task_info(
            info,
            payload=request.include_payload,
            output=request.include_output,
            limit=self._max_message_bytes,
        )

    @_unary
    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskInfo:
        return self._task(await self._leader().get(request.task_id), request)

    @_unary
    async def GetByKey(self, request: pb.GetByKeyRequest, context: Any) -> pb.GetByKeyResponse:
        found = await self._leader().get_by_key(request.key)
        if found is None:
            return pb.GetByKeyResponse()
        # The reply adds the field's tag and length to the task (at most 6 bytes).
        task = wire.fitted_task_info(
            found,
            payload=request.include_payload,
            output=request.include_output,
            limit=self._max_message_bytes - 6,
        )
        return pb.GetByKeyResponse(task=task)

    @_unary
    async def GetTaskData(
        self, request: pb.GetTaskDataRequest, context: Any
    ) -> pb.GetTaskDataResponse:
        if request.data not in (pb.TASK_DATA_PAYLOAD, pb.TASK_DATA_OUTPUT):
            raise InvalidArgument(f"data must be PAYLOAD or OUTPUT, got {request.data}")
        info = await self._leader().get(request.task_id)
        value = info.payload if request.data == pb.TASK_DATA_PAYLOAD else info.output
        return wire.task_data_response(value, info.task_id, self._max_message_bytes)

    @_unary
    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListResponse:
        options = wire.list_kwargs(request)
        asked = options.get("limit")
        if asked is None or asked > wire.MAX_LIST_PAGE:
            # A longer page ends early with a token: the reply is bounded, and so is the work
            # of one call on the event loop.
            options["limit"] = wire.MAX_LIST_PAGE
        tasks = await self._leader().list(**options)
        return wire.list_response_to_pb(tasks, options["limit"], self._max_message_bytes)

    @_unary
    async def Wait(self, request: pb.WaitRequest, context: Any) -> pb.TaskInfo:
        options = wire.wait_kwargs(request)
        sched = self._leader()
        remaining = context.time_remaining()
        if remaining is None:
            return self._task(await sched.wait(**options), request)
        # The call's own deadline bounds the wait too: answered before the client gives up.
        # Around the wait, not in place of its timeout, which is still the Scheduler's to
        # check (ten years and more is INVALID_ARGUMENT, whatever the deadline).
        timer = asyncio.timeout(remaining)
        try:
            async with timer:
                info = await sched.wait(**options)
        except TimeoutError:
            if not timer.expired():
                raise  # the Scheduler's own WaitTimedOut
            raise WaitTimedOut(
                f"task {request.task_id} did not finish within the call's deadline"
            ) from None
        return self._task(info, request)

    @_unary
    async def Cancel(self, request: pb.CancelRequest, context: Any) -> pb.CancelResponse:
        status = await self._leader().cancel(**wire.cancel_kwargs(request))
        return pb.CancelResponse(status=wire.status_to_pb(status))

    @_unary
    async def AddSchedule(self, request: pb.AddScheduleRequest, context: Any) -> pb.ScheduleInfo:
        options = wire.add_schedule_kwargs(request)
        template = TaskRequest(
            options["kind"],
            options.get("payload"),
            options.get("pool", "default"),
            tags=options["tags"],
            name=options["name"],
            timeout=options.get("timeout"),
        )
        wire.check_attempts_fit(request, [template], self._max_message_bytes)
        return wire.schedule_info_to_pb(await self._leader().add_schedule(**options))

    @_unary
    async def PauseSchedule(
        self, request: pb.PauseScheduleRequest, context: Any
    ) -> pb.ScheduleInfo:
        return wire.schedule_info_to_pb(await self._leader().pause_schedule(request.name))

    @_unary
    async def ResumeSchedule(
        self, request: pb.ResumeScheduleRequest, context: Any
    ) -> pb.ScheduleInfo:
        return wire.schedule_info_to_pb(await self._leader().resume_schedule(request.name))

    @_unary
    async def RemoveSchedule(
        self, request: pb.RemoveScheduleRequest, context: Any
    ) -> pb.RemoveScheduleResponse:
        await self._leader().remove_schedule(request.name)
        return pb.RemoveScheduleResponse()

    @_unary
    async def ListSchedules(
        self, request: pb.ListSchedulesRequest, context: Any
    ) -> pb.ListSchedulesResponse:
        schedules = await self._leader().list_schedules()
        return pb.ListSchedulesResponse(schedules=[wire.schedule_info_to_pb(s) for s in schedules])

    @_unary
    async def PreviewSchedule(
        self, request: pb.PreviewScheduleRequest, context: Any
    ) -> pb.PreviewScheduleResponse:
        # Pure computation, but answered by the leader only, as every call is: a standby's
        # answer would mislead a client into staying on its connection. In a thread: 10,000
        # occurrences take about 0.2 s, which would hold up every other call (and the
        # leadership's renewal) on the event loop.
        self._leader()
        occurrences = await asyncio.to_thread(preview, **wire.preview_kwargs(request))
        return wire.preview_response_to_pb(occurrences)

    # --- operator calls (issue 21) ----------------------------------------------------------

    @_unary
    async def PausePool(self, request: pb.PausePoolRequest, context: Any) -> pb.PoolInfo:
        return wire.pool_info_to_pb(await self._leader().pause_pool(request.name))

    @_unary
    async def ResumePool(self, request: pb.ResumePoolRequest, context: Any) -> pb.PoolInfo:
        return wire.pool_info_to_pb(await self._leader().resume_pool(request.name))

    @_unary
    async def ListPools(self, request: pb.ListPoolsRequest, context: Any) -> pb.ListPoolsResponse:
        pools = await self._leader().list_pools()
        return pb.ListPoolsResponse(pools=[wire.pool_info_to_pb(p) for p in pools])

    @_unary
    async def ListLimits(
        self, request: pb.ListLimitsRequest, context: Any
    ) -> pb.ListLimitsResponse:
        limits = await self._leader().list_limits(**wire.list_limits_kwargs(request))
        return wire.list_limits_response_to_pb(limits, self._max_message_bytes)

    @_unary
    async def Retry(self, request: pb.RetryRequest, context: Any) -> pb.TaskInfo:
        info = await self._leader().retry(request.task_id)
        return wire.fitted_task_info(
            info, payload=request.include_payload, output=False, limit=self._max_message_bytes
        )

    @_unary
    async def Rerun(self, request: pb.RerunRequest, context: Any) -> pb.RerunResponse:
        return pb.RerunResponse(task_id=await self._leader().rerun(request.task_id))

    # --- why a task is where it is (issue 32) -----------------------------------------------

    @_unary
    async def Explain(self, request: pb.ExplainRequest, context: Any) -> pb.Explanation:
        explanation = await self._leader().explain(request.task_id)
        return wire.explanation_response(explanation, self._max_message_bytes)

    @_unary
    async def ListOccurrences(
        self, request: pb.ListOccurrencesRequest, context: Any
    ) -> pb.ListOccurrencesResponse:
        options = wire.list_occurrences_kwargs(request)
        records = await self._leader().occurrences(**options)
        return wire.occurrences_response_to_pb(records, options["limit"], self._max_message_bytes)

    @_unary
    async def GetAttempts(
        self, request: pb.GetAttemptsRequest, context: Any
    ) -> pb.GetAttemptsResponse:
        attempts = await self._leader().attempts(request.task_id)
        later = [attempt for attempt in attempts if attempt.attempt > request.after]
        return wire.attempts_response_to_pb(later, self._max_message_bytes)

    @_unary
    async def GetDependants(
        self, request: pb.GetDependantsRequest, context: Any
    ) -> pb.GetDependantsResponse:
        task_ids = await self._leader().dependants(request.task_id)
        later = task_ids[bisect.bisect_right(task_ids, request.after) :]  # ascending
        return wire.dependants_response_to_pb(later, self._max_message_bytes)

    @_unary
    async def TriggerSchedule(
        self, request: pb.TriggerScheduleRequest, context: Any
    ) -> pb.TriggerScheduleResponse:
        task_id = await self._leader().trigger_schedule(request.name)
        return pb.TriggerScheduleResponse(task_id=task_id)

    @_unary
    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: Any
    ) -> pb.ListWorkersResponse:
        # The leader's links: a standby holds none (its workers attach to the leader).
        self._leader()
        workers = self._links.workers()
        return pb.ListWorkersResponse(workers=[wire.worker_info_to_pb(w) for w in workers])

    # --- the outbox -------------------------------------------------------------------------

    def _outbox_leader(self) -> Scheduler:
        """The leader, which must ingest an outbox (a standby answers as for every call)."""
        sched = self._leader()
        if not sched.has_outbox:
            raise wire.NoOutbox(NO_OUTBOX)
        return sched

    @_unary
    async def OutboxStatus(
        self, request: pb.OutboxStatusRequest, context: Any
    ) -> pb.OutboxStatusResponse:
        sched = self._outbox_leader()
        stats = await sched.outbox_stats()
        counters = sched.metrics(gauges=False)  # the counters alone: no pass over the tasks
        return wire.outbox_status_to_pb(
            stats,
            ingested=counters.outbox_ingested,
            quarantined=counters.outbox_quarantined,
            now_ns=time.time_ns(),
        )

    @_unary
    async def ListOutboxQuarantine(
        self, request: pb.ListOutboxQuarantineRequest, context: Any
    ) -> pb.ListOutboxQuarantineResponse:
        options = wire.outbox_quarantine_kwargs(request)
        sched = self._outbox_leader()
        rows = await sched.outbox_quarantine(**options)
        return wire.outbox_quarantine_response_to_pb(
            rows, options["limit"], self._max_message_bytes
        )

    @_unary
    async def RequeueOutbox(
        self, request: pb.RequeueOutboxRequest, context: Any
    ) -> pb.RequeueOutboxResponse:
        count = await self._outbox_leader().requeue_outbox(request.row_ids)
        return pb.RequeueOutboxResponse(count=count)

    @_unary
    async def DiscardOutbox(
        self, request: pb.DiscardOutboxRequest, context: Any
    ) -> pb.DiscardOutboxResponse:
        count = await self._outbox_leader().discard_outbox(request.row_ids)
        return pb.DiscardOutboxResponse(count=count)


_MAX_EVENTS_PER_MESSAGE = 512
_EVENT_FRAMING_BYTES = 6
"""A repeated field's element costs its tag (1 byte) and length (up to 5) beyond its size."""


class WorkerService(pb_grpc.WorkerServiceServicer):
    """Attach is a server stream: attempts and cancellations are pushed the moment the
    scheduler releases them (no polling), all that are ready in one message; heartbeats and
    reports are unary calls, so that each gets its own status and a report can be retried on a
    new connection."""

    def __init__(
        self,
        replica: Replica,
        max_message_bytes: int,
        *,
        leader_server: bool = True,
        arrivals: Arrivals | None = None,
        links: Links | None = None,
    ) -> None:
        self._replica = replica
        self._max_message_bytes = max_message_bytes
        self._leader_server = leader_server
        self.arrivals = Arrivals() if arrivals is None else arrivals
        self._links = Links() if links is None else links

    def _leader(self, *, leasing: bool = False, reporting: bool = False) -> Scheduler:
        _refuse_on_standby_server(self._replica, self._leader_server)
        return self._replica.leader(leasing=leasing, reporting=reporting)

    async def Attach(  # type: ignore[override]  # writes with context.write, not yield
        self, request: pb.AttachRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        self.arrivals.arrived()
        try:
            _decoded(request)
            sched = self._leader(leasing=True)
            options = wire.attach_kwargs(request)
            for pool in options["pools"]:
                authorize_pool("work", pool)
            # And the attempts it says it runs: one of a pool it may not work on would move
            # to this link, with its cancellation. Checked before anything moves, as a
            # heartbeat of each would be (an attempt this scheduler did not lease is left to
            # it: it becomes a claim that moves nothing until a heartbeat proves it).
            for token, lease_id in options["running"]:
                authorize_attempt(sched, token, lease_id)
            worker_limit = wire.attach_message_limit(request)
            if worker_limit is not None and worker_limit < self._max_message_bytes:
                # An attempt as large as the server takes would break this worker's stream,
                # again at every retry: refused now, with what to change.
                raise InvalidArgument(
                    f"this worker accepts messages of at most {worker_limit} bytes, below "
                    f"the server's limit of {self._max_message_bytes}: an attempt could be too "
                    "large for it (raise the worker's max_message_bytes)"
                )
            link = self._links.attach(
                sched, context.peer(), options, request.worker_id, caller_identity()
            )
        except Exception as exc:
            await _abort(context, exc)
            return
        log.info("worker attached", extra={"worker": request.worker_id, "pools": options["pools"]})
        # Taken from the link but left for the next message (it would not fit in this one),
        # with its encoding (its parents' outputs are read once).
        carried: tuple[LeasedAttempt | CancelRequested, pb.WorkerEvent] | None = None
        # The events of the message being put together, taken from the link and not yet
        # written: if the stream ends before its write begins (reading a parent's output
        # awaits), they go back uncounted.
        taken: list[LeasedAttempt | CancelRequested] = []
        try:
            attached = wire.Attached(sched.epoch or 0, self._replica.leases)
            await context.write(wire.worker_events_to_pb([attached]))
            while True:
                if carried is not None:
                    (first, encoded), carried = carried, None
                else:
                    try:
                        first = await link.next()
                    except CronoqError as exc:  # detached, or the scheduler stopped
                        await _abort(context, exc)
                        return
                    found = await _event_to_pb(sched, link, first, self._max_message_bytes)
                    if found is None:
                        continue
                    encoded = found
                message = pb.AttachResponse(events=[encoded])
                size = message.ByteSize()
                if size > self._max_message_bytes and isinstance(first, LeasedAttempt):
                    await _fail_unsendable(sched, first, encoded, size, self._max_message_bytes)
                    continue
                taken = [first]
                # Whatever else is ready leaves with it: under load a worker gets its attempts
                # a batch per message, and alone one at once (nothing waits to fill a batch).
                while link.queued and len(message.events) < _MAX_EVENTS_PER_MESSAGE:
                    event = await link.next()
                    found = await _event_to_pb(sched, link, event, self._max_message_bytes)
                    if found is None:
                        continue
                    size += found.ByteSize() + _EVENT_FRAMING_BYTES
                    if size > self._max_message_bytes:
                        carried = (event, found)
                        break
                    message.events.append(found)
                    taken.append(event)
                # Once a write began, its attempts may have reached the worker even if the
                # write raises (a stream cancelled mid-write): they count, and are retried
                # after their lease if the worker never got them. Only attempts that never
                # left go back uncounted: the carried one, those of a message whose write
                # had not begun, and those still queued in the link when it closes.
                taken = []  # from here on, they may have left
                await context.write(message)
        finally:
            for event in taken:
                link.unsent(event)
            if carried is not None:
                link.unsent(carried[0])
            link.close()
            self._links.detach(link)
            log.info("worker detached", extra={"worker": request.worker_id})

    @_unary
    async def Heartbeat(self, request: pb.HeartbeatRequest, context: Any) -> pb.HeartbeatResponse:
        renewed = await _heartbeat(self._leader(reporting=True), request)
        return wire.lease_renewed_to_pb(renewed)

    @_unary
    async def HeartbeatMany(
        self, request: pb.HeartbeatManyRequest, context: Any
    ) -> pb.HeartbeatManyResponse:
        heartbeats = wire.heartbeat_many_from_pb(request)
        sched = self._leader(reporting=True)
        # Each heartbeat is a Scheduler call of its own, queued before the driver's next step
        # runs: those of one call are applied in one step (a heartbeat commits nothing).
        with refusals_tallied():
            outcomes = await asyncio.gather(
                *(_heartbeat(sched, heartbeat) for heartbeat in heartbeats),
                return_exceptions=True,
            )
        return pb.HeartbeatManyResponse(results=map(wire.heartbeat_result, _each(outcomes)))

    @_unary
    async def Report(self, request: pb.ReportRequest, context: Any) -> pb.ReportResponse:
        await _report(self._leader(reporting=True), request)
        return pb.ReportResponse()

    @_unary
    async def ReportMany(
        self, request: pb.ReportManyRequest, context: Any
    ) -> pb.ReportManyResponse:
        sched = self._leader(reporting=True)
        reports = wire.report_many_from_pb(request)
        # Each report is a Scheduler call of its own; those that arrive together are judged
        # in one step and committed together.
        with refusals_tallied():
            outcomes = await asyncio.gather(
                *(_report(sched, report) for report in reports), return_exceptions=True
            )
        return pb.ReportManyResponse(results=map(wire.report_result, _each(outcomes)))


async def _submit_specs(sched: Scheduler, tasks: list[CheckedTask]) -> list[int]:
    """``sched.submit_specs``, whose keys answer only with tasks inside the caller's grant:
    a key held by another pool's (or kind's) task refuses the call, applying nothing and
    naming no task (docs/security.md, "Keys")."""
    try:
        return await sched.submit_specs(tasks, **key_scope())
    except PermissionDenied as exc:
        raise key_refused(exc) from None


def _each(outcomes: Sequence[_Outcome | BaseException]) -> list[_Outcome | CronoqError]:
    """The outcome of each call of a batch, a refusal for good standing as that call's answer.
    Any other failure is not known for every call: the batch fails as a whole, and the worker
    sends it all again (a repeat of a report that landed is answered stale; a repeated
    heartbeat renews again)."""
    answers: list[_Outcome | CronoqError] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            if not isinstance(outcome, CronoqError) or not wire.refused_for_good(outcome):
                raise outcome
            answers.append(outcome)
        else:
            answers.append(outcome)
    return answers


async def _heartbeat(sched: Scheduler, request: pb.HeartbeatRequest) -> LeaseRenewed:
    token, lease_id = wire.heartbeat_token(request)
    authorize_attempt(sched, token, lease_id)
    return await sched.heartbeat(token, lease_id=lease_id)


async def _report(sched: Scheduler, request: pb.ReportRequest) -> None:
    token, lease_id, outcome = wire.report_from_pb(request)
    authorize_attempt(sched, token, lease_id)
    if isinstance(outcome, wire.ReportSuccess):
        await sched.report_success(token, outcome.output, lease_id=lease_id)
    else:
        await sched.report_failure(
            token,
            outcome.message,
            lease_id=lease_id,
            retryable=outcome.retryable,
            retry_after=outcome.retry_after,
            traceback=outcome.traceback,
        )


async def _event_to_pb(
    sched: Scheduler, link: WorkerLink, event: LeasedAttempt | CancelRequested, max_bytes: int
) -> pb.WorkerEvent | None:
    """An event of ``link`` as the stream carries it: an attempt with the stored outputs of
    its parents, read here (``Scheduler.parent_outputs``, at most ``max_bytes`` of them) for
    the worker to decode with its codec. None: the attempt was failed instead, as a local
    pool's would be: retryable if the outputs could not be read (the next attempt may find
    the store again), for good if they are too large for any message."""
    if not isinstance(event, LeasedAttempt) or not event.after:
        return wire.worker_event_to_pb(event)
    try:
        parents = await sched.parent_outputs(event.after, max_bytes=max_bytes)
    except PayloadError as exc:
        log.warning("attempt too large to send", extra={"task_id": event.token.task_id})
        message = (
            f"{exc}: over the server's message limit of {max_bytes}, so no worker can be sent "
            "it (make the parents' outputs smaller, or raise limits.max_message_bytes)"
        )
        await _fail_attempt(sched, event, message, retryable=False)
        return None
    except CronoqError as exc:
        log.warning("parents' outputs unreadable", extra={"task_id": event.token.task_id})
        await _fail_attempt(
            sched, event, f"the outputs of its parents could not be read: {exc}", retryable=True
        )
        return None
    except BaseException:
        # The stream ended (cancelled) while they were read: the attempt never left, so it
        # goes back to its queue uncounted, as one that could not be written.
        link.unsent(event)
        raise
    return wire.worker_event_to_pb(wire.RemoteAttempt.carrying(event, parents))


async def _fail_unsendable(
    sched: Scheduler, attempt: LeasedAttempt, encoded: pb.WorkerEvent, size: int, limit: int
) -> None:
    """An attempt too large for any stream message (its task was accepted before the limit
    counted the attempt, or under a larger one; or its parents' outputs, which no submission
    could count, fill the message) fails for good instead of breaking the stream of every
    worker it is sent to: the next attempt would be as large."""
    parents = encoded.attempt.parents
    outputs = sum(parent.ByteSize() for parent in parents)
    if parents and size - outputs <= limit:
        message = (
            f"the outputs of its {len(parents)} parents take {outputs} bytes: the attempt would "
            f"take {size} bytes with them, over the server's message limit of {limit}, so no "
            "worker can be sent it (make the parents' outputs smaller, or raise "
            "limits.max_message_bytes)"
        )
    else:
        message = (
            f"the attempt takes {size} bytes, over the server's message limit of {limit}: "
            "no worker can be sent it (resubmit with a smaller payload)"
        )
    log.warning("attempt too large to send", extra={"task_id": attempt.token.task_id})
    await _fail_attempt(sched, attempt, message, retryable=False)


async def _fail_attempt(
    sched: Scheduler, attempt: LeasedAttempt, message: str, *, retryable: bool
) -> None:
    """Report an attempt that never left the server failed, as its worker would have."""
    with contextlib.suppress(CronoqError):  # already finished, or the scheduler stopped
        await sched.report_failure(
            attempt.token, message, lease_id=attempt.lease_id, retryable=retryable
        )
