"""A server span for each gRPC call (``[tracing] enabled``; docs/tracing.md).

A child of the caller's W3C trace context (its ``traceparent`` metadata), current while the
handler runs, so that what the handler does (a submission the server's Scheduler traces) is
in the caller's trace. Attributes follow OpenTelemetry's RPC conventions: ``rpc.system``,
``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``; a status the conventions count
as a server error marks the span failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeAlias

import grpc
from opentelemetry.trace import Span, Status, StatusCode

from cronoq.tracing import Tracing
from cronoq_server._grpc_metrics import code_of, wrapped_calls

__all__ = ["TracingInterceptor"]

_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
_Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# The codes OpenTelemetry's RPC conventions count as errors of a server span.
_SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def _ended(span: Span, context: _Context, error: BaseException | None) -> None:
    code = code_of(context, error)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, code.name))


class TracingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tracing: Tracing) -> None:
        self._tracing = tracing

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        return wrapped_calls(handler, lambda context: self._traced_call(method, context))

    @contextlib.contextmanager
    def _traced_call(self, method: str, context: _Context) -> Iterator[None]:
        with self._tracing.server_call(method, context.invocation_metadata()) as span:
            error: BaseException | None = None
            try:
                yield
            except BaseException as exc:
                error = exc
                raise
            finally:
                _ended(span, context, error)
