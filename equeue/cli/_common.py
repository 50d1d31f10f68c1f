"""Shared CLI helpers: broker option, error handling, tables, logging."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from equeue.config import DEFAULT_ADDRESS
from equeue.errors import EQueueError

if TYPE_CHECKING:  # imported when a command runs (the CLI starts without trio)
    from equeue.client.async_admin import AsyncAdminClient


class LogLevel(StrEnum):
    """``--log-level``: the threshold of the structured logs on stderr."""

    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


#: the environment variable ``--broker`` falls back to when the flag is absent
BROKERS_ENV = "EQUEUE_BROKERS"

BROKER_OPTION = typer.Option(
    DEFAULT_ADDRESS, "--broker", "-b", envvar=BROKERS_ENV,
    help="Broker address host:port, or several comma-separated (any one of them answers). "
         "The flag wins over the environment variable.",
)  # fmt: skip
LOG_LEVEL_OPTION = typer.Option(LogLevel.WARNING, "--log-level", help="Log threshold (quiet by default).")


def json_option(what: str = "the answer") -> Any:
    """A ``--json`` flag: print ``what`` as one JSON document on stdout (docs/cli.md)."""
    return typer.Option(False, "--json", help=f"Print {what} as one JSON document on stdout.")


#: ``--json`` of every command that prints an answer (docs/cli.md, "--json")
JSON_OPTION = json_option()
console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print one clear error line and exit non-zero."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


def run_app(app: typer.Typer) -> None:
    """Run the CLI: an EQueueError (also one raised inside a nursery, which wraps it
    in an exception group) is one ``error:`` line and exit 1; Ctrl-C is exit 130."""
    try:
        app()
    except EQueueError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if leaves and all(isinstance(e, KeyboardInterrupt) for e in leaves):
            sys.exit(130)
        if not leaves or not all(isinstance(e, EQueueError) for e in leaves):
            raise
        for line in dict.fromkeys(str(e) for e in leaves):
            err_console.print(f"[bold red]error:[/] {line}", highlight=False)
        sys.exit(1)


@contextmanager
def client(broker: str) -> Iterator[Any]:
    """A blocking :class:`equeue.client.Client` (the client's own defaults); errors
    become one-line failures."""
    from equeue.client import Client

    c = Client(broker)
    try:
        yield c
    except EQueueError as exc:
        fail(str(exc))
    finally:
        c.close()


T = TypeVar("T")


def query(broker: str, call: Callable[[Any], T], as_json: bool) -> T | None:
    """One request through :func:`client`: its answer to show, or None when it was
    printed as JSON (``--json``)."""
    with client(broker) as c:
        answer = call(c)
    if as_json:
        print_json(answer)
        return None
    return answer


def routed(broker: str, fn: Callable[[AsyncAdminClient], Awaitable[T]]) -> T:
    """``await fn(admin)`` with an :class:`equeue.client.async_admin.AsyncAdminClient`
    bootstrapped from ``broker``, in a private trio loop (commands that ask every broker
    group and merge, or any group's leader); errors become one-line failures."""
    from equeue.client.async_admin import run_routed

    try:
        return run_routed(broker, fn)
    except EQueueError as exc:
        fail(str(exc))


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]], *, right: Sequence[str] = ()) -> None:
    """Print an aligned table (numbers right-aligned)."""
    if title:
        console.print(title, highlight=False)  # on its own line: never wrapped to the table's width
    t = Table(header_style="bold")
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    console.print(t)


def print_json(obj: Any) -> None:
    """``obj`` (attrs classes, dicts, lists, scalars) as one line of JSON on stdout:
    the ``--json`` output (no markup, keys as the classes name their fields)."""
    from equeue.control import converter

    sys.stdout.write(json.dumps(converter.unstructure(obj), indent=None, default=str) + "\n")


def setup_logging(level: LogLevel) -> None:
    """Structured logs on stderr (logfmt, as the broker's; :func:`equeue.logs.setup_logging`),
    quiet (WARNING) by default."""
    from equeue.logs import setup_logging as setup

    setup(level.value)


def setup_audit_log(target: str) -> None:
    """Send the ``equeue.audit`` lines to ``target`` (a file, appended; ``-``:
    stderr) at INFO, whatever the general log level, and only there."""
    handler: logging.Handler = (
        logging.StreamHandler(sys.stderr) if target == "-" else logging.FileHandler(target, encoding="utf-8")
    )
    handler.setFormatter(logging.Formatter("%(message)s"))
    audit = logging.getLogger("equeue.audit")
    audit.setLevel(logging.INFO)
    audit.addHandler(handler)
    audit.propagate = False


def warn_if_open(cfg: Any) -> None:
    """Redis's protected mode, as a warning: a broker without authentication that
    listens beyond loopback gets a loud banner on stderr (and a log line)."""
    from equeue.users import NO_AUTH_WARNING, is_loopback

    if cfg.users_file is None and not is_loopback(cfg.host):
        bar = "!" * 78
        err_console.print(f"[bold red]{bar}\n{NO_AUTH_WARNING.format(host=cfg.host, port=cfg.port)}\n{bar}[/]",
                          highlight=False, soft_wrap=True)  # fmt: skip
