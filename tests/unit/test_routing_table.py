"""The client's route table rules (client/routing.py ``RouteCache``: revisions,
incarnations, the brokers a table names; ``Router._learn``: the addresses the
bootstrap client falls back to) and the producer's keyless selection over the
available queues (producer/routes.py ``Route.select``)."""

from __future__ import annotations

import zlib

import attrs
from hypothesis import given
from hypothesis import strategies as st

from equeue import control
from equeue.client.async_client import AsyncClient
from equeue.client.routing import MAX_LEARNT, RouteCache, Router
from equeue.producer.options import ProducerOptions
from equeue.producer.routes import Route

GROUPS = ["g1", "g2", "g3"]


def topic(name: str, owners: list[str]) -> control.TopicRoute:
    return control.TopicRoute(control.TopicInfo(name, 1, len(owners)), owners)


def table(revision: int, topics: list[control.TopicRoute], live: list[str], missing: list[str] | None = None) -> control.RouteTable:
    groups = [control.GroupRoute(g, [f"127.0.0.1:{5800 + i}"] if g in live else []) for i, g in enumerate(GROUPS)]
    return control.RouteTable(True, revision, groups, topics, missing or [])


owners_st = st.lists(st.sampled_from(GROUPS), min_size=1, max_size=8)
tables_st = st.lists(
    st.tuples(st.integers(0, 20), owners_st, st.lists(st.sampled_from(GROUPS), unique=True)), min_size=1, max_size=12
)


@given(tables_st)
def test_the_held_revision_never_goes_back_and_the_newest_table_wins(answers: list[tuple[int, list[str], list[str]]]) -> None:
    cache = RouteCache()
    newest: tuple[int, list[str], list[str]] | None = None
    for rev, owners, live in answers:
        took = cache.merge(table(rev, [topic("t", owners)], live))
        assert took == (newest is None or rev >= newest[0])
        if took:
            newest = (rev, owners, live)
        assert newest is not None
        assert cache.revision == newest[0]
        # the owners and the availability are those of the newest table taken
        assert cache.topics["t"].owners == newest[1]
        for q, g in enumerate(newest[1]):
            assert cache.owner("t", q) == g
            assert cache.available("t", q) == (g in newest[2])
        assert cache.available_queues("t") == [q for q, g in enumerate(newest[1]) if g in newest[2]]
        assert cache.live_groups() == sorted(newest[2])


def test_an_older_table_only_adds_unknown_topics() -> None:
    cache = RouteCache()
    cache.merge(table(5, [topic("a", ["g1", "g2"])], ["g1", "g2"]))
    assert not cache.merge(table(3, [topic("a", ["g3", "g3"]), topic("b", ["g3"])], ["g3"]))
    assert cache.topics["a"].owners == ["g1", "g2"]  # not replaced by the stale answer
    assert cache.owner("b", 0) == "g3"  # but a topic never seen is routed somewhere
    assert cache.live_groups() == ["g1", "g2"] and cache.revision == 5


def test_missing_topics_are_dropped_and_unknown_queues_have_no_owner() -> None:
    cache = RouteCache()
    cache.merge(table(1, [topic("a", ["g1"]), topic("b", ["g2"])], GROUPS))
    cache.merge(table(2, [], GROUPS, missing=["a"]))
    assert "a" not in cache.topics and cache.owner("a", 0) is None
    assert cache.owner("b", 0) == "g2"
    assert cache.owner("b", 1) is None and cache.owner("b", -1) is None and not cache.available("b", 1)


def test_standalone_owner_is_the_bootstrap_and_always_available() -> None:
    cache = RouteCache()
    cache.merge(control.RouteTable(False, 0, [], [topic("a", ["", "", ""])]))
    assert [cache.owner("a", q) for q in range(3)] == ["", "", ""]
    assert cache.available_queues("a") == [0, 1, 2] and cache.live_groups() == [""]
    assert cache.table().topics == [topic("a", ["", "", ""])]


@given(owners_st, st.lists(st.sampled_from(GROUPS), unique=True), st.integers(1, 200))
def test_keyless_messages_round_robin_over_the_available_queues_only(
    owners: list[str], live: list[str], n: int
) -> None:
    cache = RouteCache()
    cache.merge(table(1, [topic("t", owners)], live))
    route = Route("t", len(owners))
    available = cache.available_queues("t")
    route.available = None if len(available) == len(owners) else available
    picked = [route.select(None, ProducerOptions(), b"x", None, None, 0) for _ in range(n)]
    if available:
        # round-robin over the available queues: each in turn, none other
        assert picked == [available[i % len(available)] for i in range(n)]
    else:  # every group down: spread over all (the sends wait, then fail with QUEUE_UNAVAILABLE)
        assert set(picked) <= set(range(len(owners)))


