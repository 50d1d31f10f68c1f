"""The nemesis's schedule (docs/chaos.md, "The nemesis"): drawn from the seed alone,
a longer run begins with a shorter one's schedule, and a kind that needs what the
machine lacks (root's partitions and tmpfs, etcdctl) is never drawn."""

from __future__ import annotations

import attrs

from tests.chaos.nemesis import KINDS, Fault, schedule, schedule_digest

GROUPS = ["g1", "g2", "g3"]


def _kinds(episodes: list[list[Fault]]) -> set[str]:
    return {f.kind for e in episodes for f in e}


def test_the_seed_alone_gives_the_schedule_and_a_longer_run_starts_alike() -> None:
    a = schedule(41, 300, GROUPS, True, True, True, True)
    b = schedule(41, 300, GROUPS, True, True, True, True)
    assert schedule_digest(a) == schedule_digest(b)
    longer = schedule(41, 1800, GROUPS, True, True, True, True)
    assert [[attrs.asdict(f) for f in e] for e in longer[: len(a) - 1]] == [[attrs.asdict(f) for f in e] for e in a[:-1]]
    assert schedule_digest(schedule(42, 300, GROUPS, True, True, True, True)) != schedule_digest(a)


def test_every_kind_is_drawn_with_every_capability_and_none_that_needs_a_missing_one() -> None:
    full = _kinds(schedule(5, 3 * 3600, GROUPS, True, True, True, True))
    assert full == set(KINDS)
    bare = _kinds(schedule(5, 3 * 3600, GROUPS, False, False, False, False))
    assert bare == {k for k, (_, need) in KINDS.items() if need == ""}
    assert {"disk-full", "etcd-restore", "degrade"}.isdisjoint(bare)


def test_faults_fit_the_run_and_new_kinds_carry_their_parameters() -> None:
    episodes = schedule(7, 600, GROUPS, True, True, True, True)
    for e in episodes:
        for f in e:
            assert 3.0 <= f.at and f.at + f.duration <= 600 - 2.0
            if f.kind == "etcd-proxy":
                assert f.params["mode"] in ("blackhole", "delay", "drop-answers") and 200 <= f.params["delay_ms"] < 1500
            if f.kind == "etcd-restore":
                assert 0.5 <= f.params["drift"] <= 3.0 and f.role == "all"
            if f.kind == "replica-add-remove":
                assert f.group in GROUPS and f.role == "spare"
