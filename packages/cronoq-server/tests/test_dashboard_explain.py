"""Issue 32 on the dashboard, without a browser (the harness of test_dashboard.py: a real
Replica leading on a MemoryStore, requests through aiohttp): a task page's Explain panel for
each hold, the Rerun action and who is offered it, and a schedule's page with its occurrence
ledger, paged, its times on the schedule's clock, everything a user wrote escaped."""

from __future__ import annotations

import dataclasses
import html
import re
from datetime import UTC, datetime, timedelta
from urllib.parse import parse_qs, quote, urlencode

import markupsafe
import pytest
from test_dashboard import (
    ESCAPED,
    HOSTILE,
    TOKENS,
    Harness,
    csrf_of,
    harness,
    leased,
    sign_in,
    text,
)

from cronoq import (
    Explanation,
    Hold,
    Limit,
    OccurrenceOutcome,
    RemotePool,
    RetryPolicy,
    Scheduler,
    Status,
)
from cronoq.store import OccurrenceRecorded

# --- the Explain panel ------------------------------------------------------------------------


def panel(page: str) -> str:
    """The Explain section of a task's page."""
    found = re.search(r'<section aria-labelledby="explain".*?</section>', page, re.S)
    assert found is not None, page
    return found.group(0)


def facts(section: str) -> dict[str, str]:
    """A definition list's terms and their definitions (tags stripped, entities kept)."""
    pairs = re.findall(r"<dt>(.*?)</dt><dd[^>]*>(.*?)</dd>", section, re.S)
    return {term: re.sub(r"<[^>]+>", "", value).strip() for term, value in pairs}


def hold_of(section: str) -> str:
    found = re.search(r'<span class="badge hold-([a-z_]+)', section)
    assert found is not None, section
    return found.group(1)


async def explained(h: Harness, task_id: int) -> tuple[str, dict[str, str]]:
    """The hold a task's page shows, and the panel's facts, checked against ``explain``."""
    section = panel(await text(h.http, f"/ui/tasks/{task_id}"))
    why = await h.replica.leader().explain(task_id)
    assert hold_of(section) == why.hold.value
    assert str(markupsafe.escape(why.summary)) in section
    return why.hold.value, facts(section)


async def test_the_panel_explains_what_holds_a_waiting_scheduled_or_paused_task() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        # "other" has no worker attached: its tasks stay ready, held by the lack of a slot.
        parents = [await sched.submit("parent", None, pool="other") for _ in range(2)]
        child = await sched.submit("child", None, after=parents)
        hold, shown = await explained(h, child)
        assert hold == "dependencies"
        section = panel(await text(h.http, f"/ui/tasks/{child}"))
        for parent in parents:  # each unfinished parent linked to its page
            assert f'<li><a href="/ui/tasks/{parent}">{parent}</a></li>' in section
        assert "it waits for 2 unfinished parent(s)" in section
        assert "Since" in shown and "Pool" not in shown and "Until" not in shown

        hold, shown = await explained(h, parents[0])
        assert hold == "no_worker_slots" and shown["Pool"] == "other"

        later = await sched.submit("later", None, start_at=timedelta(hours=1))
        hold, shown = await explained(h, later)
        assert hold == "start_time"
        assert shown["Until"].endswith("(in 60 min)") and " UTC" in shown["Until"]

        await sched.pause_pool("other")
        hold, shown = await explained(h, parents[1])
        assert hold == "pool_paused"
        assert shown["Pool"] == "other"
        assert '<a href="/ui/tasks?pool=other">other</a>' in panel(
            await text(h.http, f"/ui/tasks/{parents[1]}")
        )


