"""The dashboard: server-rendered pages under ``/ui`` on the HTTP port, built on the replica's
``Scheduler`` as the gRPC service is (a standby's pages say it is one).

Who may do what is the gRPC API's: each page needs the permission of the call it makes
(``List`` and the like: ``read``), each action that of its call (``Cancel``: ``cancel``,
``Retry`` and ``Rerun``: ``admin``, ...), looked up in ``METHOD_PERMISSIONS``. A browser signs
in with a bearer token once (``Guard.sign_in``) and then holds a session cookie
(``_sessions``); with authentication off, every browser gets an anonymous session that may do
everything, as every gRPC caller may, but only if the HTTP port is on loopback (or
``auth.insecure`` says so).

Every POST is checked twice against cross-site requests: its ``Origin`` (when a browser sends
one) must be this host, and its form must carry the session's CSRF token. Pages are rendered by
Jinja2 with autoescape on; each poll of a page (htmx, every few seconds) is one bounded call
of the scheduler.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import math
import time
import unicodedata
import zoneinfo
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, tzinfo
from importlib import resources
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from aiohttp import web
from aiohttp.web_request import FileField
from multidict import MultiDictProxy

from cronoq import (
    Hold,
    PoolInfo,
    Scheduler,
    Status,
    TaskInfo,
    TaskSummary,
    WorkerInfo,
    preview,
)
from cronoq.errors import (
    CronoqError,
    InvalidArgument,
    PermissionDenied,
    ScheduleNotFound,
    SchedulerError,
    TaskNotFound,
    Unauthenticated,
)
from cronoq.store import ATTEMPTS_KEPT
from cronoq_client.protocol import NoOutbox, pb
from cronoq_server._auth import METHOD_PERMISSIONS, Grant, Guard
from cronoq_server._config import NO_OUTBOX
from cronoq_server._http import Readiness
from cronoq_server._replica import NotServing, Replica, Role
from cronoq_server._ui._samples import (
    HEADLINE_S,
    SAMPLE_INTERVAL_S,
    WINDOW_S,
    Sample,
    chart,
    rates,
    tally,
)
from cronoq_server._ui._sessions import (
    SESSION_LIFETIME_S,
    Limited,
    Session,
    Sessions,
    SessionsFull,
    SignInLimiter,
)
from cronoq_server._ui._views import (
    OccurrenceQuery,
    OccurrenceRow,
    OutboxQuery,
    TaskQuery,
    attempt_rows,
    duration,
    occurrence_rows,
    parse_id,
    quarantine_rows,
)
from cronoq_server._ui._views import preview as data_preview

__all__ = ["Dashboard"]

log = logging.getLogger("cronoq.server.ui")

PREFIX = "/ui"
COOKIE = "cronoq_session"
POLL_S = 5
"""How often a page refreshes its live part."""
_IDLE_STOP_S = WINDOW_S
"""The charts' sampling stops once no page was requested for this long, and starts again
with the next request."""
_POOLS_FRESH_S = 2.0
_MAX_TOKEN = 4096
_MAX_SCHEDULES = 500
"""Schedules one page shows (each with its next occurrences, computed in a thread)."""
_LIMIT_KEYS_SHOWN = 10
"""The busiest keys the Limits page shows of each limit."""
_NEXT_OCCURRENCES = 3
_MAX_PARENTS_SHOWN = 100
"""A task's page shows this many of its parents (``after``), and of those an explanation
says it waits for."""
_MAX_DEPENDANTS_SHOWN = 100
"""A task's page shows this many of its dependants (``Scheduler.dependants``), each looked
up for its status."""
_LIVE = [s for s in Status if s not in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)]
_Handler = Callable[[web.Request], Awaitable[web.Response]]
_ANONYMOUS = Grant("anonymous", frozenset({"admin"}))
_SCHEDULER_SERVICE = pb.DESCRIPTOR.services_by_name["SchedulerService"].full_name


def _permission(method: str) -> str:
    """The permission the gRPC API's ``method`` needs: the dashboard's rule for the same call."""
    rule = METHOD_PERMISSIONS[f"/{_SCHEDULER_SERVICE}/{method}"]
    assert rule, f"{method} is open or needs no permission"
    return rule


_READ = _permission("List")


class _Refused(Exception):
    """A page's answer other than the page: rendered as an error page with this status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# --- actions ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Moved:
    """An action's answer that leads to another page than its form's ``back``: the page of
    what it made (a rerun: the new task's)."""

    message: str
    page: str


