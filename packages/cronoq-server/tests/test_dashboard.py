"""The dashboard's handlers without a browser: a real Replica leading on a MemoryStore (on
PostgreSQL for the outbox, which only its store has), the dashboard on aiohttp's test server,
requests through an aiohttp client. Escaping, bounds, CSRF, sign-in and permissions; the pure
helpers (previews, rates, sessions)."""

from __future__ import annotations

import asyncio
import hashlib
import html
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

import aiohttp
import markupsafe
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from outbox_rows import QuarantineLog, correct_options, enqueue, unknown_pool, wait_until
from server_pg import PG_DSN, pg_schema

from cronoq import (
    InvalidArgument,
    LeasedAttempt,
    Limit,
    MemoryStore,
    RemotePool,
    RetryPolicy,
    Status,
    WorkerLink,
)
from cronoq.store import QuarantinedRow, Store
from cronoq_server._auth import AuthCollector, Grant, Guard, TokenTable
from cronoq_server._config import NO_OUTBOX, AuthSettings, IdentitySettings
from cronoq_server._http import Readiness
from cronoq_server._replica import Replica, Role
from cronoq_server._ui import Dashboard
from cronoq_server._ui._app import _when, _when_in
from cronoq_server._ui._samples import HEADLINE_S, Rate, Sample, Tick, chart, rates, tally
from cronoq_server._ui._sessions import Limited, Sessions, SessionsFull, SignInLimiter
from cronoq_server._ui._views import (
    OUTBOX_PAYLOAD_BYTES,
    OUTBOX_REASON_BYTES,
    OUTBOX_TEXT_BYTES,
    PREVIEW_BYTES,
    OutboxQuery,
    TaskQuery,
    duration,
    preview,
    quarantine_rows,
)
from cronoq_store_postgres import PgStore, PgStoreConfig

__all__ = ["pg_schema"]  # a fixture: requested by name

TOKENS = {"admin": secrets.token_urlsafe(32), "reader": secrets.token_urlsafe(32)}
WRONG = secrets.token_urlsafe(32)
PERMISSIONS = {"admin": {"admin"}, "reader": {"read"}}
HOSTILE = "<script>alert('x')</script>"
ESCAPED = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"


def _identities() -> tuple[IdentitySettings, ...]:
    return tuple(
        IdentitySettings(
            name,
            frozenset(PERMISSIONS[name]),
            token_sha256=(hashlib.sha256(token.encode()).hexdigest(),),
        )
        for name, token in TOKENS.items()
    )


@dataclass
class Harness:
    http: aiohttp.ClientSession
    replica: Replica
    guard: Guard | None
    url: str
    dashboard: Dashboard

    def browser(self) -> aiohttp.ClientSession:
        """Another browser: a client with cookies of its own."""
        return aiohttp.ClientSession(self.url, cookie_jar=aiohttp.CookieJar(unsafe=True))


async def _memory() -> Store:
    return MemoryStore()


@asynccontextmanager
async def harness(
    *,
    auth: bool = True,
    lead: bool = True,
    closed: str | None = None,
    sessions: Sessions | None = None,
    sign_ins: SignInLimiter | None = None,
    clock: Callable[[], float] = time.time,
    store: Callable[[], Awaitable[Store]] = _memory,
    limits: Sequence[Limit] = (),
    pools: Sequence[RemotePool] = (RemotePool("default"), RemotePool("other")),
) -> AsyncIterator[Harness]:
    replica = Replica(
        store,
        list(pools),
        commit_timeout=2.0,
        retention=3600.0,
        drain_timeout=1.0,
        max_payload_bytes=1 << 20,
        fatal_attempts=3,
        limits=limits,
    )
    guard = None
    if auth:
        identities = _identities()
        table = TokenTable.build(identities, ())
        guard = Guard(AuthSettings(identities=identities), table, AuthCollector())
    dashboard = Dashboard(
        replica,
        readiness=lambda: Readiness(replica.ready, replica.role.value),
        workers=list,
        guard=guard,
        closed=closed,
        sessions=sessions,
        sign_ins=sign_ins,
        clock=clock,
    )
    app = web.Application()
    dashboard.install(app)
    leading = asyncio.Event()
    replica.on_change(lambda role: leading.set() if role is Role.LEADING else None)
    running = asyncio.ensure_future(replica.run()) if lead else None
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        if running is not None:
            async with asyncio.timeout(10):
                await leading.wait()
        jar = aiohttp.CookieJar(unsafe=True)  # cookies of 127.0.0.1
        url = str(server.make_url(""))
        async with aiohttp.ClientSession(url, cookie_jar=jar) as http:
            yield Harness(http, replica, guard, url, dashboard)
    finally:
        await server.close()
        if running is not None:
            replica.shutdown()
            await running


async def sign_in(http: aiohttp.ClientSession, token: str) -> str:
    """Sign in; return the session's CSRF token (from the sign-out form of a page)."""
    async with http.post("/ui/signin", data={"token": token}, allow_redirects=False) as answer:
        assert answer.status == 303, await answer.text()
    return await csrf_of(http)


async def csrf_of(http: aiohttp.ClientSession) -> str:
    async with http.get("/ui/pools") as page:
        found = re.search(r'name="csrf" value="([^"]+)"', await page.text())
    assert found is not None
    return found.group(1)


async def text(http: aiohttp.ClientSession, path: str, status: int = 200) -> str:
    async with http.get(path, allow_redirects=False) as answer:
        body = await answer.text()
        assert answer.status == status, body
        return body


# --- escaping and bounds ----------------------------------------------------------------------


