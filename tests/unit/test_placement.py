"""equeue.placement: the etcd records' JSON (one encoder, one decoder each) and the
placement rules (spread, grow, load), with hypothesis properties."""

from __future__ import annotations

import json
from collections import Counter

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue.errors import BadRequest, ClusterDataInvalid, ErrorCode, InvalidName, NoLiveGroups
from equeue.placement import (
    BrokerRecord,
    GroupRecord,
    PauseRecord,
    TopicPlacement,
    broker_key,
    decode_broker,
    decode_group,
    decode_pause,
    decode_topic,
    encode_broker,
    encode_group,
    encode_pause,
    encode_topic,
    group_key,
    grow,
    isr_key,
    leader_key,
    load,
    parse_key,
    pause_key,
    spread,
    topic_key,
)

names = st.text(st.sampled_from("abcdefgh-_.%0123"), min_size=1, max_size=12)
group_lists = st.lists(names, min_size=1, max_size=6, unique=True)
ms = st.integers(0, 2**53)
#: a retention override: none (the brokers' default), -1 (keep forever) or a limit
retention = st.none() | st.just(-1) | st.integers(1, 2**53)

groups = st.builds(GroupRecord, name=names, created_ms=ms)
brokers = st.builds(
    BrokerRecord, group=names, broker_id=names, address=names, started_ms=ms,
    pid=st.integers(0, 2**31), version=st.text(max_size=10),
)  # fmt: skip

pauses = st.builds(PauseRecord, kind=st.sampled_from(["topic", "group"]), name=names, since_ms=ms)


@st.composite
def topics(draw: st.DrawFn) -> TopicPlacement:
    owners = draw(st.lists(names, min_size=1, max_size=40))
    return TopicPlacement(
        name=draw(names), queues=len(owners), owners=tuple(owners), created_ms=draw(ms),
        retention_ms=draw(retention), retention_bytes=draw(retention),
        compression=draw(st.none() | st.sampled_from(["producer", "none", "zstd", "lz4"])),
    )  # fmt: skip


CODECS = [
    (encode_group, decode_group, groups),
    (encode_broker, decode_broker, brokers),
    (encode_topic, decode_topic, topics()),
    (encode_pause, decode_pause, pauses),
]


@pytest.mark.parametrize(("encode", "decode", "strategy"), CODECS, ids=["group", "broker", "topic", "pause"])
def test_round_trip(encode, decode, strategy) -> None:  # type: ignore[no-untyped-def]
    @given(strategy)
    def check(record: object) -> None:
        data = encode(record)
        assert decode(data) == record
        assert isinstance(json.loads(data), dict)

    check()


@pytest.mark.parametrize("decode", [decode_group, decode_broker, decode_topic, decode_pause])
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_garbage_never_crashes(decode, data: bytes) -> None:  # type: ignore[no-untyped-def]
    try:
        decode(data)
    except ClusterDataInvalid as exc:
        assert exc.code == ErrorCode.CLUSTER_DATA_INVALID


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


@given(
    record=topics(),
    field=st.sampled_from(
        ["name", "queues", "owners", "created_ms", "retention_ms", "retention_bytes"]
    ),
    value=json_values,
)
def test_a_wrong_field_is_refused_or_still_valid(
    record: TopicPlacement, field: str, value: object
) -> None:
    """Any JSON value in any field: a valid record or ClusterDataInvalid, never
    another exception, never a record that breaks its invariants."""
    obj = json.loads(encode_topic(record))
    obj[field] = value
    try:
        decoded = decode_topic(json.dumps(obj).encode())
    except ClusterDataInvalid:
        return
    assert len(decoded.owners) == decoded.queues >= 1 and all(decoded.owners)


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b'{"name":"t","queues":2,"owners":["a"],"created_ms":1}', "1 owners for 2 queues"),
        (b'{"name":"t","queues":0,"owners":[],"created_ms":1}', "queues"),
        (b'{"name":"t","queues":1,"owners":[""],"created_ms":1}', "empty"),
        (
            b'{"name":"t","queues":"1","owners":["a"],"created_ms":1,"retention_ms":1.5}',
            "retention_ms",
        ),
        (b'{"name":"t","queues":true,"owners":["a"],"created_ms":1}', "integer"),
        (b'{"name":"t","owners":["a"],"created_ms":1}', "queues"),
        (b'{"name":"t","queues":1,"owners":["a"],"created_ms":1,"compression":"gzip"}', "compression"),
        (b"[]", "not an object"),
        (b"\xff", ""),
    ],
)
def test_bad_topic_records(payload: bytes, why: str) -> None:
    with pytest.raises(ClusterDataInvalid, match="TopicPlacement") as info:
        decode_topic(payload)
    assert why in str(info.value)


