"""The console's memory of the last minutes: what its charts and rates show.

A :class:`Sampler` runs as a task of the console's nursery. Every ``interval``
seconds it asks the cluster, over the console's own connection (the credentials of
the ``EQUEUE_*`` environment, docs/console.md), for each broker's counters, each
topic's queue ends, each consumer group's lag and the cluster's leaders, and keeps
``window`` seconds of them (15 minutes by default) in bounded deques. Pages read
them with the user's own rights checked first: a page shows a chart only beside
numbers the user's own request just read.

One round is bounded: at most :data:`MAX_TOPICS` topics and :data:`MAX_GROUPS`
groups are sampled, and each of its parts (brokers, topics, groups, cluster) is cut
off after ``2 × interval`` seconds on its own, so a slow part does not keep the later
ones from running. A broker that a round no longer lists (it left the cluster) is
forgotten, its series with it.
A failed round (a broker down, the console's credentials refused) is noted in
:attr:`Sampler.last_error` and logged when the failure starts or changes (and every
10 minutes while it lasts).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import trio

from equeue.cli.console.failures import describe, equeue_errors
from equeue.client.async_admin import AsyncAdminClient, BrokerStatsRow
from equeue.errors import EQueueError

log = logging.getLogger("equeue.cli.console")

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_WINDOW", "MAX_GROUPS", "MAX_QUEUE_SERIES", "MAX_TOPICS", "Election", "Sampler"]

#: seconds between two samples
DEFAULT_INTERVAL = 5.0
#: seconds of history kept
DEFAULT_WINDOW = 900.0
#: most topics and consumer groups sampled per round (the first by name)
MAX_TOPICS = 200
MAX_GROUPS = 100
#: most queues of a group charted one by one (a bigger group's chart has its total only)
MAX_QUEUE_SERIES = 16
#: most leader changes remembered
MAX_ELECTIONS = 50
#: seconds between two log lines of the same failure
_LOG_EVERY = 600.0


def _queue_order(key: str) -> tuple[str, int]:
    """``topic/queue`` keys by topic, then queue number (2 before 10)."""
    topic, _, queue = key.rpartition("/")
    return topic, int(queue)


@attrs.frozen
class Election:
    """A broker group's leader or epoch as the sampler saw it change."""

    at_ms: int
    group: str
    leader: str
    epoch: int


