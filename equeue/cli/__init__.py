"""The ``equeue`` command line (typer). Sub-commands live one module per concept
and import the broker/SDK packages lazily, so ``equeue --help`` stays fast.

Every command takes ``--broker host:port`` (default ``127.0.0.1:5800``). Expected
errors print one clear line to stderr and exit with status 1 (no traceback).
"""

from __future__ import annotations

import typer

from equeue.cli import (
    acl_cmd,
    broker_cmd,
    cluster_cmd,
    console_cmd,
    consume_cmd,
    group_cmd,
    message_cmd,
    produce_cmd,
    topic_cmd,
    user_cmd,
)

app = typer.Typer(
    name="equeue",
    help="equeue: a partitioned-log message broker. Start a broker, manage topics, produce and consume.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



def _print_version(value: bool) -> None:
    if value:
        from equeue import DISTRIBUTION, __version__

        typer.echo(f"equeue {__version__} ({DISTRIBUTION})")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", help="Print the version and exit.", callback=_print_version, is_eager=True
    ),
) -> None:
    """equeue: a partitioned-log message broker. Start a broker, manage topics, produce and consume."""


for module in (broker_cmd, cluster_cmd, topic_cmd, produce_cmd, consume_cmd, group_cmd, message_cmd, user_cmd, acl_cmd,
               console_cmd):
    module.register(app)


def main() -> None:
    """Console-script entry point."""
    from equeue.cli._common import run_app

    run_app(app)


__all__ = ["app", "main"]
