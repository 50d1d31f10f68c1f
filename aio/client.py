"""The asyncio client of one broker: :class:`AsyncClient`, the requests of the trio
:class:`equeue.client.AsyncClient` awaited from asyncio (each forwarded to the trio client on
a private loop thread, :mod:`equeue.aio.bridge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from equeue.aio.bridge import _forward, _Front
from equeue.client.async_client import AsyncClient as _TrioClient

__all__ = ["AsyncClient"]


class AsyncClient(_Front[_TrioClient]):
    """The admin client for asyncio: the admin methods of the trio
    :class:`equeue.client.AsyncClient`, same arguments and errors, awaited here.
    ``async with AsyncClient("host:port") as c: await c.create_topic("t", 4)``."""

    def __init__(self, brokers: str | Sequence[str] = "127.0.0.1:5800", **kwargs: Any) -> None:
        super().__init__()
        self.brokers = brokers
        self._kwargs = kwargs
        _TrioClient(brokers, **kwargs)  # validates; no I/O

    def _make_core(self) -> _TrioClient:
        return _TrioClient(self.brokers, **self._kwargs)

    async def aclose(self) -> None:
        """Close the connections and end the loop thread. Idempotent."""
        await self._close(lambda core: core.aclose())

    create_topic = _forward(_TrioClient.create_topic)
    alter_topic = _forward(_TrioClient.alter_topic)
    delete_topic = _forward(_TrioClient.delete_topic)
    list_topics = _forward(_TrioClient.list_topics)
    describe_topic = _forward(_TrioClient.describe_topic)
    get_route = _forward(_TrioClient.get_route)
    get_routes = _forward(_TrioClient.get_routes)
    queue_offsets = _forward(_TrioClient.queue_offsets)
    offset_for_time = _forward(_TrioClient.offset_for_time)
    commit_offset = _forward(_TrioClient.commit_offset)
    query_offset = _forward(_TrioClient.query_offset)
    reset_offsets = _forward(_TrioClient.reset_offsets)
    list_groups = _forward(_TrioClient.list_groups)
    describe_group = _forward(_TrioClient.describe_group)
    stats = _forward(_TrioClient.stats)
    pause_topic = _forward(_TrioClient.pause_topic)
    resume_topic = _forward(_TrioClient.resume_topic)
    pause_group = _forward(_TrioClient.pause_group)
    resume_group = _forward(_TrioClient.resume_group)
    cluster_status = _forward(_TrioClient.cluster_status)
    replication_status = _forward(_TrioClient.replication_status)
    get_message = _forward(_TrioClient.get_message)
    find_by_key = _forward(_TrioClient.find_by_key)
    pull = _forward(_TrioClient.pull)
    dlq_list = _forward(_TrioClient.dlq_list)
    dlq_resend = _forward(_TrioClient.dlq_resend)
    skip_message = _forward(_TrioClient.skip_message)
    list_skipped = _forward(_TrioClient.list_skipped)
    request = _forward(_TrioClient.request)
    call = _forward(_TrioClient.call)
    produce = _forward(_TrioClient.produce)
    heartbeat = _forward(_TrioClient.heartbeat)
    leave_group = _forward(_TrioClient.leave_group)
    release_queues = _forward(_TrioClient.release_queues)
    replica_digest = _forward(_TrioClient.replica_digest)
    send_back = _forward(_TrioClient.send_back)
