"""A PostgreSQL restart under a leader, on a private cluster (never the shared server).

What is correct here: ``pg_ctl stop -m fast`` terminates every session, the leader's advisory
lock session too, and with it the lock. The leader cannot know who takes the lock once the
server is back (any standby may), so it steps down at once (the termination listener, not the
keepalive timeout): its scheduler stops with ``Fenced``, its callers get ``SchedulerError``
(``SchedulerStopped``) without waiting for ``commit_timeout``, and a commit with the old epoch
is ``Fenced``. While the server is down, reads and connecting are ``Unavailable``, and a new
``Scheduler`` (over the same store: that is how an embedding process serves again) waits in
``start()``. Once the server is back it leads with the next epoch, having recovered everything
acknowledged, and serves.

``commit_timeout`` itself (commits ``Unavailable`` until callers get ``SchedulerError``, then a
rebuild from the store) needs a leader whose lock session survives while its pool cannot reach
the server: the proxy test
``test_ambiguous_commit_then_rebuild_retry_with_same_key_returns_landed_task`` covers it."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import pytest_asyncio
from pg_fault_helpers import (
    SubmitLoad,
    assert_synchronous_commit,
    close_all,
    config,
    current_epoch,
    ids_in_db,
    rows_with_key,
    scheduler,
    submission,
    wait_until,
)
from pg_harness import new_schema, require_postgres
from pg_private_cluster import PrivateCluster, private_cluster_unavailable

from cronoq import Scheduler, SchedulerError, Status
from cronoq.errors import Fenced, Unavailable
from cronoq_store_postgres import PgStore

COMMIT_TIMEOUT = 1.0


@pytest_asyncio.fixture
async def cluster() -> AsyncIterator[PrivateCluster]:
    await require_postgres()
    reason = private_cluster_unavailable()
    if reason is not None:
        if os.environ.get("CRONOQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    made = await PrivateCluster.create()
    try:
        await made.start()
        yield made
    finally:
        await made.destroy()


async def test_restart_steps_the_leader_down_then_a_new_scheduler_resumes_losing_no_ack(
    cluster: PrivateCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="cronoq.postgres")
    await assert_synchronous_commit(cluster.dsn)
    schema = new_schema()  # the whole cluster goes away with the test
    cfg = config(schema)
    store = await PgStore.connect(cluster.dsn, cfg)
    sched_a = scheduler(store, commit_timeout=COMMIT_TIMEOUT)
    schedulers: list[Scheduler] = [sched_a]
    starts: list[asyncio.Future[None]] = []
    load: SubmitLoad | None = None
    try:
        await sched_a.start()
        epoch_a = await current_epoch(schema, cluster.dsn)
        before = [await sched_a.submit("job", b"p", key=f"before-{i}") for i in range(20)]
        # Tasks due in an hour, so nothing runs and commits once the load stops: the server
        # goes down under an idle leader. (Down in the middle of a commit, whether the FATAL
        # that every session gets lands before or after the pool's reset is a race; the
        # fault tests inject it deterministically: test_session_ended_right_after_a_commit_*.)
        load = SubmitLoad(sched_a, "a", start_at=timedelta(hours=1))
        await load.wait_acks(50)
        await load.stop()
        before.append(await sched_a.submit("job", b"p", key="last", start_at=timedelta(hours=1)))

        stopping = time.monotonic()
        await cluster.stop("fast")
        async with asyncio.timeout(cfg.session_timeout):
            await store.leadership_lost()
        # At once: the server ended the lock session, no keepalive had to time out (the stop
        # itself, with its shutdown checkpoint, is most of this).
        assert time.monotonic() - stopping < cfg.session_timeout, time.monotonic() - stopping
        async with asyncio.timeout(1.0):
            await sched_a.leadership_lost()
        assert isinstance(sched_a.failure, Fenced)
        assert all(isinstance(e, SchedulerError) for e in load.errors), load.errors

        # While the server is down.
        asked = time.monotonic()
        with pytest.raises(SchedulerError):
            await sched_a.submit("job", b"p", key="while-down")
        assert time.monotonic() - asked < COMMIT_TIMEOUT  # stopped: no commit was tried
        with pytest.raises(Unavailable):
            await store.get_task(before[0])
        with pytest.raises(Fenced):
            await store.commit(epoch_a, [submission(epoch_a, "old-epoch")])
        with pytest.raises(Unavailable):
            await PgStore.connect(cluster.dsn, cfg)
        await sched_a.close(timeout=1.0)

        # A new scheduler over the same store waits for the server, then leads.
        sched_b = scheduler(store, commit_timeout=COMMIT_TIMEOUT)
        schedulers.append(sched_b)
        caplog.clear()
        starting = asyncio.ensure_future(sched_b.start())
        starts.append(starting)
        await wait_until(
            lambda: sum("advisory lock attempt failed" in r.message for r in caplog.records) >= 2,
            5.0,
            "the new scheduler tried the lock while the server was down",
        )
        assert not starting.done()
        await cluster.start()
        restarted = time.monotonic()
        async with asyncio.timeout(10.0):
            await starting
        assert time.monotonic() - restarted < 3.0
        assert await current_epoch(schema, cluster.dsn) == epoch_a + 1

        # Nothing acknowledged is lost, and what failed is either absent or fully known.
        acked = before + load.acked
        assert await ids_in_db(schema, acked, cluster.dsn) == set(acked)
        for task_id, key in zip(load.acked, load.acked_keys, strict=True):
            assert (await sched_b.get(task_id)).key == key
        for key in [*load.failed_keys, "while-down", "old-epoch"]:
            rows = await rows_with_key(schema, key, cluster.dsn)
            found = await sched_b.get_by_key(key)
            assert (found is None) == (not rows), key
        assert await rows_with_key(schema, "old-epoch", cluster.dsn) == []

        # And it serves.
        new = await sched_b.submit("job", b"p", key="after-restart")
        assert (await sched_b.wait(new, timeout=5.0)).status is Status.SUCCEEDED
        assert await rows_with_key(schema, "after-restart", cluster.dsn) == [new]
    finally:
        if load is not None:
            await load.stop()
        await close_all(schedulers, [store], starts)
