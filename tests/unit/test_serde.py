"""Serializers and deserializers (equeue.serde), Message.value / key_value, and strict
(str to str) message properties."""

from __future__ import annotations

import copy
import math
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from equeue import wire
from equeue.consumer import ConsumerOptions
from equeue.consumer.invoke import deserializing
from equeue.errors import ConfigError, EQueueError, SerializationError
from equeue.models import Message, check_props
from equeue.producer import ProducerOptions
from equeue.serde import (
    deserialize_into,
    json_deserializer,
    json_key_deserializer,
    json_key_serializer,
    json_serializer,
    make_serialize,
    msgpack_deserializer,
    msgpack_serializer,
    string_deserializer,
    string_key_deserializer,
    string_key_serializer,
    string_serializer,
)
from equeue.wire import batches


def _values(ints: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none()
        | st.booleans()
        | ints
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=12,
    )


json_values = _values(st.integers())
#: msgpack integers are 64-bit (signed or unsigned)
msgpack_values = _values(st.integers(-(1 << 63), (1 << 64) - 1))


@given(json_values)
def test_json_round_trips(value: Any) -> None:
    assert json_deserializer(json_serializer(value)) == value
    assert json_key_deserializer(json_key_serializer(value)) == value


def test_json_is_compact_sorted_utf8() -> None:
    assert json_serializer({"b": [1, 2], "a": "é"}) == '{"a":"é","b":[1,2]}'.encode()
    assert json_serializer({"a": 1, "b": 2}) == json_serializer({"b": 2, "a": 1})
    assert json_key_serializer({"user": 7}) == '{"user":7}'
    with pytest.raises(ValueError):
        json_serializer(math.nan)  # not JSON
    with pytest.raises(TypeError):
        json_serializer(object())
    with pytest.raises(ValueError):
        json_deserializer(b"\xff")


@given(msgpack_values | st.binary())
def test_msgpack_round_trips(value: Any) -> None:
    assert msgpack_deserializer(msgpack_serializer(value)) == value


def test_msgpack_keeps_bytes_and_non_str_map_keys() -> None:
    value = {1: b"\x00raw", "s": ["x", 2.5, None]}
    assert msgpack_deserializer(msgpack_serializer(value)) == value
    with pytest.raises(ValueError):
        msgpack_deserializer(msgpack_serializer(1) + b"\x01")  # two objects, not one
    with pytest.raises(TypeError):
        msgpack_serializer(object())
    with pytest.raises(OverflowError):
        msgpack_serializer(1 << 64)


def test_string_serializers() -> None:
    assert string_serializer("žluť") == "žluť".encode()
    assert string_deserializer("žluť".encode()) == "žluť"
    assert string_key_serializer("k") == string_key_deserializer("k") == "k"
    with pytest.raises(TypeError):
        string_serializer(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        string_key_serializer(1)  # type: ignore[arg-type]
    with pytest.raises(UnicodeDecodeError):
        string_deserializer(b"\xff")


def test_make_serialize_is_none_without_serializers() -> None:
    assert make_serialize(None, None) is None


def test_make_serialize_applies_them_and_leaves_none_keys() -> None:
    both = make_serialize(json_key_serializer, json_serializer)
    assert both is not None
    assert both({"n": 1}, ["k", 1]) == (b'{"n":1}', '["k",1]')
    assert both([1], None) == (b"[1]", None)
    value_only = make_serialize(None, msgpack_serializer)
    assert value_only is not None
    assert value_only("x", b"raw-key") == (
        msgpack_serializer("x"),
        b"raw-key",
    )  # the key goes as it is
    key_only = make_serialize(json_key_serializer, None)
    assert key_only is not None
    assert key_only(b"body", 5) == (b"body", "5")


def test_a_failing_serializer_is_a_serialization_error_naming_it() -> None:
    serialize = make_serialize(json_key_serializer, json_serializer)
    assert serialize is not None
    with pytest.raises(
        SerializationError, match="value_serializer json_serializer failed on a object"
    ) as info:
        serialize(object(), None)
    assert isinstance(info.value.__cause__, TypeError)
    assert isinstance(info.value, EQueueError) and isinstance(info.value, ValueError)
    with pytest.raises(
        SerializationError, match="key_serializer json_key_serializer failed on a set"
    ):
        serialize(1, {1})


def test_a_serializer_returning_the_wrong_type_is_refused() -> None:
    serialize = make_serialize(lambda k: k.encode(), lambda v: str(v))
    assert serialize is not None
    with pytest.raises(SerializationError, match="returned a str, not bytes"):
        serialize(1, None)
    serialize = make_serialize(lambda k: k.encode(), None)
    assert serialize is not None
    with pytest.raises(SerializationError, match="returned a bytes, not str"):
        serialize(b"x", "k")


def _consumed(body: bytes, key: str | None) -> Message:
    """A message as the consumer's record decoder makes it (slots set directly)."""
    [m] = batches.decode_records(batches.encode_record(Message(body, key=key)), 1)
    m.topic, m.queue_id, m.queue_offset = "t", 2, 7
    return m


def test_value_and_key_value_without_deserializers() -> None:
    m = _consumed(b"raw", "k")
    assert (m.value, m.key_value) == (b"raw", "k")
    assert Message(b"x").key_value is None


def test_deserialize_into_keeps_body_and_key() -> None:
    m = _consumed(b'{"a":[1]}', '"user-1"')
    deserialize_into(m, json_key_deserializer, json_deserializer)
    assert (m.value, m.key_value) == ({"a": [1]}, "user-1")
    assert (m.body, m.key) == (b'{"a":[1]}', '"user-1"')
    no_key = _consumed(b"[]", None)
    deserialize_into(no_key, json_key_deserializer, json_deserializer)
    assert (no_key.value, no_key.key_value) == ([], None)


def test_a_failing_deserializer_names_it_and_the_message() -> None:
    m = _consumed(b"not json", None)
    with pytest.raises(
        SerializationError, match=r"value_deserializer json_deserializer failed on t/2@7"
    ) as info:
        deserialize_into(m, None, json_deserializer)
    assert isinstance(info.value.__cause__, ValueError)
    k = _consumed(b"1", "not json")
    with pytest.raises(
        SerializationError, match="key_deserializer json_key_deserializer failed on t/2@7"
    ):
        deserialize_into(k, json_key_deserializer, None)


def test_a_failed_message_raises_on_access() -> None:
    m = _consumed(b"x", "k")
    err = SerializationError("boom")
    m._set_failed(err)
    with pytest.raises(SerializationError, match="boom"):
        _ = m.value
    with pytest.raises(SerializationError, match="boom"):
        _ = m.key_value


def test_the_deserialized_value_survives_pickle_and_copy_and_is_not_compared() -> None:
    m = _consumed(b"[1]", "k")
    deserialize_into(m, string_key_deserializer, json_deserializer)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(m, protocol=protocol))
        assert (back.value, back.key_value, back) == ([1], "k", m)
    assert copy.copy(m).value == copy.deepcopy(m).value == [1]
    assert m == _consumed(b"[1]", "k")  # equality is the message's, not what was made of it
    assert repr(m) == repr(_consumed(b"[1]", "k"))
    plain = pickle.loads(pickle.dumps(_consumed(b"z", None)))
    assert plain.value == b"z"


