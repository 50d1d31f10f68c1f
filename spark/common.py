"""Shared helpers of the Spark source and sink: option parsing and a per-process client.

Nothing here imports pyspark, so it is cheap to import in Spark's Python workers.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from equeue.client.client import Client
from equeue.client.retry import RetryPolicy
from equeue.client.routing import MIN_REFRESH_INTERVAL
from equeue.control import RouteTable
from equeue.errors import (
    ConfigError,
    ConnectionBroken,
    EQueueError,
    NotLeader,
    NotOwner,
    QueueUnavailable,
    TlsError,
)
from equeue.security import ClientSecurity

log = logging.getLogger("equeue.spark")

T = TypeVar("T")

__all__ = [
    "DEFAULT_FAILOVER_TIMEOUT",
    "ROUTING_ERRORS",
    "DataLossError",
    "Owner",
    "Routes",
    "client_for",
    "freeze_worker_heap",
    "opt_bool",
    "opt_int",
    "opt_str",
    "parse_offsets_json",
    "retry_routing",
    "routes_for",
    "topics_of",
]

#: offsets JSON: -2 = earliest retained, -1 = latest (the next offset to be written)
EARLIEST = -2
LATEST = -1


class DataLossError(EQueueError):
    """Offsets a query needs are gone (retention, or the topic was recreated).

    Raised only with ``failOnDataLoss=true`` (the default)."""


_clients: dict[tuple[int, str, ClientSecurity | None], Client] = {}
_clients_lock = threading.Lock()


def client_for(brokers: str, security: ClientSecurity | None = None) -> Client:
    """A blocking client for ``brokers``, shared by every call in this process with
    the same ``security`` (TLS settings and credentials, see
    :meth:`ClientSecurity.from_options`).

    Spark reuses Python workers across tasks, so one connection serves many
    partitions. The client is fork-aware; a forked child gets its own.
    """
    key = (os.getpid(), brokers, security)
    with _clients_lock:
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = Client(brokers, security=security)
        return c


@atexit.register
def _close_all() -> None:
    with _clients_lock:
        items = [c for (pid, _, _), c in _clients.items() if pid == os.getpid()]
        _clients.clear()
    for c in items:
        try:
            c.close()
        except Exception:
            pass


# --------------------------------------------------------------------------- routes
@dataclass(frozen=True)
class Owner:
    """Who serves one queue: its broker group ("" on a standalone broker) and where to
    reach it (``address``: the group's broker addresses, comma-separated, leader first;
    "" when the group has no live broker)."""

    group: str
    address: str


class Routes:
    """The owner of every queue of some topics, from one GET_ROUTES answer
    (docs/cluster.md "Routing"). A queue owned by group "" (a standalone broker, or a
    cluster answer naming no group) is served at ``bootstrap``, the source's or sink's
    ``brokers`` option: a standalone broker behaves exactly as before.
    """

    def __init__(self, table: RouteTable, bootstrap: str) -> None:
        self.table = table
        self.bootstrap = bootstrap
        #: topics the broker does not know
        self.missing = frozenset(table.missing)
        self._addresses = {g.name: ",".join(g.addresses) for g in table.groups}
        self._owners = {r.info.name: list(r.owners) for r in table.topics}

    def queues(self, topic: str) -> int:
        """How many queues ``topic`` has (0 when it is missing)."""
        return len(self._owners.get(topic, ()))

    def owner(self, topic: str, queue_id: int) -> Owner:
        """The owner of one queue; a queue the table does not list (a topic deleted
        or unknown) is asked of the bootstrap brokers, which answer what they know."""
        owners = self._owners.get(topic, [])
        group = owners[queue_id] if 0 <= queue_id < len(owners) else ""
        if not group:
            return Owner("", self.bootstrap)
        return Owner(group, self._addresses.get(group, ""))

    def by_owner(self, topic: str, queue_ids: Sequence[int] | None = None) -> dict[Owner, list[int]]:
        """``queue_ids`` (default: every queue of ``topic``) grouped by owner, in queue
        order. Raises QueueUnavailable naming the topic, the queues and the group when
        one of them is owned by a group with no live broker: a reader must never skip
        a queue silently."""
        ids = range(self.queues(topic)) if queue_ids is None else queue_ids
        out: dict[Owner, list[int]] = {}
        for q in ids:
            out.setdefault(self.owner(topic, q), []).append(q)
        for o, qs in out.items():
            if not o.address:
                raise QueueUnavailable(
                    f"{topic}: queue(s) {', '.join(map(str, qs))} are owned by broker group {o.group!r}, "
                    "which has no live broker (QUEUE_UNAVAILABLE); nothing is lost, they are served "
                    "again once the group is back"
                )
        return out


def routes_for(brokers: str, topics: Sequence[str], security: ClientSecurity | None = None) -> Routes:
    """The routes of ``topics`` (one GET_ROUTES round trip to ``brokers``; no topic is
    created). Raises what the client raises (ConnectionBroken, ...)."""
    return Routes(client_for(brokers, security).get_routes(list(topics), auto_create=False), brokers)


# --------------------------------------------------------------------------- failover
#: seconds the source waits out a broker group's failover (option ``failoverTimeout``)
DEFAULT_FAILOVER_TIMEOUT = 30.0
#: what a failover looks like to a reader: the old leader refuses (NOT_LEADER), is
#: gone (a broken connection), or the group has no leader yet (QUEUE_UNAVAILABLE)
ROUTING_ERRORS = (NotLeader, NotOwner, QueueUnavailable, ConnectionBroken)
#: the pauses between two attempts: from one route refresh interval up to 1 s
FAILOVER_PAUSES = RetryPolicy(wait_initial=MIN_REFRESH_INTERVAL, wait_max=1.0, wait_jitter=0.05)


def is_failover(exc: BaseException) -> bool:
    """A routing error worth waiting out (a certificate problem is not)."""
    return isinstance(exc, ROUTING_ERRORS) and not isinstance(exc, TlsError)


def retry_routing(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()``, called again while it fails on a routing error (:func:`is_failover`:
    a group failing over to a new leader, or down), with short pauses
    (:data:`FAILOVER_PAUSES`), for at most ``timeout`` seconds; ``fn`` reads the routes
    again on each call. Raises the last error after that, any other error at once."""
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        try:
            return fn()
        except EQueueError as exc:
            attempt += 1
            left = deadline - time.monotonic()
            if not is_failover(exc) or left <= 0:
                raise
            log.log(logging.INFO if attempt == 1 else logging.DEBUG,  # once per failover at INFO
                    "equeue: %s: %s; reading the routes again (attempt %d)", what, exc, attempt)
            time.sleep(min(FAILOVER_PAUSES.delay(attempt), left))