async def test_the_panel_explains_a_full_pool_a_limit_a_backoff_and_a_running_attempt() -> None:
    limits = [Limit("tenant", concurrency=1, per_key=True)]
    pools = (RemotePool("default", concurrency=1), RemotePool("other"))
    async with harness(auth=False, limits=limits, pools=pools) as h:
        sched = h.replica.leader()
        async with sched.attach(["default", "other"], slots=4, name=HOSTILE) as link:
            first = await sched.submit("k", None)
            attempt = await leased(link)
            queued = await sched.submit("k", None)
            hold, shown = await explained(h, queued)
            assert hold == "pool_full" and shown["Pool"] == "default: 1 of 1 running"

            # The running attempt: its number, its lease's end, the worker as it named itself.
            page = await text(h.http, f"/ui/tasks/{first}")
            assert HOSTILE not in page
            hold, shown = await explained(h, first)
            assert hold == "running"
            assert shown["Attempt"] == "1" and shown["Worker"] == ESCAPED
            assert shown["Lease ends"].endswith(")") and "(in " in shown["Lease ends"]

            # A limit per key, the key a tenant's (escaped).
            keyed = {"tenant": HOSTILE}
            holder = await sched.submit("k", None, pool="other", limits=keyed)
            held_attempt = await leased(link)
            held = await sched.submit("k", None, pool="other", limits=keyed)
            page = await text(h.http, f"/ui/tasks/{held}")
            assert HOSTILE not in page
            hold, shown = await explained(h, held)
            assert hold == "limit" and shown["Limit"] == f"tenant, key {ESCAPED}"
            for task_id in (holder, held):  # the key's room passes from one to the next
                running = held_attempt if task_id == holder else await leased(link)
                assert running.token.task_id == task_id
                await sched.report_success(running.token, lease_id=running.lease_id)
                assert (await sched.wait(task_id, timeout=10)).status is Status.SUCCEEDED

            # A failed attempt that retries in a minute.
            await sched.report_failure(
                attempt.token, "upstream answered 503", lease_id=attempt.lease_id, retry_after=60
            )
            hold, shown = await explained(h, first)
            assert hold == "retry_backoff"
            assert shown["Until"].endswith("(in 60 s)") or shown["Until"].endswith("(in 1 min)")

            # A cancel asked of a running attempt that has not ended.
            second = await leased(link)
            assert second.token.task_id == queued
            await sched.cancel(queued)
            hold, shown = await explained(h, queued)
            assert hold == "cancelling" and shown["Attempt"] == "1"
            await sched.report_failure(second.token, "stopped", lease_id=second.lease_id)


HOLDS = [
    Explanation(7, Status.READY, Hold.STOPPED_ATTEMPT, "attempt 2 was stopped", datetime.now(UTC),
                datetime.now(UTC) + timedelta(seconds=30), 2, pool="default"),
    Explanation(7, Status.READY, Hold.LEADER_CHANGE, "the scheduler is stepping down",
                datetime.now(UTC), pool="default"),
    Explanation(7, Status.READY, Hold.DISPATCHING, "nothing holds it: it starts at the next step",
                datetime.now(UTC), pool="default"),
]  # fmt: skip
"""The holds no test can hold still (a worker's late report, a leader stepping down, the
instant before a dispatch): the panel as the scheduler's answer would draw it."""


@pytest.mark.parametrize("why", HOLDS, ids=[why.hold.value for why in HOLDS])
async def test_the_panel_draws_every_hold_the_scheduler_may_answer(
    why: Explanation, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None, pool="other")
        answer = dataclasses.replace(why, task_id=task_id, summary=f"{why.summary} {HOSTILE}")

        async def explain(asked: int) -> Explanation:
            assert asked == task_id
            return answer

        monkeypatch.setattr(sched, "explain", explain)
        page = await text(h.http, f"/ui/tasks/{task_id}")
        assert HOSTILE not in page
        section = panel(page)
        assert hold_of(section) == why.hold.value
        assert f"{markupsafe.escape(why.summary)} {ESCAPED}" in section
        shown = facts(section)
        assert ("Lease ends" in shown) is (why.until is not None)
        assert ("Attempt" in shown) is (why.attempt > 0)


async def test_a_finished_task_is_explained_as_finished() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        task_id = await sched.submit("k", None, pool="other")
        await sched.cancel(task_id, "no longer wanted")
        hold, _ = await explained(h, task_id)
        assert hold == "finished"


# --- Rerun ------------------------------------------------------------------------------------