_Run = Callable[[Scheduler, Any, Grant], Awaitable[str | _Moved]]


@dataclass(frozen=True, slots=True)
class _Action:
    method: str
    """The gRPC method of the same call: its permission is this action's."""
    target: str
    """``task`` or ``row`` (an id: of a task, of a quarantined outbox row), ``pool`` or
    ``schedule`` (a name)."""
    run: _Run
    """The call; returns what to tell the user (and, for ``_Moved``, where to go)."""

    @property
    def permission(self) -> str:
        return _permission(self.method)


async def _cancel(sched: Scheduler, task_id: int, grant: Grant) -> str:
    status = await sched.cancel(task_id, f"cancelled from the dashboard by {grant.name!r}")
    return f"task {task_id}: cancel requested, it is {status.value}"


async def _retry(sched: Scheduler, task_id: int, grant: Grant) -> str:
    info = await sched.retry(task_id)
    return f"task {task_id} retried: it is {info.status.value} (attempt {info.attempt} done)"


async def _rerun(sched: Scheduler, task_id: int, grant: Grant) -> _Moved:
    new_id = await sched.rerun(task_id)
    return _Moved(f"task {task_id} rerun as task {new_id}", f"{PREFIX}/tasks/{new_id}")


async def _pause_pool(sched: Scheduler, name: str, grant: Grant) -> str:
    await sched.pause_pool(name)
    return f"pool {name} paused: it starts no attempt until resumed"


async def _resume_pool(sched: Scheduler, name: str, grant: Grant) -> str:
    await sched.resume_pool(name)
    return f"pool {name} resumed"


async def _pause_schedule(sched: Scheduler, name: str, grant: Grant) -> str:
    await sched.pause_schedule(name)
    return f"schedule {name} paused"


async def _resume_schedule(sched: Scheduler, name: str, grant: Grant) -> str:
    info = await sched.resume_schedule(name)
    here, utc = _when_in(info.next_run_at, info.timezone), _when(info.next_run_at)
    return f"schedule {name} resumed: next run at {here}" + (f" ({utc})" if here != utc else "")


async def _trigger_schedule(sched: Scheduler, name: str, grant: Grant) -> str:
    task_id = await sched.trigger_schedule(name)
    if task_id is None:
        return f"schedule {name}: not triggered, its last task is still live (overlap: skip)"
    return f"schedule {name} triggered: task {task_id}"


def _outbox_of(sched: Scheduler) -> Scheduler:
    if not sched.has_outbox:
        raise NoOutbox(NO_OUTBOX)
    return sched


async def _requeue_outbox(sched: Scheduler, row_id: int, grant: Grant) -> str:
    if not await _outbox_of(sched).requeue_outbox([row_id]):
        raise InvalidArgument(_NOT_QUARANTINED.format(row_id))
    return f"outbox row {row_id} requeued: the leader ingests it again"


async def _discard_outbox(sched: Scheduler, row_id: int, grant: Grant) -> str:
    if not await _outbox_of(sched).discard_outbox([row_id]):
        raise InvalidArgument(_NOT_QUARANTINED.format(row_id))
    return f"outbox row {row_id} discarded"


_NOT_QUARANTINED = "outbox row {} is not in the quarantine (requeued or discarded already)"

ACTIONS: Mapping[str, _Action] = {
    "cancel": _Action("Cancel", "task", _cancel),
    "retry": _Action("Retry", "task", _retry),
    "rerun": _Action("Rerun", "task", _rerun),
    "pause-pool": _Action("PausePool", "pool", _pause_pool),
    "resume-pool": _Action("ResumePool", "pool", _resume_pool),
    "pause-schedule": _Action("PauseSchedule", "schedule", _pause_schedule),
    "resume-schedule": _Action("ResumeSchedule", "schedule", _resume_schedule),
    "trigger-schedule": _Action("TriggerSchedule", "schedule", _trigger_schedule),
    "requeue-outbox": _Action("RequeueOutbox", "row", _requeue_outbox),
    "discard-outbox": _Action("DiscardOutbox", "row", _discard_outbox),
}
_ACTIONS = tuple(ACTIONS.items())
_BACK = {
    "task": "/ui/tasks",
    "row": "/ui/outbox",
    "pool": "/ui/pools",
    "schedule": "/ui/schedules",
}
_IDS = {"task": "task id", "row": "outbox row id"}
"""The actions whose target is an id, and what the id is called in a refusal."""


