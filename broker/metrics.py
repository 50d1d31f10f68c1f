"""The broker's Prometheus metrics, through prometheus-client: custom collectors over
the statistics snapshot (:class:`BrokerCollector`) and the store's published view
(:class:`QueuesCollector`), each rendered by ``generate_latest`` on a private
``CollectorRegistry`` (never the process-wide one).

``/metrics`` is bounded whatever the broker holds: by default it has the broker's
series and per-topic totals (a few lines per topic; 200 topics x 1,024 queues used
to be 48 MB of per-queue series and a second of the event loop per scrape).
Per-queue series come only on request, ``?queues=1`` (every topic) or
``?topic=NAME`` (repeatable), for at most ``metrics_queue_limit`` queues; the
``equeue_metrics_queues_omitted`` gauge counts the queues left out. The topic and
queue series are rendered in a worker thread, one scrape at a time, from the store's
published view (immutable: nothing the writer thread does changes it); only the
statistics snapshot (the loop's counters) is taken on the loop, and so is the copy of
the ephemeral groups' offsets (held in the group registry's memory, not in the view).

prometheus-client names a counter family without its ``_total`` suffix and appends
it to the sample; the names below are the exposed ones (``equeue_messages_in_total``).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs
import trio
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from equeue import control
from equeue.broker.stats import Counters
from equeue.broker.storage import StoreReader, StoreView

__all__ = [
    "BrokerCollector",
    "HttpCollector",
    "LatencyCollector",
    "Metrics",
    "PausedCollector",
    "QueueSeries",
    "QueuesCollector",
    "render_broker",
    "render_http",
    "render_latency",
    "render_metrics",
    "render_queues",
]

#: queues summed between two GIL releases of the render thread
_YIELD_EVERY = 2048
#: seconds a rendered set of topic and queue series is served again
RENDER_INTERVAL = 1.0
#: distinct /metrics queries whose series are kept for RENDER_INTERVAL
CACHED_QUERIES = 8

#: (BrokerStats field, exposed metric name, type, help)
METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("uptime_s", "equeue_uptime_seconds", "gauge", "Seconds since the broker started."),
    ("connections", "equeue_connections", "gauge", "Open client connections."),
    ("topics", "equeue_topics", "gauge", "Topics, internal ones included."),
    ("messages_in", "equeue_messages_in_total", "counter", "Messages stored by produce requests."),
    ("messages_out", "equeue_messages_out_total", "counter", "Messages returned by pulls."),
    ("bytes_in", "equeue_bytes_in_total", "counter", "Bytes of produce request payloads."),
    ("bytes_out", "equeue_bytes_out_total", "counter", "Bytes sent to clients."),
    ("produce_rate", "equeue_produce_rate", "gauge", "Messages stored per second (recent)."),
    ("pull_rate", "equeue_pull_rate", "gauge", "Messages pulled per second (recent)."),
    ("parked_pulls", "equeue_parked_pulls", "gauge", "Pulls waiting for a message (long-poll)."),
    ("next_global_offset", "equeue_next_global_offset", "gauge", "Global offset of the next stored message."),
    ("store_bytes", "equeue_store_bytes", "gauge", "Bytes of the LMDB map in use."),
    ("map_size", "equeue_map_size_bytes", "gauge", "LMDB map size (the store's maximum)."),
    ("transactions", "equeue_write_transactions_total", "counter", "Group-commit write transactions."),
    ("inline_transactions", "equeue_write_transactions_inline_total", "counter", "Write transactions committed on the event loop (--flush async inline commits)."),
    ("inline_max_seconds", "equeue_write_inline_max_seconds", "gauge", "Longest inline commit (the event loop's worst pause from one)."),
    ("pending_delayed", "equeue_pending_delayed", "gauge", "Delayed messages not yet due."),
    ("connections_refused", "equeue_connections_refused_total", "counter", "Connections refused past --max-connections."),
    ("connections_dropped", "equeue_connections_dropped_total", "counter", "Connections closed by a limit (output buffer, frame or idle timeout)."),
)  # fmt: skip

#: per-topic totals: (exposed metric name, type, help)
PER_TOPIC: tuple[tuple[str, str, str], ...] = (
    ("equeue_topic_queues", "gauge", "Queues of the topic."),
    ("equeue_topic_messages", "gauge", "Messages retained in the topic."),
    ("equeue_topic_bytes", "gauge", "Bytes of records retained in the topic."),
    ("equeue_topic_appended_total", "counter", "Messages ever appended to the topic (sum of its queues' max offsets)."),
)  # fmt: skip
#: per-queue gauges: (metric name, help)
PER_QUEUE: tuple[tuple[str, str], ...] = (
    ("equeue_queue_min_offset", "Lowest retained queue offset."),
    ("equeue_queue_max_offset", "Next queue offset to be written."),
    ("equeue_queue_messages", "Messages retained in the queue."),
    ("equeue_queue_bytes", "Bytes of records retained in the queue."),
)
OMITTED = "equeue_metrics_queues_omitted"
READY = "equeue_ready"
GROUP_LAG = "equeue_group_lag"
GROUP_QUEUE_LAG = "equeue_group_queue_lag"
TOPIC_PAUSED = "equeue_topic_paused"
GROUP_PAUSED = "equeue_group_paused"

#: the broker's statistics now
Snapshot = Callable[[], control.BrokerStats]


def _family(
    name: str, kind: str, text: str, labels: Sequence[str] = ()
) -> GaugeMetricFamily | CounterMetricFamily:
    if (
        kind == "counter"
    ):  # CounterMetricFamily drops the "_total" it is given; the sample gets it back
        return CounterMetricFamily(name, text, labels=labels)
    return GaugeMetricFamily(name, text, labels=labels)


@attrs.frozen
class QueueSeries:
    """Which per-queue series a scrape asked for: ``every`` topic (``?queues=1``),
    or the ``topics`` named (``?topic=``); none by default."""

    every: bool = False
    topics: frozenset[str] = frozenset()

    @classmethod
    def from_params(cls, params: Mapping[str, Sequence[str]]) -> QueueSeries:
        """From a query's parameters (name -> every value given)."""
        every = list(params.get("queues", ())) or ["0"]
        return cls(every[-1] in ("1", "true", "yes"), frozenset(params.get("topic", ())))

    def wants(self, topic: str) -> bool:
        return self.every or topic in self.topics


