"""Validation of topic and group names.

A user topic name matches ``[A-Za-z0-9_.-]{1,128}``. Names starting with ``%`` are
reserved for internal topics (``%RETRY%<group>``, ``%DLQ%<group>``): users may
read them but not create them.

A group name uses the same alphabet, and may end with NSQ's suffix ``#ephemeral``
(``#`` is refused anywhere else): such a group is *ephemeral* (docs/consumer.md,
"Ephemeral groups"): its offsets live in its brokers' memory only, and it is gone
with its last member. The suffix, not a setting, says so, so every broker and every
broker group knows it from the name alone. The whole name, suffix included, is at
most 128 characters.
"""

from __future__ import annotations

import re

from equeue.errors import InvalidName, ReservedTopic

__all__ = [
    "EPHEMERAL_SUFFIX",
    "MAX_NAME",
    "dlq_topic",
    "is_ephemeral",
    "is_internal",
    "retry_topic",
    "validate_group",
    "validate_topic",
]

MAX_NAME = 128
_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
#: the suffix of an ephemeral group's name (NSQ's ``#ephemeral`` channels)
EPHEMERAL_SUFFIX = "#ephemeral"


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


def is_ephemeral(group: str) -> bool:
    """Whether ``group`` (a valid group name) names an ephemeral group."""
    return group.endswith(EPHEMERAL_SUFFIX)


def validate_group(name: str) -> str:
    """Return ``name`` if it is a valid consumer group name: the topics' alphabet, with
    an optional ``#ephemeral`` suffix (1-128 characters in all). Raises InvalidName."""
    base = name[: -len(EPHEMERAL_SUFFIX)] if isinstance(name, str) and is_ephemeral(name) else name
    if not isinstance(base, str) or not _NAME.fullmatch(base) or len(name) > MAX_NAME:
        raise InvalidName(
            f"invalid group name {name!r}: use 1-128 characters of A-Z a-z 0-9 _ . -"
            f" (an ephemeral group ends with {EPHEMERAL_SUFFIX!r})"
        )
    return name