class Sampler:
    """Samples the cluster every ``interval`` s through ``admin()`` (None: no
    connection yet) and keeps ``window`` s of history."""

    def __init__(
        self, admin: Callable[[], AsyncAdminClient | None], *, interval: float = DEFAULT_INTERVAL,
        window: float = DEFAULT_WINDOW, wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:  # fmt: skip
        self._admin = admin
        self.interval = interval
        self._size = max(2, int(window / interval) + 1)
        self._wall_ms = wall_ms
        #: sample times (ms), shared by the broker series
        self.broker_times: dict[str, deque[int]] = {}
        #: broker address -> deques of messages in and out per second
        self.broker_in: dict[str, deque[float]] = {}
        self.broker_out: dict[str, deque[float]] = {}
        self._broker_last: dict[str, tuple[int, int, int]] = {}
        #: topic -> (time ms, end offset of each queue)
        self.topics: dict[str, deque[tuple[int, list[int]]]] = {}
        #: consumer group -> (time ms, total lag, lag per "topic/queue": empty past
        #: MAX_QUEUE_SERIES queues)
        self.lags: dict[str, deque[tuple[int, int, dict[str, int]]]] = {}
        self.elections: deque[Election] = deque(maxlen=MAX_ELECTIONS)
        self._leaders: dict[str, tuple[str, int]] = {}
        #: samples taken, and why the last round failed ("" when it did not)
        self.rounds = 0
        self.last_error = ""
        self._logged = -_LOG_EVERY
        self._logged_error = ""

    # ------------------------------------------------------------------ the task
    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            await self.sample()  # each part bounded on its own
            await trio.sleep(self.interval)

    async def sample(self) -> None:
        """One round; a failing part is noted in :attr:`last_error`, never raised."""
        admin = self._admin()
        if admin is None:
            return
        errors: list[str] = []
        budget = self.interval * 2
        for part in (self._brokers, self._topics, self._groups, self._cluster):
            name = part.__name__.lstrip("_")
            try:
                with trio.move_on_after(budget) as scope:
                    await part(admin)
                if scope.cancelled_caught:
                    errors.append(f"{name}: no answer within {budget:g} s")
            except Exception as exc:
                found = equeue_errors(exc)
                if found is None:  # a defect: logged with its traceback (once while it lasts), and the console goes on
                    what = f"unexpected {type(exc).__name__} in {name}"
                    if what not in self._logged_error:
                        log.exception("console sampler: %s", what)
                    errors.append(what)
                    continue
                errors.append(describe(found))
        self.rounds += 1
        self.last_error = "; ".join(dict.fromkeys(errors))
        # a lasting failure (no credentials of its own, a broker down) is logged when it
        # starts or changes, and again every _LOG_EVERY s
        changed = self.last_error != self._logged_error
        if errors and (changed or trio.current_time() - self._logged >= _LOG_EVERY):
            self._logged = trio.current_time()
            log.warning("console sampler: %s", self.last_error)
        self._logged_error = self.last_error

    def _deque(self, table: dict[str, Any], key: str) -> Any:
        if key not in table:
            table[key] = deque(maxlen=self._size)
        return table[key]

    async def _broker_rows(self, admin: AsyncAdminClient) -> list[BrokerStatsRow]:
        """Every broker's STATS (a test's subclass gives its own)."""
        return await admin.broker_stats()

    async def _brokers(self, admin: AsyncAdminClient) -> None:
        rows = await self._broker_rows(admin)
        listed = {r.address for r in rows}
        tables: tuple[dict[str, Any], ...] = (self.broker_times, self.broker_in, self.broker_out, self._broker_last)
        for table in tables:
            for gone in set(table) - listed:  # a broker no longer in the cluster: its series go
                del table[gone]
        for r in rows:
            if r.stats is None:
                continue
            now = self._wall_ms()
            key = r.address
            last = self._broker_last.get(key)
            self._broker_last[key] = (now, r.stats.messages_in, r.stats.messages_out)
            if last is None or now <= last[0]:
                continue
            dt = (now - last[0]) / 1000
            self._deque(self.broker_times, key).append(now)
            self._deque(self.broker_in, key).append(max(0.0, (r.stats.messages_in - last[1]) / dt))
            self._deque(self.broker_out, key).append(max(0.0, (r.stats.messages_out - last[2]) / dt))

    async def _topics(self, admin: AsyncAdminClient) -> None:
        topics = await admin.list_topics(include_internal=False)
        names = sorted(t.name for t in topics)[:MAX_TOPICS]
        for name in set(self.topics) - set(names):
            del self.topics[name]
        for name in names:
            try:
                merged = await admin.describe_topic(name)
            except EQueueError:
                continue
            ends = [q.max_offset if q is not None else -1 for q in merged.queues]
            self._deque(self.topics, name).append((self._wall_ms(), ends))

    async def _groups(self, admin: AsyncAdminClient) -> None:
        groups = (await admin.list_groups())[:MAX_GROUPS]
        names = {g.group for g in groups}
        for name in set(self.lags) - names:
            del self.lags[name]
        for g in groups:
            try:
                d = await admin.describe_group(g.group)
            except EQueueError:
                continue
            lags = {f"{q.topic}/{q.queue_id}": max(0, q.lag) for q in d.queues}
            per_queue = lags if len(lags) <= MAX_QUEUE_SERIES else {}
            self._deque(self.lags, g.group).append((self._wall_ms(), sum(lags.values()), per_queue))

    async def _cluster(self, admin: AsyncAdminClient) -> None:
        status = await admin.cluster_status()
        if not status.cluster:
            return
        for g in status.groups:
            seen = (g.leader, g.epoch)
            if self._leaders.get(g.name) != seen:
                if g.name in self._leaders or g.leader:
                    self.elections.appendleft(Election(self._wall_ms(), g.name, g.leader, g.epoch))
                self._leaders[g.name] = seen

    # ------------------------------------------------------------------ reads
    def broker_chart(self, addresses: Iterable[str]) -> dict[str, Any]:
        """uPlot data of messages in/out per second of each broker of ``addresses``:
        ``{"series": [names], "data": [[times s], [values]...]}`` on the union of
        their sample times (a missing value is null)."""
        keys = [a for a in addresses if a in self.broker_times]
        times = sorted({t for k in keys for t in self.broker_times[k]})
        names: list[str] = []
        data: list[list[Any]] = [[t / 1000 for t in times]]
        for k in keys:
            for label, values in (("in", self.broker_in[k]), ("out", self.broker_out[k])):
                at = dict(zip(self.broker_times[k], values, strict=False))
                names.append(f"{k} {label}")
                data.append([None if at.get(t) is None else round(at[t], 2) for t in times])
        return {"series": names, "data": data}

    def lag_chart(self, group: str) -> dict[str, Any]:
        """uPlot data of ``group``'s total lag and each of its queues' (``topic/queue``;
        a queue not sampled at a time is null), queues only for a group of at most
        :data:`MAX_QUEUE_SERIES` queues."""
        points = list(self.lags.get(group, ()))
        queues = sorted({k for _, _, per in points for k in per}, key=_queue_order)
        data: list[list[Any]] = [[t / 1000 for t, _, _ in points], [total for _, total, _ in points]]
        data += [[per.get(k) for _, _, per in points] for k in queues]
        return {"series": ["total", *queues], "data": data}

    def topic_rates(self, topic: str, span_ms: int = 60_000) -> list[float] | None:
        """Messages per second written to each queue of ``topic`` over the last
        ``span_ms`` of samples (None: fewer than two samples)."""
        points = self.topics.get(topic)
        if not points or len(points) < 2:
            return None
        t1, ends1 = points[-1]
        t0, ends0 = next(((t, e) for t, e in points if t1 - t <= span_ms and t < t1), points[-2])
        dt = (t1 - t0) / 1000
        if dt <= 0:
            return None
        return [
            max(0.0, (b - a) / dt) if a >= 0 and b >= 0 else 0.0
            for a, b in zip(ends0 + [0] * (len(ends1) - len(ends0)), ends1, strict=False)
        ]

    def topic_rate(self, topic: str) -> float | None:
        """Messages per second written to ``topic`` lately (None: not sampled yet)."""
        rates = self.topic_rates(topic)
        return None if rates is None else sum(rates)