@given(st.binary(min_size=1, max_size=16), owners_st, st.lists(st.sampled_from(GROUPS), unique=True))
def test_keyed_messages_keep_their_queue_whatever_is_down(key: bytes, owners: list[str], live: list[str]) -> None:
    cache = RouteCache()
    cache.merge(table(1, [topic("t", owners)], live))
    route = Route("t", len(owners))
    available = cache.available_queues("t")
    route.available = None if len(available) == len(owners) else available
    assert route.select(key, ProducerOptions(), b"x", None, None, 0) == zlib.crc32(key) % len(owners)


# ------------------------------------------------------------------ incarnations
def inc_table(incarnation: str, revision: int, owners: list[str]) -> control.RouteTable:
    return attrs.evolve(table(revision, [topic("t", owners)], GROUPS), incarnation=incarnation)


@given(st.lists(st.tuples(st.sampled_from(["", "A", "B"]), st.integers(0, 20), owners_st), min_size=1, max_size=12))
def test_a_table_of_another_incarnation_is_taken_whatever_its_revision(answers: list[tuple[str, int, list[str]]]) -> None:
    """The model: a table is taken when it names an incarnation other than the held
    one, else when its revision is not older; one naming none ("") never changes the
    held incarnation."""
    cache = RouteCache()
    held_inc, held_rev, held_owners = "", -1, None
    for inc, rev, owners in answers:
        expected = bool(inc and inc != held_inc) or rev >= held_rev
        assert cache.merge(inc_table(inc, rev, owners)) == expected
        if expected:
            held_inc, held_rev, held_owners = inc or held_inc, rev, owners
        assert (cache.incarnation, cache.revision) == (held_inc, held_rev)
        assert cache.topics["t"].owners == held_owners
        assert cache.table().incarnation == held_inc


def test_an_etcd_that_lost_its_data_is_followed_and_its_revisions_then_count() -> None:
    cache = RouteCache()
    assert cache.merge(inc_table("A", 900, ["g1"]))
    assert not cache.merge(inc_table("A", 899, ["g2"]))  # older, same incarnation: stale
    assert cache.merge(inc_table("B", 12, ["g2"]))  # a new etcd: its revisions start low
    assert cache.owner("t", 0) == "g2" and (cache.incarnation, cache.revision) == ("B", 12)
    assert not cache.merge(inc_table("B", 11, ["g3"]))  # within B, the revision rule again
    assert cache.merge(inc_table("", 13, ["g3"]))  # a broker predating incarnations: by revision
    assert not cache.merge(inc_table("", 12, ["g1"]))
    assert (cache.incarnation, cache.owner("t", 0)) == ("B", "g3")


# ------------------------------------------------------------------ learnt brokers
def replicated(revision: int, groups: dict[str, tuple[list[str], list[str]]]) -> control.RouteTable:
    return control.RouteTable(
        True, revision, [control.GroupRoute(n, leader, reps) for n, (leader, reps) in groups.items()], []
    )


def test_the_brokers_of_a_table_are_the_leaders_then_the_replicas_each_once() -> None:
    cache = RouteCache()
    cache.merge(replicated(1, {
        "g2": (["h:4"], ["h:4", "h:5"]),
        "g1": (["h:2"], ["h:1", "h:2", "h:3"]),
        "g3": ([], ["h:6"]),  # no leader now: its replicas still answer GET_ROUTES
    }))  # fmt: skip
    assert cache.brokers() == ["h:2", "h:4", "h:1", "h:3", "h:5", "h:6"]


def test_the_bootstrap_client_tries_its_own_brokers_then_every_one_learnt() -> None:
    """Router._learn (no I/O: the bootstrap client is never connected): the learnt
    addresses follow the bootstrap list, newest table first, those of older tables
    kept after them, at most MAX_LEARNT."""
    boot = AsyncClient("h:1,h:9")
    router = Router(boot, refresh_interval=60)
    router.cache.merge(replicated(1, {"g1": (["h:1"], ["h:1", "h:2", "h:3"])}))
    router._learn()
    assert router.learnt == ["h:2", "h:3"]
    assert boot.brokers == [("h", 1), ("h", 9), ("h", 2), ("h", 3)]
    # h:2 died and left the group; h:4 joined: both still tried, the newest first
    router.cache.merge(replicated(2, {"g1": (["h:3"], ["h:1", "h:3", "h:4"])}))
    router._learn()
    assert router.learnt == ["h:3", "h:4", "h:2"]
    assert boot.brokers == [("h", 1), ("h", 9), ("h", 3), ("h", 4), ("h", 2)]
    many = [f"m:{i}" for i in range(MAX_LEARNT + 10)]
    router.cache.merge(replicated(3, {"g1": (["m:0"], many)}))
    router._learn()
    assert router.learnt == many[:MAX_LEARNT] and boot.brokers[:2] == [("h", 1), ("h", 9)]
