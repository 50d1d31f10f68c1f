"""Ready-made serializers and deserializers (Kafka style) for the producer and the consumer.

A *serializer* turns an application value into what goes on the wire; a
*deserializer* turns it back. Bodies are bytes; keys are text on the wire (a key
routes by the crc32 of its UTF-8 bytes and is stored as text), so:

- a **value serializer** is ``Callable[[Any], bytes]``, a **value deserializer**
  ``Callable[[bytes], Any]``;
- a **key serializer** is ``Callable[[Any], str]`` (it returns *text*, never bytes),
  a **key deserializer** ``Callable[[str], Any]``. A ``None`` key is never passed to
  either: it stays "no key".

Ready-made pairs: :func:`json_serializer` / :func:`json_deserializer` (UTF-8, compact,
sorted keys: the same value always gives the same bytes), :func:`msgpack_serializer` /
:func:`msgpack_deserializer`, :func:`string_serializer` / :func:`string_deserializer`
(UTF-8 text), and for keys :func:`json_key_serializer` / :func:`json_key_deserializer`
and :func:`string_key_serializer` / :func:`string_key_deserializer` (msgpack output is
not text, so it cannot be a key).

:func:`make_serialize` and :func:`deserialize_into` apply them for the producer and the
consumer: a serializer or deserializer that raises, or returns the wrong type, becomes a
:class:`~equeue.errors.SerializationError` naming it, with the original error as its
``__cause__``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgpack

from equeue.errors import SerializationError
from equeue.models import Message

__all__ = [
    "Deserializer",
    "KeyDeserializer",
    "KeySerializer",
    "Serialize",
    "Serializer",
    "deserialize_into",
    "json_deserializer",
    "json_key_deserializer",
    "json_key_serializer",
    "json_serializer",
    "make_serialize",
    "msgpack_deserializer",
    "msgpack_serializer",
    "string_deserializer",
    "string_key_deserializer",
    "string_key_serializer",
    "string_serializer",
]

#: a value serializer: ``value -> body bytes``
Serializer = Callable[[Any], bytes]
#: a value deserializer: ``body bytes -> value``
Deserializer = Callable[[bytes], Any]
#: a key serializer: ``key -> key text`` (keys are text on the wire)
KeySerializer = Callable[[Any], str]
#: a key deserializer: ``key text -> key``
KeyDeserializer = Callable[[str], Any]
#: what :func:`make_serialize` builds: ``(value, key) -> (body, key text)``
Serialize = Callable[[Any, Any], tuple[bytes, str | None]]

_json_encoder = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False
)
_json_decoder = json.JSONDecoder()


def json_key_serializer(value: Any) -> str:
    """``value`` as compact JSON text (sorted object keys, no NaN/Infinity: they are not
    JSON). Raises TypeError for a value JSON cannot hold, ValueError for NaN/Infinity."""
    return _json_encoder.encode(value)


def json_serializer(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (sorted object keys, so equal values give equal
    bytes). Raises TypeError for a value JSON cannot hold, ValueError for NaN/Infinity."""
    return _json_encoder.encode(value).encode("utf-8")


def json_deserializer(data: bytes) -> Any:
    """A UTF-8 JSON body decoded. Raises ValueError (UnicodeDecodeError,
    json.JSONDecodeError) when it is not."""
    return json.loads(data)


def json_key_deserializer(key: str) -> Any:
    """A JSON key decoded. Raises json.JSONDecodeError (a ValueError) when it is not JSON."""
    return _json_decoder.decode(key)


def msgpack_serializer(value: Any) -> bytes:
    """``value`` as msgpack (str as the str type, bytes as the bin type). Raises
    TypeError for a value msgpack cannot hold, OverflowError for an int beyond 64 bits."""
    return msgpack.packb(value, use_bin_type=True)  # type: ignore[no-any-return]


