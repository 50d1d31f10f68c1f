"""Validation of topic and group names.

A user topic name matches ``[A-Za-z0-9_.-]{1,128}``. Names starting with ``%`` are
reserved for internal topics (``%RETRY%<group>``, ``%DLQ%<group>``): users may
read them but not create them.
"""

from __future__ import annotations

import re

from equeue.errors import InvalidName, ReservedTopic

__all__ = [
    "MAX_NAME",
    "dlq_topic",
    "is_internal",
    "retry_topic",
    "validate_group",
    "validate_topic",
]

MAX_NAME = 128
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"


def is_internal(topic: str) -> bool:
    return topic.startswith("%")


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def validate_topic(name: str, *, allow_internal: bool = False) -> str:
    """Return ``name`` if it is a valid topic name.

    Raises InvalidName for a malformed name, ReservedTopic for a ``%`` name unless
    ``allow_internal`` (then the part after the prefix must be a valid group name).
    """
    if not isinstance(name, str):
        raise InvalidName(f"topic name must be a string, not {type(name).__name__}")
    if name.startswith("%"):
        for prefix in (RETRY_PREFIX, DLQ_PREFIX):
            if name.startswith(prefix) and _NAME.fullmatch(name[len(prefix) :]):
                if not allow_internal:
                    raise ReservedTopic(f"topic names starting with '%' are reserved: {name!r}")
                return name
        raise InvalidName(f"invalid internal topic name {name!r}")
    if not _NAME.fullmatch(name):
        raise InvalidName(
            f"invalid topic name {name!r}: use 1-128 characters of A-Z a-z 0-9 _ . -"
        )
    return name


def validate_group(name: str) -> str:
    """Return ``name`` if it is a valid consumer group name (same alphabet as topics)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidName(f"invalid group name {name!r}: use 1-128 characters of A-Z a-z 0-9 _ . -")
    return name
