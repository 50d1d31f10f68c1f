"""``equeue console``: serve the web console (docs/console.md). The console package
is imported only when the command runs."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from equeue.cli._common import (
    BROKERS_ENV,
    LOG_LEVEL_OPTION,
    LogLevel,
    err_console,
    fail,
    setup_logging,
)
from equeue.config import DEFAULT_ADDRESS
from equeue.errors import ConfigError

#: the console's default port
DEFAULT_PORT = 5880


def register(app: typer.Typer) -> None:
    @app.command("console")
    def console(
        brokers: str = typer.Option(
            DEFAULT_ADDRESS, "--brokers", envvar=BROKERS_ENV,
            help="Broker addresses host:port, comma-separated: any one of them answers, and in a cluster the "
                 "console finds every broker group from it. The flag wins over the environment variable.",
        ),
        host: str = typer.Option("127.0.0.1", "--host", help="Address the console listens on."),
        port: int = typer.Option(DEFAULT_PORT, "--port", help="Port the console listens on (0: a free one, printed)."),
        certfile: Path | None = typer.Option(None, "--tls-cert", help="PEM certificate chain: serve the console over HTTPS (as broker start's --tls-cert)."),
        keyfile: Path | None = typer.Option(None, "--tls-key", help="PEM key of --tls-cert (default: in the --tls-cert file)."),
        old_certfile: Path | None = typer.Option(None, "--certfile", hidden=True, help="The old name of --tls-cert."),
        old_keyfile: Path | None = typer.Option(None, "--keyfile", hidden=True, help="The old name of --tls-key."),
        session_idle: float = typer.Option(1800.0, "--session-idle", help="Seconds without a request after which a sign-in ends."),
        sample_interval: float = typer.Option(5.0, "--sample-interval", help="Seconds between two samples of the charts (15 minutes kept)."),
        max_connections: int = typer.Option(256, "--max-connections", help="Most connections served at once: one more is answered 503 and closed."),
        log_level: LogLevel = LOG_LEVEL_OPTION,
        as_json: bool = typer.Option(False, "--json", help='Print the listening line as JSON ({"url": ...}).'),
    ) -> None:
        """Serve the web console: overview, cluster, topics, consumer groups, messages and
        dead letters in a browser. TLS to the brokers and the console's own credentials
        come from the EQUEUE_* environment, as for every command; users sign in with
        the cluster's SCRAM users."""
        import trio

        from equeue.cli.console import ConsoleConfig, serve_console, server_context
        from equeue.security import ClientSecurity
        from equeue.users import is_loopback

        setup_logging(log_level)
        if (certfile and old_certfile) or (keyfile and old_keyfile):
            fail("--certfile and --keyfile are the old names of --tls-cert and --tls-key: give one of each")
        certfile, keyfile = certfile or old_certfile, keyfile or old_keyfile
        if keyfile is not None and certfile is None:
            fail("--tls-key needs --tls-cert")
        if session_idle <= 0 or sample_interval <= 0:
            fail("--session-idle and --sample-interval must be above 0")
        if max_connections < 1:
            fail("--max-connections must be at least 1")
        try:
            security = ClientSecurity.from_env()
            ssl_context = server_context(certfile, keyfile) if certfile is not None else None
        except ConfigError as exc:
            fail(str(exc))
        if ssl_context is None and not is_loopback(host):
            err_console.print(f"[bold red]warning:[/] the console listens on {host} without TLS: passwords "
                              "cross the network in the clear (give --tls-cert)", highlight=False)  # fmt: skip
        config = ConsoleConfig(brokers, security=security, session_idle=session_idle,
                               sample_interval=sample_interval, https=ssl_context is not None,
                               max_connections=max_connections)  # fmt: skip

        refused: list[OSError] = []

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                try:
                    url = await nursery.start(lambda task_status: serve_console(
                        config, host, port, ssl_context=ssl_context, task_status=task_status))  # fmt: skip
                except OSError as exc:  # nothing else runs in the nursery yet
                    refused.append(exc)
                    return
                line = json.dumps({"url": url}) if as_json else f"console listening on {url}"
                typer.echo(line)

        trio.run(main)
        if refused:
            fail(f"cannot listen on {host}:{port}: {refused[0].strerror or refused[0]}")