async def finished(sched: Scheduler, status: Status) -> int:
    """A task of the harness's "default" pool that ended with ``status``."""
    async with sched.attach(["default"], slots=1) as link:
        task_id = await sched.submit("k", b"payload", tags=["t"], retry=RetryPolicy(max_attempts=1))
        attempt = await leased(link)
        if status is Status.SUCCEEDED:
            await sched.report_success(attempt.token, lease_id=attempt.lease_id)
        else:
            await sched.report_failure(attempt.token, "broken", lease_id=attempt.lease_id)
        assert (await sched.wait(task_id, timeout=10)).status is status
    return task_id


async def test_an_admin_reruns_a_finished_task_and_lands_on_the_new_tasks_page() -> None:
    async with harness() as h:
        sched = h.replica.leader()
        done = await finished(sched, Status.SUCCEEDED)
        failed = await finished(sched, Status.FAILED)
        csrf = await sign_in(h.http, TOKENS["admin"])
        page = await text(h.http, f"/ui/tasks/{done}")
        assert f'id="rerun-{done}"' in page and 'action="/ui/act/rerun"' in page
        form = {"task": str(done), "csrf": csrf, "back": f"/ui/tasks/{done}"}
        async with h.http.post("/ui/act/rerun", data=form, allow_redirects=False) as answer:
            assert answer.status == 303
            location = answer.headers["Location"]
        new_id = int(location.removeprefix("/ui/tasks/"))
        assert new_id != done and (await sched.get(new_id)).rerun_of == done
        page = await text(h.http, location)
        assert f"task {done} rerun as task {new_id}" in page  # the notice, on the new page
        assert f'<a href="/ui/tasks/{done}" id="rerun-of">task {done}</a>' in page
        # A live task is not offered a rerun, and one forced is refused with the reason, on
        # the page the form came from.
        assert f'id="rerun-{new_id}"' not in page
        form = {"task": str(new_id), "csrf": csrf, "back": f"/ui/tasks/{new_id}"}
        async with h.http.post("/ui/act/rerun", data=form, allow_redirects=False) as answer:
            assert answer.status == 303
            assert answer.headers["Location"] == f"/ui/tasks/{new_id}"
        page = await text(h.http, f"/ui/tasks/{new_id}")
        assert '<p class="notice error" role="status">' in page
        assert f"task {new_id} is ready" in page
        # A failed one is offered both: Retry continues it, Rerun starts it afresh.
        page = await text(h.http, f"/ui/tasks/{failed}")
        assert f'id="retry-{failed}"' in page and f'id="rerun-{failed}"' in page
        # The tasks list offers no rerun: a rerun is decided on the task's page.
        assert 'action="/ui/act/rerun"' not in await text(h.http, "/ui/tasks")


async def test_a_reader_is_not_offered_a_rerun_and_one_forced_is_refused() -> None:
    async with harness() as h:
        sched = h.replica.leader()
        done = await finished(sched, Status.SUCCEEDED)
        csrf = await sign_in(h.http, TOKENS["reader"])
        page = await text(h.http, f"/ui/tasks/{done}")
        assert "/ui/act/" not in page
        async with h.http.post("/ui/act/rerun", data={"task": str(done), "csrf": csrf}) as answer:
            assert answer.status == 403
            assert "lacks the permission &#39;admin&#39;" in await answer.text()
        assert [t.task_id for t in await sched.list()] == [done]  # no new task
        # Without the session's CSRF token, nobody reruns anything.
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        done = await finished(sched, Status.SUCCEEDED)
        await csrf_of(h.http)
        async with h.http.post("/ui/act/rerun", data={"task": str(done)}) as answer:
            assert answer.status == 403
        assert [t.task_id for t in await sched.list()] == [done]


# --- a schedule's page ------------------------------------------------------------------------


