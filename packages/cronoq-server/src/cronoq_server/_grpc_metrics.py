"""Per-method gRPC metrics: calls by method and status code, and their latency.

A server interceptor wraps each call's handler and observes it when the handler ends: its
status code is the one the handler set or aborted with (OK when it set none), ``CANCELLED``
when the call was cancelled (the client left, or its deadline passed), ``UNKNOWN`` when the
handler raised. Every method of the services the server offers, with every status code, is
a series from the start at 0, so that a rate over a code that has not happened yet is 0 and
not missing; a method the server does not know (a typo, a scanner) counts as ``unknown``
(``UNIMPLEMENTED``), so that no client can add series.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, TypeAlias

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2
from prometheus_client import CollectorRegistry, Counter, Histogram

from cronoq_client.protocol import pb

__all__ = ["GrpcMetrics", "MetricsInterceptor", "WrappedHandlers", "code_of", "wrapped_calls"]

UNKNOWN_METHOD = "unknown"
_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"  # generic for the type checker only
_Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
# From a fraction of a millisecond (a Get) to minutes (a Wait, an Attach stream's life).
_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60)


def _methods() -> tuple[str, ...]:
    """``package.Service/Method`` of every method this server offers."""
    return tuple(
        f"{service.full_name}/{method.name}"
        for descriptor in (pb.DESCRIPTOR, health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR)
        for service in descriptor.services_by_name.values()
        for method in service.methods
    )


class GrpcMetrics:
    """The series, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.methods = frozenset(_methods())
        self.calls = Counter(
            "cronoq_grpc_calls",
            "gRPC calls handled, by method and status code.",
            ("method", "code"),
            registry=registry,
        )
        self.seconds = Histogram(
            "cronoq_grpc_call_seconds",
            "gRPC call duration from the handler's start to its end, by method.",
            ("method",),
            buckets=_BUCKETS,
            registry=registry,
        )
        # Each method's series, looked up once: ``labels()`` takes a lock and checks its
        # arguments, a few µs on every call otherwise.
        self._series: dict[str, tuple[dict[grpc.StatusCode, Counter], Histogram]] = {
            method: (
                {code: self.calls.labels(method, code.name) for code in grpc.StatusCode},
                self.seconds.labels(method),
            )
            for method in sorted(self.methods)
        }
        self.calls.labels(UNKNOWN_METHOD, grpc.StatusCode.UNIMPLEMENTED.name)

    def observe(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """One call of ``method``, one of ``methods``."""
        calls, histogram = self._series[method]
        calls[code].inc()
        histogram.observe(seconds)


def code_of(
    context: grpc.aio.ServicerContext[Any, Any], error: BaseException | None
) -> grpc.StatusCode:
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.OK if error is None else grpc.StatusCode.UNKNOWN


_Around: TypeAlias = Callable[[_Context], AbstractContextManager[object]]
"""What an interceptor does around each call: entered when the handler starts, left (with
the handler's exception, if any) when it ends."""


def wrapped_calls(handler: _Handler, around: _Around) -> _Handler:
    """The handler with each call inside ``around(context)``. A response stream is a handler
    that writes with ``context.write`` and returns, or an async generator: either ends when
    its last response is written."""

    def unary(behaviour: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Any, context: _Context) -> Any:
            with around(context):
                return await behaviour(request, context)

        return call

    def streaming(behaviour: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Any, context: _Context) -> None:
            with around(context):
                result = behaviour(request, context)
                if isinstance(result, AsyncIterator):
                    async for response in result:
                        await context.write(response)
                else:
                    await result

        return call

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            unary(handler.unary_unary), handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            streaming(handler.unary_stream),
            handler.request_deserializer,
            handler.response_serializer,
        )
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(
            unary(handler.stream_unary), handler.request_deserializer, handler.response_serializer
        )
    assert handler.stream_stream is not None  # the fourth kind of handler
    return grpc.stream_stream_rpc_method_handler(
        streaming(handler.stream_stream),
        handler.request_deserializer,
        handler.response_serializer,
    )


class WrappedHandlers:
    """An interceptor's wrapped form of each method's handler, made once per handler: gRPC
    asks for the handler on every call and gets the same one back while the method's
    registration stands. One interceptor serves every server object a replica builds (the
    standby's, then the leader's), so a wrapper is reused only for the very handler it wraps:
    the leader must never answer with the standby's service."""

    def __init__(self) -> None:
        self._made: dict[str, tuple[_Handler, _Handler]] = {}  # one entry per method

    def get(self, method: str, handler: _Handler, wrap: Callable[[], _Handler]) -> _Handler:
        made = self._made.get(method)
        if made is None or made[0] is not handler:
            made = self._made[method] = handler, wrap()
        return made[1]


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: GrpcMetrics) -> None:
        self._metrics = metrics
        self._observed = WrappedHandlers()

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[_Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method.lstrip("/")
        if handler is None or method not in self._metrics.methods:
            # gRPC answers UNIMPLEMENTED for a method without a handler.
            self._metrics.calls.labels(UNKNOWN_METHOD, "UNIMPLEMENTED").inc()
            return handler
        return self._observed.get(
            method,
            handler,
            lambda: wrapped_calls(handler, lambda context: self._observed_call(method, context)),
        )

    @contextlib.contextmanager
    def _observed_call(self, method: str, context: _Context) -> Iterator[None]:
        started = time.perf_counter()
        error: BaseException | None = None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._metrics.observe(method, code_of(context, error), time.perf_counter() - started)
