"""A PostgreSQL-aware TCP proxy for the fault tests, run in the test's own event loop.

It listens on 127.0.0.1 (port 0) and forwards every client connection (a ``Link``) to the
server message by message, reading the wire protocol in both directions, so that it can:

- black-hole all traffic: stop forwarding in both directions without closing anything (closes
  are not passed on either), as a partition or a frozen peer looks to both ends; at once, at
  the next moment no request is in flight and no transaction open, or right after a chosen
  statement was sent on (its reply is then lost);
- pass a chosen statement on (a ``COMMIT``, or a batch's single autocommit statement), swallow
  the server's whole reply to it up to its ReadyForQuery (by then the server has committed),
  and cut that connection: the commit landed and the client cannot know (an ambiguous commit);
- hold a chosen statement in flight: keep its request from the server, cut the client's side
  of that connection (the client sees it break), and deliver the request on the still open
  server session later (``release_held``): a statement that lands after the client moved on;
- cut connections, and refuse new ones, picked by their startup parameters (application_name);
- count the statements each connection executes, and say when it last forwarded a message.

SSL and GSS encryption requests are answered "no" by the proxy itself, so the stream stays
readable; ``dsn_via`` gives a DSN through it with ``sslmode=disable``.
"""

from __future__ import annotations

import asyncio
import enum
import struct
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "LOCK_SESSION",
    "Link",
    "PgProxy",
    "dsn_via",
    "makes_a_batch_durable",
    "upstream_of",
    "writes_a_batch",
]

LOCK_SESSION = "cronoq-leader-lock"
"""The application_name of the store's advisory lock session."""

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102


def _error_response(*fields: tuple[bytes, str]) -> bytes:
    body = b"".join(code + text.encode() + b"\x00" for code, text in fields) + b"\x00"
    return b"E" + struct.pack("!i", len(body) + 4) + body


_FATAL = _error_response(
    (b"S", "FATAL"),
    (b"V", "FATAL"),
    (b"C", "57P01"),
    (b"M", "terminating connection due to administrator command"),
)

LinkFilter = Callable[["Link"], bool]
StatementFilter = Callable[["Link", str], bool]


def upstream_of(dsn: str) -> tuple[str, int] | None:
    """Host and port of a TCP DSN, or None when it names no TCP host."""
    parts = urlsplit(dsn)
    if not parts.hostname or parts.hostname.startswith("/"):
        return None
    return parts.hostname, parts.port or 5432


def dsn_via(dsn: str, port: int) -> str:
    """The same DSN, through 127.0.0.1:port, with SSL off so the proxy can read the stream."""
    parts = urlsplit(dsn)
    user, _, _ = parts.netloc.rpartition("@")
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    query = dict(parse_qsl(parts.query))
    query["sslmode"] = "disable"
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query), parts.fragment))


def is_commit(text: str) -> bool:
    return text.strip().rstrip(";").strip().upper() in ("COMMIT", "END")


def writes_a_batch(link: Link, text: str) -> bool:
    """The statement by which PgStore writes a batch: the fence on the leader row, alone in an
    explicit transaction or carrying the batch's rows in one autocommit statement."""
    return "cronoq_leader SET max_task_id" in text


def makes_a_batch_durable(link: Link, text: str) -> bool:
    """The message after which a batch is committed once the server has answered it: a COMMIT,
    or the batch's statement sent outside any transaction block (it commits on its own)."""
    return is_commit(text) or (link.status == b"I" and writes_a_batch(link, text))


