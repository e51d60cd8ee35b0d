"""A standby says what it waits for: one INFO line naming the session that holds the
leadership lock when it starts waiting (not one per poll), and one when it leads (issue 33,
item 6)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re

import pytest
from pg_harness import DSN, FAST

from cronoq_store_postgres import PgStore

POLLS = 5
WAIT_S = 30.0  # generous: the polls come every 50 ms


def _lines(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "cronoq.postgres" and r.levelno == logging.INFO
        and r.getMessage().startswith(start)
    ]  # fmt: skip


async def test_a_standby_logs_once_who_leads_and_once_when_it_takes_over(
    schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cronoq.postgres")
    config = dataclasses.replace(FAST, schema=schema)
    leader = await PgStore.connect(DSN, config)
    standby = await PgStore.connect(DSN, config)
    try:
        lease = await leader.acquire_leadership()
        assert _lines(caplog, "leading") == [f"leading schema {schema!r} (epoch {lease.epoch})"]
        session = leader._lock_session._conn
        assert session is not None
        holder_pid = session.get_server_pid()

        polls = 0
        polled = asyncio.Event()
        lock_session = standby._lock_session
        try_lock = lock_session._try_lock

        async def counted() -> bool:
            nonlocal polls
            taken = await try_lock()
            polls += 1
            if polls >= POLLS:
                polled.set()
            return taken

        lock_session._try_lock = counted  # type: ignore[method-assign]
        waiting = asyncio.create_task(standby.acquire_leadership())
        async with asyncio.timeout(WAIT_S):
            await polled.wait()
        assert not waiting.done()
        [line] = _lines(caplog, "standby")
        assert re.fullmatch(
            rf"standby: the leadership lock of schema {re.escape(repr(schema))} is held by "
            rf"PostgreSQL session pid {holder_pid} \(user \S+, (from \S+, )?since "
            r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+\); waiting, and taking over when that session "
            r"unlocks or ends",
            line,
        ), line

        await leader.release_leadership()
        async with asyncio.timeout(WAIT_S):
            taken = await waiting
        leading = _lines(caplog, "leading")
        assert len(leading) == 2, leading
        assert re.fullmatch(
            rf"leading schema {re.escape(repr(schema))} \(epoch {taken.epoch}\): took the lock "
            r"after \d+\.\d s as a standby",
            leading[1],
        ), leading[1]
        assert len(_lines(caplog, "standby")) == 1  # still one, whatever the polls
    finally:
        await standby.close()
        await leader.close()
