"""``equeue cluster verify``'s comparison of replica digests (pure logic; the end-to-end
run against real replicas is in tests/cluster/test_replicated_clients.py)."""

from __future__ import annotations

from equeue import control
from equeue.client.async_admin import (
    GroupVerdict,
    ReplicaAnswer,
    Verdict,
    VerifyReport,
    _gave_up,
    compare_digests,
    judge,
)


def digest(broker: str, position: int, **parts: str) -> control.ReplicaDigest:
    return control.ReplicaDigest(broker, 3, position, {k.replace("_", "/"): v for k, v in parts.items()})


def answer(d: control.ReplicaDigest | None, broker: str = "b?", error: str = "") -> ReplicaAnswer:
    if d is None:
        return ReplicaAnswer(broker, f"127.0.0.1:{len(broker)}", None, error)
    return ReplicaAnswer(d.broker_id, "127.0.0.1:1", d)


def test_equal_digests_have_no_difference() -> None:
    a = digest("b1", 10, topics="aa", messages_0="m0", offsets="oo")
    b = digest("b2", 10, topics="aa", messages_0="m0", offsets="oo")
    assert compare_digests([a, b]) == []
    v = judge("g1", [answer(b), answer(a)])
    assert v is not None and v.verdict is Verdict.EQUAL and v.position == 10 and v.differences == []
    assert [r.broker_id for r in v.replicas] == ["b1", "b2"]


def test_a_differing_part_and_a_missing_part_are_named() -> None:
    a = digest("b1", 7, topics="aa", messages_0="m0", messages_65536="m1")
    b = digest("b2", 7, topics="aa", messages_0="XX")
    c = digest("b3", 7, topics="aa", messages_0="m0", messages_65536="m1")
    assert compare_digests([a, b, c]) == [
        "messages/0: b1=m0, b2=XX, b3=m0",
        "messages/65536: b1=m1, b2=-, b3=m1",
    ]
    v = judge("g1", [answer(a), answer(b), answer(c)])
    assert v is not None and v.verdict is Verdict.DIFFER and len(v.differences) == 2


def test_different_positions_or_a_silent_replica_ask_again() -> None:
    a = digest("b1", 7, topics="aa")
    assert judge("g1", [answer(a), answer(digest("b2", 8, topics="aa"))]) is None
    assert judge("g1", [answer(a), answer(None, "b2", "connection refused")]) is None
    # one live replica: compared with nothing
    v = judge("g1", [answer(a)])
    assert v is not None and v.verdict is Verdict.EQUAL
    # no live replica at all
    none = judge("g2", [])
    assert none is not None and none.verdict is Verdict.INCOMPARABLE and none.detail == "no live replica"


def test_giving_up_says_why() -> None:
    a = digest("b1", 7, topics="aa")
    silent = _gave_up("g1", [answer(a), answer(None, "b2", "connection refused")], 5)
    assert silent.verdict is Verdict.INCOMPARABLE and "b2" in silent.detail and "connection refused" in silent.detail
    moving = _gave_up("g1", [answer(a), answer(digest("b2", 9, topics="aa"))], 5)
    assert "never at one position within 5 s (b1=7, b2=9)" in moving.detail


def verdict(v: Verdict) -> GroupVerdict:
    return GroupVerdict("g", v, None, [], [])


def test_exit_codes() -> None:
    assert VerifyReport([verdict(Verdict.EQUAL), verdict(Verdict.EQUAL)]).exit_code == 0
    assert VerifyReport([verdict(Verdict.EQUAL), verdict(Verdict.INCOMPARABLE)]).exit_code == 2
    assert VerifyReport([verdict(Verdict.INCOMPARABLE), verdict(Verdict.DIFFER)]).exit_code == 1
    assert VerifyReport([]).exit_code == 0
