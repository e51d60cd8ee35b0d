"""OpenTelemetry spans of cronoq: the ``otel`` extra (``pip install cronoq[otel]``).

Off unless asked for: a ``Scheduler``, ``AsyncClient`` or ``Worker`` given
``tracing=True`` (the global tracer provider) or ``tracing=<a TracerProvider>`` makes a
``Tracing``; otherwise none exists, this module is never imported, and the only cost on
the paths of a task is a ``None`` check. What the spans are, and why a task's attempts are
children of its submission: ``docs/tracing.md``.

Spans follow OpenTelemetry's semantic conventions for messaging (a task is a message, its pool
the destination, its id the message id) and, for calls over gRPC, for RPC. A submission stores
the W3C trace context of its span with the task (``TraceContext``), so that an
attempt, local or on a remote worker, after any failover, joins the submitter's trace.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from cronoq._model import TraceContext
from cronoq.errors import InvalidArgument

try:  # the otel extra; without it this module imports, and Tracing.of says what is missing
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - the tests run with the extra
    _MISSING: ImportError | None = exc
else:
    _MISSING = None
    _W3C = TraceContextTextMapPropagator()
    _ROOT = Context()  # an empty context: a span started in it is a root (no ambient parent)

__all__ = ["SYSTEM", "Tracing", "rpc_attributes"]

SYSTEM = "cronoq"
"""``messaging.system`` of every span (no registered value names cronoq)."""

_T = TypeVar("_T")


def _version() -> str:
    from cronoq import __version__  # cronoq imports this module lazily: no cycle at import

    return __version__


def rpc_attributes(full_method: str) -> dict[str, str]:
    """The ``rpc.*`` attributes of a gRPC method named ``/package.Service/Method``."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


