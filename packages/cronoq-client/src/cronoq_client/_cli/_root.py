"""The root ``cronoq`` group: the connection options every command shares, the client a command
gets (made on first use, closed when the command ends), and the mapping of cronoq's exceptions
to one-line messages and exit codes (``_errors``)."""

from __future__ import annotations

from typing import Any

import click

from cronoq.errors import CronoqError
from cronoq_client._cli._errors import CommandFailed, ExitCode, failure
from cronoq_client._cli._settings import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TARGET,
    Flags,
    Settings,
    resolve,
)
from cronoq_client._sync import Client

__all__ = ["Session", "cli", "session"]


class Session:
    """A command's settings, resolved on first use (``completion`` needs none), and its
    client."""

    def __init__(self, flags: Flags) -> None:
        self._flags = flags
        self._settings: Settings | None = None
        self._client: Client | None = None

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = resolve(self._flags)
        return self._settings

    def client(self) -> Client:
        if self._client is None:
            found = self.settings
            try:
                self._client = Client(
                    found.target,
                    codec=found.codec,
                    tls=found.tls,
                    token=found.token,
                    timeout=found.timeout,
                    connect_timeout=found.connect_timeout,
                )
            except CronoqError as exc:  # a TLS file that cannot be read, a bad token
                raise CommandFailed(str(exc), ExitCode.USAGE) from None
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def session() -> Session:
    return click.get_current_context().ensure_object(Session)


class _Group(click.Group):
    """Every command's CronoqError becomes its one line and exit code; Ctrl-C exits 130."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except CronoqError as exc:
            raise failure(exc) from None
        except KeyboardInterrupt:
            raise CommandFailed("interrupted", ExitCode.INTERRUPTED) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    metavar="PATH",
    help="config file [env CRONOQ_CONFIG; default ~/.config/cronoq/config.toml]",
)
@click.option("--context", help="context of the config file [env CRONOQ_CONTEXT]")
@click.option(
    "-t",
    "--target",
    multiple=True,
    metavar="HOST:PORT",
    help=f"server address; repeat or comma-separate replicas [env CRONOQ_TARGET; {DEFAULT_TARGET}]",
)
@click.option(
    "--token-file",
    metavar="PATH",
    help="file holding the bearer token [env CRONOQ_TOKEN, CRONOQ_TOKEN_FILE]",
)
@click.option("--tls/--no-tls", default=None, help="TLS with the system's roots / plaintext")
@click.option("--tls-ca", metavar="PATH", help="PEM CA of the server [env CRONOQ_TLS_CA]")
@click.option(
    "--tls-cert", metavar="PATH", help="PEM client certificate, mTLS [env CRONOQ_TLS_CERT]"
)
@click.option("--tls-key", metavar="PATH", help="PEM key of --tls-cert [env CRONOQ_TLS_KEY]")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="seconds each call may take, retries included [default 30]",
)
@click.option(
    "--connect-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="seconds to keep trying while no server answers at all "
    f"[env CRONOQ_CONNECT_TIMEOUT; default {DEFAULT_CONNECT_TIMEOUT:g}]",
)
@click.option(
    "--codec",
    metavar="json|bytes|MODULE:OBJECT",
    help="payload and output codec, as the producers' and workers' [env CRONOQ_CODEC; json]",
)
@click.version_option(package_name="cronoq-client", prog_name="cronoq")
@click.pass_context
def cli(
    ctx: click.Context,
    config: str | None,
    context: str | None,
    target: tuple[str, ...],
    token_file: str | None,
    tls: bool | None,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    timeout: float | None,
    connect_timeout: float | None,
    codec: str | None,
) -> None:
    """Run, inspect and drain a cronoq deployment: its tasks, schedules, pools, workers and
    outbox.

    Exit codes: 0 done, 1 unexpected error, 2 bad command line or config, 3 not found, 4 input
    refused, 5 unauthenticated, 6 permission denied, 7 unavailable (nothing applied), 8 outcome
    unknown, 9 wait timed out, 10 the waited task failed or was cancelled, 11 the task cannot be
    retried or rerun, 130 interrupted.
    """
    flags = Flags(
        config,
        context,
        target,
        token_file,
        tls,
        tls_ca,
        tls_cert,
        tls_key,
        timeout,
        codec,
        connect_timeout,
    )
    ctx.obj = Session(flags)
    ctx.call_on_close(ctx.obj.close)