async def test_user_strings_are_escaped_on_every_page() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        task_id = await sched.submit(
            HOSTILE, HOSTILE.encode(), key=HOSTILE, tags=[HOSTILE], name=HOSTILE
        )
        await sched.add_schedule(HOSTILE, "0 0 1 1 *", kind=HOSTILE, tags=[HOSTILE])
        pages = ["/ui/", "/ui/tasks", f"/ui/tasks/{task_id}", "/ui/schedules", "/ui/pools"]
        pages.append(f"/ui/tasks?kind={quote(HOSTILE, safe='')}")
        for path in pages:
            body = await text(h.http, path)
            assert HOSTILE not in body, path
        body = await text(h.http, f"/ui/tasks/{task_id}")
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in body
        # A query value comes back escaped in the filter form too.
        body = await text(h.http, '/ui/tasks?tag="><b>x')
        assert '"><b>x' not in body and "&#34;&gt;&lt;b&gt;x" in body


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/ui/tasks?limit=201", "limit must be at most 200"),
        ("/ui/tasks?limit=0", "limit must be between 1 and"),
        ("/ui/tasks?limit=-5", "limit must be a whole number"),
        ("/ui/tasks?status=lost", "status must be one of waiting"),
        ("/ui/tasks?after=x", "after must be a whole number"),
        (f"/ui/tasks?pool={'p' * 1025}", "pool is longer than 1024 characters"),
        (f"/ui/tasks?kind={'k' * 300}", "kind is 300 characters long; the limit is 255"),
        ("/ui/tasks/abc", "task id must be a whole number"),
        (f"/ui/tasks/{2**63}", "task id must be between 1 and"),
        ("/ui/tasks/0", "task id must be between 1 and"),
        ("/ui/outbox?limit=201", "limit must be at most 200"),
        ("/ui/outbox?after=-1", "after must be a whole number"),
        (f"/ui/outbox?after={2**63}", "after must be between 0 and"),
    ],
)
async def test_every_query_parameter_is_bounded(path: str, message: str) -> None:
    async with harness(auth=False) as h:
        body = await text(h.http, path, 400)
        assert message in body


async def test_pages_list_tasks_a_page_at_a_time_with_the_schedulers_token() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        ids = [await sched.submit("k", None, pool="other") for _ in range(5)]
        # The newest first, each page's last id the next one's ``before``.
        first = await text(h.http, "/ui/tasks?limit=2")
        listed = re.findall(r'<a href="/ui/tasks/(\d+)">', first)
        assert listed == [str(ids[4]), str(ids[3])]
        assert f'href="/ui/tasks?limit=2&amp;before={ids[3]}"' in first
        assert 'href="/ui/tasks?limit=2&amp;order=oldest"' in first  # the other order
        last = await text(h.http, f"/ui/tasks?limit=2&before={ids[1]}")
        assert re.findall(r'<a href="/ui/tasks/(\d+)">', last) == [str(ids[0])]
        assert 'rel="next"' not in last and "First page" in last
        # In submission order, each page's last id the next one's ``after``.
        first = await text(h.http, "/ui/tasks?limit=2&order=oldest")
        listed = re.findall(r'<a href="/ui/tasks/(\d+)">', first)
        assert listed == [str(i) for i in ids[:2]]
        assert f'href="/ui/tasks?limit=2&amp;order=oldest&amp;after={ids[1]}"' in first
        last = await text(h.http, f"/ui/tasks?limit=2&order=oldest&after={ids[3]}")
        assert re.findall(r'<a href="/ui/tasks/(\d+)">', last) == [str(ids[4])]
        assert 'rel="next"' not in last and "First page" in last
        keyed = await sched.submit("k", None, key="the-key")
        found = await text(h.http, "/ui/tasks?key=the-key")
        assert re.findall(r'<a href="/ui/tasks/(\d+)">', found) == [str(keyed)]


async def test_a_task_page_shows_its_dependencies_both_ways_and_a_bounded_preview() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        parent = await sched.submit("parent", b"x" * (PREVIEW_BYTES + 10), pool="other")
        child = await sched.submit("child", b'{"a": 1}', after=[parent])
        body = await text(h.http, f"/ui/tasks/{parent}")
        assert f'<a href="/ui/tasks/{child}">' in body
        assert f"{PREVIEW_BYTES + 10} bytes, the first part shown" in body
        body = await text(h.http, f"/ui/tasks/{child}")
        assert f'<li><a href="/ui/tasks/{parent}">' in body
        assert "{\n  &#34;a&#34;: 1\n}" in body  # JSON, indented


async def test_a_task_page_shows_its_dependants_once_the_parent_finished() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        parent = await sched.submit("parent", None)
        child = await sched.submit("child", None, after=[parent])
        other = await sched.submit("other", None)  # submitted after it, not a dependant
        assert await sched.cancel(parent) is Status.CANCELLED  # and the child with it
        body = await text(h.http, f"/ui/tasks/{parent}")
        assert f'<a href="/ui/tasks/{child}">' in body
        assert f'<a href="/ui/tasks/{other}">' not in body
        body = await text(h.http, f"/ui/tasks/{other}")
        assert "None known." in body


def attempt_table(body: str) -> list[list[str]]:
    """The cells of the attempts table of a task's page, tags stripped, a list per row."""
    table = re.search(r'<table id="attempt-table"[^>]*>.*?<tbody>(.*?)</tbody>', body, re.S)
    assert table is not None, body
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]
    return [[re.sub(r"<[^>]+>", "", cell).strip() for cell in row] for row in cells]


async def leased(link: WorkerLink) -> LeasedAttempt:
    async with asyncio.timeout(10):
        attempt = await link.next()
    assert isinstance(attempt, LeasedAttempt), attempt
    return attempt


async def test_a_task_page_lists_its_attempts_failed_running_and_succeeded() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        async with sched.attach(["default"], slots=1) as link:
            task_id = await sched.submit("flaky", None)
            for n in (1, 2):
                attempt = await leased(link)
                await sched.report_failure(
                    attempt.token, f"upstream answered 50{n}", retry_after=0,
                    lease_id=attempt.lease_id,
                )  # fmt: skip
            third = await leased(link)
            running = attempt_table(await text(h.http, f"/ui/tasks/{task_id}"))
            assert [(row[0], row[2], row[3]) for row in running] == [
                ("1", running[0][2], running[0][3]),
                ("2", running[1][2], running[1][3]),
                ("3", "running", "—"),
            ]
            assert running[2][1].endswith("UTC"), "a running attempt shows its start"
            await sched.report_success(third.token, lease_id=third.lease_id)
            assert (await sched.wait(task_id, timeout=10)).status is Status.SUCCEEDED
        rows = attempt_table(await text(h.http, f"/ui/tasks/{task_id}"))
        history = await sched.attempts(task_id)
        assert [a.attempt for a in history] == [1, 2], "a success writes no history row"
        assert [row[0] for row in rows] == ["1", "2", "3"]
        for row, failure in zip(rows, history, strict=False):
            started, finished, took, message = row[1:]
            assert started.endswith("UTC") and finished.endswith("UTC")
            assert took.endswith(("ms", " s")), took
            assert message == (
                f"attempt {failure.attempt} failed: upstream answered 50{failure.attempt}; "
                "retrying in 0s"
            )
        # The success, from the task itself: its start (kept by the store) and its finish.
        success = await sched.get(task_id)
        assert success.started_at is not None and success.finished_at is not None
        started, ended, took, message = rows[2][1:]
        assert started.endswith("UTC") and ended.endswith("UTC")
        assert took == duration((success.finished_at - success.started_at).total_seconds())
        assert message == "attempt 3 succeeded"


