"""The client's retry rule: which failed calls may be tried again, and how long to wait.

A failed call is tried again, on a new connection, when nothing was applied (the server says
so with a STANDBY, STOPPING or NOT_APPLIED reason, or the call never left this process because
no connection could be made), and, when its outcome is unknown, only if the call is idempotent.

"Never left this process" is decided on the status text of gRPC core, since grpcio reports a
refused connection and a connection broken mid-call with the same code (UNAVAILABLE) and no
ErrorInfo. A call fails with one of the texts in ``_NOT_SENT`` only when the channel's load
balancing pick failed: no transport, hence no stream, existed for it. That is the case for a
refused or reset TCP connection, a peer that closes before the HTTP/2 handshake, and a name
that does not resolve. A call that broke after it was sent says something else ("Socket
closed", "Cancelling all calls", "max connection age", a GOAWAY, a deadline) and stays unknown.

A call can also reach a server and never be taken up: gRPC core holds a call that arrived
until the server's event loop asks for the next one, and a server object that stops kills the
calls still held so (a replica's standby object, stopped once the replica leads; a loaded
loop takes longer to ask). The client sees CANCELLED with the bare text "CANCELLED" and no
metadata at all (``never_handled``). A cronoq server never cuts off a handler that took a call
(the standby's refuse at once; the leader's object stops only once its scheduler answered
every call, with seconds for the answers to leave), and a handler that took one answers with
trailing metadata, so such a call applied nothing and is retried like a refused connection.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

import grpc

from cronoq_client._status import Outcome, error_info, outcome, tls_refused

__all__ = ["Backoff", "Verdict", "judge", "never_handled", "never_sent"]

_NOT_SENT = (
    # pick_first / round_robin, every subchannel in TRANSIENT_FAILURE (refused, reset, closed
    # before the handshake): "failed to connect to all addresses; last error: ..."
    "failed to connect to all addresses",
    # the resolver failed: "errors resolving host:port: ..." (grpcio >= 1.60), and older texts
    "errors resolving ",
    "DNS resolution failed",
    "name resolution failed",
)


class Verdict(Enum):
    RETRY = "retry"
    """Nothing was applied, or the call is idempotent: try again on a new connection."""
    RAISE = "raise"
    """A definite answer, or an unknown outcome of a call that must not be repeated."""


def never_sent(err: grpc.RpcError) -> bool:
    """True if the call failed before any connection carried it (see the module's text)."""
    if not isinstance(err, grpc.aio.AioRpcError) or err.code() is not grpc.StatusCode.UNAVAILABLE:
        return False
    if error_info(err) is not None:
        return False  # a server answered: its reason decides
    details = err.details() or ""
    return details.startswith(_NOT_SENT)


_KILLED_UNTAKEN = "CANCELLED"
"""gRPC core's whole text for a call it killed without a status of the server's."""


def never_handled(err: grpc.RpcError) -> bool:
    """True if a server killed the call before any handler took it (see the module's text)."""
    if not isinstance(err, grpc.aio.AioRpcError) or err.code() is not grpc.StatusCode.CANCELLED:
        return False
    return (
        err.details() == _KILLED_UNTAKEN
        and not err.initial_metadata()
        and not err.trailing_metadata()
    )


def judge(err: grpc.RpcError, *, idempotent: bool) -> Verdict:
    if tls_refused(err):
        return Verdict.RAISE  # a credential, not a passing failure
    if never_sent(err) or never_handled(err):
        return Verdict.RETRY
    result = outcome(err)
    if result is Outcome.NOT_APPLIED or (result is Outcome.UNKNOWN and idempotent):
        return Verdict.RETRY
    return Verdict.RAISE


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with full jitter: try n (from 0) sleeps uniformly in
    [0, min(cap, base * factor**n)], so that clients thrown off one replica together do not
    reach the next one together."""

    base: float = 0.05
    cap: float = 2.0
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        # min() before the power could overflow: 2.0**1100 is an OverflowError.
        ceiling = self.cap if attempt > 64 else min(self.cap, self.base * self.factor**attempt)
        return random.uniform(0.0, ceiling)
