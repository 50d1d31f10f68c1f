"""``AdminClient``: the blocking twin of :class:`equeue.client.async_admin.AsyncAdminClient`.

One method per admin operation of the async admin client, same arguments, answers and
errors, each blocking until the answer arrives (the work is done once, by the async
core on the front's loop thread, as for :class:`equeue.client.client.Client`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from equeue import control
from equeue.client.async_admin import (
    AsyncAdminClient,
    BrokerStatsRow,
    ClusterReport,
    MergedDlqPage,
    MergedTopic,
    RecoveryPlan,
    VerifyReport,
)
from equeue.client.loop_thread import SyncFront
from equeue.models import PullResult

__all__ = ["AdminClient"]


class AdminClient(SyncFront[AsyncAdminClient]):
    """Blocking admin client of one equeue cluster: every operation of
    :class:`AsyncAdminClient` (``create_topic``, ``describe_group``, ``reset_offsets``,
    ...) with the same arguments, blocking until the answer arrives. Use it as
    ``with AdminClient("host:5800") as admin:`` or call :meth:`close`; keyword
    arguments go to :class:`AsyncAdminClient` (``security``, ``connect_timeout``, ...); an
    invalid one raises (TypeError, ConfigError) here, before any thread starts."""

    def __init__(self, brokers: str | Sequence[str] = "127.0.0.1:5800", **kwargs: Any) -> None:
        super().__init__()
        self.brokers = brokers
        self._kwargs = kwargs
        AsyncAdminClient(brokers, **kwargs)  # validates; no I/O

    def _make_core(self) -> AsyncAdminClient:
        return AsyncAdminClient(self.brokers, **self._kwargs)

    def close(self) -> None:
        """Close the connections and end the loop thread (the twin of
        :meth:`AsyncAdminClient.aclose`). Idempotent."""
        self._close_core(lambda core: core.aclose())

    # ------------------------------------------------------------------ topics
    def list_topics(self, include_internal: bool = True) -> list[control.TopicInfo]:
        """Blocking twin of :meth:`AsyncAdminClient.list_topics`."""
        return self._call(lambda core: core.list_topics(include_internal))

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
        """Blocking twin of :meth:`AsyncAdminClient.create_topic`."""
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
        """Blocking twin of :meth:`AsyncAdminClient.alter_topic`."""
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

    def describe_topic(self, name: str) -> MergedTopic:
        """Blocking twin of :meth:`AsyncAdminClient.describe_topic`."""
        return self._call(lambda core: core.describe_topic(name))

    def delete_topic(self, name: str) -> None:
        """Blocking twin of :meth:`AsyncAdminClient.delete_topic`."""
        return self._call(lambda core: core.delete_topic(name))

    def pause_topic(self, name: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncAdminClient.pause_topic`."""
        return self._call(lambda core: core.pause_topic(name))

    def resume_topic(self, name: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncAdminClient.resume_topic`."""
        return self._call(lambda core: core.resume_topic(name))

    # ------------------------------------------------------------------ consumer groups
    def list_groups(self) -> list[control.GroupSummary]:
        """Blocking twin of :meth:`AsyncAdminClient.list_groups`."""
        return self._call(lambda core: core.list_groups())

    def describe_group(self, group: str) -> control.GroupDescription:
        """Blocking twin of :meth:`AsyncAdminClient.describe_group`."""
        return self._call(lambda core: core.describe_group(group))

    def delete_group(self, group: str, force: bool = False) -> dict[str, control.DeleteGroupAnswer]:
        """Blocking twin of :meth:`AsyncAdminClient.delete_group`."""
        return self._call(lambda core: core.delete_group(group, force))

    def reset_offsets(
        self, group: str, topic: str, to: control.ResetTarget | str, timestamp_ms: int = 0, force: bool = False
    ) -> dict[int, int]:
        """Blocking twin of :meth:`AsyncAdminClient.reset_offsets`."""
        return self._call(lambda core: core.reset_offsets(group, topic, to, timestamp_ms, force))

    def pause_group(self, group: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncAdminClient.pause_group`."""
        return self._call(lambda core: core.pause_group(group))

    def resume_group(self, group: str) -> control.PauseAnswer:
        """Blocking twin of :meth:`AsyncAdminClient.resume_group`."""
        return self._call(lambda core: core.resume_group(group))

    # ------------------------------------------------------------------ dead letters
    def dlq_list(self, group: str, queue_id: int = 0, offset: int = 0, limit: int = 100) -> MergedDlqPage:
        """Blocking twin of :meth:`AsyncAdminClient.dlq_list`."""
        return self._call(lambda core: core.dlq_list(group, queue_id, offset, limit))

    def dlq_resend(
        self, group: str, ids: Sequence[int] = (), all_letters: bool = False, broker_group: str | None = None
    ) -> control.DlqResendAnswer:
        """Blocking twin of :meth:`AsyncAdminClient.dlq_resend`."""
        return self._call(lambda core: core.dlq_resend(group, ids, all_letters, broker_group))

    # ------------------------------------------------------------------ messages
    def get_message(
        self,
        topic: str = "",
        queue_id: int = -1,
        queue_offset: int = -1,
        global_offset: int = -1,
        broker_group: str | None = None,
    ) -> PullResult:
        """Blocking twin of :meth:`AsyncAdminClient.get_message`."""
        return self._call(lambda core: core.get_message(topic, queue_id, queue_offset, global_offset, broker_group))

    def find_by_key(self, topic: str, key: str, limit: int = 32, before: int = -1) -> PullResult:
        """Blocking twin of :meth:`AsyncAdminClient.find_by_key`."""
        return self._call(lambda core: core.find_by_key(topic, key, limit, before))

    def offset_for_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """Blocking twin of :meth:`AsyncAdminClient.offset_for_time`."""
        return self._call(lambda core: core.offset_for_time(topic, queue_id, timestamp_ms))

    def skip_message(self, topic: str, queue_id: int, queue_offset: int) -> control.SkipAnswer:
        """Blocking twin of :meth:`AsyncAdminClient.skip_message`."""
        return self._call(lambda core: core.skip_message(topic, queue_id, queue_offset))

    def list_skipped(self, topic: str) -> dict[int, list[int]]:
        """Blocking twin of :meth:`AsyncAdminClient.list_skipped`."""
        return self._call(lambda core: core.list_skipped(topic))

    # ------------------------------------------------------------------ cluster
    def cluster_status(self) -> control.ClusterStatus:
        """Blocking twin of :meth:`AsyncAdminClient.cluster_status`."""
        return self._call(lambda core: core.cluster_status())

    def cluster_report(self, connect_timeout: float = 3.0) -> ClusterReport:
        """Blocking twin of :meth:`AsyncAdminClient.cluster_report`."""
        return self._call(lambda core: core.cluster_report(connect_timeout))

    def broker_stats(self, connect_timeout: float = 3.0) -> list[BrokerStatsRow]:
        """Blocking twin of :meth:`AsyncAdminClient.broker_stats`."""
        return self._call(lambda core: core.broker_stats(connect_timeout))

    def verify_cluster(self, timeout: float = 30.0, connect_timeout: float = 3.0) -> VerifyReport:
        """Blocking twin of :meth:`AsyncAdminClient.verify_cluster`."""
        return self._call(lambda core: core.verify_cluster(timeout, connect_timeout))

    def plan_recovery(self, group: str, leader: str = "", connect_timeout: float = 3.0) -> RecoveryPlan:
        """Blocking twin of :meth:`AsyncAdminClient.plan_recovery`."""
        return self._call(lambda core: core.plan_recovery(group, leader, connect_timeout))

    def recover_group(self, plan: RecoveryPlan, connect_timeout: float = 3.0) -> control.ReplicationStatus:
        """Blocking twin of :meth:`AsyncAdminClient.recover_group`."""
        return self._call(lambda core: core.recover_group(plan, connect_timeout))

    def hand_over_group(self, group: str, to: str = "", connect_timeout: float = 3.0) -> control.ReplicationStatus:
        """Blocking twin of :meth:`AsyncAdminClient.hand_over_group`."""
        return self._call(lambda core: core.hand_over_group(group, to, connect_timeout))