def test_retention_forever_is_written_as_earlier_versions_read_no_limit() -> None:
    """-1 (keep forever) goes to etcd as 0, which every earlier version reads as "no
    limit" (and accepts: they refuse negative values); 0 or a negative value read
    from etcd is -1, never a limit that deletes."""
    rec = TopicPlacement("t", 1, ("a",), 5, retention_ms=-1, retention_bytes=None)
    obj = json.loads(encode_topic(rec))
    assert (obj["retention_ms"], obj["retention_bytes"]) == (0, None)
    assert decode_topic(encode_topic(rec)) == rec
    for stored in (0, -1, -1000):
        raw = json.dumps({"name": "t", "queues": 1, "owners": ["a"], "created_ms": 5, "retention_bytes": stored})
        assert decode_topic(raw.encode()).retention_bytes == -1
    limited = TopicPlacement("t", 1, ("a",), 5, retention_ms=60_000)
    assert json.loads(encode_topic(limited))["retention_ms"] == 60_000


def test_extra_fields_are_ignored() -> None:
    """A newer broker's extra field does not break an older one."""
    rec = GroupRecord("g1", 5)
    obj = json.loads(encode_group(rec)) | {"leader_epoch": 3}
    assert decode_group(json.dumps(obj).encode()) == rec


def test_keys() -> None:
    assert group_key("g1") == "/equeue/groups/g1"
    assert broker_key("g1", "b-1") == "/equeue/brokers/g1/b-1"
    assert topic_key("%RETRY%cg") == "/equeue/topics/%RETRY%cg"
    assert parse_key("/equeue/groups/g1") == ("group", ("g1",))
    assert parse_key("/equeue/brokers/g1/b-1") == ("broker", ("g1", "b-1"))
    assert parse_key("/equeue/topics/t") == ("topic", ("t",))
    assert parse_key("/equeue/leaders/g1") == ("leader", ("g1",))
    assert parse_key("/equeue/isr/g1") == ("isr", ("g1",))
    for other in (
        "/equeue/leaders/g1/x",
        "/equeue/isr/",
        "/equeue/topics/",
        "/equeue/brokers/g1",
        "/equeue/brokers/g/b/c",
        "/x",
    ):
        assert parse_key(other) is None
    for bad in ("", "a/b", "x" * 256, "tab\t"):
        with pytest.raises(InvalidName):
            topic_key(bad)


@given(names, names)
def test_key_round_trip(group: str, broker: str) -> None:
    assert parse_key(broker_key(group, broker)) == ("broker", (group, broker))
    assert parse_key(topic_key(group)) == ("topic", (group,))
    assert parse_key(leader_key(group)) == ("leader", (group,))
    assert parse_key(isr_key(group)) == ("isr", (group,))
    assert parse_key(pause_key("topic", group)) == ("paused", ("topic", group))
    assert parse_key(pause_key("group", broker)) == ("paused", ("group", broker))


def test_pause_keys_and_records() -> None:
    assert pause_key("topic", "orders") == "/equeue/paused/topic/orders"
    assert pause_key("group", "cg") == "/equeue/paused/group/cg"
    for other in ("/equeue/paused/queue/x", "/equeue/paused/topic", "/equeue/paused/topic/a/b", "/equeue/paused/"):
        assert parse_key(other) is None  # another kind (a newer layout's), or garbage: ignored
    with pytest.raises(BadRequest):
        pause_key("queue", "x")
    with pytest.raises(InvalidName):
        pause_key("topic", "a/b")
    for bad in (b'{"kind":"queue","name":"x","since_ms":1}', b'{"kind":"topic","name":"","since_ms":1}',
                b'{"kind":"topic","name":"x","since_ms":-1}', b'{"kind":"topic","name":"x"}'):  # fmt: skip
        with pytest.raises(ClusterDataInvalid, match="PauseRecord"):
            decode_pause(bad)


