"""The broker's counters and the statistics snapshot built from them.

:class:`Counters` is the stats sink: plain integers that loop code adds to (the
writer thread never touches them; its parked-pull answers report their sizes back
to the loop, see :mod:`equeue.broker.writer_answers`). :class:`Statistics` turns them,
plus a few gauges read from the store, the parked pulls and the appender, into the
:class:`~equeue.control.BrokerStats` of the STATS request, ``/stats`` and
``/metrics``.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Protocol

import attrs

from equeue import __version__, control
from equeue.broker.storage import StoreReader

__all__ = ["PRODUCE_LATENCY_BUCKETS", "PULL_WAIT_BUCKETS", "Counters", "Histogram", "Statistics"]

#: upper bounds (seconds) of the produce latency histogram's buckets
PRODUCE_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: upper bounds (seconds) of the pull wait histogram's buckets (a pull waits 60 s at most)
PULL_WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """A latency histogram for the loop's hot paths: fixed bucket bounds, one count
    per bucket (not cumulative), their sum; :meth:`observe` is a bisect and two
    additions, no lock (loop thread only, like :class:`Counters`). prometheus-client's
    own Histogram takes a lock per observation; the metrics module exposes this one
    through a custom collector (:mod:`equeue.broker.metrics`)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        #: observations per bucket: counts[i] for bounds[i-1] < v <= bounds[i], the last for v > bounds[-1]
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one observation."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds

    def cumulative(self) -> tuple[list[tuple[str, float]], float]:
        """Prometheus buckets (``le`` bound as text -> observations at most it, ``+Inf``
        last) and the sum: a copy, taken on the loop."""
        counts, total, running = list(self.counts), self.sum, 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*map(str, self.bounds), "+Inf"), counts, strict=True):
            running += n
            buckets.append((bound, running))
        return buckets, total


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
    #: seconds from a produce request's arrival to its answer handed to the output
    #: (after the commit, or the high watermark with --acks all)
    produce_latency: Histogram = attrs.field(factory=lambda: Histogram(PRODUCE_LATENCY_BUCKETS))
    #: seconds a parked pull waited, answered with messages / with none (its wait ended)
    pull_wait_messages: Histogram = attrs.field(factory=lambda: Histogram(PULL_WAIT_BUCKETS))
    pull_wait_empty: Histogram = attrs.field(factory=lambda: Histogram(PULL_WAIT_BUCKETS))


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
