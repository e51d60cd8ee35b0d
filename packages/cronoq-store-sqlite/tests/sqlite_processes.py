"""Real OS processes running ``sqlite_node.py`` on one SQLite file, and a reader of their lines.

Every wait is on a line the node prints (read with a timeout), never a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NODE_SCRIPT = Path(__file__).with_name("sqlite_node.py")
SEQUENCE_BITS = 40  # task ids carry their leader's epoch above these bits


@dataclass(frozen=True, slots=True)
class Line:
    at: float
    """``time.monotonic()`` when the test read it."""
    text: str

    @property
    def words(self) -> list[str]:
        return self.text.split()

    @property
    def kind(self) -> str:
        return self.text.split(" ", 1)[0]


class Node:
    """One ``sqlite_node.py`` process; its stdout lines are collected as they come."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, stderr: Path) -> None:
        self.name = name
        self.proc = proc
        self.stderr = stderr
        self.lines: list[Line] = []
        self.eof = False
        self._new = asyncio.Event()
        self._reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            self.lines.append(Line(time.monotonic(), raw.decode(errors="replace").rstrip("\n")))
            self._new.set()
        self.eof = True
        self._new.set()

    def describe(self) -> str:
        tail = "\n".join(line.text for line in self.lines[-15:])
        err = ""
        with contextlib.suppress(OSError):
            err = self.stderr.read_text()[-3000:]
        return (
            f"node {self.name} (pid {self.proc.pid}, exit {self.proc.returncode}), "
            f"{len(self.lines)} lines, last:\n{tail}\nstderr:\n{err}"
        )

    async def expect(
        self, match: str | Callable[[Line], bool], timeout: float, *, count: int = 1
    ) -> Line:
        """The ``count``-th line that matches (a line kind like ``"ACK"``, or a predicate)."""

        def matches(line: Line) -> bool:
            return line.kind == match if isinstance(match, str) else match(line)

        seen = 0
        index = 0
        try:
            async with asyncio.timeout(timeout):
                while True:
                    while index < len(self.lines):
                        line = self.lines[index]
                        index += 1
                        if matches(line):
                            seen += 1
                            if seen == count:
                                return line
                    if self.eof:
                        raise AssertionError(f"{match!r} never came; {self.describe()}")
                    self._new.clear()
                    await self._new.wait()
        except TimeoutError:
            raise AssertionError(
                f"no {count} x {match!r} within {timeout}s ({seen} seen); {self.describe()}"
            ) from None

    def of(self, kind: str) -> list[Line]:
        return [line for line in self.lines if line.kind == kind]

    def acked(self) -> set[int]:
        return {int(line.words[1]) for line in self.of("ACK")}

    def signal(self, signum: int) -> float:
        """Send a signal; return the time it was sent."""
        now = time.monotonic()
        self.proc.send_signal(signum)
        return now

    async def exited(self, timeout: float) -> int:
        try:
            async with asyncio.timeout(timeout):
                code = await self.proc.wait()
                await self._reader  # every line it wrote has been read
        except TimeoutError:
            raise AssertionError(f"did not exit within {timeout}s; {self.describe()}") from None
        return code

    async def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Cluster:
    """Nodes on one database file; ``kill_all`` (always, in a finally) SIGKILLs what runs."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.db = directory / "cronoq.db"
        self.nodes: list[Node] = []

    async def spawn(self, name: str, config: dict[str, Any], *load: str) -> Node:
        stderr = self.directory / f"{name}.stderr"
        with stderr.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                str(NODE_SCRIPT),
                str(self.db),
                "--config",
                json.dumps(config),
                *load,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
            )
        node = Node(name, proc, stderr)
        self.nodes.append(node)
        return node

    async def kill_all(self) -> None:
        for node in self.nodes:
            await node.kill()

    def connect(self, timeout: float = 5.0) -> sqlite3.Connection:
        """A connection of the test's own, outside every node (autocommit)."""
        return sqlite3.connect(self.db, timeout=timeout, isolation_level=None)

    async def task_rows(self) -> dict[int, tuple[str, int]]:
        """id -> (status, attempt) of every task row in the file."""

        def read() -> dict[int, tuple[str, int]]:
            with contextlib.closing(self.connect()) as conn:
                rows = conn.execute("SELECT id, status, attempt FROM cronoq_tasks").fetchall()
            return {task_id: (status, attempt) for task_id, status, attempt in rows}

        return await asyncio.to_thread(read)


def epoch_of(task_id: int) -> int:
    return task_id >> SEQUENCE_BITS
