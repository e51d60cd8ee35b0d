"""Real OS processes on one SQLite file: a killed, a paused and a cleanly stopped leader, and
three processes contending under load. The nodes are ``sqlite_node.py``; every wait is on a line
they print, with a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from sqlite_processes import Cluster, Line, Node, epoch_of

pytestmark = pytest.mark.skipif(
    not hasattr(signal, "SIGSTOP") or not hasattr(os, "waitid"),
    reason="needs POSIX signals and waitid",
)

STARTUP = 20.0
"""Seconds a node may take to start Python, open the store and lead (2 loaded cores)."""
MARGIN = 1.0
"""Seconds allowed on top of ``lease_ttl + lock_poll`` for a takeover: the new leader's lease
transaction, its recovery and first commit, and the line reaching the test on a loaded machine."""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(tmp_path)
    try:
        yield cluster
    finally:
        await cluster.kill_all()


def timings(ttl: float, renew: float, poll: float, **more: float) -> dict[str, Any]:
    return {"lease_ttl": ttl, "lease_renew": renew, "lock_poll": poll, **more}


def run_of(task_id: int, attempt: int) -> Callable[[Line], bool]:
    return lambda line: line.words == ["RUN", str(task_id), str(attempt)]


async def test_sigkill_leader_standby_leads_within_lease_and_running_tasks_are_retried(
    cluster: Cluster,
) -> None:
    ttl, renew, poll = 1.5, 0.3, 0.1
    config = timings(ttl, renew, poll, busy_timeout=1.0)
    a = await cluster.spawn("a", config, "--block", "3", "--submitters", "2", "--interval", "0.005")
    epoch_a = int((await a.expect("LEADING", STARTUP)).words[1])
    b = await cluster.spawn("b", config)
    await b.expect("OPEN", STARTUP)
    # Three attempts block in A's executor threads while A acknowledges submissions.
    await a.expect("RUN", 10, count=3)
    await a.expect("ACK", 10, count=3 + 50)
    running = {int(line.words[1]) for line in a.of("RUN")}
    assert [line.words[2] for line in a.of("RUN")] == ["1", "1", "1"]

    killed_at = a.signal(signal.SIGKILL)
    assert await a.exited(5) == -signal.SIGKILL
    acked = a.acked()
    leading = await b.expect("LEADING", ttl + poll + MARGIN + 5)
    took = leading.at - killed_at
    print(f"takeover after SIGKILL: {took:.3f}s (lease_ttl {ttl}s, lock_poll {poll}s)")
    # Not before the dead leader's lease ran out (it was renewed at most `renew` before the
    # kill; 0.25 s for a late renewal), and at most one poll after it did.
    assert ttl - renew - 0.25 <= took <= ttl + poll + MARGIN, f"took {took:.2f}s"
    assert int(leading.words[1]) == epoch_a + 1

    for task_id in running:
        await b.expect(run_of(task_id, 2), 10)
    rows = await cluster.task_rows()
    assert acked <= rows.keys(), f"acknowledged but lost: {sorted(acked - rows.keys())}"
    assert {rows[task_id] for task_id in running} == {("running", 2)}
    assert not b.of("ERR") and not b.of("LOST"), b.describe()


def wait_stopped(pid: int) -> None:
    """Block until the child ``pid`` is stopped, leaving that state for other waiters."""
    os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOWAIT)


def ids_if_lock_free(db: Path, epoch: int) -> set[int] | None:
    """The ids of ``epoch`` in the file, or None if someone holds the write lock.

    Asked while the leader is stopped: if the lock is free, the file holds exactly what the
    leader committed before it stopped.
    """
    with contextlib.closing(sqlite3.connect(db, timeout=0, isolation_level=None)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname == "SQLITE_BUSY":
                return None
            raise
        try:
            rows = conn.execute("SELECT id FROM cronoq_tasks WHERE id >> 40 = ?", (epoch,))
            return {task_id for (task_id,) in rows}
        finally:
            conn.execute("ROLLBACK")


async def stop_outside_a_transaction(a: Node, db: Path, epoch: int) -> tuple[float, set[int]]:
    """SIGSTOP ``a`` in the middle of its load, but not while it holds SQLite's write lock.

    A process stopped inside a write transaction keeps the lock (the kernel releases it only
    when the process dies), so no standby could take over until it resumes: when that happens,
    let it go on and stop it again. Returns when it was stopped and its ids in the file then.
    """
    for attempt in range(1, 31):
        await a.expect("ACK", 10, count=len(a.of("ACK")) + 1)
        stopped_at = a.signal(signal.SIGSTOP)
        async with asyncio.timeout(5):
            await asyncio.to_thread(wait_stopped, a.proc.pid)
        committed = await asyncio.to_thread(ids_if_lock_free, db, epoch)
        if committed is not None:
            print(f"stopped outside a write transaction at attempt {attempt}")
            return stopped_at, committed
        a.signal(signal.SIGCONT)
    raise AssertionError("the leader was inside a write transaction at each of 30 stops")


async def test_sigstop_leader_past_its_lease_is_fenced_on_resume_and_writes_nothing_more(
    cluster: Cluster,
) -> None:
    ttl, renew, poll = 1.0, 0.2, 0.05
    config = timings(ttl, renew, poll, busy_timeout=1.0)
    load = ("--submitters", "2", "--interval", "0.005")
    a = await cluster.spawn("a", config, *load)
    epoch_a = int((await a.expect("LEADING", STARTUP)).words[1])
    b = await cluster.spawn("b", config, *load)
    await b.expect("OPEN", STARTUP)
    await a.expect("ACK", 10, count=20)

    stopped_at, committed_before_stop = await stop_outside_a_transaction(a, cluster.db, epoch_a)
    leading = await b.expect("LEADING", ttl + poll + MARGIN + 5)
    assert int(leading.words[1]) == epoch_a + 1
    print(f"takeover after SIGSTOP: {leading.at - stopped_at:.3f}s (lease_ttl {ttl}s)")
    assert leading.at - stopped_at <= ttl + poll + MARGIN, f"{leading.at - stopped_at:.2f}s"
    await b.expect("ACK", 10, count=10)  # the new leader writes while the old one is paused

    a.signal(signal.SIGCONT)
    lost = await a.expect("LOST", 10)
    print(f"old leader: {lost.text}; {len(a.of('ERR'))} refused calls")
    assert "Fenced" in lost.text, lost.text
    # Why, as the store saw it (its commit was refused, or its renewal found the takeover).
    assert "leadership was lost" not in lost.text, lost.text
    assert await a.exited(10) == 0, a.describe()
    acks_b = len(b.of("ACK"))
    await b.expect("ACK", 10, count=acks_b + 20)  # the new leader keeps working

    rows = await cluster.task_rows()
    rows_a = {task_id for task_id in rows if epoch_of(task_id) == epoch_a}
    assert rows_a == committed_before_stop, (
        f"written by the old leader after the takeover: {sorted(rows_a - committed_before_stop)}"
    )
    assert rows_a == a.acked(), (
        f"in the file, not acknowledged: {sorted(rows_a - a.acked())}; "
        f"acknowledged, not in the file: {sorted(a.acked() - rows_a)}"
    )
    assert b.acked() <= rows.keys()
    assert {epoch_of(task_id) for task_id in b.acked()} == {epoch_a + 1}
    assert not b.of("ERR") and not b.of("LOST"), b.describe()


async def test_clean_stop_hands_over_at_once_well_under_the_lease_ttl(cluster: Cluster) -> None:
    ttl, renew, poll = 5.0, 1.0, 0.1
    config = timings(ttl, renew, poll)
    a = await cluster.spawn("a", config, "--submitters", "1", "--interval", "0.01")
    epoch_a = int((await a.expect("LEADING", STARTUP)).words[1])
    b = await cluster.spawn("b", config)
    await b.expect("OPEN", STARTUP)
    await a.expect("ACK", 10, count=20)

    sent_at = a.signal(signal.SIGTERM)  # the node answers with scheduler.close()
    leading = await b.expect("LEADING", ttl + poll + MARGIN + 5)
    took = leading.at - sent_at
    print(f"takeover after a clean stop: {took:.3f}s (lease_ttl {ttl}s)")
    # A released lease is taken at the standby's next poll: far below the ttl a crash costs.
    assert took <= 1.5, f"took {took:.2f}s with a {ttl}s lease"
    assert int(leading.words[1]) == epoch_a + 1
    await a.expect("CLOSED", 10)
    assert await a.exited(10) == 0, a.describe()
    rows = await cluster.task_rows()
    assert a.acked() <= rows.keys()
    assert not a.of("ERR") and not a.of("LOST"), a.describe()


async def test_three_processes_under_load_see_no_error_and_one_leader(cluster: Cluster) -> None:
    # Standbys poll every 20 ms; the production busy_timeout (5 s) stays.
    config = timings(2.0, 0.3, 0.02)
    load = ("--submitters", "4", "--interval", "0.002", "--duration", "3")
    # All three start at once on a file that does not exist yet: they race to create it,
    # set WAL and migrate, then to take the first lease.
    nodes = [await cluster.spawn(name, config, *load) for name in "abc"]
    waits = {asyncio.ensure_future(node.expect("LEADING", STARTUP)): node for node in nodes}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for other in pending:
        other.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    first = done.pop()
    first.result()  # a node that ended before leading fails the test here, with its output
    leader = waits[first]
    finished = await leader.expect("LOADDONE", 20)

    acks = int(finished.words[1])
    print(f"leader {leader.name}: {acks} acknowledgements in 3 s")
    everything = [line for node in nodes for line in node.lines]
    errors = [f"{node.name}: {line.text}" for node in nodes for line in node.of("ERR")]
    contention = [
        line.text
        for line in everything
        if line.kind == "LOG" and ("BUSY" in line.text or "LOCKED" in line.text)
    ]
    assert acks >= 300, f"too light a load to tell: {acks} acknowledgements"
    assert errors == [], errors
    assert contention == [], contention
    leadings = [f"{node.name}: {line.text}" for node in nodes for line in node.of("LEADING")]
    assert leadings == [f"{leader.name}: {leader.of('LEADING')[0].text}"], "leadership moved"
    for node in nodes:
        assert node.proc.returncode is None, node.describe()
        assert node.of("OPEN"), node.describe()
        assert not node.of("LOST"), node.describe()
    rows = await cluster.task_rows()
    assert len(leader.acked()) == acks
    assert leader.acked() <= rows.keys()
