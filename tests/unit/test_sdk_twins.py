"""The SDK fronts stay twins of their trio cores: every public method of a core has a
method of the same name in each front over it, with the same parameter names, kinds and
defaults (annotations are not compared: a front may narrow or restate them).

Deliberate differences are listed once, in DIFFERENCES, each with its reason; the test
fails on any other difference and on an entry that is no longer needed."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from equeue import aio
from equeue.client.admin import AdminClient
from equeue.client.async_admin import AsyncAdminClient
from equeue.client.async_client import AsyncClient
from equeue.client.client import Client
from equeue.consumer import AsyncConsumer, Consumer
from equeue.producer import AsyncProducer, Producer

#: (core, front) pairs: the blocking fronts and the asyncio fronts over the trio cores
PAIRS: list[tuple[type, type]] = [
    (AsyncClient, Client),
    (AsyncAdminClient, AdminClient),
    (AsyncProducer, Producer),
    (AsyncConsumer, Consumer),
    (AsyncClient, aio.AsyncClient),
    (AsyncAdminClient, aio.AsyncAdminClient),
    (AsyncProducer, aio.AsyncProducer),
    (AsyncConsumer, aio.AsyncConsumer),
]

#: dunders that are part of the public surface of a core
PUBLIC_DUNDERS = ("__aenter__", "__aexit__", "__aiter__")

#: the core's method renamed in every front (same parameters)
RENAMED = {
    ("Client", "aclose"): "close",
    ("AdminClient", "aclose"): "close",
    ("Producer", "aclose"): "close",
    ("Consumer", "aclose"): "close",
}

_LOOP = "loop-thread plumbing of the trio client: callable on its own trio loop only"
_WITH = "a blocking front is a plain context manager (with), not an async one"
_CONSUMER_LOOP = (
    "the core's interface for a front on another thread: the front iterates with its own "
    "iterator, and puts back a batch its interrupted poll took"
)
_NOWAIT = "never blocks and is callable on the trio loop only; the front's send_async is its non-blocking send"

#: (front class name qualified by module, core method) -> why the front differs
DIFFERENCES: dict[tuple[str, str], str] = {
    **{
        (front, name): _LOOP
        for front in ("equeue.client.client.Client", "equeue.aio.client.AsyncClient")
        for name in (
            "answer",
            "brokers",
            "can_send_now",
            "connected",
            "connection_epoch",
            "cork",
            "uncork",
            "drop_connection",
            "retarget",
            "send_request",
            "send_request_nowait",
        )
    },
    **{
        (front, name): _WITH
        for front in (
            "equeue.client.client.Client",
            "equeue.client.admin.AdminClient",
            "equeue.producer.producer.Producer",
            "equeue.consumer.consumer.Consumer",
        )
        for name in ("__aenter__", "__aexit__")
    },
    ("equeue.consumer.consumer.Consumer", "__aiter__"): "a blocking front iterates with __iter__",
    **{
        (front, name): "the admin client's trio connection and route table: usable on its own trio loop only"
        for front in ("equeue.client.admin.AdminClient", "equeue.aio.admin.AsyncAdminClient")
        for name in ("client", "router")
    },
    **{
        (front, "__aexit__"): "takes *exc: asyncio's exit needs no exception names"
        for front in (
            "equeue.aio.client.AsyncClient",
            "equeue.aio.admin.AsyncAdminClient",
            "equeue.aio.consumer.AsyncConsumer",
        )
    },
    **{
        (front, name): _NOWAIT
        for front in ("equeue.producer.producer.Producer", "equeue.aio.producer.AsyncProducer")
        for name in ("send_nowait", "submit_nowait", "submit")
    },
    ("equeue.producer.producer.Producer", "flush"): (
        "flush(timeout): a blocking caller bounds the wait with a timeout; "
        "the async flush() is bounded by the caller's cancel scope"
    ),
    **{
        (front, "poll"): (
            "poll(timeout, max_messages): a caller on another thread or loop bounds the wait with a "
            "timeout, as confluent-kafka's; the trio poll is bounded by the caller's cancel scope"
        )
        for front in ("equeue.consumer.consumer.Consumer", "equeue.aio.consumer.AsyncConsumer")
    },
    **{
        (front, name): _CONSUMER_LOOP
        for front in ("equeue.consumer.consumer.Consumer", "equeue.aio.consumer.AsyncConsumer")
        for name in ("iteration", "undo_poll")
    },
}


def _public(cls: type) -> list[str]:
    return sorted(n for n in dir(cls) if not n.startswith("_") or n in PUBLIC_DUNDERS)


def _shape(cls: type, name: str) -> Any:
    """Parameter names, kinds and defaults of ``cls.name`` ("property" for one)."""
    if isinstance(inspect.getattr_static(cls, name), property):
        return "property"
    attr = getattr(cls, name)
    if not callable(attr):
        return "attribute"
    params = list(inspect.signature(attr).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return [(p.name, p.kind, p.default) for p in params]


def _key(front: type) -> str:
    return f"{front.__module__}.{front.__qualname__}"


def _differences(core: type, front: type) -> dict[str, str]:
    """Each core method the front has no exact twin of, with what is wrong."""
    found: dict[str, str] = {}
    for name in _public(core):
        twin = RENAMED.get((front.__name__, name), name)
        if not hasattr(front, twin):
            found[name] = f"{_key(front)} has no {twin}"
            continue
        want, got = _shape(core, name), _shape(front, twin)
        if want != got:
            found[name] = f"{_key(front)}.{twin}: {got} != core's {want}"
    return found


@pytest.mark.parametrize(("core", "front"), PAIRS, ids=[_key(f) for _, f in PAIRS])
def test_front_is_a_twin_of_its_core(core: type, front: type) -> None:
    found = _differences(core, front)
    listed = {name for (f, name) in DIFFERENCES if f == _key(front)}
    unexplained = {n: why for n, why in found.items() if n not in listed}
    assert not unexplained, f"differences not in DIFFERENCES: {unexplained}"


def test_every_listed_difference_is_still_needed() -> None:
    found = {(_key(front), name) for core, front in PAIRS for name in _differences(core, front)}
    stale = sorted(set(DIFFERENCES) - found)
    assert not stale, f"DIFFERENCES entries no longer needed: {stale}"


def test_a_missing_twin_is_found() -> None:
    """The comparison sees a missing method, a renamed parameter and a changed default."""

    class Core:
        async def a(self, x: int, y: int = 1) -> None: ...
        async def b(self, x: int) -> None: ...
        async def c(self, x: int = 1) -> None: ...
        async def d(self) -> None: ...

    class Front:
        def a(self, x: int, y: int = 1) -> None: ...
        def b(self, z: int) -> None: ...
        def c(self, x: int = 2) -> None: ...

    assert sorted(_differences(Core, Front)) == ["b", "c", "d"]
