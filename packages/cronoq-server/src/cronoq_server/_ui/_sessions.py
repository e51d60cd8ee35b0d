"""The dashboard's sessions: what a signed-in browser's cookie stands for.

The cookie holds a random session id, never the token: the server keeps, under the id's
SHA-256 digest, the identity's grant, the token's digest (so that a token revoked by a reload
of the tokens file ends its sessions at the next request), the session's CSRF token and its
expiry. Memory is bounded: past ``limit`` sessions the oldest is dropped (its browser signs in
again).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cronoq_server._auth import Grant

__all__ = ["SESSION_LIFETIME_S", "Session", "Sessions"]

SESSION_LIFETIME_S = 12 * 3600.0
"""A session ends this long after sign-in, whatever its use: a working day."""
MAX_SESSIONS = 10_000


@dataclass(slots=True)
class Session:
    grant: Grant
    token_digest: bytes | None
    """None: authentication is off (an anonymous session, for its CSRF token)."""
    csrf: str
    expires: float
    notice: tuple[str, str] | None = None
    """What the last action did, (``ok`` or ``error``, text), shown once by the next page."""

    def take_notice(self) -> tuple[str, str] | None:
        notice, self.notice = self.notice, None
        return notice


def _key(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8", "surrogateescape")).digest()


class Sessions:
    def __init__(
        self,
        *,
        limit: int = MAX_SESSIONS,
        lifetime: float = SESSION_LIFETIME_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit = limit
        self._lifetime = lifetime
        self._clock = clock
        self._open: OrderedDict[bytes, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def open(self, grant: Grant, token_digest: bytes | None) -> tuple[str, Session]:
        """A new session: its id (the cookie's value) and itself."""
        session_id = secrets.token_urlsafe(32)
        session = Session(
            grant, token_digest, secrets.token_urlsafe(32), self._clock() + self._lifetime
        )
        self._open[_key(session_id)] = session
        while len(self._open) > self._limit:
            self._open.popitem(last=False)
        return session_id, session

    def get(self, session_id: str) -> Session | None:
        key = _key(session_id)
        session = self._open.get(key)
        if session is not None and session.expires <= self._clock():
            del self._open[key]
            return None
        return session

    def close(self, session_id: str) -> None:
        self._open.pop(_key(session_id), None)