# --- formatting -------------------------------------------------------------------------------


def _when(moment: datetime | None) -> str:
    if moment is None:
        return ""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _when_in(moment: datetime, zone: str) -> str:
    """``moment`` on the clock of the time zone ``zone`` (a schedule's), with the zone's
    abbreviation at that moment: ``2026-07-01 03:00:00 CEST``."""
    local = moment.astimezone(_zone(zone))
    return f"{local:%Y-%m-%d %H:%M:%S} {local.tzname()}"


@functools.lru_cache(maxsize=64)
def _zone(name: str) -> tzinfo:
    """A schedule's time zone (checked when the schedule was added); UTC if this host's
    zone database lacks it."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return UTC


def _ago(moment: datetime | None) -> str:
    if moment is None:
        return ""
    seconds = (datetime.now(UTC) - moment).total_seconds()
    future = seconds < 0
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            amount = f"{seconds / size:.0f} {unit}"
            break
    else:
        amount = f"{seconds:.0f} s"
    return f"in {amount}" if future else f"{amount} ago"


def _minutes(seconds: float) -> str:
    """A span of the charts: ``45 s``, ``2.5 min``, ``15 min``."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f}".removesuffix(".0") + " min"


def _finished(summary: TaskSummary) -> datetime | None:
    ns = summary.finished_ns
    return None if ns is None else datetime.fromtimestamp(ns / 1e9, UTC)


def _summary(info: TaskInfo) -> TaskSummary:
    finished = info.finished_at
    return TaskSummary(
        info.task_id,
        info.status,
        info.attempt,
        info.pool,
        info.kind,
        info.key,
        info.tags,
        None if finished is None else int(finished.timestamp() * 1e9),
        info.error,
    )


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("cronoq_server._ui", "templates"),
        autoescape=True,  # every template: user strings (kinds, keys, messages) are escaped
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        when=_when,
        when_in=_when_in,
        ago=_ago,
        finished=_finished,
        minutes=_minutes,
        duration=duration,
    )
    environment.globals.update(
        poll_s=POLL_S,
        live=set(_LIVE),
        Status=Status,
        Hold=Hold,
        sample_s=SAMPLE_INTERVAL_S,
        headline_s=HEADLINE_S,
        headline_min=round(HEADLINE_S / 60),
    )
    return environment


def _static() -> dict[str, tuple[bytes, str]]:
    """The assets, read once from the package (inside the wheel: no CDN)."""
    types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
    found: dict[str, tuple[bytes, str]] = {}
    for entry in resources.files("cronoq_server._ui").joinpath("static").iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if suffix in types:
            found[entry.name] = (entry.read_bytes(), types[suffix])
    return found


