"""ProducerOptions: one validated options class; the producers' keyword arguments build it."""

from __future__ import annotations

import math
import uuid
from typing import Any

import attrs
import pytest

from equeue.errors import ConfigError
from equeue.producer import AsyncProducer, OnFull, Producer, ProducerOptions


def test_defaults_are_the_documented_figures() -> None:
    o = ProducerOptions()
    assert (o.retries, o.retry_backoff, o.send_timeout, o.linger) == (3, 0.2, 30.0, 0.005)
    assert (o.max_batch_bytes, o.max_buffered_bytes, o.max_in_flight) == (1 << 20, 64 << 20, 8)
    assert (o.max_message_bytes, o.route_refresh, o.connect_timeout) == (4 << 20, 5.0, 5.0)
    assert o.on_full is OnFull.BLOCK and o.auto_create and not o.stable_id
    assert o.producer_id is None and o.queue_selector is None


@pytest.mark.parametrize(
    "bad",
    [
        {"retries": -1},
        {"retry_backoff": -0.1},
        {"send_timeout": 0},
        {"linger": -1},
        {"max_in_flight": 0},
        {"max_in_flight": 17},
        {"max_batch_bytes": 0},
        {"max_batch_bytes": (8 << 20) + 1},
        {"max_buffered_bytes": 1000, "max_batch_bytes": 2000},
        {"on_full": "drop"},
        {"queue_selector": 3},
        {"max_message_bytes": 0},
        {"route_refresh": 0},
        {"connect_timeout": -1},
        {"producer_id": b"short"},
        {"producer_id": "not-a-uuid"},
        {"retries": "3"},
    ],
)
def test_invalid_values_raise_config_error(bad: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        ProducerOptions(**bad)
    with pytest.raises(ConfigError):
        AsyncProducer("127.0.0.1:1", **bad)


def test_strings_and_ids_are_converted() -> None:
    u = uuid.uuid4()
    o = ProducerOptions(on_full="raise", producer_id=str(u), linger=math.inf)
    assert o.on_full is OnFull.RAISE and o.on_full == "raise"
    assert o.producer_id == u.bytes
    assert ProducerOptions(producer_id=u).producer_id == u.bytes
    assert ProducerOptions(producer_id=bytearray(16)).producer_id == bytes(16)


def test_keywords_build_the_options_and_do_not_mix_with_an_options_object() -> None:
    p = AsyncProducer("127.0.0.1:1", retries=5, on_full="raise")
    assert p.options == ProducerOptions(retries=5, on_full=OnFull.RAISE)
    assert len(p.producer_id) == 16  # random when not given
    fixed = ProducerOptions(producer_id=bytes(range(16)))
    assert AsyncProducer("127.0.0.1:1", options=fixed).producer_id == bytes(range(16))
    with pytest.raises(ConfigError):
        AsyncProducer("127.0.0.1:1", options=fixed, retries=1)
    with pytest.raises(ConfigError):
        Producer("127.0.0.1:1", options=fixed, retries=1)


def test_options_are_frozen_and_evolve() -> None:
    o = ProducerOptions()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        o.retries = 9  # type: ignore[misc]
    assert attrs.evolve(o, retries=9).retries == 9
    with pytest.raises(ConfigError):
        attrs.evolve(o, retries=-9)


def test_retry_policy_follows_the_options() -> None:
    p = ProducerOptions(retries=2, retry_backoff=0.1, send_timeout=7.0).retry_policy
    assert (p.attempts, p.timeout, p.wait_initial, p.wait_max) == (3, 7.0, 0.1, 5.0)
    assert 0.1 <= p.delay(1) <= 0.1 + 0.025
    assert 0.4 <= p.delay(3) <= 0.4 + 0.025
    assert 5.0 <= p.delay(20) <= 5.0 + 0.025
