"""Properties of the queue allocation strategies (pure, fast)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue.allocation import (
    STRATEGIES,
    AllocationStrategy,
    Queue,
    allocate,
    allocate_for,
    average,
    average_by_circle,
    consistent_hash,
    get_strategy,
)
from equeue.errors import ConfigError

ALL = [average, average_by_circle, consistent_hash]
BALANCED = [average, average_by_circle]

queue_st = st.tuples(st.sampled_from(["a", "b", "orders", "zz"]), st.integers(0, 31))
queues_st = st.lists(queue_st, max_size=40)
member_st = st.text(alphabet="abcxyz-0123", min_size=1, max_size=6)
members_st = st.lists(member_st, max_size=8)
fast = settings(max_examples=60, deadline=None)


def owners(result: dict[str, list[Queue]]) -> dict[Queue, str]:
    """Queue -> owner, asserting no queue is assigned twice."""
    out: dict[Queue, str] = {}
    for member, qs in result.items():
        for q in qs:
            assert q not in out, f"{q} assigned to {out[q]} and {member}"
            out[q] = member
    return out


def rocketmq_average(queues: list[Queue], members: list[str], member: str) -> list[Queue]:
    """A direct port of RocketMQ's AllocateMessageQueueAveragely index math (oracle)."""
    index, n, q = members.index(member), len(members), len(queues)
    mod = q % n
    size = 1 if q <= n else (q // n + 1 if mod > 0 and index < mod else q // n)
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % q] for i in range(min(size, q - start))]


@pytest.mark.parametrize("strategy", ALL)
@fast
@given(queues=queues_st, members=members_st)
def test_every_queue_assigned_exactly_once(
    strategy: AllocationStrategy, queues: list[Queue], members: list[str]
) -> None:
    result = strategy(queues, members)
    if not members:
        assert result == {}
        return
    assert set(result) == set(members)
    assert set(owners(result)) == set(queues)
    assert sum(len(qs) for qs in result.values()) == len(set(queues))


@pytest.mark.parametrize("strategy", BALANCED)
@fast
@given(queues=queues_st, members=members_st.filter(bool))
def test_balanced_within_one(
    strategy: AllocationStrategy, queues: list[Queue], members: list[str]
) -> None:
    sizes = [len(qs) for qs in strategy(queues, members).values()]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("strategy", ALL)
@fast
@given(queues=queues_st, members=members_st, data=st.data())
def test_deterministic_under_shuffle_and_duplicates(
    strategy: AllocationStrategy, queues: list[Queue], members: list[str], data: st.DataObject
) -> None:
    expected = strategy(queues, members)
    shuffled_q = data.draw(st.permutations(queues + queues[:3]))
    shuffled_m = data.draw(st.permutations(members + members[:2]))
    assert strategy(shuffled_q, shuffled_m) == expected


@fast
@given(
    topic_queues=st.integers(1, 8),
    member_count=st.integers(1, 8),
    members=st.sets(member_st, min_size=8, max_size=8),
)
def test_average_exact_share_when_divisible(
    topic_queues: int, member_count: int, members: set[str]
) -> None:
    ms = sorted(members)[:member_count]
    queues = [("t", i) for i in range(topic_queues * member_count)]
    result = average(queues, ms)
    assert all(len(qs) == topic_queues for qs in result.values())


@fast
@given(queues=queues_st, members=members_st.filter(bool))
def test_average_matches_rocketmq(queues: list[Queue], members: list[str]) -> None:
    qs, ms = sorted(set(queues)), sorted(set(members))
    result = average(queues, members)
    for member in ms:
        assert result[member] == (rocketmq_average(qs, ms, member) if qs else [])


def test_average_examples() -> None:
    queues = [("t", i) for i in range(5)]
    assert average(queues, ["b", "a"]) == {
        "a": [("t", 0), ("t", 1), ("t", 2)],
        "b": [("t", 3), ("t", 4)],
    }
    assert average(queues[:1], ["a", "b"]) == {"a": [("t", 0)], "b": []}


def test_average_by_circle_example() -> None:
    queues = [("t", i) for i in range(5)]
    assert average_by_circle(queues, ["b", "a"]) == {
        "a": [("t", 0), ("t", 2), ("t", 4)],
        "b": [("t", 1), ("t", 3)],
    }


@fast
@given(queues=queues_st, members=st.lists(member_st, max_size=6), newcomer=member_st)
def test_consistent_hash_join_moves_only_to_newcomer(
    queues: list[Queue], members: list[str], newcomer: str
) -> None:
    members = [m for m in members if m != newcomer]
    before = owners(consistent_hash(queues, members, virtual_nodes=16))
    after = owners(consistent_hash(queues, [*members, newcomer], virtual_nodes=16))
    for q, owner in after.items():
        if q in before:
            assert owner in (before[q], newcomer)