async def test_the_limits_page_shows_each_limits_use_and_a_held_task_what_it_waits_for() -> None:
    limits = [Limit("tenant", concurrency=1, per_key=True), Limit("stripe", rate=5, per=1)]
    async with harness(auth=False, limits=limits) as h:
        sched = h.replica.leader()
        async with sched.attach(["default"], slots=5) as link:
            keys = {"tenant": HOSTILE, "stripe": None}
            first = await sched.submit("limited", None, limits=keys)
            attempt = await leased(link)
            held = await sched.submit("limited", None, limits=keys)
            page = await text(h.http, "/ui/limits")
            assert HOSTILE not in page
            rows = {row[0]: row[1:] for row in _table_rows(page, "limit-table")}
            assert rows["tenant"] == [
                "1 running, per key", "queue", "1", "1", "0", "1",
                f"{ESCAPED} 1 running, 1 waiting",
            ]  # fmt: skip
            assert rows["stripe"][:6] == ["5 starts per 1s", "queue", "1", "1", "1", "1"]
            task_page = await text(h.http, f"/ui/tasks/{held}")
            assert HOSTILE not in task_page
            waiting_for = (await sched.get(held)).waiting_for
            assert waiting_for == f"limit 'tenant' key {HOSTILE!r}: 1 of 1 running"
            waiting = markupsafe.escape(waiting_for)
            assert f'<dd class="message waiting-for">{waiting}</dd>' in task_page
            assert "Waiting for" not in await text(h.http, f"/ui/tasks/{first}")
            assert '<a href="/ui/limits" aria-current="page">Limits</a>' in page
            await sched.report_success(attempt.token, lease_id=attempt.lease_id)
            second = await leased(link)
            await sched.report_success(second.token, lease_id=second.lease_id)
    async with harness(auth=False) as h:
        assert "No task limit is configured" in await text(h.http, "/ui/limits")


def _table_rows(page: str, table_id: str) -> list[list[str]]:
    """The cells of a table's body rows, as text with their tags removed (entities kept)."""
    body = page.split(f'id="{table_id}"', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell).strip() for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_a_schedule_time_reads_on_its_zones_clock_with_the_zones_abbreviation() -> None:
    summer, winter = datetime(2026, 7, 1, 1, 0, tzinfo=UTC), datetime(2026, 1, 15, 2, 0, tzinfo=UTC)
    assert _when_in(summer, "Europe/Paris") == "2026-07-01 03:00:00 CEST"  # DST applied
    assert _when_in(winter, "Europe/Paris") == "2026-01-15 03:00:00 CET"
    assert _when_in(winter, "Asia/Kolkata") == "2026-01-15 07:30:00 IST"
    assert _when_in(winter, "UTC") == _when(winter) == "2026-01-15 02:00:00 UTC"
    assert _when_in(winter, "Nowhere/Atlantis") == "2026-01-15 02:00:00 UTC"


async def test_the_schedules_page_shows_each_schedules_times_in_its_zone_and_in_utc() -> None:
    async with harness() as h:
        sched = h.replica.leader()
        await sched.add_schedule("digest", "30 9 * * *", kind="k", timezone="Asia/Kolkata")
        await sched.add_schedule("nightly", "0 3 * * *", kind="k")
        csrf = await sign_in(h.http, TOKENS["admin"])
        body = await text(h.http, "/ui/schedules")
        digest, nightly = re.findall(r'<ul class="times">(.*?)</ul>', body, re.S)
        # 09:30 in Kolkata (UTC+05:30, no DST) is 04:00 UTC: the zone, then each run on its
        # clock (UTC in the title) and on UTC's.
        assert digest.count('<li class="zone">Asia/Kolkata</li>') == 1
        shown = re.findall(r'title="([^"]+)">([^<]+)</time>.*?<span class="help">([^<]+)<', digest)
        assert len(shown) == 3
        for utc_title, here, utc in shown:
            assert here.endswith(" 09:30:00 IST") and utc.endswith(" 04:00:00 UTC")
            assert utc_title == utc
        # A UTC schedule: its times once, no zone line.
        assert "zone" not in nightly and "help" not in nightly
        assert nightly.count(" 03:00:00 UTC</time>") == 3
        # The notice of a resume gives its next run on the zone's clock, and UTC's.
        await sched.pause_schedule("digest")
        async with h.http.post(
            "/ui/act/resume-schedule", data={"schedule": "digest", "csrf": csrf}
        ) as answer:
            assert re.search(
                r"schedule digest resumed: next run at \S+ 09:30:00 IST \(\S+ 04:00:00 UTC\)",
                await answer.text(),
            )


async def test_a_failure_shows_its_error_in_the_list_and_its_traceback_on_its_page() -> None:
    """Why a task failed without opening it (the list's error column), and where, once opened
    (the traceback its worker sent, escaped like any text)."""
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        trace = '  File "job.py", line 9, in run\n    parse(row)\nValueError: <b>bad</b> row'
        async with sched.attach(["default"], slots=1) as link:
            task_id = await sched.submit("parse", None, retry=RetryPolicy(max_attempts=1))
            attempt = await leased(link)
            await sched.report_failure(
                attempt.token, "ValueError: <b>bad</b> row", lease_id=attempt.lease_id,
                traceback=trace,
            )  # fmt: skip
            assert (await sched.wait(task_id, timeout=10)).status is Status.FAILED
        error = "attempt 1 failed: ValueError: &lt;b&gt;bad&lt;/b&gt; row; no attempts left"
        listing = await text(h.http, "/ui/tasks?status=failed")
        assert f'<td data-label="Error" class="message">{error}</td>' in listing
        page = await text(h.http, f"/ui/tasks/{task_id}")
        assert f'<dd class="message">{error}</dd>' in page
        shown = re.search(r'<h2 id="traceback">Traceback</h2>\s*<pre[^>]*>(.*?)</pre>', page, re.S)
        assert shown is not None, page
        assert html.unescape(shown.group(1)) == f"Traceback (most recent call last):\n{trace}"
        assert "<b>bad</b>" not in page
        [row] = attempt_table(page)
        assert row[4].startswith(error) and "Traceback" in row[4]


