"""A task whose row cannot be decoded is quarantined at recovery; lookups then return it as
failed, saying why, instead of raising a decoding error (issue 9, item 11)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlite_harness import SqliteHarness

from cronoq import Pool, Scheduler, Status, TaskContext


async def noop(ctx: TaskContext, payload: object) -> None:
    return None


async def test_get_and_wait_of_a_quarantined_task_return_it_failed(tmp_path: Path) -> None:
    harness = SqliteHarness(tmp_path / "cronoq.db")
    try:
        first = Scheduler([Pool("default", noop)], store=await harness.open())
        async with first:
            task_id = await first.submit("later", b"x", start_at=timedelta(hours=1))
        await harness.corrupt_task(harness.opened[0], task_id)
        second = Scheduler([Pool("default", noop)], store=await harness.open())
        async with second:
            for info in (await second.get(task_id), await second.wait(task_id, timeout=0)):
                assert info.status is Status.FAILED
                assert info.message.startswith("quarantined: ")
                assert info.task_id == task_id
    finally:
        await harness.close_all()
