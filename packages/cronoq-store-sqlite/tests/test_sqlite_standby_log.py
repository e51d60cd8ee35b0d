"""A standby says what it waits for: one INFO line naming the lease's holder when it starts
waiting (not one per poll), and one when it leads (issue 33, item 6)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

import pytest
from sqlite_harness import FAST

from cronoq_store_sqlite import SqliteStore
from cronoq_store_sqlite._store import describe_holder

POLLS = 5
WAIT_S = 30.0  # generous: the polls come every 50 ms


def _lines(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "cronoq.sqlite" and r.levelno == logging.INFO
        and r.getMessage().startswith(start)
    ]  # fmt: skip


async def test_a_standby_logs_once_who_leads_and_once_when_it_takes_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cronoq.sqlite")
    path = str(tmp_path / "cronoq.db")
    leader = await SqliteStore.open(path, FAST)
    standby = await SqliteStore.open(path, FAST)
    try:
        lease = await leader.acquire_leadership()
        assert _lines(caplog, "leading") == [f"leading {path} (epoch {lease.epoch})"]

        # Count the standby's looks at the lease, to know it polled several times.
        polls = 0
        polled = asyncio.Event()
        look = standby._try_take_lease

        async def counted() -> int | None:
            nonlocal polls
            found = await look()
            polls += 1
            if polls >= POLLS:
                polled.set()
            return found

        standby._try_take_lease = counted  # type: ignore[method-assign]
        waiting = asyncio.create_task(standby.acquire_leadership())
        async with asyncio.timeout(WAIT_S):
            await polled.wait()
        assert not waiting.done()
        who = f"{socket.gethostname()} pid {os.getpid()}"
        assert _lines(caplog, "standby") == [
            f"standby: the lease of {path} is held by {who}; waiting, and taking over when it "
            f"is released or not renewed for lease_ttl ({FAST.lease_ttl:g} s)"
        ]

        await leader.release_leadership()
        async with asyncio.timeout(WAIT_S):
            taken = await waiting
        leading = _lines(caplog, "leading")
        assert len(leading) == 2, leading
        assert leading[1].startswith(
            f"leading {path} (epoch {taken.epoch}): took over the lease after "
        ) and leading[1].endswith(" s as a standby"), leading[1]
        assert len(_lines(caplog, "standby")) == 1  # still one, whatever the polls
    finally:
        await standby.close()
        await leader.close()


def test_a_holder_is_shown_as_host_and_pid_or_as_written() -> None:
    assert describe_holder("web-1/4242/0123abcd") == "web-1 pid 4242"
    # A lease taken by an earlier release: its random hex.
    assert describe_holder("0123456789abcdef") == "holder 0123456789abcdef"
    assert describe_holder("a/b/c") == "holder a/b/c"