@attrs.frozen(eq=False)  # registries key collectors by identity
class BrokerCollector:
    """The broker-wide series of one statistics snapshot (a few dozen samples)."""

    stats: control.BrokerStats

    def collect(self) -> Iterable[Metric]:
        for field, name, kind, text in METRICS:
            family = _family(name, kind, text)
            family.add_metric([], getattr(self.stats, field))
            yield family
        info = GaugeMetricFamily(
            "equeue_info", "Broker version and flush policy.", labels=["version", "flush"]
        )
        info.add_metric([self.stats.version, self.stats.flush], 1)
        yield info


@attrs.frozen(eq=False)  # registries key collectors by identity
class QueuesCollector:
    """Per-topic totals, each consumer group's lag per topic, the omitted-queues
    gauge, and the per-queue series ``series`` asks for (at most ``queue_limit``
    queues, and as many group queues' lag), from ``view``: one pass over its queues
    and one over its committed offsets. Any thread may run it (it lets the GIL go now and then)."""

    view: StoreView
    series: QueueSeries = QueueSeries()
    queue_limit: int = 10_000
    #: (group, topic, queue) -> committed offset of the live ephemeral groups (a copy)
    ephemeral: Mapping[tuple[str, str, int], int] = attrs.Factory(dict)

    def collect(self) -> Iterable[Metric]:
        view, series = self.view, self.series
        # one pass over the queues the view knows (a queue never written to has no entry);
        # in a worker thread, let the GIL go now and then so the event loop never waits
        # a whole switch interval for it
        sums: dict[int, list[int]] = {}
        for i, (topic_id, _q, st) in enumerate(view.all_queues()):
            if not i % _YIELD_EVERY:
                time.sleep(0)
            acc = sums.get(topic_id)
            if acc is None:
                acc = sums[topic_id] = [0, 0, 0]
            acc[0] += st.next_offset - st.min_offset
            acc[1] += st.bytes
            acc[2] += st.next_offset
        topics = [_family(name, kind, text, ["topic"]) for name, kind, text in PER_TOPIC]
        queues = [
            GaugeMetricFamily(name, text, labels=["topic", "queue"]) for name, text in PER_QUEUE
        ]
        rows = 0
        omitted = 0
        for info in sorted(view.topics.values(), key=lambda t: t.name):
            retained, size, appended = sums.get(info.topic_id, (0, 0, 0))
            for family, value in zip(topics, (info.queues, retained, size, appended), strict=True):
                family.add_metric([info.name], value)
            if not series.wants(info.name):
                continue
            room = max(0, min(info.queues, self.queue_limit - rows))
            omitted += info.queues - room
            rows += room
            time.sleep(0)
            for q in range(room):
                st = view.queue(info.topic_id, q)
                values = (st.min_offset, st.next_offset, st.next_offset - st.min_offset, st.bytes)
                for family, value in zip(queues, values, strict=True):
                    family.add_metric([info.name, str(q)], value)
        # consumer groups' lag, from their committed offsets: per group and topic, and
        # per queue for the topics asked for (within the same limit)
        group_lag = GaugeMetricFamily(
            GROUP_LAG,
            "Messages a consumer group has not committed yet, per topic.",
            labels=["group", "topic"],
        )
        queue_lag = GaugeMetricFamily(
            GROUP_QUEUE_LAG,
            "Messages a consumer group has not committed yet, per queue.",
            labels=["group", "topic", "queue"],
        )
        lags: dict[tuple[str, str], int] = {}
        lag_rows = 0
        offsets = itertools.chain(view.offsets.items(), self.ephemeral.items())
        for i, ((group, topic, q), committed) in enumerate(offsets):
            if not i % _YIELD_EVERY:
                time.sleep(0)
            held = view.topics.get(topic)
            if held is None or q >= held.queues:
                continue
            st = view.queue(held.topic_id, q)
            lag = max(0, st.next_offset - max(committed, st.min_offset))
            lags[(group, topic)] = lags.get((group, topic), 0) + lag
            if series.wants(topic):
                if lag_rows < self.queue_limit:
                    queue_lag.add_metric([group, topic, str(q)], lag)
                    lag_rows += 1
                else:
                    omitted += 1
        for (group, topic), lag in lags.items():
            group_lag.add_metric([group, topic], lag)
        yield from topics
        yield group_lag
        yield GaugeMetricFamily(
            OMITTED,
            "Queues whose per-queue series this scrape left out (over the limit).",
            value=omitted,
        )
        if rows:
            yield from queues
        if lag_rows:
            yield queue_lag


