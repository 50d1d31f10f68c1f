"""The asyncio admin client of a cluster: :class:`AsyncAdminClient`, the operations of the
trio :class:`equeue.client.async_admin.AsyncAdminClient` (fan-out over every broker group and
merge) awaited from asyncio, each forwarded to the trio admin client on a private loop thread
(:mod:`equeue.aio.bridge`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from equeue.aio.bridge import _forward, _Front
from equeue.client.async_admin import AsyncAdminClient as _TrioAdmin

__all__ = ["AsyncAdminClient"]


class AsyncAdminClient(_Front[_TrioAdmin]):
    """The admin client of one equeue cluster for asyncio: every operation of the trio
    :class:`equeue.client.AsyncAdminClient` (``create_topic``, ``describe_topic``,
    ``pause_topic``, ``reset_offsets``, ...), same arguments, answers and errors, awaited
    here. ``async with AsyncAdminClient("host:5800") as admin: await admin.create_topic("t", 4)``.
    Keyword arguments go to the trio client (``security``, ``connect_timeout``, ...); an
    invalid one raises (TypeError, ConfigError) here, before anything starts."""

    def __init__(self, brokers: str | Sequence[str] = "127.0.0.1:5800", **kwargs: Any) -> None:
        super().__init__()
        self.brokers = brokers
        self._kwargs = kwargs
        _TrioAdmin(brokers, **kwargs)  # validates; no I/O

    def _make_core(self) -> _TrioAdmin:
        return _TrioAdmin(self.brokers, **self._kwargs)

    async def aclose(self) -> None:
        """Close every connection and end the loop thread. Idempotent."""
        await self._close(lambda core: core.aclose())

    list_topics = _forward(_TrioAdmin.list_topics)
    create_topic = _forward(_TrioAdmin.create_topic)
    alter_topic = _forward(_TrioAdmin.alter_topic)
    describe_topic = _forward(_TrioAdmin.describe_topic)
    delete_topic = _forward(_TrioAdmin.delete_topic)
    pause_topic = _forward(_TrioAdmin.pause_topic)
    resume_topic = _forward(_TrioAdmin.resume_topic)
    list_groups = _forward(_TrioAdmin.list_groups)
    describe_group = _forward(_TrioAdmin.describe_group)
    delete_group = _forward(_TrioAdmin.delete_group)
    reset_offsets = _forward(_TrioAdmin.reset_offsets)
    pause_group = _forward(_TrioAdmin.pause_group)
    resume_group = _forward(_TrioAdmin.resume_group)
    dlq_list = _forward(_TrioAdmin.dlq_list)
    dlq_resend = _forward(_TrioAdmin.dlq_resend)
    get_message = _forward(_TrioAdmin.get_message)
    find_by_key = _forward(_TrioAdmin.find_by_key)
    offset_for_time = _forward(_TrioAdmin.offset_for_time)
    skip_message = _forward(_TrioAdmin.skip_message)
    list_skipped = _forward(_TrioAdmin.list_skipped)
    cluster_status = _forward(_TrioAdmin.cluster_status)
    cluster_report = _forward(_TrioAdmin.cluster_report)
    broker_stats = _forward(_TrioAdmin.broker_stats)
    verify_cluster = _forward(_TrioAdmin.verify_cluster)
    plan_recovery = _forward(_TrioAdmin.plan_recovery)
    recover_group = _forward(_TrioAdmin.recover_group)
    hand_over_group = _forward(_TrioAdmin.hand_over_group)
