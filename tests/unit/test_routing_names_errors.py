"""Key routing (equeue.routing), name validation (equeue.names) and the error tree
(equeue.errors)."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import subprocess
import sys
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import equeue
from equeue import errors
from equeue.errors import (
    BrokerError,
    ConfigError,
    CorruptRecord,
    EQueueError,
    ErrorCode,
    InternalBrokerError,
    InvalidName,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    ReservedTopic,
    error_for_code,
)
from equeue.names import (
    MAX_NAME,
    dlq_topic,
    is_ephemeral,
    is_internal,
    retry_topic,
    validate_group,
    validate_topic,
)
from equeue.routing import RoundRobin, key_bytes_hash, key_hash, queue_for_key

# ------------------------------------------------------------------------- routing
#: (key, crc32) pairs: the standard CRC-32 check value and values any zlib computes
KNOWN_HASHES = [
    ("123456789", 0xCBF43926),
    ("", 0),
    ("a", 3904355907),
    ("hello", 907060870),
    ("user-42", 2097592435),
    ("é", 235179326),
    ("日本", 3350711756),
]
KNOWN_QUEUES = [
    ("user-42", 4, 3),
    ("", 4, 0),
    ("user-1", 4, 0),
    ("order-1", 16, 15),
    ("order-1", 8, 7),
    ("hello", 4, 2),
    ("a", 3, 0),
    ("日本", 16, 12),
]


@pytest.mark.parametrize(("key", "crc"), KNOWN_HASHES)
def test_key_hash_known_values(key: str, crc: int) -> None:
    assert key_hash(key) == crc
    assert key_hash(key.encode()) == crc


@pytest.mark.parametrize(("key", "n", "queue"), KNOWN_QUEUES)
def test_queue_for_key_known_values(key: str, n: int, queue: int) -> None:
    assert queue_for_key(key, n) == queue
    assert queue_for_key(key.encode(), n) == queue


def test_documented_example() -> None:
    assert queue_for_key("user-42", 4) == 3


@settings(max_examples=200)
@given(key=st.text(max_size=50), n=st.integers(1, 1024))
def test_queue_for_key_is_crc32_mod_n(key: str, n: int) -> None:
    q = queue_for_key(key, n)
    assert 0 <= q < n
    assert q == (zlib.crc32(key.encode("utf-8")) & 0xFFFFFFFF) % n
    assert q == queue_for_key(key.encode("utf-8"), n)


@settings(max_examples=200)
@given(key=st.binary(max_size=50), n=st.integers(1, 1024))
def test_the_producers_routing_is_queue_for_key(key: bytes, n: int) -> None:
    """The producer's inline fast path and :meth:`equeue.producer.routes.Route.select` pick
    the queue :func:`queue_for_key` names."""
    from equeue.producer.options import ProducerOptions
    from equeue.producer.routes import Route

    assert key_bytes_hash(key) % n == queue_for_key(key, n)
    assert Route("t", n).select(key, ProducerOptions(), b"", None, None, 0) == queue_for_key(key, n)


def test_route_select_round_robin_and_selector() -> None:
    from equeue.producer.options import ProducerOptions
    from equeue.producer.routes import Route

    r = Route("t", 3)
    assert [r.select(None, ProducerOptions(), b"", None, None, 0) for _ in range(4)] == [0, 1, 2, 0]
    pick_last = ProducerOptions(queue_selector=lambda count, msg: count - 1)
    assert r.select(b"k", pick_last, b"", None, None, 0) == 2
    with pytest.raises(ConfigError):
        r.select(b"k", ProducerOptions(queue_selector=lambda count, msg: count), b"", None, None, 0)


@pytest.mark.parametrize("n", [0, -1])
def test_queue_count_must_be_positive(n: int) -> None:
    with pytest.raises(ConfigError):
        queue_for_key("k", n)
    with pytest.raises(ConfigError):
        RoundRobin().next(n)


_SUBPROCESS_KEYS = ["user-42", "", "order-1", "日本", "x" * 100, "a", "hello"]


@pytest.mark.parametrize("seed", ["0", "12345"])
def test_routing_is_independent_of_the_hash_seed(seed: str) -> None:
    code = (
        "import json, sys\n"
        "from equeue.routing import queue_for_key\n"
        "keys = json.loads(sys.argv[1])\n"
        "print(json.dumps([[queue_for_key(k, n) for n in (1, 3, 4, 7, 16)] for k in keys]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(_SUBPROCESS_KEYS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    expected = [[queue_for_key(k, n) for n in (1, 3, 4, 7, 16)] for k in _SUBPROCESS_KEYS]
    assert json.loads(out) == expected
    assert expected[0][2] == 3  # user-42 over 4 queues


def test_round_robin_cycles() -> None:
    rr = RoundRobin()
    assert [rr.next(3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    rr = RoundRobin(start=5)
    assert [rr.next(4) for _ in range(4)] == [1, 2, 3, 0]


def test_package_reexports_routing() -> None:
    assert equeue.queue_for_key is queue_for_key
    assert equeue.key_hash is key_hash


# ------------------------------------------------------------------------- names
VALID = ["a", "orders", "Orders_2024", "a.b-c_d", "0", "-", ".", "x" * MAX_NAME]
INVALID = [
    "",
    "x" * (MAX_NAME + 1),
    "has space",
    "slash/name",
    "tab\t",
    "new\nline",
    "orders\n",
    "ümlaut",
    "日本",
    "star*",
    "a:b",
    "a|b",
]


@pytest.mark.parametrize("name", VALID)
def test_valid_names(name: str) -> None:
    assert validate_topic(name) == name
    assert validate_topic(name, allow_internal=True) == name
    assert validate_group(name) == name
    assert not is_internal(name)


@pytest.mark.parametrize("name", INVALID)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidName):
        validate_topic(name)
    with pytest.raises(InvalidName):
        validate_topic(name, allow_internal=True)
    with pytest.raises(InvalidName):
        validate_group(name)


@pytest.mark.parametrize("value", [None, 42, b"orders", ["orders"]])
def test_non_string_names(value: object) -> None:
    with pytest.raises(InvalidName):
        validate_topic(value)  # type: ignore[arg-type]
    with pytest.raises(InvalidName):
        validate_group(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["%RETRY%g", "%DLQ%group-1", retry_topic("a.b"), dlq_topic("x")])
def test_reserved_topics(name: str) -> None:
    assert is_internal(name)
    with pytest.raises(ReservedTopic):
        validate_topic(name)
    assert validate_topic(name, allow_internal=True) == name


@pytest.mark.parametrize(
    "name", ["%", "%RETRY%", "%DLQ%", "%FOO%g", "%retry%g", "%RETRY%bad name", "%DLQ%a/b", "%x"]
)
def test_malformed_internal_names(name: str) -> None:
    with pytest.raises(InvalidName):
        validate_topic(name)
    with pytest.raises(InvalidName):
        validate_topic(name, allow_internal=True)


def test_internal_topic_helpers() -> None:
    assert retry_topic("g") == "%RETRY%g"
    assert dlq_topic("g") == "%DLQ%g"
    with pytest.raises(InvalidName):
        validate_group("%RETRY%g")


@pytest.mark.parametrize("name", ["g#ephemeral", "a.b-c_1#ephemeral", "x" * 118 + "#ephemeral"])
def test_ephemeral_group_names(name: str) -> None:
    assert validate_group(name) == name and is_ephemeral(name)
    assert not is_ephemeral("g") and not is_ephemeral("ephemeral")
    with pytest.raises(InvalidName):  # never a topic name, nor its retry/dead-letter topics
        validate_topic(name)
    with pytest.raises(InvalidName):
        validate_topic(retry_topic(name), allow_internal=True)


@pytest.mark.parametrize(
    "name",
    ["#ephemeral", "g#Ephemeral", "g#ephemeral#ephemeral", "g#ephemeralx", "g#x", "#g", "a#b#ephemeral",
     "bad name#ephemeral", "g #ephemeral", "x" * 119 + "#ephemeral", "g#ephemeral\n"],
)  # fmt: skip
def test_hash_only_as_the_ephemeral_suffix(name: str) -> None:
    with pytest.raises(InvalidName):
        validate_group(name)


def test_name_errors_have_wire_codes() -> None:
    assert InvalidName("x").code == ErrorCode.INVALID_NAME
    assert ReservedTopic("x").code == ErrorCode.RESERVED_TOPIC
    # an invalid name is also a configuration error (raised before sending)
    assert issubclass(InvalidName, ConfigError)
    assert issubclass(InvalidName, ValueError)


@settings(max_examples=200)
@given(name=st.text(max_size=140))
def test_validate_topic_raises_only_name_errors(name: str) -> None:
    try:
        assert validate_topic(name) == name
    except (InvalidName, ReservedTopic):
        return
    assert not name.startswith("%")
    assert 1 <= len(name) <= MAX_NAME


# ------------------------------------------------------------------------- errors
def _exception_classes() -> list[type[EQueueError]]:
    return [
        obj
        for name, obj in vars(errors).items()
        if inspect.isclass(obj)
        and issubclass(obj, EQueueError)
        and obj.__module__ == errors.__name__
        and not name.startswith("_")
    ]


def test_all_is_complete() -> None:
    public = {
        name
        for name, obj in vars(errors).items()
        if not name.startswith("_")
        and (inspect.isclass(obj) or inspect.isfunction(obj))
        and getattr(obj, "__module__", None) == errors.__name__
    }
    assert set(errors.__all__) == public
    assert len(errors.__all__) == len(set(errors.__all__))
    for cls in _exception_classes():
        assert cls.__name__ in errors.__all__


def test_package_reexports_every_error() -> None:
    for name in errors.__all__:
        assert getattr(equeue, name) is getattr(errors, name)
        assert name in equeue.__all__


def test_every_exception_derives_from_eqeue_error_and_is_in_the_tree() -> None:
    doc = errors.__doc__ or ""
    for obj in vars(errors).values():
        if inspect.isclass(obj) and issubclass(obj, BaseException):
            assert obj.__module__ != errors.__name__ or issubclass(obj, EQueueError), obj
    assert len(_exception_classes()) == 58
    for cls in _exception_classes():
        assert cls.__name__ in doc, f"{cls.__name__} missing from the tree diagram"


def test_no_builtin_shadowing() -> None:
    import builtins

    for name in errors.__all__:
        assert not hasattr(builtins, name), name


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_error_for_code_keeps_the_code(code: ErrorCode) -> None:
    exc = error_for_code(code, "boom")
    assert isinstance(exc, EQueueError)
    assert exc.code == code  # type: ignore[attr-defined]
    assert "boom" in str(exc)
    if code in (ErrorCode.PROTOCOL_ERROR, ErrorCode.UNSUPPORTED_VERSION, ErrorCode.FRAME_TOO_LARGE):
        assert isinstance(exc, RemoteProtocolError)
    else:
        assert isinstance(exc, BrokerError)


def test_error_for_code_accepts_plain_ints() -> None:
    exc = error_for_code(23, "bad crc")
    assert type(exc) is CorruptRecord
    assert exc.code is ErrorCode.CORRUPT_RECORD  # type: ignore[attr-defined]


def test_every_broker_error_class_is_reachable_from_its_code() -> None:
    for cls in _exception_classes():
        if issubclass(cls, BrokerError) and cls is not BrokerError:
            exc = error_for_code(cls.code, "m")
            assert type(exc) is cls, cls
            assert cls().code == cls.code


def test_error_codes_are_unique_per_class() -> None:
    subclasses = [
        c for c in _exception_classes() if issubclass(c, BrokerError) and c is not BrokerError
    ]
    codes = [c.code for c in subclasses]
    assert len(codes) == len(set(codes))


def test_unknown_code_maps_to_internal_error() -> None:
    exc = error_for_code(12345, "what")
    assert isinstance(exc, InternalBrokerError)
    assert exc.code == ErrorCode.INTERNAL_ERROR
    assert "12345" in str(exc) and "what" in str(exc)


def test_error_codes_are_stable() -> None:
    """Other-language clients depend on these numbers."""
    assert {c.name: c.value for c in ErrorCode} == {
        "OK": 0,
        "PROTOCOL_ERROR": 1,
        "UNSUPPORTED_VERSION": 2,
        "FRAME_TOO_LARGE": 3,
        "UNKNOWN_REQUEST": 4,
        "BAD_REQUEST": 5,
        "INVALID_NAME": 10,
        "TOPIC_NOT_FOUND": 11,
        "TOPIC_EXISTS": 12,
        "QUEUE_NOT_FOUND": 13,
        "RESERVED_TOPIC": 14,
        "MESSAGE_TOO_LARGE": 20,
        "STORE_FULL": 21,
        "STORE_ERROR": 22,
        "CORRUPT_RECORD": 23,
        "DELAY_TOO_LONG": 24,
        "MESSAGE_NOT_FOUND": 25,
        "INVALID_MESSAGE": 26,
        "OFFSET_OUT_OF_RANGE": 27,
        "STORE_DAMAGED": 28,
        "STORE_TRUNCATED": 29,
        "BROKER_BUSY": 30,
        "SHUTTING_DOWN": 31,
        "NOT_QUEUE_OWNER": 32,
        "GROUP_HAS_MEMBERS": 33,
        "OUT_OF_ORDER_SEQUENCE": 34,
        "AUTH_REQUIRED": 40,
        "AUTH_FAILED": 41,
        "NOT_AUTHORIZED": 42,
        "UNSUPPORTED_MECHANISM": 43,
        "TOO_MANY_CONNECTIONS": 35,
        "TOO_MANY_PULLS": 36,
        "GROUP_NOT_FOUND": 37,
        "TOPIC_PAUSED": 38,
        "EPHEMERAL_GROUP": 39,
        "NOT_OWNER": 50,
        "QUEUE_UNAVAILABLE": 51,
        "CLUSTER_UNAVAILABLE": 52,
        "NO_LIVE_GROUPS": 53,
        "CLUSTER_DATA_INVALID": 54,
        "NOT_LEADER": 55,
        "NOT_ENOUGH_REPLICAS": 56,
        "STALE_EPOCH": 57,
        "NOT_A_REPLICA": 58,
        "BROKER_ID_CONFLICT": 59,
        "INTERNAL_ERROR": 99,
    }
    assert all(0 <= c <= 0xFFFF for c in ErrorCode)


def test_transient_errors() -> None:
    transient = {c.__name__ for c in _exception_classes() if c.transient}
    assert transient == {
        "ConnectionBroken",
        "OperationTimeout",
        "OutOfOrderSequence",
        "BrokerBusy",
        "BrokerShuttingDown",
        "BufferFull",
        "TooManyConnections",
        "TooManyPulls",
        "NotOwner",
        "QueueUnavailable",
        "ClusterUnavailable",
        "NoLiveGroups",
        "NotLeader",
        "NotEnoughReplicas",
        "StaleEpoch",
        "NotAReplica",
        "TopicPaused",
    }


def _instances() -> list[EQueueError]:
    out: list[EQueueError] = []
    for cls in _exception_classes():
        if issubclass(cls, ProtocolError):
            out.append(cls("proto", ErrorCode.FRAME_TOO_LARGE))
        elif issubclass(cls, BrokerError):
            out.append(cls("broker said no"))
            out.append(cls("with explicit code", ErrorCode.STORE_ERROR))
            out.append(cls())
        else:
            out.append(cls("plain"))  # type: ignore[call-arg]
    out += [error_for_code(c, f"from code {c}") for c in ErrorCode]  # type: ignore[misc]
    return out


@pytest.mark.parametrize("exc", _instances(), ids=lambda e: f"{type(e).__name__}:{e}")
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_exceptions_pickle_round_trip(exc: EQueueError, protocol: int) -> None:
    copy = pickle.loads(pickle.dumps(exc, protocol=protocol))
    assert type(copy) is type(exc)
    assert str(copy) == str(exc)
    assert copy.args == exc.args
    assert getattr(copy, "code", None) == getattr(exc, "code", None)
    assert copy.transient == exc.transient


def test_protocol_errors_carry_codes() -> None:
    assert RemoteProtocolError("x").code == ErrorCode.PROTOCOL_ERROR
    assert LocalProtocolError("x", ErrorCode.UNSUPPORTED_VERSION).code == (
        ErrorCode.UNSUPPORTED_VERSION
    )


def test_broker_error_default_message_is_the_class_name() -> None:
    assert str(CorruptRecord()) == "CorruptRecord"