@attrs.frozen
class ReplicationSample:
    """A cluster member's replication state for the metrics, taken on the loop:
    its REPLICATION_STATUS, the promotions it won and whether it is fenced now."""

    status: control.ReplicationStatus
    promotions: int
    fenced: bool
    #: takeover transactions tried and won (the group's election), times fenced,
    #: times it stopped serving as the leader (fenced or lost its leadership)
    elections_attempted: int = 0
    elections_won: int = 0
    fences: int = 0
    step_downs: int = 0


@attrs.frozen(eq=False)  # registries key collectors by identity
class ReplicationCollector:
    """``equeue_ready`` always; the ``equeue_replication_*`` series in a cluster
    (``sample`` not None), per follower on its group's leader."""

    ready: bool
    sample: ReplicationSample | None

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            READY, "1 when the broker serves clients (/readyz answers 200).", value=int(self.ready)
        )
        if self.sample is None:
            return
        st = self.sample.status
        leading = st.role == "leader"
        for name, text, value in (
            ("equeue_replication_leader", "1 while this broker leads its group.", int(leading)),
            ("equeue_replication_fenced", "1 while this broker leads but is fenced (no lease renewal reached etcd).", int(self.sample.fenced)),
            ("equeue_replication_epoch", "The group's leader epoch this broker knows.", st.epoch),
            ("equeue_replication_isr_size", "Members of the group's in-sync replicas.", len(st.isr)),
            ("equeue_replication_position", "This replica's replication log position.", st.position),
            ("equeue_replication_high_watermark", "Log position below which every in-sync replica holds every entry.", st.high_watermark),
        ):  # fmt: skip
            yield GaugeMetricFamily(name, text, value=value)
        yield CounterMetricFamily(
            "equeue_replication_promotions_total", "Times this broker became its group's leader.",
            value=self.sample.promotions,
        )  # fmt: skip
        for name, text, value in (
            ("equeue_replication_elections_attempted_total", "Takeovers of its group's leadership this broker tried in etcd.", self.sample.elections_attempted),
            ("equeue_replication_elections_won_total", "Takeovers of its group's leadership this broker won.", self.sample.elections_won),
            ("equeue_replication_fences_total", "Times this broker was fenced (no lease renewal reached etcd in time).", self.sample.fences),
            ("equeue_replication_step_downs_total", "Times this broker stopped serving as its group's leader (fenced, or leadership lost).", self.sample.step_downs),
        ):  # fmt: skip
            yield CounterMetricFamily(name, text, value=value)
        if not leading:
            return
        labels = ["follower"]
        lag = GaugeMetricFamily(
            "equeue_replication_follower_lag_messages",
            "Messages a follower is behind.",
            labels=labels,
        )
        lag_s = GaugeMetricFamily(
            "equeue_replication_follower_lag_seconds",
            "How far behind a follower is, in time.",
            labels=labels,
        )
        in_sync = GaugeMetricFamily(
            "equeue_replication_follower_in_sync",
            "1 while the follower is in the in-sync replicas.",
            labels=labels,
        )
        for r in st.replicas:
            lag.add_metric([r.broker_id], r.lag_messages)
            lag_s.add_metric([r.broker_id], r.lag_ms / 1000)
            in_sync.add_metric([r.broker_id], int(r.in_sync))
        yield from (lag, lag_s, in_sync)