class Link:
    """One proxied client connection."""

    def __init__(self, number: int, client: asyncio.StreamWriter) -> None:
        self.number = number
        self.params: dict[str, str] = {}
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self._statements: dict[bytes, str] = {}
        self.executed: Counter[str] = Counter()
        """How many times each statement text was executed (simple or extended protocol)."""
        self.status = b"I"
        """Transaction status from the server's last ReadyForQuery: I, T or E."""
        self.pending = 1
        """Requests (Query, Sync, and the startup) not yet answered by a ReadyForQuery."""
        self.last_forwarded = time.monotonic()
        """When a client message was last sent on to the server."""
        self.closed = False
        self.last_statement = ""
        """The text of the last statement the client sent."""
        self._armed: _Trigger | None = None
        self._dropping: _Trigger | None = None
        self._fatal_after: _Trigger | None = None
        self.held = b""
        """A held request (see ``PgProxy.hold``), kept from the server until released."""
        self.holding = False
        """The client's side is cut; the server's stays open for the held request."""
        self.answered = asyncio.Event()
        """Set at the server's ReadyForQuery to the released request."""

    @property
    def application_name(self) -> str:
        return self.params.get("application_name", "")

    @property
    def is_lock_session(self) -> bool:
        return self.application_name == LOCK_SESSION

    @property
    def quiet(self) -> bool:
        """No request in flight and no transaction open."""
        return self.pending == 0 and self.status == b"I"

    def count(self, fragment: str) -> int:
        """Executions of statements whose text contains ``fragment``."""
        return sum(n for text, n in self.executed.items() if fragment in text)

    def abort(self) -> None:
        self.closed = True
        for writer in (self.client, self.server):
            if writer is not None:
                writer.transport.abort()

    def __repr__(self) -> str:
        return f"<Link {self.number} {self.application_name!r} status={self.status!r}>"


class _Action(enum.Enum):
    BLACKHOLE = "blackhole"
    DROP_REPLY = "drop reply"
    FATAL_AFTER = "fatal after the reply"
    HOLD = "hold in flight"


@dataclass
class _Trigger:
    action: _Action
    links: LinkFilter
    statement: StatementFilter
    then: Callable[[Link], None] | None = None
    text: str = ""


class PgProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.links: list[Link] = []
        self.port = 0
        self.blackholed = False
        self.blackholed_at: float | None = None
        self.became_blackholed = asyncio.Event()
        self.refuse: LinkFilter | None = None
        """New connections it picks are closed right after their startup message."""
        self._quiet_filter: LinkFilter | None = None
        self._quiet_not_after: StatementFilter | None = None
        self._triggers: list[_Trigger] = []
        self.reply_dropped = asyncio.Event()
        self.fatal_sent = asyncio.Event()
        self.dropped_statement = ""
        """The statement whose reply was dropped, once it was."""
        self.blackholed_after = ""
        """The statement after which the black hole fell, if one did."""
        self.blackholed_in_transaction = False
        """Whether that statement was sent inside an explicit transaction block."""
        self.holding: Link | None = None
        """The link whose request is held, once one is."""

    async def start(self) -> PgProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def stop_listening(self) -> None:
        """Refuse new connections as a server that is not running does (ECONNREFUSED)."""
        assert self._server is not None
        self._server.close()

    async def listen_again(self) -> None:
        """Accept connections again, on the same port."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def dsn(self, dsn: str) -> str:
        return dsn_via(dsn, self.port)

    def lock_links(self) -> list[Link]:
        return [link for link in self.links if link.is_lock_session]

    # --- faults -----------------------------------------------------------------------------

    def blackhole(self) -> None:
        """Stop forwarding anything, in both directions, on every link, old and new."""
        if not self.blackholed:
            self.blackholed = True
            self.blackholed_at = time.monotonic()
            self.became_blackholed.set()

    def blackhole_when_quiet(
        self, links: LinkFilter = lambda link: True, not_after: StatementFilter | None = None
    ) -> None:
        """Black-hole at the first moment every link ``links`` picks is quiet: the server is
        left with no request in flight and no open transaction of theirs.

        That moment is a ReadyForQuery (or now, if they are all quiet and ``not_after`` is
        None): with ``not_after``, not one that answers a statement it matches, after which
        the client still has a step to take (asyncpg's pool resets a connection it gets back,
        so a store's call is not over when the server has answered its statement)."""
        self._quiet_filter = links
        self._quiet_not_after = not_after
        if not_after is None:
            self._check_quiet(None)

    def blackhole_after(
        self, statement: StatementFilter, links: LinkFilter = lambda link: True
    ) -> None:
        """Black-hole right after the next matching statement was sent on in full: the server
        runs it, its reply is lost."""
        self._triggers.append(_Trigger(_Action.BLACKHOLE, links, statement))

    def drop_reply_to(
        self,
        statement: StatementFilter,
        links: LinkFilter = lambda link: True,
        then: Callable[[Link], None] | None = None,
    ) -> None:
        """Send the next matching statement on, swallow the server's whole reply to it (up to
        its ReadyForQuery, sent once the server is done with it) and cut that link, calling
        ``then`` with it first."""
        self._triggers.append(_Trigger(_Action.DROP_REPLY, links, statement, then))

    def fatal_after_reply_to(
        self, statement: StatementFilter, links: LinkFilter = lambda link: True
    ) -> None:
        """Pass the next matching statement and its whole reply on, then, in the same write
        as its ReadyForQuery, a FATAL ErrorResponse (57P01, as a server shutting down sends
        every session), and cut the link: the client learns the statement's outcome, then
        that its connection is gone, before it can use it again."""
        self._triggers.append(_Trigger(_Action.FATAL_AFTER, links, statement))

    def hold(self, statement: StatementFilter, links: LinkFilter = lambda link: True) -> None:
        """Keep the next matching statement's request (from its Bind, or its Query, to the
        end of the request) from the server, then cut the client's side of that link only:
        the client sees its connection break, the server session waits, idle, for the held
        request, which ``release_held`` delivers."""
        self._triggers.append(_Trigger(_Action.HOLD, links, statement))

    async def release_held(self) -> str:
        """Deliver the held request on its server session, wait for the server's answer (it
        has run the statement, committed or not), close that session; return the statement."""
        link = self.holding
        assert link is not None and link.server is not None, "no request is held"
        self.holding = None
        link.server.write(link.held)
        await link.answered.wait()
        link.abort()
        return link.last_statement

    def cut(self, links: LinkFilter) -> int:
        """Abort the picked links, both sides; return how many."""
        picked = [link for link in self.links if not link.closed and links(link)]
        for link in picked:
            link.abort()
        return len(picked)

    def _check_quiet(self, answered: Link | None) -> None:
        picked = self._quiet_filter
        if picked is None:
            return
        not_after = self._quiet_not_after
        if (
            answered is not None
            and not_after is not None
            and not_after(answered, answered.last_statement)
        ):
            return
        if all(link.quiet for link in self.links if not link.closed and picked(link)):
            self._quiet_filter = None
            self.blackhole()

    def _arm(self, link: Link, text: str) -> None:
        for trigger in self._triggers:
            if trigger.links(link) and trigger.statement(link, text):
                self._triggers.remove(trigger)
                trigger.text = text
                link._armed = trigger
                return

    def _fire(self, link: Link) -> None:
        """The armed statement was sent on in full."""
        trigger, link._armed = link._armed, None
        assert trigger is not None
        if trigger.action is _Action.BLACKHOLE:
            self.blackholed_after = trigger.text
            self.blackholed_in_transaction = link.status != b"I"
            self.blackhole()
        elif trigger.action is _Action.DROP_REPLY:
            link._dropping = trigger
        else:
            link._fatal_after = trigger

    # --- connections --------------------------------------------------------------------------

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._track(asyncio.ensure_future(coro))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        current = asyncio.current_task()
        if current is not None:
            self._track(current)
        link = Link(len(self.links) + 1, writer)
        self.links.append(link)
        try:
            startup = await self._read_startup(link, reader, writer)
            if self.refuse is not None and self.refuse(link):
                link.abort()
                return
            if self.blackholed:
                while await reader.read(65536):
                    pass
                return
            server_reader, server_writer = await asyncio.open_connection(*self._upstream)
            link.server = server_writer
            if link.closed:  # cut while connecting
                link.abort()
                return
            server_writer.write(startup)
            link.last_forwarded = time.monotonic()
        except (OSError, asyncio.IncompleteReadError):
            link.abort()
            return
        self._spawn(self._client_to_server(link, reader, server_writer))
        await self._server_to_client(link, server_reader, writer)

    async def _read_startup(
        self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes:
        """The client's startup (or cancel) message, after declining any encryption."""
        while True:
            head = await reader.readexactly(4)
            (length,) = struct.unpack("!i", head)
            body = await reader.readexactly(length - 4)
            (code,) = struct.unpack("!i", body[:4])
            if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                break
            writer.write(b"N")
        if code == _CANCEL_REQUEST:
            link.params["cancel"] = "1"
            link.pending = 0
        else:
            fields = body[4:].split(b"\x00")
            for name, value in zip(fields[0::2], fields[1::2], strict=False):
                if name:
                    link.params[name.decode()] = value.decode()
        return head + body

    @staticmethod
    async def _message(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
        kind = await reader.readexactly(1)
        (length,) = struct.unpack("!i", await reader.readexactly(4))
        return kind, await reader.readexactly(length - 4)

    async def _client_to_server(
        self, link: Link, reader: asyncio.StreamReader, server: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                kind, body = await self._message(reader)
                if self.blackholed:
                    continue
                complete = self._on_client_message(link, kind, body)
                if link._armed is not None and link._armed.action is _Action.HOLD:
                    link.held += kind + struct.pack("!i", len(body) + 4) + body
                    if complete:
                        link._armed = None
                        link.holding = True
                        self.holding = link
                        link.client.transport.abort()
                        return
                    continue
                server.write(kind + struct.pack("!i", len(body) + 4) + body)
                link.last_forwarded = time.monotonic()
                if complete and link._armed is not None:
                    self._fire(link)
        except (OSError, asyncio.IncompleteReadError):
            pass
        if not self.blackholed and not link.holding:  # a black hole passes no close on
            link.abort()

    def _on_client_message(self, link: Link, kind: bytes, body: bytes) -> bool:
        """Track the message; True if it completes a request (a Query, or a Sync)."""
        if kind == b"Q":
            text = body.rstrip(b"\x00").decode(errors="replace")
            link.executed[text] += 1
            link.last_statement = text
            link.pending += 1
            self._arm(link, text)
            return True
        if kind == b"P":
            name, query, _ = body.split(b"\x00", 2)
            link._statements[name] = query.decode(errors="replace")
        elif kind == b"B":
            _portal, statement, _ = body.split(b"\x00", 2)
            text = link._statements.get(statement, "?")
            link.executed[text] += 1
            link.last_statement = text
            self._arm(link, text)
        elif kind == b"S":
            link.pending += 1
            return True
        return False

    async def _server_to_client(
        self, link: Link, reader: asyncio.StreamReader, client: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                kind, body = await self._message(reader)
                if self.blackholed:
                    continue
                if link.holding:  # the client is gone: only the released request's end
                    if kind == b"Z":
                        link.answered.set()
                    continue
                if kind == b"Z":
                    link.status = body[:1]
                    link.pending = max(0, link.pending - 1)
                dropping = link._dropping
                if kind == b"Z" and link._fatal_after is not None:
                    link._fatal_after = None
                    client.write(kind + struct.pack("!i", len(body) + 4) + body + _FATAL)
                    link.abort()
                    self.fatal_sent.set()
                    return
                if dropping is None:
                    client.write(kind + struct.pack("!i", len(body) + 4) + body)
                elif kind == b"Z":  # the server is done with it (and has committed it)
                    link._dropping = None
                    self.dropped_statement = dropping.text
                    if dropping.then is not None:
                        dropping.then(link)
                    link.abort()
                    self.reply_dropped.set()
                    return
                if kind == b"Z":
                    self._check_quiet(link)
        except (OSError, asyncio.IncompleteReadError):
            pass
        if not self.blackholed:
            link.abort()

    async def close(self) -> None:
        """Close the listener and cut every link, whatever the black hole: each link's tasks
        then end on their own (cancelling a connection handler would make asyncio log it)."""
        if self._server is not None:
            self._server.close()
        for link in self.links:
            link.abort()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        if self._server is not None:
            await self._server.wait_closed()
