"""The dashboard in a real headless browser (Debian's chromium, driven by Selenium through
chromium-driver) against a real ``cronoq-server`` process on PostgreSQL (whose store has the
outbox, and so the Outbox page) with real tasks run by a real worker and outbox rows it
quarantined: every page loads, every action clicked shows its effect through the API, a page
updates itself without a reload, a read-only identity is offered no action and is refused one
it forces, and at 1280 and 390 px no page scrolls sideways and every control is reached by
scrolling down. A screenshot of each page (1280 px wide, and the phone-width ones) goes to
``CRONOQ_SCREENSHOTS`` (default: a temporary directory).

Without chromium and chromium-driver these tests skip, unless ``CRONOQ_REQUIRE_BROWSER=1``
(CI), which fails them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from outbox_rows import enqueue, logged_quarantine, schema_of_its_own
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait
from server_pg import PG_DSN
from server_process import ServerProcess, config_toml, running_server
from test_server_auth import identities_toml

from cronoq import RetryPolicy, ScheduleInfo, Status, TaskContext, TaskError
from cronoq_client import AsyncClient, Worker

POOLS = '[[pools]]\nname = "default"\n[[pools]]\nname = "reports"\n[[pools]]\nname = "archive"\n'
TOKENS = {"admin": "admin-" + "a" * 40, "reader": "reader-" + "r" * 40, "worker": "w" * 44}
IDENTITIES = {
    "admin": {"permissions": ["admin"]},
    "reader": {"permissions": ["read"]},
    "worker": {"permissions": ["work"], "work_pools": ["default"]},
}
WAIT_S = 20.0
"""Longest wait for the browser (a page's poll runs every 5 s)."""
DESKTOP = (1280, 900)
PHONE = (390, 844)


def _binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        why = "chromium and chromium-driver are missing (apt-get install chromium chromium-driver)"
        if os.environ.get("CRONOQ_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return chromium, driver


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("CRONOQ_SCREENSHOTS")
    directory = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    directory.mkdir(parents=True, exist_ok=True)
    return directory


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    chromium, driver_path = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={DESKTOP[0]},{DESKTOP[1]}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class Cluster:
    server: ServerProcess
    client: AsyncClient
    succeeded: int
    failed: int
    queued: list[int]
    child: int
    crashed: list[int]
    """Failed for good with a long message (an unbroken address in it)."""
    quarantined: list[int]
    """Outbox rows that could not become tasks: a kind, options and a reason at their longest
    without a space, a binary payload."""
    ledgered: str
    """A schedule that came due several times (its first task started, then skipped while that
    one waited in the paused pool, then paused), in a zone of its own: its page has a ledger."""


LONG_MESSAGE = (
    "the export of table orders_2026_12_daily_partitioned failed: the upstream answered 502 for "
    "https://warehouse.internal.example/api/v2/exports/orders_2026_12_daily_partitioned?since="
    "2026-12-01T00:00:00Z&format=parquet&page_token=c3RhcnRfYWZ0ZXJfMTIzNDU2Nzg5MDEyMzQ1Njc4OQ"
)
LONG_KEY = "invoice-run-" + "0123456789abcdef" * 4
"""Keys, tags and kinds up to their limits: nothing in a row may widen the page."""
_HELD: list[asyncio.Event] = []
"""What a ``hold`` task waits for (one event per cluster, made in its event loop)."""


async def _work(ctx: TaskContext, payload: bytes) -> bytes:
    if ctx.kind == "hold":  # running until the cluster ends
        await _HELD[-1].wait()
    if ctx.kind == "boom":  # a crash, not a TaskError: its page shows the traceback
        raise ConnectionError("the upstream answered 502")
    if ctx.kind.startswith("crash"):
        raise TaskError(LONG_MESSAGE, retryable=False)
    return b'{"rows": 3, "source": "warehouse"}'


# Rows the leader quarantines: (kind, payload, options), each cell as long as it may be.
OUTBOX_ROWS = [
    ("k" * 255, b'{"order": 42}', '{"pool": "warehouse-exports-nightly-partitioned"}'),
    ("export", bytes(range(256)), '{"tags": ["' + "t" * 200 + '"], "pool": "nope"}'),
    ("export", b"", '{"start_at": "' + "9" * 64 + '"}'),
    ("discard-me", b"", '{"pool": "nope"}'),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    _HELD.append(asyncio.Event())
    tables = "[auth]\nreload_interval_s = 600\n" + identities_toml(IDENTITIES, TOKENS)
    async with schema_of_its_own() as schema:
        store = (
            f'[store]\nkind = "postgres"\ndsn = "{PG_DSN}"\nschema = "{schema}"\n'
            "outbox_poll_s = 0.1\n"
        )
        config = config_toml(store, pools=POOLS, tables=tables)
        async with _cluster(tmp_path_factory.mktemp("ui"), config, schema) as running:
            yield running


@contextlib.asynccontextmanager
async def _cluster(directory: Path, config: str, schema: str) -> AsyncIterator[Cluster]:
    async with running_server(directory, config) as server:
        await server.leading()
        worker = Worker(
            server.target, {"default": _work}, slots=4, worker_id="etl-1", token=TOKENS["worker"]
        )
        working = asyncio.ensure_future(worker.run())
        try:
            async with AsyncClient(server.target, token=TOKENS["admin"], timeout=10) as client:
                succeeded = await client.submit("sync", b'{"table": "orders"}', tags=["etl"])
                failed = await client.submit(
                    "boom", b"", key="boom-1", tags=["etl"], retry=RetryPolicy(max_attempts=1)
                )
                for task_id in (succeeded, failed):
                    await client.wait(task_id, timeout=WAIT_S)
                # The reports pool has no worker: its tasks stay queued.
                queued = [
                    await client.submit("report", b'{"day": %d}' % day, pool="reports",
                                        tags=["daily"], key=f"report-{day}")
                    for day in range(1, 4)
                ]  # fmt: skip
                child = await client.submit("publish", b"", pool="reports", after=[queued[0]])
                await client.add_schedule("nightly", "0 3 * * *", kind="report", pool="reports")
                crashed = [
                    await client.submit("crash-export-orders-daily-partitioned", b"",
                                        key=f"{LONG_KEY}-{n}", tags=["etl", "x" * 60])
                    for n in range(3)
                ]  # fmt: skip
                for task_id in crashed:
                    await client.wait(task_id, timeout=WAIT_S)
                # Every other state a row can be in: running, scheduled, in a paused pool;
                # and a paused schedule in a zone of its own.
                await client.submit("hold", b"", tags=["etl"])
                await client.submit("sync", b"", start_at=timedelta(hours=1), tags=["etl"])
                await client.submit("compact", b"", pool="archive", key=LONG_KEY)
                await client.pause_pool("archive")
                await client.add_schedule("weekly-digest", "30 9 * * 1", kind="report",
                                          pool="reports", timezone="Asia/Kolkata")  # fmt: skip
                await client.pause_schedule("weekly-digest")
                await _fill_a_ledger(client)
                quarantined = await enqueue(schema, *OUTBOX_ROWS)
                for row_id in quarantined:
                    await logged_quarantine(server, row_id)
                yield Cluster(
                    server, client, succeeded, failed, queued, child, crashed, quarantined, LEDGERED
                )
        finally:
            _HELD[-1].set()
            worker.stop()
            await asyncio.gather(working, return_exceptions=True)


LEDGERED = "every-second"


async def _fill_a_ledger(client: AsyncClient) -> None:
    """Records of every outcome a schedule's page may show in a few seconds: the schedule fires
    every second into the paused archive pool, so its first occurrence starts a task and the
    next ones are skipped while that task waits (overlap skip); paused, the occurrences due
    meanwhile are recorded as such when it resumes; paused again for good, so that the pages
    stay as they are while the tests look."""
    await client.add_schedule(LEDGERED, "* * * * * *", kind="compact", pool="archive",
                              timezone="Europe/Paris")  # fmt: skip
    await asyncio.sleep(3.5)
    await client.pause_schedule(LEDGERED)
    await asyncio.sleep(2.5)
    await client.resume_schedule(LEDGERED)
    await client.pause_schedule(LEDGERED)


async def _until(browser: WebDriver, condition: Callable[[WebDriver], object]) -> None:
    """Wait for the browser in a thread: the event loop runs the worker meanwhile. A poll may
    swap the page's live part between two reads of it, and a click's POST replaces the whole
    document while a read is under way (Chromium then answers "unhandled inspector error"):
    such a read is tried again, and the condition must still hold before the wait ends."""
    wait = WebDriverWait(browser, WAIT_S, ignored_exceptions=[WebDriverException])
    await asyncio.to_thread(wait.until, condition)


async def _page(browser: WebDriver, url: str) -> None:
    await asyncio.to_thread(browser.get, url)


def _shot(browser: WebDriver, directory: Path, name: str, size: tuple[int, int]) -> None:
    """A PNG of the whole page at this width (the window grows to the page's height)."""
    browser.set_window_size(*size)
    browser.execute_script("window.scrollTo(0, 0)")  # from its top, wherever a test scrolled
    # As tall as the page (at most 3,000 px): the window is the page and the browser's bars.
    inner, outer, page = browser.execute_script(
        "return [window.innerHeight, window.outerHeight, document.body.scrollHeight]"
    )
    if page > inner:
        browser.set_window_size(size[0], outer - inner + min(int(page), 3000))
    assert browser.save_screenshot(str(directory / f"{name}.png"))
    browser.set_window_size(*size)


async def _sign_in(browser: WebDriver, base: str, token: str) -> None:
    browser.delete_all_cookies()
    await _page(browser, f"{base}/ui/")
    assert browser.current_url.startswith(f"{base}/ui/signin")
    field = browser.find_element(By.ID, "token")
    field.send_keys(token)
    await asyncio.to_thread(field.send_keys, Keys.ENTER)  # a keyboard, not a mouse
    await _until(browser, lambda b: b.current_url == f"{base}/ui/")


async def _click(browser: WebDriver, element_id: str, notice: str) -> None:
    """Click a button (an action's POST); wait for the page it leads to, saying ``notice``."""
    await asyncio.to_thread(browser.find_element(By.ID, element_id).click)
    await _until(browser, lambda b: any(notice in text for text in _notices(b)))


def _notices(browser: WebDriver) -> list[str]:
    """The texts of the page's notices, read in one script: no element outlives the read."""
    texts: list[str] = browser.execute_script(
        'return [...document.querySelectorAll(".notice")].map(n => n.innerText);'
    )
    return texts


_LISTED = """
return [...document.querySelectorAll("#live tbody td.id a")].map(a => Number(a.textContent));
"""


def _listed(browser: WebDriver) -> list[int]:
    """The ids of the tasks the page lists, in its order (read in one script: a snapshot)."""
    ids: list[int] = browser.execute_script(_LISTED)
    return ids


async def _schedule(client: AsyncClient, name: str) -> ScheduleInfo:
    (found,) = [s for s in await client.list_schedules() if s.name == name]
    return found


def _actions(browser: WebDriver) -> list[str]:
    return [
        form.get_attribute("action") or ""
        for form in browser.find_elements(By.CSS_SELECTOR, "form[action*='/ui/act/']")
    ]


@pytest.mark.asyncio(loop_scope="module")
async def test_every_page_loads_and_every_action_shows_its_effect_through_the_api(
    cluster: Cluster, browser: WebDriver, screenshots: Path
) -> None:
    base, client = cluster.server.http, cluster.client
    browser.delete_all_cookies()
    await _page(browser, f"{base}/ui/signin")
    _shot(browser, screenshots, "signin", DESKTOP)
    await _sign_in(browser, base, TOKENS["admin"])

    # Overview: the replica leads; a task submitted now shows up without a reload.
    assert "epoch" in browser.find_element(By.ID, "live").text
    browser.execute_script("window.cronoqMarker = 42")
    extra = await client.submit("report", b"{}", pool="reports")
    await _until(browser, lambda b: _ready_count(b, "reports") == len(cluster.queued) + 1)
    assert browser.execute_script("return window.cronoqMarker") == 42  # the same page

    # Pools: pause and resume "reports".
    await _page(browser, f"{base}/ui/pools")
    _shot(browser, screenshots, "pools", DESKTOP)
    await _click(browser, "pause-pool-2", "pool reports paused")
    assert {p.name: p.paused for p in await client.list_pools()}["reports"]
    await _click(browser, "resume-pool-2", "pool reports resumed")
    assert not {p.name: p.paused for p in await client.list_pools()}["reports"]

    # Tasks: filtered, paged the newest first; cancel a queued one from the list.
    await _page(browser, f"{base}/ui/tasks?pool=reports&status=ready&limit=2")
    assert _listed(browser) == [extra, cluster.queued[2]]
    _shot(browser, screenshots, "tasks", DESKTOP)
    _shot(browser, screenshots, "tasks-phone", PHONE)
    await asyncio.to_thread(browser.find_element(By.LINK_TEXT, "Next page").click)
    await _until(browser, lambda b: f"before={cluster.queued[2]}" in b.current_url)
    assert _listed(browser) == [cluster.queued[1], cluster.queued[0]]
    await asyncio.to_thread(browser.find_element(By.LINK_TEXT, "First page").click)
    await _until(browser, lambda b: "before=" not in b.current_url)
    await _click(browser, f"cancel-{extra}", f"task {extra}: cancel requested")
    assert (await client.get(extra)).status is Status.CANCELLED

    # A task: the failed one, retried (the worker fails it again: attempt 2).
    await _page(browser, f"{base}/ui/tasks/{cluster.failed}")
    assert "the upstream answered 502" in browser.page_source
    # Its attempts: one row, the failure, with its start, end, duration and message.
    number, started, ended, took, message = (
        cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#attempt-table td")
    )
    error = "attempt 1 failed: ConnectionError: the upstream answered 502; no attempts left"
    assert (number, message) == ("1", f"{error}\nTraceback")  # the traceback folded under it
    traceback = browser.find_element(By.CSS_SELECTOR, "#traceback + pre").text
    assert traceback.startswith("Traceback (most recent call last):")
    assert 'raise ConnectionError("the upstream answered 502")' in traceback
    assert started.endswith("UTC") and ended.endswith("UTC") and took.endswith("s")
    _shot(browser, screenshots, "task-attempts", DESKTOP)
    await _page(browser, f"{base}/ui/tasks/{cluster.succeeded}")
    payload, output = browser.find_elements(By.CSS_SELECTOR, "pre.data")
    assert '"orders"' in payload.text and '"warehouse"' in output.text
    await _page(browser, f"{base}/ui/tasks/{cluster.queued[0]}")
    assert browser.find_element(By.LINK_TEXT, str(cluster.child))  # its dependant
    _shot(browser, screenshots, "task", DESKTOP)
    await _page(browser, f"{base}/ui/tasks/{cluster.failed}")
    await _click(browser, f"retry-{cluster.failed}", f"task {cluster.failed} retried")
    again = await client.wait(cluster.failed, timeout=WAIT_S)
    assert (again.status, again.attempt) == (Status.FAILED, 2)

    # Rerun the succeeded task: the new task's page, which names the original; the worker
    # runs it as it ran the original.
    await _page(browser, f"{base}/ui/tasks/{cluster.succeeded}")
    assert _explained(browser)[0] == "finished"
    await _click(browser, f"rerun-{cluster.succeeded}", f"task {cluster.succeeded} rerun as task")
    rerun = int(browser.current_url.rsplit("/", 1)[1])
    assert rerun != cluster.succeeded
    original_page = browser.execute_script('return document.getElementById("rerun-of").href')
    assert original_page == f"{base}/ui/tasks/{cluster.succeeded}"
    done = await client.wait(rerun, timeout=WAIT_S)
    original = await client.get(cluster.succeeded)
    assert (done.status, done.kind, done.tags) == (Status.SUCCEEDED, original.kind, original.tags)
    await _until(browser, lambda b: _explained(b)[0] == "finished")  # the page caught up
    _shot(browser, screenshots, "task-rerun", DESKTOP)
    # A task the paused pool holds: the panel says which pool, and that it is paused.
    held = await _schedule(client, cluster.ledgered)
    assert held.last_task_id is not None
    await _page(browser, f"{base}/ui/tasks/{held.last_task_id}")
    assert _explained(browser) == [
        "pool_paused",
        "its pool 'archive' is paused: resume it to start",
    ]

    # Schedules: pause, resume, run now.
    await _page(browser, f"{base}/ui/schedules")
    _shot(browser, screenshots, "schedules", DESKTOP)
    await _click(browser, "pause-schedule-1", "schedule nightly paused")
    assert (await _schedule(client, "nightly")).paused
    await _click(browser, "resume-schedule-1", "schedule nightly resumed")
    assert not (await _schedule(client, "nightly")).paused
    await _click(browser, "trigger-schedule-1", "schedule nightly triggered")
    schedule = await _schedule(client, "nightly")
    assert schedule.last_task_id is not None
    assert (await client.get(schedule.last_task_id)).schedule == "nightly"

    # A schedule's page, from the list: its ledger, the newest first, on its clock and UTC's.
    await _follow(browser, cluster.ledgered, lambda url: "/ui/schedule?name=" in url)
    # (A leader that fires a second late coalesces; an occurrence may come due between the
    # fixture's resume and pause.)
    outcomes = _outcomes(browser)
    assert outcomes[-1] in ("started", "coalesced") and "paused" in outcomes[:2], outcomes
    assert set(outcomes) <= {"started", "coalesced", "skipped", "paused"}, outcomes
    assert len(outcomes) >= 3, outcomes
    rows = _ledger(browser)
    due = rows[0]["Due"]
    assert due.endswith("UTC") and ("CET" in due or "CEST" in due), due
    held = await _schedule(client, cluster.ledgered)
    assert rows[-1]["Task"] == str(held.last_task_id)  # the task its first occurrence started
    _shot(browser, screenshots, "schedule", DESKTOP)
    _shot(browser, screenshots, "schedule-phone", PHONE)
    # A page of two, then the older ones: the link carries the last due time shown.
    await _page(browser, f"{browser.current_url}&limit=2")
    assert len(_outcomes(browser)) == 2
    await _follow(browser, "Older", lambda url: "before=" in url)
    assert _outcomes(browser) == outcomes[2:4]
    await _follow(browser, "Newest", lambda url: "before=" not in url)
    assert _outcomes(browser) == outcomes[:2]
    # Its actions act on it and come back to its page.
    await _click(browser, "resume-schedule", f"schedule {cluster.ledgered} resumed")
    assert "/ui/schedule?name=" in browser.current_url
    await _click(browser, "pause-schedule", f"schedule {cluster.ledgered} paused")
    assert (await _schedule(client, cluster.ledgered)).paused

    # Workers: the attached one.
    await _page(browser, f"{base}/ui/workers")
    cells = [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "#live td")]
    assert cells[:2] == ["etl-1", "worker"], cells  # its name, then the identity of its token
    _shot(browser, screenshots, "workers", DESKTOP)

    # Outbox: the quarantined rows with their reasons; discard one, requeue another (its
    # pool still unknown, the leader quarantines it again).
    await _page(browser, f"{base}/ui/outbox")
    reasons = [
        cell.text for cell in browser.find_elements(By.CSS_SELECTOR, "td[data-label=Reason]")
    ]
    assert reasons[0].startswith("UnknownPool: unknown pool 'warehouse-exports-nightly")
    assert reasons[2].startswith("InvalidArgument: start_at must be an ISO 8601 time")
    _shot(browser, screenshots, "outbox", DESKTOP)
    _shot(browser, screenshots, "outbox-phone", PHONE)
    dropped, requeued = cluster.quarantined[3], cluster.quarantined[1]
    await _click(browser, f"discard-{dropped}", f"outbox row {dropped} discarded")
    await _click(browser, f"requeue-{requeued}", f"outbox row {requeued} requeued")
    await logged_quarantine(cluster.server, requeued, times=2)
    left = [row.row_id for row in await client.outbox_quarantine()]
    assert left == [r for r in cluster.quarantined if r != dropped]

    # The keyboard: the first Tab reaches the skip link, which leads to the content.
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    assert browser.switch_to.active_element.get_attribute("class") == "skip"

    # The overview last, its charts drawn from the samples taken meanwhile.
    await _page(browser, f"{base}/ui/")
    await _until(
        browser, lambda b: b.find_elements(By.CSS_SELECTOR, "polyline.finished[points*=' ']")
    )
    _shot(browser, screenshots, "overview", DESKTOP)
    _shot(browser, screenshots, "overview-phone", PHONE)


_EXPLAINED = """
const panel = document.querySelector("section.explain");
if (panel === null) return ["", ""];
return [panel.querySelector(".badge").title, panel.querySelector(".summary .message").innerText];
"""


def _explained(browser: WebDriver) -> list[str]:
    """The hold and the summary of a task page's Explain panel (read in one script)."""
    shown: list[str] = browser.execute_script(_EXPLAINED)
    return shown


_LEDGER = """
return [...document.querySelectorAll("#occurrence-table tbody tr")].map(tr => Object.fromEntries(
  [...tr.querySelectorAll("td[data-label]")].map(td => [td.dataset.label, td.innerText.trim()])
));
"""


def _ledger(browser: WebDriver) -> list[dict[str, str]]:
    """The rows of a schedule's page's ledger, the newest first, each cell's text by its
    column's name (read in one script: a snapshot)."""
    rows: list[dict[str, str]] = browser.execute_script(_LEDGER)
    return rows


def _outcomes(browser: WebDriver) -> list[str]:
    """The outcomes a schedule's page lists, the newest first (``no_pool`` as the API has it)."""
    return [row["Outcome"].replace(" ", "_") for row in _ledger(browser)]


_FOLLOW = """
const link = [...document.querySelectorAll("#content a")]
  .find(a => a.textContent.trim() === arguments[0]);
if (link === undefined) return false;
link.click();
return true;
"""


async def _follow(browser: WebDriver, text: str, arrived: Callable[[str], bool]) -> None:
    """Follow the link of this text, found and clicked in one script (a poll cannot swap it
    between the two), and wait until the browser's address says the page arrived."""

    def press() -> None:
        # The page may begin to unload as the script returns: the click was made.
        with contextlib.suppress(WebDriverException):
            assert browser.execute_script(_FOLLOW, text), f"no link {text!r}"

    await asyncio.to_thread(press)
    await _until(browser, lambda b: arrived(b.current_url))


_READY_COUNT = """
for (const card of document.querySelectorAll(".card")) {
  if (card.querySelector("h3 a").textContent.trim() !== arguments[0]) continue;
  for (const pair of card.querySelectorAll("dl.depth div")) {
    if (pair.querySelector("dt").textContent.trim() === "ready") {
      return Number(pair.querySelector("dd").textContent.trim());
    }
  }
}
return -1;
"""


def _ready_count(browser: WebDriver, pool: str) -> int:
    """The ready count in the overview's card of ``pool`` (-1 if not shown), read in one
    script: a snapshot of the page, which a poll cannot swap halfway."""
    count: int = browser.execute_script(_READY_COUNT, pool)
    return count


_FORCE = """
const done = arguments[arguments.length - 1];
const csrf = document.querySelector("input[name=csrf]").value;
fetch(arguments[0], {method: "POST", body: new URLSearchParams({csrf: csrf, task: arguments[1]})})
  .then(answer => done(answer.status), error => done(String(error)));
"""


@pytest.mark.asyncio(loop_scope="module")
async def test_a_reader_is_offered_no_action_and_is_refused_one_it_forces(
    cluster: Cluster, browser: WebDriver, screenshots: Path
) -> None:
    base = cluster.server.http
    await _sign_in(browser, base, TOKENS["reader"])
    target = cluster.queued[1]
    pages = (
        "/ui/", "/ui/tasks", "/ui/schedules", "/ui/pools", "/ui/limits", "/ui/outbox",
        f"/ui/tasks/{target}", f"/ui/schedule?name={cluster.ledgered}",
        f"/ui/tasks/{cluster.succeeded}",
    )  # fmt: skip
    for path in pages:
        await _page(browser, f"{base}{path}")
        assert browser.find_elements(By.ID, "live"), path
        assert _actions(browser) == [], path
    await _page(browser, f"{base}/ui/tasks/{target}")
    _shot(browser, screenshots, "task-read-only", DESKTOP)
    status = await asyncio.to_thread(
        browser.execute_async_script, _FORCE, f"{base}/ui/act/cancel", str(target)
    )
    assert status == 403
    assert (await cluster.client.get(target)).status is Status.READY
    before = [t.task_id for t in await cluster.client.list()]
    status = await asyncio.to_thread(
        browser.execute_async_script, _FORCE, f"{base}/ui/act/rerun", str(cluster.succeeded)
    )
    assert status == 403
    assert [t.task_id for t in await cluster.client.list()] == before  # no task made


_WIDTHS = """
return {
  inner: window.innerWidth,
  html: document.documentElement.scrollWidth,
  body: document.body.scrollWidth,
  // The outermost boxes past the window's right edge (not those inside a box that clips).
  wide: [...document.querySelectorAll("body *")]
    .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
    .filter(e => {
      for (let up = e.parentElement; up !== null; up = up.parentElement) {
        if (getComputedStyle(up).overflowX !== "visible") return false;
      }
      return true;
    })
    .slice(0, 5)
    .map(e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + "." + e.className),
};
"""

_UNREACHABLE = """
// One script, so that a poll cannot swap the page's live part between two controls.
const unreachable = [];
for (const element of document.querySelectorAll(arguments[0])) {
  if (element.getClientRects().length === 0) continue;  // not rendered
  element.scrollIntoView({block: "center", inline: "nearest"});
  const box = element.getBoundingClientRect();
  const scrolled = [];
  for (let up = element.parentElement; up !== null; up = up.parentElement) {
    if (up.scrollLeft !== 0) scrolled.push(up.tagName.toLowerCase() + "." + up.className);
  }
  const first = element.getClientRects()[0];  // a link broken over two lines: its first part
  const hit = document.elementFromPoint(first.left + first.width / 2, first.top + first.height / 2);
  const inside = box.left >= 0 && box.right <= window.innerWidth
    && box.top >= 0 && box.bottom <= window.innerHeight;
  const onTop = hit !== null && (hit === element || element.contains(hit));
  if (!inside || window.scrollX !== 0 || scrolled.length > 0 || !onTop) {
    unreachable.push({
      what: element.id || element.textContent.trim().slice(0, 40),
      box: [box.left, box.top, box.right, box.bottom], scrolled: scrolled, on_top: onTop,
      page_x: window.scrollX,
    });
  }
}
return unreachable;
"""
_CELLS = """
// Each cell of the page's tables: how it is laid out, and whether its column's name precedes
// it (drawn by the stylesheet from data-label).
return [...document.querySelectorAll("#live tbody td[data-label]")].map(td => {
  const before = getComputedStyle(td, "::before").content;
  return [getComputedStyle(td).display,
          before === JSON.stringify(td.dataset.label) ? "label" : before];
});
"""
_CONTROLS = "a[href]:not(.skip), button, input:not([type=hidden]), select"


def _fits(browser: WebDriver, page: str) -> list[str]:
    """Why the page scrolls sideways at the window's width ([] if it does not)."""
    widths = browser.execute_script(_WIDTHS)
    inner = widths["inner"]
    return [
        f"{page}: {which} is {widths[which]} px wide in a {inner} px window: {widths['wide']}"
        for which in ("html", "body")
        if widths[which] > inner
    ]


def _unreachable(browser: WebDriver, page: str) -> list[str]:
    """The controls of the page (actions, links, fields) that cannot be brought into view by
    scrolling down alone: after scrollIntoView each must lie within the window, with neither
    the page nor any box around it scrolled sideways, and nothing covering it."""
    return [f"{page}: {place}" for place in browser.execute_script(_UNREACHABLE, _CONTROLS)]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("size", [DESKTOP, PHONE], ids=["desktop", "phone"])
async def test_every_page_fits_the_width_and_every_control_is_reachable_by_scrolling_down(
    cluster: Cluster, browser: WebDriver, screenshots: Path, size: tuple[int, int]
) -> None:
    """At 1280 and at 390 px, with tasks in every state (failed with long messages and keys,
    running, scheduled, waiting, in a paused pool), two schedules (one paused, in its own time
    zone), three pools (one paused) and quarantined outbox rows (a kind of 255 characters,
    options and reasons without a space, a binary payload): no page is wider than the window,
    and every action, link and field of the pages is reached by scrolling down, never
    sideways."""
    base = cluster.server.http
    browser.delete_all_cookies()
    browser.set_window_size(*size)
    try:
        assert browser.execute_script("return window.innerWidth") == size[0]
        await _page(browser, f"{base}/ui/signin")
        problems = _fits(browser, "signin") + _unreachable(browser, "signin")
        await _sign_in(browser, base, TOKENS["admin"])
        pages = {
            "overview": "/ui/",
            "tasks": "/ui/tasks",
            "task": f"/ui/tasks/{cluster.crashed[0]}",
            "schedules": "/ui/schedules",
            "schedule": f"/ui/schedule?name={cluster.ledgered}",
            "workers": "/ui/workers",
            "pools": "/ui/pools",
            "outbox": "/ui/outbox",
        }
        for name, path in pages.items():
            await _page(browser, f"{base}{path}")
            problems += _fits(browser, name) + _unreachable(browser, name)
            # On a phone a table row is a card: each cell a block, after its column's name.
            cells = browser.execute_script(_CELLS)
            if name != "overview":
                assert cells, name
            wanted = ("block", "label") if size == PHONE else ("table-cell", "none")
            assert {tuple(cell) for cell in cells} <= {wanted}, (name, cells)
            if size == PHONE and name in ("schedules", "pools"):
                _shot(browser, screenshots, f"{name}-phone", PHONE)
        assert not problems, "\n".join(problems)
        # The data each page was checked with is there, its actions offered.
        await _page(browser, f"{base}/ui/tasks")
        shown = {
            b.get_attribute("id") for b in browser.find_elements(By.CSS_SELECTOR, "#live button")
        }
        assert {f"retry-{t}" for t in cluster.crashed} <= shown
        assert {f"cancel-{t}" for t in cluster.queued} <= shown
        statuses = {b.text for b in browser.find_elements(By.CSS_SELECTOR, "#live .badge")}
        assert {"failed", "succeeded", "running", "scheduled", "ready", "waiting"} <= statuses
        await _page(browser, f"{base}/ui/schedules")
        assert {"resume-schedule-2", "trigger-schedule-2", "pause-schedule-1"} <= {
            b.get_attribute("id") for b in browser.find_elements(By.CSS_SELECTOR, "#live button")
        }
        await _page(browser, f"{base}/ui/pools")
        assert browser.find_elements(By.ID, "resume-pool-3")
        await _page(browser, f"{base}/ui/outbox")
        row = cluster.quarantined[0]
        assert browser.find_elements(By.ID, f"requeue-{row}")
        assert browser.find_elements(By.ID, f"discard-{row}")
    finally:
        browser.set_window_size(*DESKTOP)