# ----------------------------------------------------------------------------- rules
def test_spread_twelve_over_three() -> None:
    owners = spread(12, ["g3", "g1", "g2"], {})
    assert Counter(owners) == {"g1": 4, "g2": 4, "g3": 4}
    assert owners[:3] == ("g1", "g2", "g3")  # interleaved, ties by name


def test_spread_starts_from_the_least_loaded() -> None:
    owners = spread(4, ["g1", "g2", "g3"], {"g1": 5, "g2": 3, "g3": 4})
    assert owners == ("g2", "g2", "g3", "g1")  # g2 reaches 5 with g3's 5 and g1's 5


def test_grow_keeps_existing_and_fills_the_least_loaded() -> None:
    p = TopicPlacement("t", 8, spread(8, ["a", "b"], {}), 1)
    grown = grow(p, 4, ["a", "b", "c"], load([p]))
    assert grown.owners[:8] == p.owners
    assert grown.owners[8:] == ("c", "c", "c", "c")  # c owns 0, a and b own 4 each
    assert grown.queues == 12 and grow(p, 0, [], {}) is p


def test_errors() -> None:
    with pytest.raises(NoLiveGroups) as info:
        spread(3, [], {})
    assert info.value.transient and info.value.code == ErrorCode.NO_LIVE_GROUPS
    with pytest.raises(BadRequest):
        spread(0, ["a"], {})
    p = TopicPlacement("t", 2, ("a", "a"), 1)
    with pytest.raises(BadRequest):
        grow(p, -1, ["a"], {})
    with pytest.raises(NoLiveGroups):
        grow(p, 1, [], {})
    with pytest.raises(ValueError):
        attrs.evolve(p, queues=3)


def test_load_counts_queues_per_group() -> None:
    ps = [TopicPlacement("t1", 3, ("a", "b", "a"), 1), TopicPlacement("t2", 1, ("c",), 1)]
    assert load(ps) == {"a": 2, "b": 1, "c": 1}
    assert load([]) == {}


@given(queues=st.integers(1, 200), live=group_lists, base=st.integers(0, 50))
def test_spread_is_balanced_within_one_when_load_is_equal(
    queues: int, live: list[str], base: int
) -> None:
    owners = spread(queues, live, dict.fromkeys(live, base))
    counts = Counter(owners)
    per_group = [counts.get(g, 0) for g in live]
    assert max(per_group) - min(per_group) <= 1
    assert set(owners) <= set(live) and len(owners) == queues


@given(
    queues=st.integers(1, 100), live=group_lists, extra=st.integers(0, 100),
    loads=st.dictionaries(names, st.integers(0, 100)), data=st.data(),
)  # fmt: skip
def test_grow_never_moves_and_places_on_live_groups_only(
    queues: int, live: list[str], extra: int, loads: dict[str, int], data: st.DataObject
) -> None:
    old_owners = data.draw(st.lists(names, min_size=queues, max_size=queues))
    p = TopicPlacement("t", queues, tuple(old_owners), 1)
    grown = grow(p, extra, live, loads)
    assert grown.owners[:queues] == p.owners
    assert set(grown.owners[queues:]) <= set(live)
    assert grown.queues == queues + extra
    # least loaded first: after growing, the new queues leave the live groups' loads
    # (their old load + what they got) as level as possible
    got = Counter(grown.owners[queues:])
    final = [loads.get(g, 0) + got.get(g, 0) for g in live]
    for g in live:
        if got.get(g, 0):  # a group that got a queue was not above another's final load minus one
            assert loads.get(g, 0) + got[g] - 1 <= min(final)


@given(
    queues=st.integers(1, 100), live=group_lists, loads=st.dictionaries(names, st.integers(0, 100))
)
def test_spread_is_deterministic(queues: int, live: list[str], loads: dict[str, int]) -> None:
    assert spread(queues, live, loads) == spread(queues, list(reversed(live)), dict(loads))


def test_a_record_without_compression_reads_as_the_brokers_default() -> None:
    """A placement written before topics had a compression setting takes the brokers'
    ``--compression``; one with a setting round-trips it."""
    raw = b'{"name":"t","queues":1,"owners":["a"],"created_ms":1}'
    assert decode_topic(raw).compression is None
    rec = TopicPlacement("t", 1, ("a",), 5, compression="zstd")
    assert json.loads(encode_topic(rec))["compression"] == "zstd"
    assert decode_topic(encode_topic(rec)) == rec
