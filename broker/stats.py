"""The broker's counters and the statistics snapshot built from them.

:class:`Counters` is the stats sink: plain integers that loop code adds to (the
writer thread never touches them; its parked-pull answers report their sizes back
to the loop, see :mod:`equeue.broker.thread_answer`). :class:`Statistics` turns them,
plus a few gauges read from the store, the parked pulls and the appender, into the
:class:`~equeue.control.BrokerStats` of the STATS request, ``/stats`` and
``/metrics``.
"""

from __future__ import annotations

import time
from typing import Protocol

import attrs

from equeue import __version__, control
from equeue.broker.storage import StoreReader

__all__ = ["Counters", "Statistics"]


@attrs.define
class Counters:
    """Traffic counters (loop thread only)."""

    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    connections: int = 0
    #: connections refused because --max-connections were open
    connections_refused: int = 0
    #: connections closed by a limit (output buffer, frame timeout, idle timeout)
    connections_dropped: int = 0
    last_rate_t: float = 0.0
    last_in: int = 0
    last_out: int = 0
    produce_rate: float = 0.0
    pull_rate: float = 0.0


class _Parked(Protocol):
    @property
    def parked(self) -> int: ...


class _Transactions(Protocol):
    @property
    def transactions(self) -> int: ...
    @property
    def inline_transactions(self) -> int: ...
    @property
    def inline_max_seconds(self) -> float: ...


class Statistics:
    """Builds :class:`~equeue.control.BrokerStats`; rates are recomputed at most
    once a second (between two snapshots)."""

    def __init__(
        self,
        counters: Counters,
        store: StoreReader,
        parked: _Parked,
        appender: _Transactions,
        *,
        flush: str,
    ) -> None:
        self.counters = counters
        self._store = store
        self._parked = parked
        self._appender = appender
        self._flush = flush
        self._started = time.monotonic()

    def snapshot(self) -> control.BrokerStats:
        s = self.counters
        now = time.monotonic()
        if now - s.last_rate_t >= 1.0:
            dt = now - s.last_rate_t if s.last_rate_t else now - self._started
            s.produce_rate = (s.messages_in - s.last_in) / max(dt, 1e-9)
            s.pull_rate = (s.messages_out - s.last_out) / max(dt, 1e-9)
            s.last_rate_t, s.last_in, s.last_out = now, s.messages_in, s.messages_out
        store = self._store
        return control.BrokerStats(
            version=__version__,
            uptime_s=now - self._started,
            connections=s.connections,
            topics=len(store.topics),
            messages_in=s.messages_in,
            messages_out=s.messages_out,
            bytes_in=s.bytes_in,
            bytes_out=s.bytes_out,
            produce_rate=s.produce_rate,
            pull_rate=s.pull_rate,
            parked_pulls=self._parked.parked,
            next_global_offset=store.next_global,
            store_bytes=store.store_bytes(),
            map_size=store.map_size,
            flush=self._flush,
            transactions=self._appender.transactions,
            pending_delayed=sum(store.sched_pending.values()),
            connections_refused=s.connections_refused,
            connections_dropped=s.connections_dropped,
            inline_transactions=self._appender.inline_transactions,
            inline_max_seconds=self._appender.inline_max_seconds,
        )