# --- actions: CSRF, origin, permissions ---------------------------------------------------------


async def test_an_action_needs_the_sessions_csrf_token_and_a_same_origin_form() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None)
        csrf = await csrf_of(h.http)
        form = {"task": str(task_id)}
        async with h.http.post("/ui/act/cancel", data=form) as answer:
            assert answer.status == 403
            assert "CSRF token is missing or stale" in await answer.text()
        async with h.http.post("/ui/act/cancel", data={**form, "csrf": "forged"}) as answer:
            assert answer.status == 403
        cross = {"Origin": "https://evil.example"}
        async with h.http.post(
            "/ui/act/cancel", data={**form, "csrf": csrf}, headers=cross
        ) as answer:
            assert answer.status == 403
            assert "a form of another site" in await answer.text()
        assert (await sched.get(task_id)).status is Status.READY
        async with h.http.post(
            "/ui/act/cancel",
            data={**form, "csrf": csrf, "back": "//evil.example/"},
            allow_redirects=False,
        ) as answer:
            assert answer.status == 400  # never another site, and nothing applied
        assert (await sched.get(task_id)).status is Status.READY
        async with h.http.post(
            "/ui/act/cancel", data={**form, "csrf": csrf}, allow_redirects=False
        ) as answer:
            assert answer.status == 303
            assert answer.headers["Location"] == "/ui/tasks"
        assert (await sched.get(task_id)).status is Status.CANCELLED
        page = await text(h.http, "/ui/tasks")
        assert f"task {task_id}: cancel requested, it is cancelled" in page


BAD_TARGETS = [
    "/ui/tasks\r\nSet-Cookie: x=1",  # CR LF: a header of the attacker's
    "/ui/tasks\n",
    "/ui/tasks\x00",
    "/ui/tasks\x7f",
    "/ui/tasks\u2028",
    "/ui/\u202etasks",  # a bidirectional override
    "//evil.example/ui/",
    "https://evil.example/ui/",
    "/ui\\evil.example",
    "/elsewhere",
    "/ui/" + "x" * 2048,
]


