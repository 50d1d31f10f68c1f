"""Stable routing of keys to queues.

The queue of a keyed message is ``crc32(utf8(key)) mod queue_count``, where
crc32 is the IEEE 802.3 CRC-32 (zlib's ``crc32``, Java's ``java.util.zip.CRC32``,
Go's ``hash/crc32.ChecksumIEEE``), read as an unsigned 32-bit integer. It never
depends on the process (unlike Python's ``hash()``, which is salted per process),
so every client in any language picks the same queue for the same key.

Examples: ``queue_for_key("user-42", 4) == 3``; ``queue_for_key("", 4) == 0``.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable
from typing import Final

from equeue.errors import ConfigError

__all__ = ["RoundRobin", "key_bytes_hash", "key_hash", "queue_for_key"]

#: the hash of a key's UTF-8 bytes: IEEE CRC-32 read unsigned (zlib's, a C function,
#: so the producer's per-message ``key_bytes_hash(key) % queue_count`` costs no frame)
key_bytes_hash: Final[Callable[[bytes], int]] = zlib.crc32


def key_hash(key: str | bytes) -> int:
    """The stable 32-bit hash of a key (CRC-32 of its UTF-8 bytes, unsigned)."""
    return key_bytes_hash(key.encode("utf-8") if isinstance(key, str) else key)


def queue_for_key(key: str | bytes, queue_count: int) -> int:
    """The queue a keyed message goes to. Raises ConfigError if ``queue_count < 1``."""
    if queue_count < 1:
        raise ConfigError(f"queue count must be >= 1, got {queue_count}")
    return key_hash(key) % queue_count


class RoundRobin:
    """Round-robin queue choice for messages without a key (thread-safe enough:
    ``itertools.count`` advances atomically under the GIL)."""

    def __init__(self, start: int = 0) -> None:
        self._counter = itertools.count(start)

    def next(self, queue_count: int) -> int:
        if queue_count < 1:
            raise ConfigError(f"queue count must be >= 1, got {queue_count}")
        return next(self._counter) % queue_count
