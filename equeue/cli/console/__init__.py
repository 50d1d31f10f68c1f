"""The web console (``equeue console``): a separate process that shows and administers
a cluster (or a standalone broker) in a browser, through the SDK's admin layer
(:mod:`equeue.client.async_admin`), as nsqadmin or RocketMQ Dashboard do.

A Starlette application (:mod:`equeue.cli.console.app`, the pages in
:mod:`equeue.cli.console.pages`) served by Hypercorn's trio connection server behind the
accept loop and limits it shares with the broker's HTTP port
(:mod:`equeue.cli.console.server` on :mod:`equeue.client.httpserve`), with Jinja2 templates and two vendored scripts (htmx,
uPlot; ``static/vendor/README.md``). Users sign in with the cluster's SCRAM users and
the brokers' ACLs decide what each sees and may do (:mod:`equeue.cli.console.sessions`);
the charts come from the console's memory of the last 15 minutes
(:mod:`equeue.cli.console.sampler`). docs/console.md is the user's guide.

Nothing but the CLI imports this package.
"""

from __future__ import annotations

from equeue.cli.console.app import Console, ConsoleConfig
from equeue.cli.console.server import open_console, serve_console, server_context

__all__ = ["Console", "ConsoleConfig", "open_console", "serve_console", "server_context"]