# --------------------------------------------------------------------------- options
def opt_str(options: Mapping[str, str], name: str, default: str | None = None) -> str:
    """A string option (Spark passes every option value as a string). Raises ConfigError
    when a required option (``default is None``) is missing."""
    v = options.get(name.lower(), options.get(name))
    if v is None or v == "":
        if default is None:
            raise ConfigError(f'the equeue data source needs the option "{name}"')
        return default
    return str(v)


def opt_int(options: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    v = options.get(name.lower(), options.get(name))
    if v is None or v == "":
        return default
    try:
        return int(str(v).strip())
    except ValueError:
        raise ConfigError(f'option "{name}" must be an integer, got {v!r}') from None


def opt_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    v = options.get(name.lower(), options.get(name))
    if v is None or v == "":
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f'option "{name}" must be true or false, got {v!r}')


_frozen_in = 0  # the process whose heap freeze_worker_heap froze (0: none yet)


def freeze_worker_heap() -> None:
    """Once per process: collect, then ``gc.freeze()`` every object alive now, so that
    later garbage collections skip them.

    Why: Spark's Python daemon runs a full ``gc.collect()`` in a reused worker after
    every task, and with pyspark, pyarrow, numpy and this package loaded that walk
    costs a worker tens of milliseconds of CPU per task, on the cores the task itself
    and the JVM need. What is alive at a worker's first equeue task is almost all
    modules, classes and functions that live as long as the process; frozen, they are
    still freed by reference counting, only never examined by the cycle collector.
    The price: a reference cycle alive at that moment that becomes garbage later is
    never freed (at most the first task's own objects, once per worker).

    Called in the worker at the start of a read or a write (option ``gcFreeze``,
    default on; docs/spark.md). Checks the process id, so a fork of a frozen process
    freezes its own heap again. Raises nothing.
    """
    global _frozen_in
    pid = os.getpid()
    if _frozen_in == pid:
        return
    _frozen_in = pid
    gc.collect()
    gc.freeze()


def topics_of(options: Mapping[str, str]) -> list[str]:
    """The ``topic`` option: one topic or several, comma-separated (order kept, no repeats)."""
    raw = opt_str(options, "topic")
    out: list[str] = []
    for t in raw.split(","):
        t = t.strip()
        if t and t not in out:
            out.append(t)
    if not out:
        raise ConfigError('option "topic" names no topic')
    return out


def parse_offsets_json(text: str, topics: list[str], name: str) -> dict[str, dict[int, int]]:
    """``{"orders": {"0": 10, "1": -2}}`` → {"orders": {0: 10, 1: -2}}.

    Raises ConfigError for malformed JSON, a topic not in the ``topic`` option, or an
    offset below -2.
    """
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"option {name} is neither earliest, latest nor JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f'option {name} must be a JSON object like {{"orders": {{"0": 10}}}}')
    out: dict[str, dict[int, int]] = {}
    for topic, queues in data.items():
        if topic not in topics:
            raise ConfigError(f"option {name} names topic {topic!r}, which is not in the topic option")
        if not isinstance(queues, dict):
            raise ConfigError(f"option {name}: the value for {topic!r} must be an object of queue -> offset")
        per: dict[int, int] = {}
        for q, off in queues.items():
            try:
                qi, oi = int(q), int(off)
            except (TypeError, ValueError):
                raise ConfigError(f"option {name}: bad queue/offset {q!r}: {off!r} for {topic!r}") from None
            if qi < 0 or oi < EARLIEST:
                raise ConfigError(f"option {name}: bad queue/offset {q!r}: {off!r} for {topic!r}")
            per[qi] = oi
        out[topic] = per
    return out
