"""The dashboard's sessions, what a signed-in browser's cookie stands for, and the bounds on
signing in.

The cookie holds a random session id, never the token: the server keeps, under the id's
SHA-256 digest, the identity's grant, the token's digest (so that a token revoked by a reload
of the tokens file ends its sessions at the next request), the session's CSRF token and its
expiry.

Memory is bounded without letting one identity end another's sessions (issue 29 item 5):

- each identity holds at most ``per_identity`` sessions: its next sign-in ends its own oldest
  one (a person signing in from another browser), never another identity's;
- over all identities at most ``limit``: past it a sign-in is refused (``SessionsFull``)
  until a session ends, rather than dropping someone else's;
- failed sign-in attempts are rate limited per peer address (``SignInLimiter``): a token
  guesser gets ten tries a minute. A valid token is never charged, and failures over all
  peers only raise an alarm (a log line), so that nobody, from however many addresses, can
  lock the operators out by failing on purpose; a flood of sign-ins of a valid token is
  bounded by its identity's own share of sessions.

The anonymous sessions of a dashboard without authentication (one per browser, for its CSRF
token) all belong to one identity: they share the overall ``limit``, the oldest dropped.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cronoq_server._auth import Grant

__all__ = [
    "MAX_SESSIONS",
    "MAX_SESSIONS_PER_IDENTITY",
    "SESSION_LIFETIME_S",
    "SIGN_INS_OVERALL",
    "SIGN_INS_PER_PEER",
    "Limited",
    "Session",
    "Sessions",
    "SessionsFull",
    "SignInLimiter",
]

SESSION_LIFETIME_S = 12 * 3600.0
"""A session ends this long after sign-in, whatever its use: a working day."""
MAX_SESSIONS = 10_000
"""Sessions over all identities; past it a sign-in is refused until one ends."""
MAX_SESSIONS_PER_IDENTITY = 20
"""Sessions of one identity (its browsers and devices); its next sign-in ends its oldest."""
SIGN_INS_PER_PEER = (10, 60.0)
"""Failed sign-ins from one peer address: 10 at once, then one every 6 s (10 a minute)."""
SIGN_INS_OVERALL = (100, 60.0)
"""Failed sign-ins from all peers together before the alarm: 100 at once, then 100 a
minute."""
MAX_PEERS_TRACKED = 10_000
"""Peer addresses whose sign-in budget is remembered; the least recently seen is forgotten
first (it starts again with a full budget)."""


@dataclass(slots=True)
class Session:
    grant: Grant
    token_digest: bytes | None
    """None: authentication is off (an anonymous session, for its CSRF token)."""
    csrf: str
    expires: float
    notice: tuple[str, str] | None = None
    """What the last action did, (``ok`` or ``error``, text), shown once by the next page."""
    owner: str = ""
    """The identity it was opened for: the one whose sessions it counts among."""

    def take_notice(self) -> tuple[str, str] | None:
        notice, self.notice = self.notice, None
        return notice


class SessionsFull(Exception):
    """Every session the server keeps is taken: a sign-in waits until one ends."""

    def __init__(self, limit: int, retry_after: float) -> None:
        super().__init__(
            f"the dashboard already keeps {limit:,} sessions, its limit: sign in again once "
            "some have ended (signed out, or expired)"
        )
        self.retry_after = retry_after


def _key(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).digest()


class Sessions:
    def __init__(
        self,
        *,
        limit: int = MAX_SESSIONS,
        per_identity: int = MAX_SESSIONS_PER_IDENTITY,
        lifetime: float = SESSION_LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._per_identity = per_identity
        self._lifetime = lifetime
        self._clock = clock
        # Oldest first: every session lives as long, so this is also the order of expiry.
        self._open: OrderedDict[bytes, Session] = OrderedDict()
        self._by_owner: dict[str, OrderedDict[bytes, None]] = {}

    def __len__(self) -> int:
        return len(self._open)

    def of(self, identity: str) -> int:
        """How many sessions ``identity`` holds."""
        return len(self._by_owner.get(identity, ()))

    def open(self, grant: Grant, token_digest: bytes | None) -> tuple[str, Session]:
        """A new session: its id (the cookie's value) and itself. Ends the identity's own
        oldest session if it holds its share already; raises SessionsFull if every session
        is taken by others."""
        now = self._clock()
        self._expire(now)
        owner = grant.name
        # The anonymous sessions (no token) are one identity's: they share the whole limit.
        share = self._per_identity if token_digest is not None else self._limit
        mine = self._by_owner.get(owner)
        if mine is not None and len(mine) >= share:
            while len(mine) >= share:
                self._drop(next(iter(mine)))
        elif len(self._open) >= self._limit:
            oldest = next(iter(self._open.values()))
            raise SessionsFull(self._limit, max(oldest.expires - now, 1.0))
        session_id = secrets.token_urlsafe(32)
        session = Session(
            grant, token_digest, secrets.token_urlsafe(32), now + self._lifetime, owner=owner
        )
        key = _key(session_id)
        self._open[key] = session
        self._by_owner.setdefault(owner, OrderedDict())[key] = None
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        key = _key(session_id)
        session = self._open.get(key)
        if session is not None and session.expires <= self._clock():
            self._drop(key)
            return None
        return session

    def close(self, session_id: str) -> None:
        self._drop(_key(session_id))

    def _drop(self, key: bytes) -> None:
        session = self._open.pop(key, None)
        if session is None:
            return
        owned = self._by_owner[session.owner]
        del owned[key]
        if not owned:
            del self._by_owner[session.owner]

    def _expire(self, now: float) -> None:
        while self._open:
            key, oldest = next(iter(self._open.items()))
            if oldest.expires > now:
                return
            self._drop(key)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float
    warned: bool = False
    """Its refusals were logged (once, until it admits an attempt again)."""


@dataclass(frozen=True, slots=True)
class Limited:
    """A sign-in attempt refused for its rate: retry after ``retry_after`` seconds."""

    scope: str
    """``peer`` (this address's budget) or ``overall`` (every address's)."""
    retry_after: int
    first: bool
    """The first refusal since this budget last admitted an attempt: worth a log line."""


class SignInLimiter:
    """Token buckets on failed sign-ins: one per peer address, which refuses that address's
    next attempts while it is empty, and one over all peers, which only raises an alarm."""

    def __init__(
        self,
        *,
        per_peer: tuple[int, float] = SIGN_INS_PER_PEER,
        overall: tuple[int, float] = SIGN_INS_OVERALL,
        max_peers: int = MAX_PEERS_TRACKED,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``per_peer``, ``overall``: (failures at once, seconds to earn them all back)."""
        self._per_peer = per_peer
        self._overall_rate = overall
        self._max_peers = max_peers
        self._clock = clock
        self._peers: OrderedDict[str, _Bucket] = OrderedDict()
        self._overall = _Bucket(float(overall[0]), clock())

    def admit(self, peer: str) -> Limited | None:
        """None if an attempt from ``peer`` may be checked now, else why not (its address
        failed too often lately). Takes nothing: only a failure is charged."""
        bucket = self._peers.get(peer)
        if bucket is None:
            return None
        wait = _wait(bucket, self._per_peer, self._clock())
        if wait <= 0:
            bucket.warned = False
            return None
        first = not bucket.warned
        bucket.warned = True
        return Limited("peer", max(1, math.ceil(wait)), first)

    def failed(self, peer: str) -> Limited | None:
        """Charge a failed attempt from ``peer``; an ``overall`` Limited (logged once a spell,
        refusing nobody) when failures over all peers outran their budget."""
        now = self._clock()
        bucket = self._peers.pop(peer, None)
        if bucket is None:
            bucket = _Bucket(float(self._per_peer[0]), now)
        self._peers[peer] = bucket  # the most recently seen last
        while len(self._peers) > self._max_peers:
            self._peers.popitem(last=False)
        _wait(bucket, self._per_peer, now)
        bucket.tokens -= 1
        wait = _wait(self._overall, self._overall_rate, now)
        if wait <= 0:
            self._overall.tokens -= 1
            self._overall.warned = False
            return None
        first = not self._overall.warned
        self._overall.warned = True
        return Limited("overall", max(1, math.ceil(wait)), first)


def _wait(bucket: _Bucket, rate: tuple[int, float], now: float) -> float:
    """Refill ``bucket`` to ``now``; the seconds until it holds a token (0: it does)."""
    burst, period = rate
    per_second = burst / period
    bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * per_second)
    bucket.at = now
    return 0.0 if bucket.tokens >= 1 else (1 - bucket.tokens) / per_second
