"""Where a producer's messages go: cached queue counts per topic and queue selection.

Selection (:meth:`Route.select`): a keyed message goes to
:func:`equeue.routing.queue_for_key` (``crc32(key) mod queue_count``), others
round-robin (:class:`equeue.routing.RoundRobin`) over the queues whose broker group
is available (all of them standalone), unless a ``queue_selector`` option decides.
Routes come from the producer's :class:`equeue.client.routing.Router`: fetched on first use
(with the retry policy, within ``send_timeout``), refreshed with owners every
``route_refresh`` seconds by the router, and at once when a broker answers
QueueNotFound (:meth:`Routes.invalidate`) or NOT_OWNER / QUEUE_UNAVAILABLE (the lanes).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import trio

from equeue.client.retry import retry_async
from equeue.client.routing import Router
from equeue.errors import ConfigError, OperationTimeout
from equeue.models import Message
from equeue.names import validate_topic
from equeue.producer._lane import _Lane
from equeue.producer.options import ProducerOptions
from equeue.routing import RoundRobin, queue_for_key

log = logging.getLogger("equeue.producer")

__all__ = ["Route", "Routes"]


class Route:
    """One topic as the producer sees it: its queue count and its lanes."""

    __slots__ = ("available", "count", "fetched", "lanes", "rr", "topic")

    def __init__(self, topic: str, count: int) -> None:
        self.topic = topic
        self.count = count
        #: the queue ids keyless messages go to when some group is down (None: all)
        self.available: list[int] | None = None
        self.fetched = time.monotonic()
        self.rr = RoundRobin()
        #: queue id -> lane (created under the buffer lock by the submit path)
        self.lanes: dict[int, _Lane] = {}

    def select(
        self,
        key: bytes | None,
        options: ProducerOptions,
        body: bytes,
        tags: str | None,
        properties: dict[str, Any] | None,
        due: int,
    ) -> int:
        """The queue of one message (any thread; the produce hot path). Raises
        ConfigError when a ``queue_selector`` returns no valid queue id."""
        selector = options.queue_selector
        if selector is None:
            if key is not None:
                return queue_for_key(key, self.count)
            available = self.available
            if available:
                return available[self.rr.next(len(available))]
            return self.rr.next(self.count)
        count = self.count
        qid = selector(count, Message(body, key, tags, properties or {}, due, self.topic))
        if not isinstance(qid, int) or not 0 <= qid < count:
            raise ConfigError(f"queue_selector returned {qid!r}; {self.topic!r} has {count} queues")
        return qid


class Routes:
    """The routes of every topic a producer used (loop thread, read by any thread)."""

    def __init__(self, router: Router, options: ProducerOptions) -> None:
        self.router = router
        self.options = options
        self.topics: dict[str, Route] = {}
        router.subscribe(self.update)

    def get(self, topic: str) -> Route | None:
        """The cached route, or None before its first fetch (any thread, no wait)."""
        return self.topics.get(topic)

    async def fetch(self, topic: str) -> Route:
        """The cached route of ``topic``, fetched on first use.

        Raises InvalidName/ReservedTopic, TopicNotFound (``auto_create`` off or refused
        by the broker), the last transient error after ``retries`` (see
        :attr:`ProducerOptions.retry_policy`), OperationTimeout after ``send_timeout``.
        """
        route = self.topics.get(topic)
        if route is not None:
            return route
        validate_topic(topic)
        opts = self.options
        with trio.move_on_after(opts.send_timeout) as cs:
            t = await retry_async(
                lambda: self.router.route(topic, auto_create=opts.auto_create), opts.retry_policy,
                what=f"producer.route:{topic}", where=",".join(self.router.seeds),
            )
        if cs.cancelled_caught:
            raise OperationTimeout(
                f"no route for topic {topic!r} within send_timeout ({opts.send_timeout:g} s)"
            )
        route = self.topics.get(topic)
        if route is None:
            route = self.topics[topic] = Route(topic, t.info.queues)
            self._apply(route)
        return route

    def invalidate(self, topic: str) -> None:
        """The broker said a queue does not exist: refresh the routes now."""
        route = self.topics.get(topic)
        if route is not None:
            route.fetched = 0.0
            self.router.invalidate(topic)

    def lanes(self) -> list[_Lane]:
        """Every lane of every topic (a snapshot)."""
        return [lane for route in list(self.topics.values()) for lane in list(route.lanes.values())]

    def update(self) -> None:
        """The router took a new table: queue counts, available queues, lane owners."""
        for route in list(self.topics.values()):
            self._apply(route)

    def _apply(self, route: Route) -> None:
        t = self.router.cached(route.topic)
        if t is None:
            return
        if t.info.queues != route.count:
            log.info("topic %s now has %d queues (was %d)", route.topic, t.info.queues, route.count)
            route.count = t.info.queues
        available = self.router.cache.available_queues(route.topic)
        route.available = None if len(available) == route.count else available
        route.fetched = time.monotonic()
        for qid, lane in list(route.lanes.items()):
            lane.owner_changed(self.router.owner(route.topic, qid))
