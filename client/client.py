"""``Client``: the blocking twin of :class:`equeue.client.async_client.AsyncClient`.

One typed method per request method of the async client, same arguments, answers and
errors, each blocking until the answer arrives (the work is done once, by the async
core on the front's loop thread). The loop-thread plumbing of the async client
(``send_request``, ``cork``, ...) has no blocking twin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from equeue import control, wire
from equeue.client.async_client import AsyncClient
from equeue.client.loop_thread import SyncFront
from equeue.models import PullResult

T = TypeVar("T")


class Client(SyncFront[AsyncClient]):
    """Blocking admin/low-level client: every request method of :class:`AsyncClient`
    (``create_topic``, ``pull``, ``describe_group``, ...) with the same arguments,
    blocking until the answer arrives."""

    def __init__(self, brokers: str | Sequence[str] = "127.0.0.1:5800", **kwargs: Any) -> None:
        super().__init__()
        self.brokers = brokers
        self._kwargs = kwargs
        AsyncClient(brokers, **kwargs)  # validates (TypeError, ConfigError) before any thread starts; no I/O

    def _make_core(self) -> AsyncClient:
        return AsyncClient(self.brokers, **self._kwargs)

    def close(self) -> None:
        """Close the connection and end the loop thread (the twin of
        :meth:`AsyncClient.aclose`). Idempotent."""
        self._close_core(lambda core: core.aclose())

    def request(self, code: int, payload: bytes) -> bytes:
        """Blocking twin of :meth:`AsyncClient.request`."""
        return self._call(lambda core: core.request(code, payload))

    def call(self, req: Any, answer: type[T] | Any = None) -> T:
        """Blocking twin of :meth:`AsyncClient.call`."""
        return self._call(lambda core: core.call(req, answer))

    def produce(self, req: wire.ProduceRequest) -> wire.ProduceResponse:
        """Blocking twin of :meth:`AsyncClient.produce`."""
        return self._call(lambda core: core.produce(req))

    def pull(self, req: wire.PullRequest) -> PullResult:
        """Blocking twin of :meth:`AsyncClient.pull`."""
        return self._call(lambda core: core.pull(req))

    def create_topic(
        self,
        name: str,
        queues: int = 4,
        *,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        exist_ok: bool = False,
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Blocking twin of :meth:`AsyncClient.create_topic`."""
        return self._call(
            lambda core: core.create_topic(
                name,
                queues,
                retention_ms=retention_ms,
                retention_bytes=retention_bytes,
                exist_ok=exist_ok,
                compression=compression,
            )
        )

    def alter_topic(
        self,
        name: str,
        *,
        queues: int | None = None,
        retention_ms: int | None = None,
        retention_bytes: int | None = None,
        reset: Iterable[str] = (),
        compression: str | None = None,
    ) -> control.TopicInfo:
        """Blocking twin of :meth:`AsyncClient.alter_topic`."""
        return self._call(
            lambda core: core.alter_topic(
                name,
                queues=queues,
                retention_ms=retention_ms,
                retention_bytes=retention_bytes,
                reset=reset,
                compression=compression,
            )
        )

    def delete_topic(self, name: str) -> None:
        """Blocking twin of :meth:`AsyncClient.delete_topic`."""
        return self._call(lambda core: core.delete_topic(name))

    def list_topics(self, include_internal: bool = True) -> list[control.TopicInfo]:
        """Blocking twin of :meth:`AsyncClient.list_topics`."""
        return self._call(lambda core: core.list_topics(include_internal))

    def describe_topic(self, name: str) -> control.TopicDescription:
        """Blocking twin of :meth:`AsyncClient.describe_topic`."""
        return self._call(lambda core: core.describe_topic(name))

    def get_route(self, topic: str, auto_create: bool = True) -> control.TopicInfo:
        """Blocking twin of :meth:`AsyncClient.get_route`."""
        return self._call(lambda core: core.get_route(topic, auto_create))

    def get_routes(self, topics: Sequence[str], auto_create: bool = False) -> control.RouteTable:
        """Blocking twin of :meth:`AsyncClient.get_routes`."""
        return self._call(lambda core: core.get_routes(topics, auto_create))

    def queue_offsets(self, topic: str, queue_id: int) -> control.QueueStats:
        """Blocking twin of :meth:`AsyncClient.queue_offsets`."""
        return self._call(lambda core: core.queue_offsets(topic, queue_id))

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Blocking twin of :meth:`AsyncClient.offset_for_time`."""
        return self._call(lambda core: core.offset_for_time(topic, queue_id, timestamp_ms))

    def commit_offset(
        self, group: str, topic: str, queue_id: int, offset: int, consumer_id: str = ""
    ) -> None:
        """Blocking twin of :meth:`AsyncClient.commit_offset`."""
        return self._call(
            lambda core: core.commit_offset(group, topic, queue_id, offset, consumer_id)
        )

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Blocking twin of :meth:`AsyncClient.query_offset`."""
        return self._call(lambda core: core.query_offset(group, topic, queue_id))

    def reset_offsets(
        self,
        group: str,
        topic: str,
        to: control.ResetTarget | str,
        timestamp_ms: int = 0,
        force: bool = False,
    ) -> dict[int, int]:
        """Blocking twin of :meth:`AsyncClient.reset_offsets`."""
        return self._call(lambda core: core.reset_offsets(group, topic, to, timestamp_ms, force))

    def heartbeat(self, hb: control.Heartbeat) -> control.HeartbeatAnswer:
        """Blocking twin of :meth:`AsyncClient.heartbeat`."""
        return self._call(lambda core: core.heartbeat(hb))

    def leave_group(self, group: str, consumer_id: str) -> None:
        """Blocking twin of :meth:`AsyncClient.leave_group`."""
        return self._call(lambda core: core.leave_group(group, consumer_id))

    def release_queues(self, group: str, consumer_id: str, leases: list[str]) -> None:
        """Blocking twin of :meth:`AsyncClient.release_queues`."""
        return self._call(lambda core: core.release_queues(group, consumer_id, leases))

    def list_groups(self) -> list[control.GroupSummary]:
        """Blocking twin of :meth:`AsyncClient.list_groups`."""
        return self._call(lambda core: core.list_groups())

    def describe_group(self, group: str) -> control.GroupDescription:
        """Blocking twin of :meth:`AsyncClient.describe_group`."""
        return self._call(lambda core: core.describe_group(group))

    def stats(self) -> control.BrokerStats:
        """Blocking twin of :meth:`AsyncClient.stats`."""
        return self._call(lambda core: core.stats())

    def pause_topic(self, name: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncClient.pause_topic`."""
        return self._call(lambda core: core.pause_topic(name))

    def resume_topic(self, name: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncClient.resume_topic`."""
        return self._call(lambda core: core.resume_topic(name))

    def pause_group(self, group: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncClient.pause_group`."""
        return self._call(lambda core: core.pause_group(group))

    def resume_group(self, group: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncClient.resume_group`."""
        return self._call(lambda core: core.resume_group(group))

    def cluster_status(self) -> control.ClusterStatus:
        """Blocking twin of :meth:`AsyncClient.cluster_status`."""
        return self._call(lambda core: core.cluster_status())

    def replication_status(self) -> control.ReplicationStatus:
        """Blocking twin of :meth:`AsyncClient.replication_status`."""
        return self._call(lambda core: core.replication_status())

    def replica_digest(self, range_size: int = 65536) -> control.ReplicaDigest:
        """Blocking twin of :meth:`AsyncClient.replica_digest`."""
        return self._call(lambda core: core.replica_digest(range_size))

    def get_message(
        self, topic: str = "", queue_id: int = -1, queue_offset: int = -1, global_offset: int = -1
    ) -> PullResult:
        """Blocking twin of :meth:`AsyncClient.get_message`."""
        return self._call(
            lambda core: core.get_message(topic, queue_id, queue_offset, global_offset)
        )

    def find_by_key(self, topic: str, key: str, limit: int = 32, before: int = -1) -> PullResult:
        """Blocking twin of :meth:`AsyncClient.find_by_key`."""
        return self._call(lambda core: core.find_by_key(topic, key, limit, before))

    def send_back(
        self,
        group: str,
        topic: str,
        queue_id: int,
        queue_offset: int,
        reconsume_times: int,
        max_reconsume_times: int = 16,
        retry_delays_ms: Sequence[int] = (),
    ) -> control.SendBackAnswer:
        """Blocking twin of :meth:`AsyncClient.send_back`."""
        return self._call(
            lambda core: core.send_back(
                group,
                topic,
                queue_id,
                queue_offset,
                reconsume_times,
                max_reconsume_times,
                retry_delays_ms,
            )
        )

    def dlq_list(
        self, group: str, queue_id: int = 0, offset: int = 0, limit: int = 100
    ) -> control.DlqPage:
        """Blocking twin of :meth:`AsyncClient.dlq_list`."""
        return self._call(lambda core: core.dlq_list(group, queue_id, offset, limit))

    def dlq_resend(
        self, group: str, ids: Sequence[int] = (), all_letters: bool = False
    ) -> control.DlqResendAnswer:
        """Blocking twin of :meth:`AsyncClient.dlq_resend`."""
        return self._call(lambda core: core.dlq_resend(group, ids, all_letters))

    def skip_message(self, topic: str, queue_id: int, queue_offset: int) -> control.SkipAnswer:
        """Blocking twin of :meth:`AsyncClient.skip_message`."""
        return self._call(lambda core: core.skip_message(topic, queue_id, queue_offset))

    def list_skipped(self, topic: str) -> dict[int, list[int]]:
        """Blocking twin of :meth:`AsyncClient.list_skipped`."""
        return self._call(lambda core: core.list_skipped(topic))
