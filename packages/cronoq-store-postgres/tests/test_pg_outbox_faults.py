"""The outbox when the leader does not learn how its ingest commit ended: the reply to the
commit that deletes the rows with their tasks is lost (it landed), then the store stays out of
reach past ``commit_timeout``, so the scheduler rebuilds its memory from the store and the
ingest reads the outbox again. The same leader, the same rows: each must still become exactly
one task (the deletion landed with them, and the next read comes after it)."""

from __future__ import annotations

import asyncio
from collections import Counter

import asyncpg
from pg_fault_helpers import close_all, config, scheduler
from pg_harness import DSN
from pg_proxy import Link, PgProxy, writes_a_batch

from cronoq import SchedulerError, TaskRequest
from cronoq_store_postgres import PgStore, enqueue_many

ROWS = 200
WAIT_S = 20.0


def not_lock(link: Link) -> bool:
    return not link.is_lock_session


def takes_outbox_rows(link: Link, text: str) -> bool:
    """The commit statement that deletes outbox rows with the batch's tasks."""
    return writes_a_batch(link, text) and "outbox_taken AS" in text


async def test_an_ingest_commit_whose_reply_is_lost_makes_each_row_one_task(
    schema: str, proxy: PgProxy
) -> None:
    store = await PgStore.connect(proxy.dsn(DSN), config(schema))
    sched = scheduler(store, commit_timeout=0.5)
    app = await asyncpg.connect(DSN)
    try:
        await sched.start()

        def unreachable(dropped: Link) -> None:
            proxy.refuse = not_lock
            proxy.cut(lambda link: not_lock(link) and link is not dropped)
            # Back after the commit timeout: the scheduler has rebuilt by then, or is at it.
            asyncio.get_running_loop().call_later(1.0, setattr, proxy, "refuse", None)

        proxy.drop_reply_to(takes_outbox_rows, not_lock, then=unreachable)
        async with app.transaction():
            await enqueue_many(
                app, [TaskRequest("job", str(i).encode()) for i in range(ROWS)], schema=schema
            )
        async with asyncio.timeout(WAIT_S):
            await proxy.reply_dropped.wait()
            while True:  # until the rebuilt scheduler serves, as a client would retry
                try:
                    await sched.submit("marker", b"m", key="marker")
                    break
                except SchedulerError:
                    await asyncio.sleep(0.05)
            # And it ingests again: a second batch after the fault.
            await enqueue_many(
                app, [TaskRequest("job", f"after-{i}".encode()) for i in range(10)], schema=schema
            )
            while await app.fetchval(f'SELECT count(*) FROM "{schema}".cronoq_outbox'):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # a table to read: no event to await
        made = Counter(
            bytes(r["payload"])
            for r in await app.fetch(
                f"SELECT payload FROM \"{schema}\".cronoq_tasks WHERE kind = 'job'"
            )
        )
        rebuilds = sum(link.count("SELECT epoch, max_task_id FROM") for link in proxy.links)
        assert sched.running
    finally:
        await app.close()
        await proxy.close()
        await close_all([sched], [store], [])
    assert rebuilds >= 2, "the scheduler did not rebuild: the fault missed its mark"
    expected = [
        *(str(i).encode() for i in range(ROWS)),
        *(f"after-{i}".encode() for i in range(10)),
    ]
    assert made == Counter(expected), {p: n for p, n in made.items() if n != 1}