@attrs.frozen(eq=False)  # registries key collectors by identity
class PausedCollector:
    """``equeue_topic_paused{topic}`` and ``equeue_group_paused{group}``: 1 for each
    paused topic and consumer group (no series: not paused), so the series are as
    many as the operator's pauses."""

    topics: frozenset[str]
    groups: frozenset[str]

    def collect(self) -> Iterable[Metric]:
        for name, label, text, names in (
            (TOPIC_PAUSED, "topic", "1 while the topic's produce is paused (equeue topic pause).", self.topics),
            (GROUP_PAUSED, "group", "1 while the consumer group's pulls are held (equeue group pause).", self.groups),
        ):
            family = GaugeMetricFamily(name, text, labels=[label])
            for value in sorted(names):
                family.add_metric([value], 1)
            yield family


PRODUCE_LATENCY = "equeue_produce_latency_seconds"
PULL_WAIT = "equeue_pull_wait_seconds"


@attrs.frozen(eq=False)  # registries key collectors by identity
class LatencyCollector:
    """The latency histograms of :class:`~equeue.broker.stats.Counters`: produce
    latency, and the wait of parked pulls by ``outcome`` ("messages": answered with
    messages, "empty": answered with none when its wait ended). Built on the loop
    (the buckets are copied then)."""

    produce: tuple[list[tuple[str, float]], float]
    pull_messages: tuple[list[tuple[str, float]], float]
    pull_empty: tuple[list[tuple[str, float]], float]

    @classmethod
    def of(cls, counters: Counters) -> LatencyCollector:
        """A copy of ``counters``' histograms (loop thread)."""
        return cls(
            counters.produce_latency.cumulative(),
            counters.pull_wait_messages.cumulative(),
            counters.pull_wait_empty.cumulative(),
        )

    def collect(self) -> Iterable[Metric]:
        produce = HistogramMetricFamily(
            PRODUCE_LATENCY,
            "Seconds from a produce request's arrival to its answer (after the commit, "
            "or the high watermark with --acks all).",
        )
        produce.add_metric([], *self.produce)
        yield produce
        pull = HistogramMetricFamily(
            PULL_WAIT, "Seconds a parked pull waited before it was answered.", labels=["outcome"]
        )
        pull.add_metric(["messages"], *self.pull_messages)
        pull.add_metric(["empty"], *self.pull_empty)
        yield pull


def render_latency(counters: Counters) -> str:
    """The latency histograms (see :class:`LatencyCollector`; loop thread)."""
    return _render(LatencyCollector.of(counters))


@attrs.frozen(eq=False)  # registries key collectors by identity
class HttpCollector:
    """The HTTP port's own connections: open now, and refused past its cap."""

    open: int
    refused: int

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            "equeue_http_connections", "Open connections to the HTTP port.", value=self.open
        )
        yield CounterMetricFamily(
            "equeue_http_connections_refused",
            "Connections to the HTTP port refused past --http-max-connections.",
            value=self.refused,
        )