@fast
@given(queues=queues_st, members=st.lists(member_st, min_size=2, max_size=6), data=st.data())
def test_consistent_hash_leave_moves_only_leavers_queues(
    queues: list[Queue], members: list[str], data: st.DataObject
) -> None:
    leaver = data.draw(st.sampled_from(members))
    remaining = [m for m in members if m != leaver]
    before = owners(consistent_hash(queues, members, virtual_nodes=16))
    after = owners(consistent_hash(queues, remaining, virtual_nodes=16))
    for q, owner in before.items():
        if owner != leaver and remaining:
            assert after[q] == owner


def test_consistent_hash_roughly_spreads() -> None:
    queues = [("orders", i) for i in range(256)]
    members = [f"consumer-{i}" for i in range(8)]
    sizes = [len(qs) for qs in consistent_hash(queues, members).values()]
    assert min(sizes) > 0  # not balanced within one, but nobody starves


@pytest.mark.parametrize("bad", [0, -1])
def test_consistent_hash_rejects_bad_virtual_nodes(bad: int) -> None:
    with pytest.raises(ConfigError):
        consistent_hash([("t", 0)], ["a"], virtual_nodes=bad)


@pytest.mark.parametrize("strategy", ALL)
def test_malformed_input_rejected(strategy: AllocationStrategy) -> None:
    with pytest.raises(ConfigError):
        strategy([("t", "0")], ["a"])  # type: ignore[list-item]
    with pytest.raises(ConfigError):
        strategy([("t", 0)], [1])  # type: ignore[list-item]


def test_get_strategy_names_and_callables() -> None:
    assert get_strategy("average") is average
    assert get_strategy("average_by_circle") is average_by_circle
    assert get_strategy("consistent_hash") is consistent_hash
    assert set(STRATEGIES) == {"average", "average_by_circle", "consistent_hash"}

    def custom(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
        return average(queues, members)

    assert get_strategy(custom) is custom


@pytest.mark.parametrize("bad", ["Average", "hash", "", 42, None])
def test_get_strategy_rejects_unknown(bad: object) -> None:
    with pytest.raises(ConfigError):
        get_strategy(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_allocate_for_partitions_queues(name: str) -> None:
    queues = [("t", i) for i in range(10)]
    members = ["c", "a", "b"]
    parts = [allocate_for(m, queues, members, name) for m in members]
    assert sorted(q for part in parts for q in part) == queues
    assert allocate_for("stranger", queues, members, name) == []
    assert allocate_for("a", queues, [], name) == []


def _drops(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    return {members[0]: list(queues[1:])}


def _duplicates(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    return {m: list(queues) for m in members}


def _unknown_member(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    return {"ghost": list(queues)}


def _unknown_queue(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    return {members[0]: [*queues, ("t", 99)]}


def _unhashable(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    return {members[0]: [["t", 0]]}  # type: ignore[list-item]


def _not_a_dict(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    return list(queues)  # type: ignore[return-value]


def _not_a_list(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    return {members[0]: "t0"}  # type: ignore[dict-item]


def _raises(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
    raise ZeroDivisionError("oops")


@pytest.mark.parametrize(
    "buggy",
    [
        _drops,
        _duplicates,
        _unknown_member,
        _unknown_queue,
        _unhashable,
        _not_a_dict,
        _not_a_list,
        _raises,
    ],
)
def test_allocate_for_rejects_buggy_strategy(buggy: AllocationStrategy) -> None:
    queues = [("t", i) for i in range(4)]
    with pytest.raises(ConfigError):
        allocate_for("a", queues, ["a", "b"], buggy)


def test_allocate_chains_strategy_exception() -> None:
    with pytest.raises(ConfigError) as info:
        allocate([("t", 0)], ["a"], _raises)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_allocate_accepts_user_strategy_with_missing_entries_and_normalizes() -> None:
    def all_to_last(queues: Sequence[Queue], members: Sequence[str]) -> dict[str, list[Queue]]:
        return {members[-1]: list(reversed(queues))}

    queues = [("t", 2), ("t", 0), ("t", 1), ("t", 0)]
    assert allocate(queues, ["b", "a", "b"], all_to_last) == {
        "a": [],
        "b": [("t", 0), ("t", 1), ("t", 2)],
    }
    assert Counter(allocate_for("b", queues, ["a", "b"], all_to_last)) == Counter(set(queues))