_SECURITY_HEADERS = {
    # Scripts and styles only from this server: nothing inline, no eval (htmx is told so).
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


_LOCATION_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "\\")
"""What a Location header carries as it is: printable ASCII (a page's own query, as
``request.path_qs`` gives it, may hold any other character: those are percent-encoded)."""
_MAX_TARGET = 2048
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Control and format characters, surrogates, line and paragraph separators: never in a
redirect (CR LF would end the Location header inside it)."""


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": quote(location, safe=_LOCATION_SAFE)})


def _target(value: object, field: str, default: str) -> str:
    """The page of this dashboard to go to after a form (an action's ``back``, the sign-in's
    ``next``), ``default`` when the form names none. Anything else is a 400 before anything
    is applied: a control character (CR LF would split the redirect's header), or a place
    that is not a path of this dashboard (another site: ``//host``, a scheme, a backslash)."""
    if value is None or value == "":
        return default
    refused = _Refused(
        400, f"{field} must be a page of this dashboard: a path under {PREFIX}/, without "
        "control characters, of at most 2,048 characters",
    )  # fmt: skip
    if not isinstance(value, str) or len(value) > _MAX_TARGET:
        raise refused
    if not value.startswith(f"{PREFIX}/") or "\\" in value:
        raise refused
    if any(unicodedata.category(c) in _UNSAFE_CATEGORIES for c in value):
        raise refused
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        raise refused
    return value


# --- the dashboard ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Visit:
    """One request as a page handler sees it: who made it, and an action's checked form."""

    request: web.Request
    session: Session | None
    form: MultiDictProxy[str | bytes | bytearray | FileField] | None = None

    def grant(self, permission: str) -> Grant:
        """The caller's grant if it has ``permission``, else a 403 saying which it lacks."""
        if self.session is None:
            raise _Refused(401, "sign in first")
        grant = self.session.grant
        if not grant.allows(permission):
            raise _Refused(403, f"identity {grant.name!r} lacks the permission {permission!r}")
        return grant


_Page = Callable[[_Visit], Awaitable[web.Response]]


class Dashboard:
    """``Dashboard(...).install(app)`` adds ``/ui`` to the HTTP server's application."""

    def __init__(
        self,
        replica: Replica,
        *,
        readiness: Callable[[], Readiness],
        workers: Callable[[], list[WorkerInfo]],
        guard: Guard | None,
        closed: str | None = None,
        sessions: Sessions | None = None,
        sign_ins: SignInLimiter | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``workers``: the worker links of the replica's leading server object. ``closed``:
        why the dashboard serves nothing (authentication off on a non-loopback port).
        ``sessions``, ``sign_ins``: the sessions and the sign-in rate limits (the defaults of
        ``_sessions`` unless given). ``clock``: the Unix time the charts' samples are taken
        and read at."""
        self._replica = replica
        self._readiness = readiness
        self._workers = workers
        self._guard = guard
        self._closed = closed
        self._sessions = Sessions() if sessions is None else sessions
        self._sign_ins = SignInLimiter() if sign_ins is None else sign_ins
        self._clock = clock
        self._templates = _environment()
        self._assets = _static()
        self._samples: deque[Sample] = deque(maxlen=int(WINDOW_S / SAMPLE_INTERVAL_S) + 1)
        self._last_view = 0.0
        self._sampling: asyncio.Task[None] | None = None
        self._pools_seen: tuple[Scheduler, float, list[PoolInfo]] | None = None

    def install(self, app: web.Application) -> None:
        ui = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024)
        ui.router.add_get("", _to_overview)  # /ui itself
        ui.router.add_get("/", self._page(self._overview))
        ui.router.add_get("/tasks", self._page(self._tasks))
        ui.router.add_get("/tasks/{task_id}", self._page(self._task))
        ui.router.add_get("/schedules", self._page(self._schedules))
        # A schedule's page: its name in the query, not the path, since a name is any text
        # ("a/b", "..", "%", "#"), which a path would split or a browser resolve.
        ui.router.add_get("/schedule", self._page(self._schedule))
        ui.router.add_get("/workers", self._page(self._workers_page))
        ui.router.add_get("/pools", self._page(self._pools))
        ui.router.add_get("/limits", self._page(self._limits))
        ui.router.add_get("/outbox", self._page(self._outbox))
        ui.router.add_post("/act/{action}", self._page(self._act))
        ui.router.add_get("/signin", self._page(self._signin_page, signing_in=True))
        ui.router.add_post("/signin", self._page(self._signin, signing_in=True))
        ui.router.add_post("/signout", self._page(self._signout))
        ui.router.add_get("/static/{name}", self._asset)
        ui.on_cleanup.append(self._stop_sampling)
        app.add_subapp(PREFIX, ui)

    # --- every request ------------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # aiohttp's 404 and 405 of a path under /ui
            if exc.status < 400:
                raise
            response = self._error(_Visit(request, None), exc.status, exc.reason.lower())
        response.headers.update(_SECURITY_HEADERS)
        return response

    def _page(self, page: _Page, *, signing_in: bool = False) -> _Handler:
        """The aiohttp handler of a page: the session checked (and its CSRF token for a POST),
        the page's refusals rendered."""

        async def handler(request: web.Request) -> web.Response:
            visit = _Visit(request, None)
            opened: str | None = None
            try:
                if self._closed is not None:
                    raise _Refused(403, self._closed)
                if request.method == "POST":
                    _check_origin(request)
                session, opened = self._session(request)
                if session is None and signing_in:
                    response = await page(visit)
                elif session is None and request.method == "GET":
                    target = quote(request.path_qs, safe="")
                    response = _redirect(f"{PREFIX}/signin?next={target}")
                elif session is None:
                    raise _Refused(401, "sign in first: the session ended")
                elif signing_in:
                    response = _redirect(f"{PREFIX}/")
                else:
                    self._viewed()  # someone signed in is watching: sample for the charts
                    visit = _Visit(request, session)
                    if request.method == "POST":
                        visit = _Visit(request, session, await _checked_form(request, session))
                    response = await page(visit)
            except _Refused as exc:
                response = self._error(visit, exc.status, str(exc))
            except NotServing:
                response = self._render(visit, "standby.html", 503, title="Standby")
            except CronoqError as exc:
                response = self._error(visit, _status_of(exc), str(exc))
            if opened is not None:  # an anonymous session (authentication off) begins
                _set_cookie(request, response, opened)
            return response

        return handler

    def _session(self, request: web.Request) -> tuple[Session | None, str | None]:
        """The request's session, and the id of one opened for it (authentication off)."""
        session_id = request.cookies.get(COOKIE, "")
        session = self._sessions.get(session_id) if 0 < len(session_id) <= 64 else None
        if self._guard is None:
            if session is None:
                session_id, session = self._sessions.open(_ANONYMOUS, None)
                return session, session_id
            return session, None
        if session is not None and session.token_digest is not None:
            grant = self._guard.grant_of(session.token_digest)
            if grant is None:  # the token was revoked by a reload
                self._sessions.close(session_id)
                return None, None
            session.grant = grant
        return session, None

    # --- rendering ----------------------------------------------------------------------------

    def _render(
        self, visit: _Visit, template: str, status: int = 200, **context: Any
    ) -> web.Response:
        session = visit.session
        grant = None if session is None else session.grant
        sched = self._replica.scheduler
        body = self._templates.get_template(template).render(
            request=visit.request,
            session=session,
            identity=None if grant is None or self._guard is None else grant.name,
            can={name: grant is not None and grant.allows(a.permission) for name, a in _ACTIONS},
            notice=None if session is None else session.take_notice(),
            role=self._replica.role.value,
            reason=self._replica.reason,
            epoch=None if sched is None else sched.epoch,
            outbox=sched is not None and sched.has_outbox,
            **context,
        )
        return web.Response(
            status=status,
            text=body,
            content_type="text/html",
            headers={"Cache-Control": "no-store"},
        )

    def _error(self, visit: _Visit, status: int, message: str) -> web.Response:
        return self._render(visit, "error.html", status, title=f"Error {status}", message=message)

    def _leader(self, visit: _Visit, permission: str = _READ) -> Scheduler:
        visit.grant(permission)
        return self._replica.leader()

    # --- pages --------------------------------------------------------------------------------

    async def _overview(self, visit: _Visit) -> web.Response:
        visit.grant(_READ)
        readiness = self._readiness()
        try:
            sched = self._replica.leader()
        except NotServing:
            return self._render(visit, "overview.html", title="Overview", readiness=readiness,
                                pools=None, charts={}, tallies={}, workers=0,
                                figures=None)  # fmt: skip
        pools = await self._list_pools(sched)
        now = self._clock()
        samples = list(self._samples)
        charts = {pool.name: chart(rates(samples, pool.name), now) for pool in pools}
        tallies = {pool.name: tally(samples, pool.name, now) for pool in pools}
        return self._render(
            visit,
            "overview.html",
            title="Overview",
            readiness=readiness,
            pools=pools,
            charts=charts,
            tallies=tallies,
            workers=len(self._workers()),
            # The counters and the outbox's figures as last read: no pass over the tasks, no
            # query of the store.
            figures=sched.metrics(gauges=False) if sched.has_outbox else None,
        )

    async def _tasks(self, visit: _Visit) -> web.Response:
        sched = self._leader(visit)
        query = TaskQuery.parse(visit.request.query)
        if query.key is not None:
            found = await sched.get_by_key(query.key)
            rows = [] if found is None else [_summary(found)]
            next_after = None
        else:
            rows = await sched.list(
                status=query.status,
                pool=query.pool,
                kind=query.kind,
                tag=query.tag,
                limit=query.limit,
                after=query.after,
                before=query.before,
                newest_first=not query.oldest_first,
            )
            next_after = rows[-1].task_id if len(rows) == query.limit else None
        return self._render(
            visit,
            "tasks.html",
            title="Tasks",
            query=query,
            rows=rows,
            next_page=None if next_after is None else query.page(next_after),
            first_page=query.page(None) if query.paged else None,
            other_order=query.reordered(),
        )

    async def _task(self, visit: _Visit) -> web.Response:
        sched = self._leader(visit)
        task_id = parse_id(visit.request.match_info["task_id"], "task id")
        info = await sched.get(task_id)
        history, dependant_ids, why = await asyncio.gather(
            sched.attempts(task_id), sched.dependants(task_id), sched.explain(task_id)
        )
        # A dependant pruned meanwhile is left out (TaskNotFound), as a list page would.
        found = await asyncio.gather(
            *(sched.get(i) for i in dependant_ids[:_MAX_DEPENDANTS_SHOWN]),
            return_exceptions=True,
        )
        return self._render(
            visit,
            "task.html",
            title=f"Task {task_id}",
            task=info,
            attempts=attempt_rows(info, history),
            attempts_kept=ATTEMPTS_KEPT,
            parents=info.after[:_MAX_PARENTS_SHOWN],
            why=why,
            why_parents=why.parents[:_MAX_PARENTS_SHOWN],
            dependants=[_summary(d) for d in found if isinstance(d, TaskInfo)],
            dependant_count=len(dependant_ids),
            payload=data_preview(info.payload),
            output=data_preview(info.output),
        )

    async def _schedules(self, visit: _Visit) -> web.Response:
        sched = self._leader(visit)
        schedules = await sched.list_schedules()
        shown = schedules[:_MAX_SCHEDULES]

        def occurrences() -> list[list[datetime]]:
            # Parsing and stepping a cron expression is CPU work: off the event loop.
            return [preview(s.cron, s.timezone, _NEXT_OCCURRENCES) for s in shown]

        return self._render(
            visit,
            "schedules.html",
            title="Schedules",
            schedules=list(zip(shown, await asyncio.to_thread(occurrences), strict=True)),
            hidden=len(schedules) - len(shown),
        )

    async def _schedule(self, visit: _Visit) -> web.Response:
        sched = self._leader(visit)
        query = OccurrenceQuery.parse(visit.request.query)
        # The ledger first: it says ScheduleNotFound (a 404) for a name neither listed nor
        # recorded; a removed schedule's records are kept, and shown without it.
        records = await sched.occurrences(query.name, before=query.before, limit=query.limit)
        found = [s for s in await sched.list_schedules() if s.name == query.name]
        schedule = found[0] if found else None
        zone = "UTC" if schedule is None else schedule.timezone

        def computed() -> tuple[list[datetime], list[OccurrenceRow]]:
            # Parsing and stepping a cron expression is CPU work: off the event loop.
            if schedule is None:
                return [], occurrence_rows(records, None, zone)
            upcoming = preview(schedule.cron, zone, _NEXT_OCCURRENCES)
            return upcoming, occurrence_rows(records, schedule.cron, zone)

        upcoming, rows = await asyncio.to_thread(computed)
        return self._render(
            visit,
            "schedule.html",
            title=f"Schedule {query.name}",
            name=query.name,
            schedule=schedule,
            zone=zone,
            upcoming=upcoming,
            rows=rows,
            query=query,
            # This page's own address, encoded from its fields (a name may hold "&", "%" or
            # "#", which the request's decoded query would not carry back intact).
            here=f"{PREFIX}/schedule?{query.page(query.before)}",
            older=query.page(records[-1].due_at) if len(records) == query.limit else None,
            newest=query.page(None) if query.before is not None else None,
        )

    async def _workers_page(self, visit: _Visit) -> web.Response:
        self._leader(visit)
        return self._render(visit, "workers.html", title="Workers", workers=self._workers())

    async def _pools(self, visit: _Visit) -> web.Response:
        sched = self._leader(visit)
        return self._render(visit, "pools.html", title="Pools", pools=await self._list_pools(sched))

    async def _limits(self, visit: _Visit) -> web.Response:
        sched = self._leader(visit)
        limits = await sched.list_limits(keys=_LIMIT_KEYS_SHOWN)
        return self._render(
            visit, "limits.html", title="Limits", limits=limits, keys_shown=_LIMIT_KEYS_SHOWN
        )

    async def _outbox(self, visit: _Visit) -> web.Response:
        sched = self._leader(visit)
        query = OutboxQuery.parse(visit.request.query)
        if not sched.has_outbox:
            return self._render(visit, "outbox.html", title="Outbox", unavailable=NO_OUTBOX)
        rows = await sched.outbox_quarantine(after=query.after or 0, limit=query.limit)
        return self._render(
            visit,
            "outbox.html",
            title="Outbox",
            unavailable=None,
            figures=sched.metrics(gauges=False),
            rows=quarantine_rows(rows),
            next_page=query.page(rows[-1].row_id) if len(rows) == query.limit else None,
            first_page=query.page(None) if query.after is not None else None,
            after=query.after,
        )

    async def _list_pools(self, sched: Scheduler) -> list[PoolInfo]:
        """``list_pools``, shared by every page and viewer for ``_POOLS_FRESH_S``: it counts
        the live tasks in one pass (about 0.7 ms per 1,000 of them on the event loop), which
        each poll of each open overview would otherwise repeat. An action forgets it."""
        now = time.monotonic()
        seen = self._pools_seen
        if seen is not None and seen[0] is sched and now - seen[1] < _POOLS_FRESH_S:
            return seen[2]
        pools = await sched.list_pools()
        self._pools_seen = (sched, now, pools)
        return pools

    # --- actions ------------------------------------------------------------------------------

    async def _act(self, visit: _Visit) -> web.Response:
        name = visit.request.match_info["action"]
        action = ACTIONS.get(name)
        if action is None:
            raise _Refused(404, "no such action")
        grant = visit.grant(action.permission)
        assert visit.form is not None and visit.session is not None
        raw = visit.form.get(action.target)
        if not isinstance(raw, str) or not raw or len(raw) > 255:
            raise _Refused(400, f"the form needs a {action.target} (at most 255 characters)")
        ids = _IDS.get(action.target)
        target: int | str = raw if ids is None else parse_id(raw, ids)
        back = _target(visit.form.get("back"), "back", _BACK[action.target])
        sched = self._replica.leader()
        self._pools_seen = None  # the next page shows the pool as the action left it
        try:
            done = await action.run(sched, target, grant)
        except (NotServing, PermissionDenied):
            raise
        except CronoqError as exc:  # refused by the scheduler (not retryable, unknown, ...)
            visit.session.notice = ("error", str(exc))
        else:
            if isinstance(done, _Moved):  # to the page of what it made
                back = done.page
                done = done.message
            visit.session.notice = ("ok", done)
        log.info("dashboard action", extra={"identity": grant.name, "action": name})
        return _redirect(back)

    # --- signing in ---------------------------------------------------------------------------

    async def _signin_page(self, visit: _Visit) -> web.Response:
        next_page = visit.request.query.get("next", "")
        _target(next_page, "next", "")  # refused now, not once a token was typed
        return self._render(visit, "signin.html", title="Sign in", next=next_page, failed=False)

    async def _signin(self, visit: _Visit) -> web.Response:
        assert self._guard is not None  # with authentication off, every browser has a session
        request = visit.request
        peer = request.remote or ""
        # An address that failed too often lately is refused before its token is looked at;
        # only failures are charged, so a valid token is never locked out by others' failures.
        limited = self._sign_ins.admit(peer)
        if limited is not None:
            return self._limited(visit, limited, peer)
        form = await request.post()
        token = form.get("token")
        next_page = _target(form.get("next"), "next", f"{PREFIX}/")
        try:
            if not isinstance(token, str) or len(token) > _MAX_TOKEN:
                raise Unauthenticated("the credentials were not accepted")
            grant, token_digest = self._guard.sign_in(token, peer)
        except Unauthenticated:
            alarm = self._sign_ins.failed(peer)
            if alarm is not None and alarm.first:
                log.warning(
                    "dashboard sign-in failures over all addresses past their budget: someone "
                    "may be guessing tokens; addresses are still limited one by one",
                    extra={"peer": peer},
                )
            return self._render(
                visit, "signin.html", 401, title="Sign in", next=next_page, failed=True
            )
        try:
            session_id, _ = self._sessions.open(grant, token_digest)
        except SessionsFull as exc:
            log.warning("dashboard sign-in refused: sessions full", extra={"identity": grant.name})
            return _retry_after(self._error(visit, 503, str(exc)), exc.retry_after)
        response = _redirect(next_page)
        _set_cookie(request, response, session_id)
        log.info("dashboard sign-in", extra={"identity": grant.name})
        return response

    def _limited(self, visit: _Visit, limited: Limited, peer: str) -> web.Response:
        """A sign-in refused for its rate: 429, with when to try again. Logged once per
        spell of refusals (a flood of attempts is one line, not one each)."""
        if limited.first:
            log.warning(
                "dashboard sign-ins limited",
                extra={"peer": peer, "scope": limited.scope, "retry_after_s": limited.retry_after},
            )
        message = (
            "too many failed sign-in attempts from this address: try again in "
            f"{limited.retry_after} s"
        )
        return _retry_after(self._error(visit, 429, message), limited.retry_after)

    async def _signout(self, visit: _Visit) -> web.Response:
        self._sessions.close(visit.request.cookies.get(COOKIE, ""))
        response = _redirect(f"{PREFIX}/signin" if self._guard is not None else f"{PREFIX}/")
        response.del_cookie(COOKIE, path=PREFIX)
        return response

    async def _asset(self, request: web.Request) -> web.Response:
        found = self._assets.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        body, content_type = found
        return web.Response(
            body=body, content_type=content_type, headers={"Cache-Control": "max-age=3600"}
        )

    # --- the charts' samples ------------------------------------------------------------------

    def _viewed(self) -> None:
        self._last_view = time.monotonic()
        if self._sampling is None or self._sampling.done():
            self._sampling = asyncio.get_running_loop().create_task(
                self._sample(), name="cronoq-ui-samples"
            )

    async def _sample(self) -> None:
        while time.monotonic() - self._last_view < _IDLE_STOP_S:
            self.sample()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def sample(self) -> None:
        """Add a sample of the leader's counters to the charts' ring (none on a standby): what
        the sampling loop does every ``SAMPLE_INTERVAL_S``."""
        sched = self._replica.scheduler
        if sched is not None and self._replica.role is Role.LEADING:
            metrics = sched.metrics(gauges=False)  # the counters: no pass over tasks
            self._samples.append(Sample(self._clock(), metrics.epoch, dict(metrics.finished)))

    async def _stop_sampling(self, _: web.Application) -> None:
        if self._sampling is not None:
            self._sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampling


async def _to_overview(_: web.Request) -> web.Response:
    return _redirect(f"{PREFIX}/")


def _status_of(exc: CronoqError) -> int:
    if isinstance(exc, TaskNotFound | ScheduleNotFound):
        return 404
    if isinstance(exc, PermissionDenied):
        return 403
    if isinstance(exc, SchedulerError):
        return 503
    if isinstance(exc, InvalidArgument):
        return 400
    return 409


def _retry_after(response: web.Response, seconds: float) -> web.Response:
    response.headers["Retry-After"] = str(max(1, math.ceil(seconds)))
    return response


def _check_origin(request: web.Request) -> None:
    """A browser says where a POST comes from: only this host's pages may post here."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise _Refused(403, "a form of another site cannot act here")
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        raise _Refused(403, "a form of another site cannot act here")


async def _checked_form(
    request: web.Request, session: Session
) -> MultiDictProxy[str | bytes | bytearray | FileField]:
    """The form of a POST, which must carry the session's CSRF token."""
    form = await request.post()
    csrf = form.get("csrf")
    if not isinstance(csrf, str) or not hmac.compare_digest(csrf.encode(), session.csrf.encode()):
        raise _Refused(403, "the form's CSRF token is missing or stale: reload the page")
    return form


def _set_cookie(request: web.Request, response: web.StreamResponse, session_id: str) -> None:
    response.set_cookie(
        COOKIE,
        session_id,
        path=PREFIX,
        httponly=True,
        samesite="Strict",
        secure=request.secure,
        max_age=int(SESSION_LIFETIME_S),
    )
