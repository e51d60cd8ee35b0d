"""The ``cronoq-server`` command: ``check-config``, ``migrate`` and ``serve``.

Exit codes: see ``_exits`` (0 success, 1 the store failed, 2 invalid command line or
configuration, 3 a port cannot be listened on, 128 + N a forced stop by signal N).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

from cronoq.errors import CronoqError
from cronoq_server._config import (
    PostgresStoreSettings,
    ServerConfig,
    load_config,
    open_store,
    render_config,
)
from cronoq_server._errors import ConfigError
from cronoq_server._exits import EXIT_FAILED, EXIT_INVALID
from cronoq_store_postgres import PgStore

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cronoq-server",
        description="Run a cronoq scheduler as a service. Settings come from the TOML file of "
        "--config and CRONOQ_* environment variables (which win), e.g. CRONOQ_STORE__DSN.",
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("check-config", "validate the configuration and print it, secrets masked"),
        ("migrate", "create or upgrade the store's schema, then exit"),
        ("serve", "serve gRPC and HTTP (migrates the store first, unless store.migrate = 'never')"),
    ):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument("--config", metavar="FILE", help="TOML configuration file")
    return parser


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: the installed distribution's version, and those of the cronoq packages
    it runs with (a deployment upgrades them together: docs/server.md, the protocol)."""
    names = ("cronoq-server", "cronoq", "cronoq-client")
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in names[1:])
    parser.add_argument(
        "--version",
        action="version",
        version=f"{names[0]} {metadata.version(names[0])} ({versions})",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        count = len(exc.issues)
        print(
            f"cronoq-server: invalid configuration ({count} problem{'s' * (count != 1)}):",
            file=sys.stderr,
        )
        for issue in exc.issues:
            print(f"  {issue}", file=sys.stderr)
        return EXIT_INVALID
    for name in config.ignored_env:
        print(f"cronoq-server: note: {name} is not a setting, ignored", file=sys.stderr)
    if args.command == "check-config":
        sys.stdout.write(render_config(config))
        return 0
    if args.command == "migrate":
        return asyncio.run(_migrate(config))
    # Imported here: the gRPC side (and its imports) is needed by `serve` alone.
    from cronoq_server._server import run

    tune_collector()
    try:
        loop_factory = event_loop_factory(config.runtime.event_loop)
    except ImportError as exc:
        print(f'cronoq-server: runtime.event_loop = "uvloop", but {exc}', file=sys.stderr)
        return EXIT_INVALID
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(run(config))


def event_loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop ``serve`` runs on (None: asyncio's own). uvloop's cheaper callbacks and futures
    made single-call submissions 10-20% faster (docs/performance.md)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None  # auto: where uvloop is not installed (Windows, say)
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


SERVE_GC_THRESHOLDS = (50_000, 20, 100)
"""The cyclic collector's thresholds in ``serve`` (Python's defaults: 700, 10, 10)."""


def tune_collector() -> None:
    """A server holds every live task in memory, and a batch of submissions allocates
    thousands of objects: at Python's default thresholds the collector runs every 700 of them
    and promotes the live tasks through every generation. Fewer, larger young collections
    made 1,000-task SubmitMany calls 13-25% faster (docs/performance.md); cyclic garbage,
    which the scheduler's hot paths do not make, lives a little longer."""
    gc.set_threshold(*SERVE_GC_THRESHOLDS)


async def _migrate(config: ServerConfig) -> int:
    settings = config.store
    try:
        if isinstance(settings, PostgresStoreSettings):
            # Whatever store.migrate says: this is the step that migrates, as the owner role.
            done = await PgStore.migrate(settings.dsn, settings.options)
        else:  # SQLite migrates on open (its writer may alter its own file); memory: nothing
            store = await open_store(config)
            await store.close()
    except (CronoqError, OSError) as exc:
        message = " ".join(str(exc).split())
        print(f"cronoq-server migrate: {type(exc).__name__}: {message}", file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(settings, PostgresStoreSettings):
        print(f"cronoq-server migrate: the {config.store.kind} store's schema is up to date")
    elif done.before == done.after:
        print(f"cronoq-server migrate: the schema {done.schema!r} is up to date ({done.after})")
    else:
        print(
            f"cronoq-server migrate: the schema {done.schema!r} was migrated from version "
            f"{done.before} to {done.after}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