def render_http(open_connections: int, refused: int) -> str:
    """The HTTP port's connection series (see :class:`HttpCollector`)."""
    return _render(HttpCollector(open_connections, refused))


def _render(collector: Collector) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry).decode()


def render_broker(s: control.BrokerStats) -> str:
    """The broker-wide series in the Prometheus text format (version 0.0.4)."""
    return _render(BrokerCollector(s))


def render_replication(ready: bool, sample: ReplicationSample | None) -> str:
    """``equeue_ready`` and the replication series (see :class:`ReplicationCollector`)."""
    return _render(ReplicationCollector(ready, sample))


def render_queues(
    view: StoreView, series: QueueSeries | None = None, queue_limit: int = 10_000,
    ephemeral: Mapping[tuple[str, str, int], int] | None = None,
) -> str:  # fmt: skip
    """The topic and queue series (see :class:`QueuesCollector`) as text; pure: any
    thread may run it."""
    return _render(QueuesCollector(view, series or QueueSeries(), queue_limit, ephemeral or {}))


def render_metrics(
    s: control.BrokerStats,
    view: StoreView,
    series: QueueSeries | None = None,
    queue_limit: int = 10_000,
) -> str:
    """The whole of ``/metrics``: :func:`render_broker` then :func:`render_queues`."""
    return render_broker(s) + render_queues(view, series, queue_limit)


class Metrics:
    """Renders ``/metrics`` off the loop, one scrape at a time: the broker's series
    from a statistics snapshot taken on the loop, the topic and queue series in a
    worker thread from the store's immutable published view.

    The topic and queue part is reused for :data:`RENDER_INTERVAL` seconds (per
    query, the last :data:`CACHED_QUERIES` of them), so scrapes back to back cost
    one pass over the queues a second at most; the broker's series are always fresh.
    """

    def __init__(
        self, statistics: Snapshot, store: StoreReader, queue_limit: int, *,
        ready: Callable[[], bool] = lambda: True,
        replication: Callable[[], ReplicationSample | None] = lambda: None,
        counters: Counters | None = None, http: Callable[[], tuple[int, int]] | None = None,
        ephemeral: Callable[[], Mapping[tuple[str, str, int], int]] = dict,
        paused: Callable[[], tuple[frozenset[str], frozenset[str]]] | None = None,
    ) -> None:  # fmt: skip
        self._statistics = statistics
        self._counters = counters
        #: the HTTP port's (open, refused) connections (None: no such series)
        self._http = http
        #: a copy of the live ephemeral groups' offsets, taken on the loop
        self._ephemeral = ephemeral
        #: the paused topics and groups now (None: the store's view has them)
        self._paused = paused
        self._ready = ready
        self._replication = replication
        self._store = store
        self._queue_limit = queue_limit
        self._limiter = trio.CapacityLimiter(1)
        #: query -> (trio time rendered, its topic and queue series)
        self._recent: dict[QueueSeries, tuple[float, str]] = {}

    async def render(self, series: QueueSeries) -> bytes:
        """The metrics text (UTF-8); waits for a scrape already rendering."""
        async with self._limiter:
            now = trio.current_time()
            hit = self._recent.get(series)
            if hit is None or now - hit[0] >= RENDER_INTERVAL:
                view = self._store.view
                queues = await trio.to_thread.run_sync(
                    render_queues, view, series, self._queue_limit, self._ephemeral()
                )
                self._recent.pop(series, None)
                self._recent[series] = hit = (now, queues)
                while len(self._recent) > CACHED_QUERIES:
                    del self._recent[next(iter(self._recent))]
            paused = self._paused() if self._paused is not None else (
                self._store.view.paused_topics, self._store.view.paused_groups
            )
            text = (
                render_broker(self._statistics())
                + render_replication(self._ready(), self._replication())
                + _render(PausedCollector(*paused))
                + (render_latency(self._counters) if self._counters is not None else "")
                + (render_http(*self._http()) if self._http is not None else "")
                + hit[1]
            )
        return text.encode()

    def stats(self) -> control.BrokerStats:
        """The broker's statistics now (``/stats``)."""
        return self._statistics()