def msgpack_deserializer(data: bytes) -> Any:
    """A msgpack body decoded (arrays as lists, bin as bytes, str as str; map keys of
    any hashable type). Raises ValueError (msgpack's ExtraData, FormatError,
    StackError are ValueErrors) for bytes that are not exactly one msgpack object."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def string_serializer(value: str) -> bytes:
    """A str as UTF-8. Raises TypeError for anything but a str."""
    if not isinstance(value, str):
        raise TypeError(f"expected a str, got {type(value).__name__}")
    return value.encode("utf-8")


def string_deserializer(data: bytes) -> str:
    """A UTF-8 body as str. Raises UnicodeDecodeError (a ValueError) for invalid UTF-8."""
    return data.decode("utf-8")


def string_key_serializer(value: str) -> str:
    """A str key as it is. Raises TypeError for anything but a str."""
    if not isinstance(value, str):
        raise TypeError(f"expected a str, got {type(value).__name__}")
    return value


def string_key_deserializer(key: str) -> str:
    """A key as it is (text already)."""
    return key


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def make_serialize(
    key_serializer: KeySerializer | None, value_serializer: Serializer | None
) -> Serialize | None:
    """The producer's one serializing step, ``(value, key) -> (body, key)``, or None
    when neither serializer is set (the producer then takes bodies and keys as they
    are: its hot path pays one ``is None`` check).

    Without a value serializer the value goes through as it is (bytes or str, checked
    later as usual); without a key serializer the key does. A ``None`` key is never
    serialized. The step raises SerializationError when a serializer raises (the
    cause chained) or returns the wrong type (bytes-like for a value, str for a key).
    """
    if key_serializer is None and value_serializer is None:
        return None

    def serialize(value: Any, key: Any) -> tuple[Any, Any]:
        if value_serializer is not None:
            try:
                value = value_serializer(value)
            except Exception as exc:
                raise SerializationError(
                    f"value_serializer {_name(value_serializer)} failed on a {type(value).__name__}: {exc!r}"
                ) from exc
            if not isinstance(value, bytes | bytearray | memoryview):
                raise SerializationError(
                    f"value_serializer {_name(value_serializer)} returned a {type(value).__name__}, not bytes"
                )
        if key is not None and key_serializer is not None:
            try:
                key = key_serializer(key)
            except Exception as exc:
                raise SerializationError(
                    f"key_serializer {_name(key_serializer)} failed on a {type(key).__name__}: {exc!r}"
                ) from exc
            if not isinstance(key, str):
                raise SerializationError(
                    f"key_serializer {_name(key_serializer)} returned a {type(key).__name__}, not str "
                    "(keys are text on the wire)"
                )
        return value, key

    return serialize


def deserialize_into(
    msg: Message, key_deserializer: KeyDeserializer | None, value_deserializer: Deserializer | None
) -> None:
    """Deserialize ``msg``'s key and body and keep them on it (``msg.key_value``,
    ``msg.value``; ``msg.key`` and ``msg.body`` are left as they are). A ``None`` key
    stays None. Raises SerializationError naming the deserializer and the message's
    position, its error chained (the consumer treats it as a handler failure)."""
    if value_deserializer is not None:
        msg._set_value(_deserialized("value_deserializer", value_deserializer, msg.body, msg))
    if key_deserializer is not None and msg.key is not None:
        msg._set_key_value(_deserialized("key_deserializer", key_deserializer, msg.key, msg))


def _deserialized(option: str, fn: Callable[[Any], Any], data: Any, msg: Message) -> Any:
    """``fn(data)``; SerializationError naming the option, ``fn`` and ``msg``'s position
    (the error chained) when it raises."""
    try:
        return fn(data)
    except Exception as exc:
        raise SerializationError(f"{option} {_name(fn)} failed on {_where(msg)}: {exc!r}") from exc


def _where(msg: Message) -> str:
    return f"{msg.topic}/{msg.queue_id}@{msg.queue_offset}"
