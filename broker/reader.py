"""The store as the broker's request side reads it: a typed, read-only view.

:class:`StoreReader` names exactly the reads the handlers, the statistics and the
HTTP endpoint make, so they depend on these and not on the whole
:class:`~broker.store.Store` (whose writes belong to the appender alone). Reads run
on the loop, each in its own LMDB read transaction (MVCC), except the parked-pull
answers of :mod:`broker.thread_answer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from broker.store import QueueState, ReadResult
from equeue import control

__all__ = ["StoreReader"]


class StoreReader(Protocol):
    """Reads of the store; :class:`broker.store.Store` provides them."""

    @property
    def topics(self) -> Mapping[str, control.TopicInfo]: ...
    @property
    def next_global(self) -> int: ...
    @property
    def map_size(self) -> int: ...
    @property
    def sched_pending(self) -> Mapping[int, int]: ...

    def queue_state(self, topic_id: int, queue_id: int) -> QueueState: ...
    def read_queue(
        self,
        info: control.TopicInfo,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tag_filter: frozenset[bytes] | None = None,
        verify: bool = True,
    ) -> ReadResult: ...
    def get_global(self, global_offset: int) -> bytes | None: ...
    def get_queue_offset(
        self, info: control.TopicInfo, queue_id: int, offset: int
    ) -> tuple[int, bytes] | None: ...
    def find_by_key(
        self, info: control.TopicInfo, key: str, limit: int
    ) -> list[tuple[int, bytes]]: ...
    def offset_for_time(self, info: control.TopicInfo, queue_id: int, ts_ms: int) -> int: ...
    def committed(self, group: str, topic: str, queue_id: int) -> int: ...
    def describe(self, name: str) -> control.TopicDescription: ...
    def store_bytes(self) -> int: ...
    def groups_of(self, topic: str | None = None) -> set[str]: ...
    def group_offsets(self, group: str) -> dict[tuple[str, int], int]: ...
