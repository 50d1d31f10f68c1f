"""Queue allocation strategies for consumer groups in clustering mode.

In clustering mode every queue of a subscribed topic is consumed by exactly one live
member of the group. An *allocation strategy* decides which one::

    strategy(queues, members) -> {member: [queue, ...]}

A queue is ``(topic, queue_id)``; a member is a consumer id string. The broker and
every client compute the same allocation independently (the broker rejects a pull for
a queue the allocation gives to another member), so every strategy here is a pure
function of the *sets* of queues and members:

- inputs are deduplicated and sorted (members lexicographically, queues by
  ``(topic, queue_id)``), so the input order never matters;
- the result has an entry, possibly empty, for every member, and is ``{}`` when there
  are no members;
- queues of several topics may be passed together; the built-in strategies then
  balance the total, not each topic (call once per topic to balance per topic).

Built-in strategies (names accepted by :func:`get_strategy`):

``average``
    RocketMQ ``AllocateMessageQueueAveragely``: contiguous blocks of the sorted queues
    in member order; the first ``len(queues) % len(members)`` members get one extra.
``average_by_circle``
    RocketMQ ``AllocateMessageQueueAveragelyByCircle``: queue ``i`` goes to member
    ``i % len(members)``.
``consistent_hash``
    A hash ring with virtual nodes; few queues move when membership changes, but the
    shares are only roughly balanced.

User strategies are plain callables with the same signature; :func:`allocate` and
:func:`allocate_for` check their result, since a user callable may be buggy.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from equeue.errors import ConfigError

__all__ = [
    "STRATEGIES",
    "AllocationStrategy",
    "Queue",
    "allocate",
    "allocate_for",
    "average",
    "average_by_circle",
    "consistent_hash",
    "get_strategy",
]

Queue = tuple[str, int]
AllocationStrategy = Callable[[Sequence[Queue], Sequence[str]], dict[str, list[Queue]]]


def _normalize(queues: Iterable[Queue], members: Iterable[str]) -> tuple[list[Queue], list[str]]:
    """Deduplicate and sort the inputs. Raises ConfigError on a malformed queue or member."""
    queue_set: set[Queue] = set()
    for queue in queues:
        if (
            not isinstance(queue, tuple)
            or len(queue) != 2
            or not isinstance(queue[0], str)
            or not isinstance(queue[1], int)
        ):
            raise ConfigError(f"a queue must be a (topic: str, queue_id: int) tuple, got {queue!r}")
        queue_set.add(queue)
    member_set: set[str] = set()
    for member in members:
        if not isinstance(member, str):
            raise ConfigError(f"a member id must be a str, got {member!r}")
        member_set.add(member)
    return sorted(queue_set), sorted(member_set)


def average(queues: Iterable[Queue], members: Iterable[str]) -> dict[str, list[Queue]]:
    """Contiguous blocks of the sorted queues, in sorted member order.

    Block sizes differ by at most one; the first ``len(queues) % len(members)`` members
    get the larger blocks. With more members than queues, the last members get nothing.
    Raises ConfigError on a malformed queue or member.
    """
    qs, ms = _normalize(queues, members)
    if not ms:
        return {}
    base, extra = divmod(len(qs), len(ms))
    result: dict[str, list[Queue]] = {}
    start = 0
    for index, member in enumerate(ms):
        size = base + (1 if index < extra else 0)
        result[member] = qs[start : start + size]
        start += size
    return result


def average_by_circle(queues: Iterable[Queue], members: Iterable[str]) -> dict[str, list[Queue]]:
    """Deal the sorted queues round-robin: queue ``i`` goes to sorted member ``i % n``.

    Shares differ by at most one. Raises ConfigError on a malformed queue or member.
    """
    qs, ms = _normalize(queues, members)
    if not ms:
        return {}
    result: dict[str, list[Queue]] = {member: [] for member in ms}
    for index, queue in enumerate(qs):
        result[ms[index % len(ms)]].append(queue)
    return result


def _ring_position(key: str) -> int:
    """Position on the ring: the first 8 bytes of SHA-256(UTF-8 key), big-endian unsigned.

    A stable hash (never Python's salted ``hash()``), so every process and language
    builds the same ring.
    """
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def consistent_hash(
    queues: Iterable[Queue], members: Iterable[str], *, virtual_nodes: int = 64
) -> dict[str, list[Queue]]:
    """Assign each queue to the first member node clockwise on a hash ring.

    Member ``m`` has ``virtual_nodes`` nodes at positions ``_ring_position(f"{m}#{i}")``
    for ``i`` in ``range(virtual_nodes)``; queue ``(t, q)`` sits at
    ``_ring_position(f"{t}#{q}")`` and goes to the first node at or after it (wrapping
    around); nodes at equal positions are ordered by ``(member, i)``.

    Why: when a member joins, only queues it takes over move; when one leaves, only its
    queues move. Shares are *not* balanced within one: with ``n`` members each gets
    about ``1/n`` of the queues, closer with more virtual nodes and more queues.

    Raises ConfigError if ``virtual_nodes < 1`` or on a malformed queue or member.
    """
    if not isinstance(virtual_nodes, int) or virtual_nodes < 1:
        raise ConfigError(f"virtual_nodes must be an int >= 1, got {virtual_nodes!r}")
    qs, ms = _normalize(queues, members)
    if not ms:
        return {}
    ring = sorted(
        (_ring_position(f"{member}#{i}"), member, i) for member in ms for i in range(virtual_nodes)
    )
    positions = [position for position, _, _ in ring]
    result: dict[str, list[Queue]] = {member: [] for member in ms}
    for queue in qs:
        index = bisect.bisect_left(positions, _ring_position(f"{queue[0]}#{queue[1]}"))
        result[ring[index % len(ring)][1]].append(queue)
    return result


STRATEGIES: Mapping[str, AllocationStrategy] = {
    "average": average,
    "average_by_circle": average_by_circle,
    "consistent_hash": consistent_hash,
}
"""The built-in strategies by name."""


def get_strategy(name_or_callable: str | AllocationStrategy) -> AllocationStrategy:
    """Resolve a strategy name (a key of :data:`STRATEGIES`) or return a callable as is.

    Raises ConfigError for an unknown name or something neither a str nor callable.
    """
    if isinstance(name_or_callable, str):
        try:
            return STRATEGIES[name_or_callable]
        except KeyError:
            known = ", ".join(sorted(STRATEGIES))
            raise ConfigError(
                f"unknown allocation strategy {name_or_callable!r} (known: {known})"
            ) from None
    if callable(name_or_callable):
        return name_or_callable
    raise ConfigError(
        f"an allocation strategy must be a name or a callable, got {name_or_callable!r}"
    )


def allocate(
    queues: Iterable[Queue],
    members: Iterable[str],
    strategy: str | AllocationStrategy = "average",
) -> dict[str, list[Queue]]:
    """Run a strategy on the normalized inputs and check its result.

    The strategy receives deduplicated, sorted lists. The returned dict has an entry for
    every member (missing entries count as empty), each list sorted.

    Raises ConfigError if the strategy is unknown, raises, or returns anything but an
    assignment of every queue to exactly one known member (the exception it raised is
    chained as ``__cause__``).
    """
    func = get_strategy(strategy)
    qs, ms = _normalize(queues, members)
    if not ms:
        return {}
    try:
        raw = func(qs, ms)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"allocation strategy {func!r} raised {exc!r}") from exc
    return _check_assignment(raw, qs, ms)


def _check_assignment(
    raw: object, queues: list[Queue], members: list[str]
) -> dict[str, list[Queue]]:
    """Validate and normalize a strategy's result. Raises ConfigError when it is invalid."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"allocation strategy returned {type(raw).__name__}, not a dict")
    known_queues = set(queues)
    known_members = set(members)
    owner: dict[Queue, str] = {}
    result: dict[str, list[Queue]] = {member: [] for member in members}
    for member, assigned in raw.items():
        if member not in known_members:
            raise ConfigError(f"allocation strategy assigned queues to unknown member {member!r}")
        if isinstance(assigned, str | bytes) or not isinstance(assigned, Iterable):
            raise ConfigError(
                f"allocation strategy gave member {member!r} {assigned!r}, not a list of queues"
            )
        for queue in assigned:
            try:
                known = queue in known_queues
            except TypeError:  # unhashable, so certainly not one of ours
                known = False
            if not known:
                raise ConfigError(f"allocation strategy assigned unknown queue {queue!r}")
            if queue in owner:
                raise ConfigError(
                    f"allocation strategy assigned queue {queue!r} to both "
                    f"{owner[queue]!r} and {member!r}"
                )
            owner[queue] = member
            result[member].append(queue)
    missing = [queue for queue in queues if queue not in owner]
    if missing:
        raise ConfigError(f"allocation strategy left queues unassigned: {missing!r}")
    for assigned_queues in result.values():
        assigned_queues.sort()
    return result


def allocate_for(
    member: str,
    queues: Iterable[Queue],
    members: Iterable[str],
    strategy: str | AllocationStrategy,
) -> list[Queue]:
    """The sorted queues the strategy assigns to ``member``.

    A member not (yet) in ``members`` owns nothing and gets ``[]``. Raises ConfigError
    like :func:`allocate` when the strategy is unknown or its result is invalid.
    """
    return allocate(queues, members, strategy).get(member, [])