class Tracing:
    """Makes cronoq's spans with one OpenTelemetry tracer. Built by ``of()``."""

    __slots__ = ("_tracer",)

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("cronoq", _version(), tracer_provider)

    @classmethod
    def of(cls, setting: object, what: str = "tracing") -> Tracing | None:
        """The tracing a ``tracing=`` argument asks for: None for False or None, the global
        tracer provider's for True, that provider's for a ``TracerProvider``."""
        if setting is None or setting is False:
            return None
        if _MISSING is not None:
            raise InvalidArgument(
                f"{what} needs OpenTelemetry's API: pip install 'cronoq[otel]' ({_MISSING})"
            )
        if setting is True:
            return cls()
        if isinstance(setting, cls):
            return setting
        if isinstance(setting, TracerProvider):
            return cls(setting)
        raise InvalidArgument(
            f"{what} must be a bool or an OpenTelemetry TracerProvider, got "
            f"{type(setting).__name__}"
        )

    # --- propagation ------------------------------------------------------------------------

    @staticmethod
    def context_of(span: Span) -> TraceContext | None:
        """The W3C context that makes a span the parent of another (None: not recording)."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, trace.set_span_in_context(span, _ROOT))
        return TraceContext.from_headers(carrier.get("traceparent"), carrier.get("tracestate"))

    @staticmethod
    def inject(span: Span, metadata: list[tuple[str, str]]) -> None:
        """Add ``traceparent`` (and ``tracestate``) of ``span`` to outgoing gRPC metadata."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, trace.set_span_in_context(span, _ROOT))
        metadata.extend(carrier.items())

    @staticmethod
    def _parent(trace_context: TraceContext | None) -> Context:
        if trace_context is None:
            return _ROOT
        carrier = {"traceparent": trace_context.traceparent}
        if trace_context.tracestate:
            carrier["tracestate"] = trace_context.tracestate
        return _W3C.extract(carrier, _ROOT)

    # --- spans ------------------------------------------------------------------------------

    @contextmanager
    def submit(self, pools: Sequence[str], count: int, rpc: str | None = None) -> Iterator[Span]:
        """The span of a submission (``create``, a producer span), current inside the block:
        its context is what the tasks store. ``rpc``: the gRPC method it calls, if any."""
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "create",
            "messaging.operation.name": "submit",
        }
        distinct = set(pools)
        destination = next(iter(distinct)) if len(distinct) == 1 else None
        if destination is not None:
            attributes["messaging.destination.name"] = destination
        if count != 1:
            attributes["messaging.batch.message_count"] = count
        if rpc is not None:
            attributes.update(rpc_attributes(rpc))
        name = f"submit {destination}" if destination is not None else "submit"
        with self._tracer.start_as_current_span(
            name, kind=SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield span

    @staticmethod
    def submitted(span: Span, task_ids: Sequence[int]) -> None:
        """Name the task a single submission created (``messaging.message.id``)."""
        if len(task_ids) == 1:
            span.set_attribute("messaging.message.id", str(task_ids[0]))

    @contextmanager
    def commit(self, mutations: int, epoch: int) -> Iterator[Span]:
        """One store transaction of a step (a root span: it serves many tasks' traces)."""
        with self._tracer.start_as_current_span(
            "commit",
            context=_ROOT,
            attributes={"cronoq.commit.mutations": mutations, "cronoq.epoch": epoch},
        ) as span:
            yield span

    def dispatched(
        self, trace_context: TraceContext | None, pool: str, task_id: int, attempt: int,
        remote: bool,
    ) -> None:  # fmt: skip
        """An attempt released to its executor, in its task's trace (a point in time)."""
        self._tracer.start_span(
            f"dispatch {pool}",
            context=self._parent(trace_context),
            attributes={
                **self._message(pool, task_id, attempt),
                "messaging.operation.name": "dispatch",
                "cronoq.attempt.remote": remote,
            },
        ).end()

    @contextmanager
    def attempt(
        self, trace_context: TraceContext | None, pool: str, task_id: int, attempt: int
    ) -> Iterator[Span]:
        """The span of one attempt (``process``, a consumer span), current inside the block so
        that the function's own spans are its children. A child of the submission's span,
        and linked to it, as the conventions ask of a consumer of one message."""
        parent = self._parent(trace_context)
        creation = trace.get_current_span(parent).get_span_context()
        links = [Link(creation)] if creation.is_valid else None
        attributes = {
            **self._message(pool, task_id, attempt),
            "messaging.operation.type": "process",
            "messaging.operation.name": "run",
        }
        span = self._tracer.start_span(f"run {pool}", parent, SpanKind.CONSUMER, attributes, links)
        with trace.use_span(span, end_on_exit=True):
            yield span

    @staticmethod
    def outcome(error: str | None, retryable: bool = False) -> None:
        """Record how an attempt ended on its span, the current one (``error``: its failure
        message; None: it succeeded)."""
        span = trace.get_current_span()
        if error is None:
            span.set_attribute("cronoq.attempt.outcome", "succeeded")
            return
        span.set_attributes(
            {
                "cronoq.attempt.outcome": "failed",
                "cronoq.attempt.retryable": retryable,
                "error.type": "retryable" if retryable else "not_retryable",
            }
        )
        span.set_status(Status(StatusCode.ERROR, error))

    @contextmanager
    def settle(self, pool: str, task_id: int, attempt: int, rpc: str) -> Iterator[Span]:
        """A worker's report of an attempt's outcome (``settle``, a client span)."""
        attributes = {
            **self._message(pool, task_id, attempt),
            "messaging.operation.type": "settle",
            "messaging.operation.name": "report",
            **rpc_attributes(rpc),
        }
        with self._tracer.start_as_current_span(
            f"report {pool}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            yield span

    @contextmanager
    def server_call(
        self, full_method: str, metadata: Iterable[tuple[str, str | bytes]] | None
    ) -> Iterator[Span]:
        """A gRPC call a server serves (a server span, child of the caller's context)."""
        with self._tracer.start_as_current_span(
            full_method.lstrip("/"),
            context=self._parent(TraceContext.from_metadata(metadata)),
            kind=SpanKind.SERVER,
            attributes=rpc_attributes(full_method),
            # An aborted call raises, with the status it was given: the interceptor judges it.
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            yield span

    @staticmethod
    def _message(pool: str, task_id: int, attempt: int) -> dict[str, Any]:
        return {
            "messaging.system": SYSTEM,
            "messaging.destination.name": pool,
            "messaging.message.id": str(task_id),
            "cronoq.attempt.number": attempt,
        }

    @staticmethod
    def in_context(fn: Callable[..., _T]) -> Callable[..., _T]:
        """``fn`` bound to the current context (its span), for a call on another thread:
        ``run_in_executor`` does not carry context variables over."""
        context = contextvars.copy_context()

        def call(*args: Any) -> _T:
            return context.run(fn, *args)

        return call