@pytest.mark.parametrize("back", BAD_TARGETS)
async def test_an_action_with_a_bad_return_address_is_a_400_and_applies_nothing(
    back: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 29 item 4: the action used to be applied and the browser left without an answer
    (aiohttp refused the header, with a 2 KB traceback in the log)."""
    caplog.set_level(logging.DEBUG)
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None)
        csrf = await csrf_of(h.http)
        form = {"task": str(task_id), "csrf": csrf, "back": back}
        async with h.http.post("/ui/act/cancel", data=form, allow_redirects=False) as answer:
            assert answer.status == 400
            body = await answer.text()
        message = "back must be a page of this dashboard: a path under /ui/, without control"
        assert message in body
        assert (await sched.get(task_id)).status is Status.READY
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


@pytest.mark.parametrize("target", BAD_TARGETS)
async def test_a_sign_in_with_a_bad_next_page_is_a_400_and_opens_no_session(
    target: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with harness() as h:
        async with h.http.get(f"/ui/signin?next={quote(target, safe='')}") as answer:
            assert answer.status == 400
            assert "next must be a page of this dashboard" in await answer.text()
        form = {"token": TOKENS["admin"], "next": target}
        async with h.http.post("/ui/signin", data=form, allow_redirects=False) as answer:
            assert answer.status == 400
            assert "Set-Cookie" not in answer.headers
        assert list(h.http.cookie_jar) == []
        await text(h.http, "/ui/tasks", 303)  # not signed in
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_a_return_address_with_other_characters_is_sent_percent_encoded() -> None:
    """A page's own address (``request.path_qs``, its query decoded) goes back as it came,
    with what a header must not carry raw percent-encoded."""
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None)
        csrf = await csrf_of(h.http)
        form = {"task": str(task_id), "csrf": csrf, "back": "/ui/tasks?kind=é x<y>&tag=a%26b"}
        async with h.http.post("/ui/act/cancel", data=form, allow_redirects=False) as answer:
            assert answer.status == 303
            assert answer.headers["Location"] == "/ui/tasks?kind=%C3%A9%20x<y>&tag=a%26b"
        assert (await sched.get(task_id)).status is Status.CANCELLED


async def test_a_refused_action_says_why_and_a_bad_target_is_a_400() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None)
        csrf = await csrf_of(h.http)
        async with h.http.post(
            "/ui/act/retry", data={"task": str(task_id), "csrf": csrf}
        ) as answer:
            assert answer.status == 200  # redirected to the tasks page, which says why
            assert f"task {task_id} is ready: only a failed or cancelled task" in (
                await answer.text()
            )
        async with h.http.post("/ui/act/cancel", data={"task": "1e3", "csrf": csrf}) as answer:
            assert answer.status == 400
        async with h.http.post("/ui/act/explode", data={"csrf": csrf}) as answer:
            assert answer.status == 404
        async with h.http.post(
            "/ui/act/pause-pool", data={"pool": "x" * 256, "csrf": csrf}
        ) as answer:
            assert answer.status == 400


async def test_sign_in_gives_a_session_cookie_and_a_reader_is_offered_and_allowed_no_action(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with harness() as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None)
        async with h.http.get("/ui/tasks", allow_redirects=False) as answer:
            assert answer.status == 303
            assert answer.headers["Location"] == "/ui/signin?next=%2Fui%2Ftasks"
        async with h.http.post("/ui/act/cancel", data={"task": str(task_id)}) as answer:
            assert answer.status == 401  # no session: no action, whatever the form says
        wrong = secrets.token_urlsafe(32)
        async with h.http.post("/ui/signin", data={"token": wrong}) as answer:
            assert answer.status == 401
        async with h.http.post("/ui/signin", data={"token": "t" * 5000}) as answer:
            assert answer.status == 401
        async with h.http.post(
            "/ui/signin", data={"token": TOKENS["reader"]}, allow_redirects=False
        ) as answer:
            cookie = answer.headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/ui" in cookie
        assert TOKENS["reader"] not in cookie
        csrf = await csrf_of(h.http)
        for path in ("/ui/", "/ui/tasks", f"/ui/tasks/{task_id}", "/ui/schedules", "/ui/pools"):
            body = await text(h.http, path)
            assert "/ui/act/" not in body, path  # no action offered
        async with h.http.post(
            "/ui/act/cancel", data={"task": str(task_id), "csrf": csrf}
        ) as answer:
            assert answer.status == 403
            assert "identity &#39;reader&#39; lacks the permission &#39;cancel&#39;" in (
                await answer.text()
            )
        assert (await sched.get(task_id)).status is Status.READY
        # A token revoked by a reload ends the sessions it opened.
        assert h.guard is not None
        h.guard.tokens = TokenTable.build(_identities()[:1], ())
        await text(h.http, "/ui/tasks", 303)
    logged = caplog.text
    assert wrong not in logged and TOKENS["reader"] not in logged
    assert "authentication failed" in logged


async def test_an_admin_is_offered_every_action_and_signs_out() -> None:
    async with harness() as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None)
        csrf = await sign_in(h.http, TOKENS["admin"])
        body = await text(h.http, f"/ui/tasks/{task_id}")
        assert 'action="/ui/act/cancel"' in body
        body = await text(h.http, "/ui/pools")
        assert 'action="/ui/act/pause-pool"' in body
        async with h.http.post("/ui/signout", data={"csrf": csrf}, allow_redirects=False) as answer:
            assert answer.headers["Location"] == "/ui/signin"
        await text(h.http, "/ui/tasks", 303)


async def test_a_standby_says_so_and_an_open_dashboard_off_loopback_is_closed() -> None:
    async with harness(auth=False, lead=False) as h:
        body = await text(h.http, "/ui/tasks", 503)
        assert "This replica is <strong>standby</strong>" in body
        # Even a refusal starts the browser's anonymous session (its CSRF token).
        assert [cookie.key for cookie in h.http.cookie_jar] == ["cronoq_session"]
        body = await text(h.http, "/ui/")
        assert "This replica is <strong>standby</strong>" in body
    async with harness(auth=False, lead=False, closed="the dashboard is off") as h:
        assert "the dashboard is off" in await text(h.http, "/ui/", 403)
        async with h.http.get("/ui/static/htmx.min.js") as answer:
            assert answer.status == 200  # assets need no session


async def test_every_answer_carries_the_security_headers() -> None:
    async with harness() as h:
        for path in ("/ui/signin", "/ui/tasks", "/ui/static/ui.css", "/ui/nothing"):
            async with h.http.get(path, allow_redirects=False) as answer:
                policy = answer.headers["Content-Security-Policy"]
                assert "script-src 'self'" in policy and "unsafe" not in policy, path
                assert answer.headers["X-Frame-Options"] == "DENY"


# --- the outbox (PostgreSQL) ---------------------------------------------------------------


def _pg(schema: str) -> Callable[[], Awaitable[Store]]:
    async def connect() -> Store:
        return await PgStore.connect(PG_DSN, PgStoreConfig(schema=schema, outbox_poll=0.1))

    return connect


def _row_ids(page: str) -> list[int]:
    return [int(found) for found in re.findall(r'<td data-label="Id" class="id">(\d+)</td>', page)]


async def test_the_outbox_page_lists_quarantined_rows_with_their_reasons_a_page_at_a_time(
    pg_schema: str,
) -> None:
    with QuarantineLog.watching() as log:
        async with harness(auth=False, store=_pg(pg_schema)) as h:
            ids = await enqueue(
                pg_schema,
                unknown_pool(HOSTILE, HOSTILE.encode()),
                unknown_pool("binary", bytes(range(256)) * 4),
                ("late", b"", '{"priority": 1e99}'),
            )
            reasons = await log.quarantined(*ids)
            assert reasons[ids[2]].startswith("InvalidArgument: priority must be between")
            first = await text(h.http, "/ui/outbox?limit=2")
            assert _row_ids(first) == ids[:2]
            assert "UnknownPool: unknown pool &#39;nope&#39;; configured: default, other" in first
            assert HOSTILE not in first and "&lt;script&gt;" in first
            assert "1024 bytes, hex" in first  # the binary payload: its size, and hex
            assert '<a href="/ui/outbox" aria-current="page">Outbox</a>' in first  # navigation
            assert f'href="/ui/outbox?limit=2&amp;after={ids[1]}" rel="next"' in first
            second = await text(h.http, f"/ui/outbox?limit=2&after={ids[1]}")
            assert _row_ids(second) == ids[2:]
            assert "priority must be" in second and 'rel="next"' not in second
            assert 'href="/ui/outbox?limit=2">First page</a>' in second
            # The overview: the figures the leader read last (once a second, no query).
            sched = h.replica.leader()
            await wait_until(
                lambda: sched.metrics(gauges=False).outbox_quarantine_depth == 3, "figures"
            )
            overview = await text(h.http, "/ui/")
            assert '<dd id="outbox-depth">0</dd>' in overview
            assert '<dd id="outbox-oldest">none waits</dd>' in overview
            assert '<a href="/ui/outbox" id="outbox-quarantined">3 rows</a>' in overview


async def test_an_admin_requeues_and_discards_rows_and_a_reader_is_offered_neither(
    pg_schema: str,
) -> None:
    with QuarantineLog.watching() as log:
        async with harness(store=_pg(pg_schema)) as h:
            fixed, dropped = await enqueue(pg_schema, unknown_pool("fixed"), unknown_pool())
            await log.quarantined(fixed, dropped)
            reader = h.browser()
            try:
                await sign_in(reader, TOKENS["reader"])
                page = await text(reader, "/ui/outbox")
                assert _row_ids(page) == [fixed, dropped] and "/ui/act/" not in page
                csrf = await csrf_of(reader)
                form = {"row": str(fixed), "csrf": csrf}
                async with reader.post("/ui/act/discard-outbox", data=form) as answer:
                    assert answer.status == 403
                    assert "lacks the permission &#39;admin&#39;" in await answer.text()
            finally:
                await reader.close()
            csrf = await sign_in(h.http, TOKENS["admin"])
            page = await text(h.http, "/ui/outbox")
            assert f'id="requeue-{fixed}"' in page and f'id="discard-{dropped}"' in page
            # Corrected by SQL, then requeued: the leader ingests it into a task.
            await correct_options(pg_schema, fixed, '{"key": "fixed-row"}')
            async with h.http.post(
                "/ui/act/requeue-outbox", data={"row": str(fixed), "csrf": csrf}
            ) as answer:
                assert answer.status == 200  # back on the outbox page, which says what it did
                assert f"outbox row {fixed} requeued" in await answer.text()
            sched = h.replica.leader()

            async def ingested() -> bool:
                return await sched.get_by_key("fixed-row") is not None

            await wait_until(ingested, "the requeued row's task")
            form = {"row": str(dropped), "csrf": csrf, "back": "/ui/outbox?limit=10"}
            async with h.http.post(
                "/ui/act/discard-outbox", data=form, allow_redirects=False
            ) as answer:
                assert answer.headers["Location"] == "/ui/outbox?limit=10"
            page = await text(h.http, "/ui/outbox?limit=10")
            assert f"outbox row {dropped} discarded" in page and _row_ids(page) == []
            async with h.http.post("/ui/act/discard-outbox", data=form) as answer:
                assert f"outbox row {dropped} is not in the quarantine" in await answer.text()
            async with h.http.post(
                "/ui/act/requeue-outbox", data={"row": "1e3", "csrf": csrf}
            ) as answer:
                assert answer.status == 400
                assert "outbox row id must be a whole number" in await answer.text()


async def test_without_an_outbox_its_page_says_how_to_have_one() -> None:
    async with harness(auth=False) as h:
        shown = NO_OUTBOX.replace("'", "&#39;")  # as Jinja escapes it
        page = await text(h.http, "/ui/outbox")
        assert shown in page
        assert '<a href="/ui/outbox"' not in page  # not in the navigation
        assert 'id="outbox"' not in await text(h.http, "/ui/")  # no outbox on the overview
        csrf = await csrf_of(h.http)
        async with h.http.post("/ui/act/requeue-outbox", data={"row": "1", "csrf": csrf}) as answer:
            assert shown in await answer.text()


# --- the pure parts -------------------------------------------------------------------------


def test_a_preview_is_text_json_or_hex_and_bounded() -> None:
    assert preview(None) is None
    found = preview(b"plain")
    assert found is not None and (found.text, found.binary, found.truncated) == (
        "plain",
        False,
        False,
    )
    cut = preview("é".encode() * PREVIEW_BYTES)  # a character cut by the end
    assert cut is not None and not cut.binary and cut.truncated
    assert len(cut.text) == PREVIEW_BYTES // 2
    binary = preview(bytes(range(256)) * 10)
    assert binary is not None and binary.binary and binary.truncated
    assert binary.text.startswith("0001 0203")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.00664, "6.64 ms"),
        (1.5, "1.5 s"),
        (59.9, "59.9 s"),
        (245, "4 min 05 s"),
        (7380, "2 h 03 min"),
    ],
)
def test_a_duration_reads_in_the_unit_that_fits(seconds: float, shown: str) -> None:
    assert duration(seconds) == shown


def test_rates_skip_a_change_of_leader_and_chart_scales_to_the_peak() -> None:
    samples = [
        Sample(100.0, 1, {("p", "succeeded"): 0}),
        Sample(105.0, 1, {("p", "succeeded"): 10, ("p", "failed"): 5}),
        Sample(110.0, 2, {("p", "succeeded"): 1}),  # a new leader: counters from zero
        Sample(115.0, 2, {("p", "succeeded"): 11, ("q", "failed"): 99}),
    ]
    found = rates(samples, "p")
    assert [(r.at, r.finished, r.failed) for r in found] == [(105.0, 3.0, 1.0), (115.0, 2.0, 0.0)]
    drawn = chart(found, now=115.0, width=100, height=10)
    assert drawn.peak == 3.0
    assert drawn.finished.split(" ") == ["0.0,1.0", "100.0,3.7"]  # the peak at the top
    assert drawn.span_s == 10.0  # the ring holds 10 s so far: the axis spans them
    # The axes: time from the span's start to now, tasks per second from 0 to the peak.
    assert drawn.x_ticks == (Tick(0.0, "-10 s"), Tick(100.0, "now"))
    assert drawn.y_ticks == (Tick(9.0, "0"), Tick(1.0, "3"))


def test_the_time_axis_ticks_every_5_minutes_over_the_window_and_every_minute_below_10() -> None:
    rate = [Rate(0.0, 1.0, 0.0)]
    full = chart(rate, now=900.0, width=300)
    assert [t.label for t in full.x_ticks] == ["-15 min", "-10 min", "-5 min", "now"]
    assert [t.at for t in full.x_ticks] == [0.0, 100.0, 200.0, 300.0]
    filling = chart([Rate(600.0, 1.0, 0.0)], now=780.0, width=300)  # 3 minutes so far
    assert [t.label for t in filling.x_ticks] == ["-3 min", "-2 min", "-1 min", "now"]


def _ring(*points: tuple[float, int, int, int]) -> list[Sample]:
    """Samples of pool p: (at, epoch, succeeded so far, failed so far)."""
    return [
        Sample(at, epoch, {("p", "succeeded"): ok, ("p", "failed"): bad, ("q", "failed"): 7 * bad})
        for at, epoch, ok, bad in points
    ]


def test_the_headline_counts_the_failures_of_its_window_not_of_the_last_sample() -> None:
    # Issue 33: 22 tasks failed for good a minute ago, none since: the last 5-second sample
    # said 0% failed; the headline says 22 of the 30 that finished in the last 5 minutes.
    samples = _ring((1000.0, 1, 0, 0), (1005.0, 1, 8, 22), (1060.0, 1, 8, 22), (1065.0, 1, 8, 22))
    assert rates(samples, "p")[-1].failed == 0.0
    counted = tally(samples, "p", now=1066.0)
    assert (counted.finished, counted.failed, counted.span_s) == (30, 22, 66.0)
    assert counted.failure_ratio == pytest.approx(22 / 30)
    # What ended before the window is left out; the span is the window's.
    old = _ring((600.0, 1, 0, 0), (700.0, 1, 100, 50), (710.0, 1, 100, 50), (1000.0, 1, 100, 50))
    later = tally([*old, *_ring((1005.0, 1, 101, 52))], "p", now=1005.0)
    assert later.span_s == HEADLINE_S - 5.0
    assert (later.finished, later.failed) == (3, 2)
    # Nothing across a change of leader (the counters start again); nothing finished: no ratio.
    changed = tally(_ring((1000.0, 1, 5, 5), (1005.0, 2, 1, 0), (1010.0, 2, 1, 0)), "p", 1010.0)
    assert (changed.finished, changed.failed, changed.failure_ratio) == (0, 0, None)
    assert tally([], "p", now=1.0).span_s == 0.0


async def test_the_overview_states_its_headlines_window_and_counts_failures_within_it() -> None:
    now = [1_000_000.0]  # the dashboard's clock, moved by hand
    async with harness(clock=lambda: now[0]) as h:
        sched = h.replica.leader()
        await sign_in(h.http, TOKENS["admin"])
        h.dashboard.sample()
        now[0] += 60
        for task_id in [await sched.submit("k", None) for _ in range(22)]:
            await sched.cancel(task_id)
        h.dashboard.sample()
        now[0] += 5
        h.dashboard.sample()  # a last interval in which nothing ended
        now[0] += 1
        body = await text(h.http, "/ui/")
        assert (
            "Failed or cancelled in the last 1.1 min (as far as the samples go): "
            "<strong>22</strong> of 22 finished (100%)"
        ) in body
        assert "No task finished in the last 1.1 min" in body  # the other pool
        # Once the samples span the window, the headline names it alone; later still, what
        # ended before the window is no longer counted (and the samples, with a gap of 231 s
        # between two of them, cover only the last 4.1 min of it).
        now[0] += HEADLINE_S - 70
        h.dashboard.sample()
        body = await text(h.http, "/ui/")
        assert "in the last 5 min: <strong>22</strong> of 22 finished (100%)" in body
        now[0] += 10
        h.dashboard.sample()
        body = await text(h.http, "/ui/")
        assert "No task finished in the last 4.1 min (as far as the samples go)" in body
        assert "<strong>22</strong>" not in body
        # The chart's legend, and its axes' titles and ticks.
        assert "finished (any outcome), per second" in body
        assert "failed or cancelled, per second" in body
        assert '<text class="title" x="-38" y="-6">tasks/s</text>' in body
        assert ">time</text>" in body
        assert ">-4 min</text>" in body and ">now</text>" in body  # the span the rates cover


def test_a_task_query_keeps_its_filters_across_pages() -> None:
    query = TaskQuery.parse({"status": "ready", "pool": " p ", "limit": "20", "before": "7"})
    assert (query.status, query.pool, query.before, query.limit) == (Status.READY, "p", 7, 20)
    assert query.page(5) == "status=ready&pool=p&limit=20&before=5"
    assert query.reordered() == "status=ready&pool=p&limit=20&order=oldest"
    oldest = TaskQuery.parse({"kind": "k", "order": "oldest", "after": "7"})
    assert (oldest.oldest_first, oldest.after, oldest.paged) == (True, 7, True)
    assert oldest.page(9) == "kind=k&order=oldest&after=9"
    assert oldest.reordered() == "kind=k"
    # The bound at the far end of the order stays on every page.
    bounded = TaskQuery.parse({"kind": "k", "after": "3", "before": "9"})
    assert bounded.page(7) == "kind=k&after=3&before=7"
    assert bounded.page(None) == "kind=k&after=3"
    bounded = TaskQuery.parse({"kind": "k", "order": "oldest", "after": "3", "before": "9"})
    assert bounded.page(5) == "kind=k&order=oldest&before=9&after=5"
    with pytest.raises(InvalidArgument, match="order must be newest or oldest"):
        TaskQuery.parse({"order": "random"})


def test_an_outbox_page_keeps_its_size_and_shows_each_row_bounded() -> None:
    query = OutboxQuery.parse({"limit": "20", "after": "7"})
    assert (query.after, query.limit) == (7, 20)
    assert query.page(27) == "limit=20&after=27"
    assert query.page(None) == "limit=20"
    assert OutboxQuery.parse({}).page(3) == "after=3"
    with pytest.raises(InvalidArgument, match="limit must be at most 200"):
        OutboxQuery.parse({"limit": "201"})
    huge = QuarantinedRow(
        5, "k" * 300, bytes(range(256)), '{"name": "' + "é" * 500 + '"}', 10**18, "w" * 5000,
        2 * 10**18, 100_000,  # a listing holds the head; the row is 100,000 bytes
    )  # fmt: skip
    [row] = quarantine_rows([huge])
    assert row.reason == "w" * (OUTBOX_REASON_BYTES - 3) + "..."
    assert row.kind == "k" * 253 + "..."
    assert len(row.options.encode()) == OUTBOX_TEXT_BYTES - 1 and row.options.endswith("...")
    assert (row.payload.size, row.payload.binary, row.payload.truncated) == (100_000, True, True)
    assert row.payload.text == bytes(range(OUTBOX_PAYLOAD_BYTES)).hex(" ", 2)
    assert (row.enqueued, row.quarantined) == (
        datetime.fromtimestamp(1e9, UTC),
        datetime.fromtimestamp(2e9, UTC),
    )


def test_sessions_expire_and_anonymous_ones_are_bounded() -> None:
    now = [0.0]
    sessions = Sessions(limit=2, lifetime=10.0, clock=lambda: now[0])
    anonymous = Grant("anonymous", frozenset({"admin"}))
    first, _ = sessions.open(anonymous, None)
    second, _ = sessions.open(anonymous, None)
    sessions.open(anonymous, None)
    # Authentication off: every browser's session is the one anonymous identity's, whose
    # share is the whole limit: the oldest is dropped.
    assert sessions.get(first) is None and sessions.get(second) is not None
    now[0] = 10.0
    assert sessions.get(second) is None and len(sessions) == 1


# --- issue 29 item 5: sessions per identity, a limit that refuses, sign-ins rate limited ------

DIGEST = b"\0" * 32


def test_an_identity_past_its_share_ends_its_own_oldest_session_only() -> None:
    sessions = Sessions(limit=100, per_identity=3)
    admin, _ = sessions.open(Grant("admin"), DIGEST)
    readers = [sessions.open(Grant("reader"), DIGEST)[0] for _ in range(5)]
    assert [sessions.get(r) is not None for r in readers] == [False, False, True, True, True]
    assert sessions.get(admin) is not None
    assert (sessions.of("reader"), sessions.of("admin"), len(sessions)) == (3, 1, 4)


def test_past_the_overall_limit_a_sign_in_is_refused_and_nobody_is_evicted() -> None:
    now = [0.0]
    sessions = Sessions(limit=3, per_identity=2, lifetime=100.0, clock=lambda: now[0])
    admin, _ = sessions.open(Grant("admin"), DIGEST)  # until 100
    now[0] = 10.0
    readers = [sessions.open(Grant("reader"), DIGEST)[0] for _ in range(2)]  # until 110
    with pytest.raises(SessionsFull) as raised:
        sessions.open(Grant("other"), DIGEST)
    assert raised.value.retry_after == 90.0  # when the oldest session ends
    assert "already keeps 3 sessions, its limit" in str(raised.value)
    assert all(sessions.get(s) is not None for s in (admin, *readers))
    # An identity at its share still replaces its own oldest, full or not.
    sessions.open(Grant("reader"), DIGEST)
    assert sessions.get(readers[0]) is None and sessions.get(admin) is not None
    sessions.close(admin)
    now[0] = 50.0
    other, _ = sessions.open(Grant("other"), DIGEST)  # until 150
    with pytest.raises(SessionsFull):
        sessions.open(Grant("admin"), DIGEST)
    now[0] = 110.0  # the readers' sessions expired: their places are free
    assert sessions.open(Grant("admin"), DIGEST) and sessions.get(other) is not None
    assert sessions.of("reader") == 0


def test_failed_sign_ins_are_limited_per_peer_and_raise_an_alarm_over_all_peers() -> None:
    now = [0.0]
    limiter = SignInLimiter(per_peer=(3, 30.0), overall=(5, 10.0), clock=lambda: now[0])
    assert limiter.admit("a") is None  # unknown address: a full budget
    assert [limiter.failed("a") for _ in range(3)] == [None, None, None]
    assert limiter.admit("a") == Limited("peer", 10, first=True)  # one back every 10 s
    assert limiter.admit("a") == Limited("peer", 10, first=False)  # logged once
    assert [limiter.failed("b") for _ in range(2)] == [None, None]
    # Failures over all peers past their budget: an alarm, and "c" is still admitted.
    assert limiter.failed("c") == Limited("overall", 2, first=True)  # one back every 2 s
    assert limiter.failed("c") == Limited("overall", 2, first=False)
    assert limiter.admit("c") is None
    now[0] = 2.0
    assert limiter.admit("a") == Limited("peer", 8, first=False)
    now[0] = 10.0
    assert limiter.admit("a") is None
    limiter.failed("a")
    assert limiter.admit("a") == Limited("peer", 10, first=True)  # a new spell: logged again


def test_the_peers_a_limiter_remembers_are_bounded() -> None:
    limiter = SignInLimiter(per_peer=(1, 60.0), overall=(1000, 1.0), max_peers=2)
    for peer in ("a", "b", "c"):
        limiter.failed(peer)
    assert limiter.admit("c") is not None and limiter.admit("b") is not None
    assert limiter.admit("a") is None  # forgotten: a full budget again


def test_the_default_bounds_are_20_sessions_an_identity_and_10_failures_a_minute() -> None:
    sessions = Sessions()
    for _ in range(21):
        sessions.open(Grant("reader"), DIGEST)
    assert sessions.of("reader") == 20
    limiter = SignInLimiter(clock=lambda: 0.0)
    assert [limiter.failed("peer") for _ in range(10)] == [None] * 10
    assert limiter.admit("peer") == Limited("peer", 6, first=True)
    assert [limiter.failed(f"peer-{i}") for i in range(90)] == [None] * 90
    assert limiter.failed("peer-100") == Limited("overall", 1, first=True)  # 0.6 s, rounded up


async def test_failures_from_everywhere_never_lock_out_a_valid_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Review of issue 29 item 5: when every attempt was charged, failures from enough
    addresses (or behind one proxy) refused every sign-in, the operators' too."""
    caplog.set_level(logging.DEBUG)
    limiter = SignInLimiter(per_peer=(10, 60.0), overall=(1, 60.0), clock=lambda: 0.0)
    async with harness(sign_ins=limiter) as h:
        async with aiohttp.ClientSession(h.url, cookie_jar=aiohttp.DummyCookieJar()) as guesser:
            for _ in range(3):
                async with guesser.post(
                    "/ui/signin", data={"token": WRONG}, allow_redirects=False
                ) as answer:
                    assert answer.status == 401
        await sign_in(h.http, TOKENS["admin"])
        await text(h.http, "/ui/tasks")
    alarms = [r for r in caplog.records if "past their budget" in r.getMessage()]
    assert len(alarms) == 1


async def test_a_flood_of_failed_sign_ins_is_refused_429_and_ends_no_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue 29 item 5: a token guesser gets ten tries a minute from one address, then 429;
    nobody's session ends. The limiter's clock stands still: no try is earned back."""
    caplog.set_level(logging.DEBUG)
    limiter = SignInLimiter(clock=lambda: 0.0)
    async with harness(sign_ins=limiter) as h:
        await sign_in(h.http, TOKENS["admin"])
        answers = []
        async with aiohttp.ClientSession(h.url, cookie_jar=aiohttp.DummyCookieJar()) as flood:
            for _ in range(30):
                form = {"token": WRONG}
                async with flood.post("/ui/signin", data=form, allow_redirects=False) as answer:
                    answers.append((answer.status, answer.headers.get("Retry-After")))
                    body = await answer.text()
        assert answers == [(401, None)] * 10 + [(429, "6")] * 20
        assert "too many failed sign-in attempts from this address: try again in 6 s" in body
        await text(h.http, "/ui/tasks")  # the admin is still signed in
    limited = [r for r in caplog.records if r.getMessage() == "dashboard sign-ins limited"]
    assert len(limited) == 1


async def test_many_sign_ins_of_one_identity_end_only_its_own_sessions() -> None:
    generous = SignInLimiter(per_peer=(100, 60.0), overall=(100, 60.0), clock=lambda: 0.0)
    async with harness(sessions=Sessions(limit=5, per_identity=3), sign_ins=generous) as h:
        await sign_in(h.http, TOKENS["admin"])
        async with aiohttp.ClientSession(h.url, cookie_jar=aiohttp.DummyCookieJar()) as flood:
            for _ in range(10):
                form = {"token": TOKENS["reader"]}
                async with flood.post("/ui/signin", data=form, allow_redirects=False) as answer:
                    assert answer.status == 303
        await text(h.http, "/ui/tasks")  # the admin's session outlived them


async def test_a_sign_in_past_the_session_limit_is_a_503_and_evicts_nobody() -> None:
    async with harness(sessions=Sessions(limit=2, per_identity=2)) as h:
        await sign_in(h.http, TOKENS["admin"])
        async with h.browser() as reader, h.browser() as second:
            await sign_in(reader, TOKENS["reader"])
            form = {"token": TOKENS["admin"]}
            async with second.post("/ui/signin", data=form, allow_redirects=False) as answer:
                assert answer.status == 503
                assert int(answer.headers["Retry-After"]) > 0
                assert "already keeps 2 sessions, its limit" in await answer.text()
            await text(reader, "/ui/tasks")
        await text(h.http, "/ui/tasks")
