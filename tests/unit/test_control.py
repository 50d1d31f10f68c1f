"""Control-plane payloads (equeue.control): JSON round trips and malformed input."""

from __future__ import annotations

import json
import typing
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from equeue import control
from equeue.control import REQUEST_TYPES, decode, encode
from equeue.errors import RemoteProtocolError
from equeue.protocol import RequestCode

ANSWER_TYPES: list[type] = [
    control.TopicInfo,
    control.QueueStats,
    control.TopicDescription,
    control.OffsetAnswer,
    control.ResetAnswer,
    control.MemberInfo,
    control.HeartbeatAnswer,
    control.GroupSummary,
    control.GroupQueue,
    control.GroupDescription,
    control.DeleteGroupAnswer,
    control.BrokerStats,
    control.SendBackAnswer,
    control.DeadLetter,
    control.DlqPage,
    control.DlqResendAnswer,
    control.GroupRoute,
    control.TopicRoute,
    control.RouteTable,
    control.BrokerStatus,
    control.GroupStatus,
    control.ClusterStatus,
]

#: floats travel as JSON numbers: NaN would never compare equal after a round trip
finite_floats = st.floats(allow_nan=False, allow_infinity=False)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy for a control field type, filling in *every* attrs field (even
    the ones with defaults, which ``st.builds`` would leave alone)."""
    if attrs.has(tp):
        attrs.resolve_types(tp)
        return st.builds(tp, **{f.name: strategy_for(f.type) for f in attrs.fields(tp)})
    if tp is float:
        return finite_floats
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is list:
        return st.lists(strategy_for(args[0]), max_size=4)
    if origin is dict:
        return st.dictionaries(strategy_for(args[0]), strategy_for(args[1]), max_size=4)
    if args and type(None) in args:  # X | None
        (inner,) = [a for a in args if a is not type(None)]
        return st.none() | strategy_for(inner)
    return st.from_type(tp)


ALL_MODELS = sorted([*REQUEST_TYPES.values(), *ANSWER_TYPES], key=lambda c: c.__name__)


def test_request_types_are_keyed_by_their_code() -> None:
    assert len(REQUEST_TYPES) == 35
    for code, cls in REQUEST_TYPES.items():
        assert getattr(cls, "CODE") == code  # noqa: B009
        assert isinstance(code, RequestCode)
        assert attrs.has(cls)
    # the hot paths are packed binary, never JSON
    assert RequestCode.PRODUCE not in REQUEST_TYPES
    assert RequestCode.PULL not in REQUEST_TYPES


def test_code_is_not_a_field() -> None:
    for cls in REQUEST_TYPES.values():
        assert "CODE" not in attrs.fields_dict(cls)


@pytest.mark.parametrize("cls", ALL_MODELS, ids=lambda c: c.__name__)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    obj = data.draw(strategy_for(cls))
    payload = encode(obj)
    assert isinstance(payload, bytes)
    json.loads(payload)  # plain JSON
    assert decode(payload, cls) == obj


@settings(max_examples=50)
@given(infos=st.lists(strategy_for(control.TopicInfo), max_size=5))
def test_list_round_trip(infos: list[control.TopicInfo]) -> None:
    assert decode(encode(infos), list[control.TopicInfo]) == infos


def test_known_encoding() -> None:
    assert encode(control.CreateTopic("orders", 8)) == (
        b'{"name":"orders","queues":8,"retention_ms":null,"retention_bytes":null,"exist_ok":false,'
        b'"compression":null}'
    )
    assert encode(control.AlterTopic("t", retention_ms=-1, reset=["retention_bytes"])) == (
        b'{"name":"t","queues":null,"retention_ms":-1,"retention_bytes":null,"reset":["retention_bytes"],'
        b'"compression":null}'
    )
    assert encode(control.ResetAnswer({1: 2})) == b'{"offsets":{"1":2}}'
    assert decode(b'{"offsets":{"1":2}}', control.ResetAnswer) == control.ResetAnswer({1: 2})


def test_defaults_fill_missing_fields() -> None:
    assert decode(b'{"name":"t"}', control.CreateTopic) == control.CreateTopic("t")
    # an ALTER_TOPIC of a client that knows no ``reset``: nothing is reset
    assert decode(b'{"name":"t","retention_ms":5}', control.AlterTopic) == control.AlterTopic("t", retention_ms=5)
    assert control.AlterTopic("t").reset == []
    assert decode(b'{"group":"g","consumer_id":"c","topics":["t"]}', control.Heartbeat) == (
        control.Heartbeat("g", "c", ["t"])
    )


def test_route_tables_with_and_without_replicas_and_incarnation() -> None:
    table = control.RouteTable(True, 7, [control.GroupRoute("g1", ["h:1"], ["h:1", "h:2"])], [], [], "c0ffee")
    assert encode(table) == (
        b'{"cluster":true,"revision":7,"groups":[{"name":"g1","addresses":["h:1"],"replicas":["h:1","h:2"]}],'
        b'"topics":[],"missing":[],"incarnation":"c0ffee"}'
    )
    # the answer of a broker that predates both fields: no replicas, no incarnation
    old = b'{"cluster":true,"revision":7,"groups":[{"name":"g1","addresses":["h:1"]}],"topics":[],"missing":[]}'
    assert decode(old, control.RouteTable) == control.RouteTable(True, 7, [control.GroupRoute("g1", ["h:1"])], [])
    assert decode(old, control.RouteTable).incarnation == "" and control.GroupRoute("g", []).replicas == []
    for bad in (b'"replicas":"h:1"', b'"replicas":[1]'):  # a wrong type is a bad payload, not a list of letters
        with pytest.raises(RemoteProtocolError):
            decode(b'{"name":"g1","addresses":[],' + bad + b"}", control.GroupRoute)
    with pytest.raises(RemoteProtocolError):
        decode(old[:-1] + b',"incarnation":5}', control.RouteTable)


@pytest.mark.parametrize("cls", [control.ListTopics, control.ListGroups, control.Stats])
def test_empty_payload_means_all_defaults(cls: type) -> None:
    assert decode(b"", cls) == cls()


def test_unknown_keys_are_ignored() -> None:
    """Newer clients may add fields; older brokers ignore them."""
    assert decode(b'{"name":"t","future":1}', control.DeleteTopic) == control.DeleteTopic("t")


@pytest.mark.parametrize(
    "payload",
    [
        b"{",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"null",
        b"42",
        b'"name"',
        b"{}",  # missing required field
        b'{"name":null}',  # not the topic "None"
        b'{"name":5}',
        b'{"name":["a"]}',
        b'{"name":"t","queues":"many"}',
        b'{"name":"t","queues":[1]}',
        b'{"name":"t","queues":1.9}',  # not silently truncated
        b'{"name":"t","queues":true}',
        b'{"name":"t","retention_ms":false}',
        b'{"name":"t","exist_ok":"false"}',  # bool("false") would be True
        b'{"name":"t","exist_ok":1}',
    ],
)
def test_malformed_payload_raises_remote_protocol_error(payload: bytes) -> None:
    with pytest.raises(RemoteProtocolError):
        decode(payload, control.CreateTopic)


@pytest.mark.parametrize(
    ("payload", "cls"),
    [
        (b'{"name":"t","reset":"retention_ms"}', control.AlterTopic),  # a list, not a string
        (b'{"name":"t","reset":[1]}', control.AlterTopic),
        (b'{"name":"t","reset":[null]}', control.AlterTopic),
        (b'{"offsets":{"x":1}}', control.ResetAnswer),
        (b'{"offsets":[1,2]}', control.ResetAnswer),
        (b'{"info":{},"queues":[]}', control.TopicDescription),
        (b'{"group":"g","consumer_id":"c","topics":5}', control.Heartbeat),
    ],
)
def test_malformed_nested_payload_raises_remote_protocol_error(payload: bytes, cls: type) -> None:
    with pytest.raises(RemoteProtocolError):
        decode(payload, cls)


@pytest.mark.parametrize("cls", ALL_MODELS, ids=lambda c: c.__name__)
@settings(max_examples=25)
@given(payload=st.binary(max_size=60))
def test_garbage_raises_only_remote_protocol_error(cls: type, payload: bytes) -> None:
    try:
        decode(payload, cls)
    except RemoteProtocolError:
        pass


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | finite_floats | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=10,
)


@pytest.mark.parametrize("cls", ALL_MODELS, ids=lambda c: c.__name__)
@settings(max_examples=25)
@given(value=json_values)
def test_wrong_shaped_json_raises_only_remote_protocol_error(cls: type, value: object) -> None:
    try:
        decode(json.dumps(value).encode(), cls)
    except RemoteProtocolError:
        pass


def test_converter_is_dedicated() -> None:
    import cattrs

    assert control.converter is not cattrs.global_converter


def test_reset_target_is_an_enum_on_the_wire_as_its_string() -> None:
    req = control.ResetOffsets("g", "t", "earliest")
    assert req.to is control.ResetTarget.EARLIEST
    assert json.loads(encode(req))["to"] == "earliest"
    assert decode(b'{"group": "g", "topic": "t", "to": "time", "timestamp_ms": 5}', control.ResetOffsets).to is (
        control.ResetTarget.TIME
    )
    with pytest.raises(RemoteProtocolError):  # answered as a coded error, never a crash
        decode(b'{"group": "g", "topic": "t", "to": "yesterday"}', control.ResetOffsets)


@given(
    kind=st.sampled_from(["topic", "group"]),
    name=st.text(min_size=1, max_size=20),
    paused=st.booleans(),
    changed=st.booleans(),
)
def test_pause_answers_round_trip(kind: str, name: str, paused: bool, changed: bool) -> None:
    answer = control.PauseAnswer(kind, name, paused, changed)
    assert control.decode(control.encode(answer), control.PauseAnswer) == answer
    for req in (control.PauseTopic(name), control.ResumeTopic(name), control.PauseGroup(name), control.ResumeGroup(name)):
        assert control.decode(control.encode(req), type(req)) == req
        assert control.REQUEST_TYPES[req.CODE] is type(req)
