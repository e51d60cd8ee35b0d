"""A real cronoq-server (server_process) for tests whose own code is synchronous (the sync
Client, the ``cronoq`` command): its process is started and its log read by an event loop in a
thread of its own, which keeps reading while the test blocks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from server_process import ServerProcess, config_toml, start_server

_R = TypeVar("_R")

CALL_TIMEOUT_S = 60.0
POOLS = '[[pools]]\nname = "default"\n[[pools]]\nname = "other"\n'


@dataclass(frozen=True, slots=True)
class ThreadedServer:
    server: ServerProcess
    loop: asyncio.AbstractEventLoop

    @property
    def target(self) -> str:
        return self.server.target

    def call(self, coro: Coroutine[Any, Any, _R], timeout: float = CALL_TIMEOUT_S) -> _R:
        """Run ``coro`` on the server's loop (a wait for a log line, an AsyncClient call)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self, coro: Coroutine[Any, Any, _R]) -> asyncio.Task[_R]:
        """Start ``coro`` as a task of the server's loop (a Worker's run) and return it."""

        async def spawn() -> asyncio.Task[_R]:
            return asyncio.get_running_loop().create_task(coro)

        return self.call(spawn())


MEMORY = '[store]\nkind = "memory"\n'


@contextlib.contextmanager
def threaded_server(
    directory: Path, pools: str = POOLS, tables: str = "", store: str = MEMORY
) -> Iterator[ThreadedServer]:
    """A leading server (``tables``: more sections, as config_toml's; ``store``: its
    ``[store]`` section, in memory by default), until the block ends."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-server-loop", daemon=True)
    thread.start()
    config = config_toml(store, pools=pools, tables=tables)

    async def started() -> ServerProcess:
        server = await start_server(directory, config)
        try:
            await server.leading()
        except BaseException:
            await server.stop()
            raise
        return server

    try:
        running = ThreadedServer(asyncio.run_coroutine_threadsafe(started(), loop).result(), loop)
        try:
            yield running
        finally:
            running.call(running.server.stop())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def cli_env(target: str, tmp_path: Path, token: str = "") -> dict[str, str]:
    """The environment of a ``cronoq`` command against ``target``: no config file or
    credentials of the machine's user may leak in."""
    return {
        "CRONOQ_TARGET": target,
        "CRONOQ_CONFIG": "",
        "XDG_CONFIG_HOME": str(tmp_path / "no-config"),
        "CRONOQ_CONTEXT": "",
        "CRONOQ_TOKEN": token,
        "CRONOQ_TOKEN_FILE": "",
        "CRONOQ_TLS_CA": "",
        "CRONOQ_TLS_CERT": "",
        "CRONOQ_TLS_KEY": "",
        "CRONOQ_CODEC": "",
    }