def test_deserializing_wraps_only_with_deserializers() -> None:
    def handler(m: Message) -> Any:
        return m.value

    assert deserializing(handler, ConsumerOptions(), False) is handler
    wrapped = deserializing(handler, ConsumerOptions(value_deserializer=json_deserializer), False)
    assert wrapped(_consumed(b'{"x":1}', None)) == {"x": 1}
    with pytest.raises(SerializationError):
        wrapped(_consumed(b"{", None))


async def test_deserializing_wraps_async_handlers() -> None:
    async def handler(m: Message) -> Any:
        return m.key_value

    wrapped = deserializing(handler, ConsumerOptions(key_deserializer=json_key_deserializer), True)
    assert await wrapped(_consumed(b"", "[2]")) == [2]


def test_options_take_callables_only() -> None:
    assert ProducerOptions(value_serializer=json_serializer).value_serializer is json_serializer
    with pytest.raises(ConfigError, match="value_serializer must be callable"):
        ProducerOptions(value_serializer="json")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="key_serializer must be callable"):
        ProducerOptions(key_serializer=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="value_deserializer must be callable"):
        ConsumerOptions(value_deserializer="json")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="key_deserializer must be callable"):
        ConsumerOptions(key_deserializer=b"x")  # type: ignore[arg-type]


# ---------------------------------------------------------------- strict properties
@pytest.mark.parametrize(
    ("props", "match"),
    [
        ({"n": 1}, "property 'n' must be a str, not int"),
        ({"n": None}, "property 'n' must be a str, not NoneType"),
        ({"n": b"v"}, "property 'n' must be a str, not bytes"),
        ({1: "v"}, "property names must be str, not int"),
    ],
)
def test_properties_are_str_to_str(props: dict[Any, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match):
        check_props(props)
    with pytest.raises(TypeError, match=match):
        Message(b"x", properties=props)
    with pytest.raises(TypeError, match=match):
        wire.pack_entry(b"x", None, None, {"ok": "v", **props})
    m = Message(b"x")
    m.properties.update(props)  # past the converter: the encoders still refuse it
    with pytest.raises(TypeError, match=match):
        wire.encode_entry(m)
    with pytest.raises(TypeError, match=match):
        batches.encode_record(m)
    with pytest.raises(TypeError, match=match):
        m.properties = props  # attrs runs the converter on assignment too


def test_str_properties_and_str_subclasses_pass() -> None:
    class Name(str):
        pass

    m = Message(b"x", properties={Name("a"): Name("b"), "c": ""})
    assert m.properties == {"a": "b", "c": ""}
    [back] = batches.decode_records(batches.encode_record(m), 1)
    assert back.properties == {"a": "b", "c": ""}
    entry = wire.encode_entry(m)
    assert wire.decode_entries(entry, 0, 1)[0].properties == {"a": "b", "c": ""}
