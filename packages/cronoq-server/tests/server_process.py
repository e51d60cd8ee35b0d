"""A real ``cronoq-server serve`` process for tests: started on ports the OS picks, its log
lines parsed as they come, so a test awaits an event ("leading") instead of sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from cronoq_client import protocol as wire
from cronoq_client.protocol import pb

STARTUP_TIMEOUT_S = 30.0


class AttachStream:
    """An Attach call read event by event: one stream message carries one or more."""

    def __init__(self, call: grpc.aio.UnaryStreamCall[Any, Any]) -> None:
        self.call = call
        self._unread: deque[pb.WorkerEvent] = deque()

    async def raw(self) -> pb.WorkerEvent:
        while not self._unread:
            message = await self.call.read()
            assert isinstance(message, pb.AttachResponse), message
            assert message.events, "a stream message without events"
            self._unread.extend(message.events)
        return self._unread.popleft()

    async def event(self) -> wire.WorkerEvent | wire.UnreadableAttempt:
        return wire.worker_event_from_pb(await self.raw())

    def cancel(self) -> None:
        self.call.cancel()


def parse_line(line: str) -> dict[str, str]:
    """One key=value log line as a dict (``msg`` holds the event); {} if it is not one."""
    try:
        words = shlex.split(line)
    except ValueError:
        return {}
    fields: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    return fields


@dataclass
class ServerProcess:
    process: asyncio.subprocess.Process
    lines: list[dict[str, str]] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)
    grpc_port: int = 0
    http_port: int = 0
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    _reader: asyncio.Task[None] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    async def _read(self) -> None:
        assert self.process.stderr is not None
        async for data in self.process.stderr:
            text = data.decode("utf-8", "replace").rstrip("\n")
            self.raw.append(text)
            fields = parse_line(text)
            async with self._changed:
                self.lines.append(fields)
                self._changed.notify_all()
        async with self._changed:
            self._changed.notify_all()

    def events(self, name: str, **fields: str) -> list[dict[str, str]]:
        return [
            line
            for line in self.lines
            if line.get("msg") == name and all(line.get(k) == v for k, v in fields.items())
        ]

    async def wait_for(
        self, name: str, timeout: float = STARTUP_TIMEOUT_S, **fields: str
    ) -> dict[str, str]:
        """The first log line of event ``name`` with these fields (waiting for it if need be)."""
        return await self.wait_line(
            lambda line: (
                line.get("msg") == name and all(line.get(k) == v for k, v in fields.items())
            ),
            repr(name),
            timeout,
        )

    async def wait_line(
        self,
        matches: Callable[[dict[str, str]], bool],
        what: str,
        timeout: float = STARTUP_TIMEOUT_S,
    ) -> dict[str, str]:
        """The first log line that ``matches`` (waiting for it if need be)."""
        async with asyncio.timeout(timeout), self._changed:
            while True:
                found = [line for line in self.lines if matches(line)]
                if found:
                    return found[0]
                if self.process.returncode is not None or (
                    self._reader is not None and self._reader.done()
                ):
                    raise AssertionError(
                        f"the server exited before {what}:\n" + "\n".join(self.raw[-30:])
                    )
                await self._changed.wait()

    async def leading(self, timeout: float = STARTUP_TIMEOUT_S) -> dict[str, str]:
        """Once this replica leads and its leader's server alone holds the port."""
        return await self.wait_for("serving", timeout, role="leading")

    def signal(self, signum: int) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signum)

    async def wait_exit(self, timeout: float) -> int:
        async with asyncio.timeout(timeout):
            code = await self.process.wait()
        if self._reader is not None:
            await self._reader
        return code

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await self.process.wait()
        if self._reader is not None:
            await self._reader


async def start_server(
    directory: Path, config: str, env: dict[str, str] | None = None
) -> ServerProcess:
    """Start ``cronoq-server serve`` with this TOML (ports 0 unless it says otherwise) in
    ``directory``; return once it listens (it may still be a standby)."""
    path = directory / f"server-{os.urandom(4).hex()}.toml"
    path.write_text(config)
    # The test run's own CRONOQ_* switches (CRONOQ_REQUIRE_POSTGRES, ...) are not the server's
    # settings, which it would note as unknown: only ``env`` passes settings.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("CRONOQ_")}
    environ = {**inherited, **(env or {})}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "cronoq_server",
        "serve",
        "--config",
        str(path),
        cwd=directory,
        env=environ,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    server = ServerProcess(process)
    server._reader = asyncio.get_running_loop().create_task(server._read())
    try:
        listening = await server.wait_for("listening")
    except BaseException:
        await server.stop()
        raise
    server.grpc_port = int(listening["grpc_port"])
    server.http_port = int(listening["http_port"])
    return server


DEFAULT_POOL = '[[pools]]\nname = "default"\n'


def config_toml(store: str, *, pools: str = DEFAULT_POOL, extra: str = "", tables: str = "") -> str:
    """A test configuration: ports the OS picks, quick timings, this store section; ``extra``
    holds top-level keys, ``tables`` more sections ([tls], [limits], ...)."""
    return (
        f"{extra}\n"
        "commit_timeout_s = 2.0\ndrain_timeout_s = 5.0\n"
        '[listen]\ngrpc = "127.0.0.1:0"\nhttp = "127.0.0.1:0"\n'
        f"{store}\n{tables}\n{pools}"
    )


@contextlib.asynccontextmanager
async def running_server(
    directory: Path, config: str, env: dict[str, str] | None = None
) -> AsyncIterator[ServerProcess]:
    server = await start_server(directory, config, env)
    try:
        yield server
    finally:
        await server.stop()