def _ns(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000_000


async def plant(sched: Scheduler, name: str, *records: OccurrenceRecorded) -> None:
    """Ledger records, written to the store as the leader's batch would write them (the
    scheduler's own are decided by its clock; these say exactly what a page must show)."""
    assert sched.epoch is not None
    await sched.store.commit(sched.epoch, records)


def record(
    name: str,
    due: datetime,
    until: datetime,
    outcome: OccurrenceOutcome,
    task_id: int | None = None,
    message: str = "",
) -> OccurrenceRecorded:
    return OccurrenceRecorded(
        name, _ns(due), _ns(until), outcome, task_id, _ns(due + timedelta(seconds=1)), message
    )


def last_four_am() -> datetime:
    """The latest 04:00 UTC (09:30 in Kolkata, UTC+05:30 without DST) before now."""
    now = datetime.now(UTC)
    moment = now.replace(hour=4, minute=0, second=0, microsecond=0)
    return moment if moment <= now else moment - timedelta(days=1)


def ledger_rows(page: str) -> list[dict[str, str]]:
    body = page.split('id="occurrence-table"', 1)[1].split("<tbody>", 1)[1]
    body = body.split("</tbody>", 1)[0]
    rows = []
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = re.findall(r'<td data-label="([^"]+)"[^>]*>(.*?)</td>', row, re.S)
        rows.append(dict(cells))
    return rows


def plain(cell: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", cell)).strip()


def schedule_page(name: str, **fields: str) -> str:
    return "/ui/schedule?" + urlencode({"name": name, **fields})


async def test_a_schedules_page_shows_its_fields_and_its_ledger_on_its_clock_and_in_utc() -> None:
    async with harness() as h:
        sched = h.replica.leader()
        await sched.add_schedule("digest", "30 9 * * *", kind="report", pool="other",
                                 timezone="Asia/Kolkata", overlap="allow")  # fmt: skip
        last = last_four_am()
        day = timedelta(days=1)
        task_id = await sched.submit("report", None, pool="other")
        await plant(
            sched,
            "digest",
            record("digest", last, last + day, OccurrenceOutcome.STARTED, task_id),
            record("digest", last - 4 * day, last, OccurrenceOutcome.COALESCED, task_id - 1 or 1,
                   "the occurrences due until the next ran once, as one task"),
            record("digest", last - 5 * day, last - 4 * day, OccurrenceOutcome.MISSED, None,
                   "fired 2 h late, past its grace of 60s (catch_up='skip')"),
        )  # fmt: skip
        await sign_in(h.http, TOKENS["admin"])
        listing = await text(h.http, "/ui/schedules")
        assert '<a href="/ui/schedule?name=digest">digest</a>' in listing
        page = await text(h.http, schedule_page("digest"))
        shown = facts(page.split('id="schedule-facts"', 1)[1].split("</dl>", 1)[0])
        assert shown["Cron"] == "30 9 * * *" and shown["Time zone"] == "Asia/Kolkata"
        assert (shown["Kind"], shown["Pool"], shown["Overlap"]) == ("report", "other", "allow")
        assert shown["Catch-up"] == "coalesce" and shown["State"] == "active"
        assert shown["Next occurrences"].count(" 09:30:00 IST") == 3
        for action in ("pause-schedule", "trigger-schedule"):
            assert f'id="{action}"' in page
        newest, coalesced, missed = ledger_rows(page)
        # Due: on the schedule's clock, UTC under it.
        assert plain(newest["Due"]) == (
            f"{last + timedelta(hours=5, minutes=30):%Y-%m-%d} 09:30:00 IST "
            f"{last:%Y-%m-%d} 04:00:00 UTC"
        )
        assert "started" in newest["Outcome"] and plain(newest["Covers"]) == "this occurrence"
        assert newest["Task"] == f'<a href="/ui/tasks/{task_id}">{task_id}</a>'
        assert plain(newest["Message"]) == "—"
        # Several occurrences decided together: their span, to the next one (excluded).
        assert "coalesced" in coalesced["Outcome"]
        assert plain(coalesced["Covers"]) == (
            f"the occurrences due until {last + timedelta(hours=5, minutes=30):%Y-%m-%d} "
            f"09:30:00 IST {last:%Y-%m-%d} 04:00:00 UTC (not included)"
        )
        assert "missed" in missed["Outcome"] and plain(missed["Covers"]) == "this occurrence"
        assert plain(missed["Task"]) == "—"
        assert "catch_up=&#39;skip&#39;" in missed["Message"]
        # A task of the schedule links to its page.
        triggered = await sched.trigger_schedule("digest")
        page = await text(h.http, f"/ui/tasks/{triggered}")
        assert '<dd><a href="/ui/schedule?name=digest">digest</a></dd>' in page


async def test_the_ledger_pages_back_with_older_links_carrying_the_last_due_time() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        await sched.add_schedule("hourly", "0 * * * *", kind="k", pool="other")
        now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
        hour = timedelta(hours=1)
        dues = [now - n * hour for n in range(5)]  # the newest first
        await plant(
            sched,
            "hourly",
            *(record("hourly", due, due + hour, OccurrenceOutcome.SKIPPED, 1) for due in dues),
        )
        seen: list[str] = []
        path = schedule_page("hourly", limit="2")
        pages = 0
        while True:
            page = await text(h.http, path)
            pages += 1
            rows = ledger_rows(page)
            seen += [plain(row["Due"]) for row in rows]
            older = re.search(r'<a href="(/ui/schedule\?[^"]+)" rel="next">Older</a>', page)
            if pages > 1:
                assert ">Newest</a>" in page
            if older is None:
                break
            assert len(rows) == 2
            path = older.group(1).replace("&amp;", "&")
        assert pages == 3 and seen == [f"{due:%Y-%m-%d %H:%M:%S} UTC" for due in dues]
        # The link carries the last due time shown as an ISO 8601 "before", and the page size.
        first = await text(h.http, schedule_page("hourly", limit="2"))
        before = quote(dues[1].isoformat(), safe="")
        assert f"/ui/schedule?name=hourly&amp;limit=2&amp;before={before}" in first
        assert ">Newest</a>" not in first
        # Before the oldest record: an empty page that says so.
        page = await text(h.http, schedule_page("hourly", before=dues[4].isoformat()))
        assert ledger_rows(page) == [{}] and "No occurrence due before that." in page


HOSTILE_NAME = HOSTILE + ' & "#1" 100% /../x'
"""Markup, and each character a URL's query or path would take for its own."""


async def test_a_hostile_schedule_name_and_message_are_escaped_and_its_page_acts_on_it() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        await sched.add_schedule(HOSTILE_NAME, "0 3 * * *", kind=HOSTILE, pool="other")
        last = datetime.now(UTC).replace(hour=3, minute=0, second=0, microsecond=0)
        if last > datetime.now(UTC):
            last -= timedelta(days=1)
        await plant(
            sched,
            HOSTILE_NAME,
            record(HOSTILE_NAME, last, last + timedelta(days=1), OccurrenceOutcome.NO_POOL,
                   message=f"its pool {HOSTILE!r} is not configured"),
        )  # fmt: skip
        listing = await text(h.http, "/ui/schedules")
        assert HOSTILE not in listing
        link = re.search(r'<a href="(/ui/schedule\?name=[^"]+)">', listing)
        assert link is not None
        path = link.group(1).replace("&amp;", "&")
        assert "<" not in path and "#" not in path and "&" not in path.removeprefix("/ui/")
        page = await text(h.http, path)
        assert HOSTILE not in page
        assert f"<h1>Schedule {markupsafe.escape(HOSTILE_NAME)}</h1>" in page
        [row] = ledger_rows(page)
        assert row["Message"] == f"its pool {markupsafe.escape(repr(HOSTILE))} is not configured"
        assert "no pool" in row["Outcome"]
        # The page's own address in its poll and its forms' return: the name intact ("&",
        # "#" and "%" encoded), so that the poll shows this schedule and the action comes back.
        here = "/ui/schedule?" + urlencode({"name": HOSTILE_NAME})
        poll = re.search(r'hx-get="/ui/schedule\?([^"]+)"', page)
        assert poll is not None
        assert parse_qs(html.unescape(poll.group(1))) == {"name": [HOSTILE_NAME]}
        assert f'name="back" value="{markupsafe.escape(here)}"' in page
        csrf = await csrf_of(h.http)
        form = {"schedule": HOSTILE_NAME, "csrf": csrf, "back": here}
        async with h.http.post(
            "/ui/act/pause-schedule", data=form, allow_redirects=False
        ) as answer:
            assert answer.status == 303
            assert answer.headers["Location"] == here
        page = await text(h.http, here)
        assert f"schedule {markupsafe.escape(HOSTILE_NAME)} paused" in page
        assert 'id="resume-schedule"' in page
        assert (await sched.list_schedules())[0].paused


async def test_a_removed_schedules_ledger_is_still_shown_in_utc() -> None:
    async with harness(auth=False) as h:
        sched = h.replica.leader()
        await sched.add_schedule("gone", "0 3 * * *", kind="k", pool="other",
                                 timezone="Europe/Paris")  # fmt: skip
        last = datetime.now(UTC).replace(hour=2, minute=0, second=0, microsecond=0)
        await plant(
            sched, "gone", record("gone", last, last + timedelta(days=1), OccurrenceOutcome.PAUSED)
        )
        await sched.remove_schedule("gone")
        page = await text(h.http, schedule_page("gone"))
        assert "No schedule is named gone now: it was removed." in page
        assert "/ui/act/" not in page and 'id="schedule-facts"' not in page
        [row] = ledger_rows(page)
        assert plain(row["Due"]) == f"{last:%Y-%m-%d %H:%M:%S} UTC"
        # Without its cron, a record shows its span.
        assert plain(row["Covers"]).startswith("the occurrences due until")


async def test_a_reader_sees_a_schedules_page_without_its_actions() -> None:
    async with harness() as h:
        sched = h.replica.leader()
        await sched.add_schedule("nightly", "0 3 * * *", kind="k", pool="other")
        await sign_in(h.http, TOKENS["reader"])
        page = await text(h.http, schedule_page("nightly"))
        assert "/ui/act/" not in page and "No occurrence has come due yet." in page
        async with (
            h.browser() as stranger,  # no session: sent to sign in, shown nothing
            stranger.get(schedule_page("nightly"), allow_redirects=False) as answer,
        ):
            assert answer.status == 303
            assert answer.headers["Location"].startswith("/ui/signin?next=")


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/ui/schedule", 400, "name is required"),
        ("/ui/schedule?name=", 400, "name is required"),
        (schedule_page("x" * 256), 400, "schedule name is 256 characters long; the limit is 255"),
        (schedule_page("x" * 1025), 400, "name is longer than 1024 characters"),
        (schedule_page("nightly", limit="201"), 400, "limit must be at most 200"),
        (schedule_page("nightly", limit="0"), 400, "limit must be between 1 and"),
        (schedule_page("nightly", before="yesterday"), 400, "before must be an ISO 8601 time"),
        (schedule_page("nightly", before="2026-07-01T03:00:00"), 400, "with its UTC offset"),
        (schedule_page("nightly", before="2" * 65), 400, "before must be an ISO 8601 time"),
        (schedule_page("nightly", before="2026-07-01T03:00:00+25:00"), 400, "ISO 8601"),
        # Past what a clock can show in some zone, or a store can hold: refused, not a 500.
        (schedule_page("nightly", before="0001-01-01T00:00:00+14:00"), 400, "ISO 8601"),
        (schedule_page("nightly", before="9999-12-31T23:59:59-14:00"), 400, "ISO 8601"),
        (schedule_page("nightly", before="1677-01-01T00:00:00+00:00"), 400, "between 1678-01-01"),
        (schedule_page("nightly", before="9999-12-31T00:00:00+00:00"), 400, "and 2262-01-01"),
        (schedule_page("nowhere"), 404, "no schedule named &#39;nowhere&#39;"),
    ],
)
async def test_every_parameter_of_a_schedules_page_is_bounded(
    path: str, status: int, message: str
) -> None:
    async with harness(auth=False) as h:
        await h.replica.leader().add_schedule("nightly", "0 3 * * *", kind="k", pool="other")
        assert message in await text(h.http, path, status)
