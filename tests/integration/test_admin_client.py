"""The admin client (``AdminClient``, blocking, and ``AsyncAdminClient``, trio) against a
real broker: topics created, described, altered, paused and resumed, and deleted; a
group's offsets reset, the group paused, resumed and deleted; message lookups; bad
input refused before anything is sent."""

from __future__ import annotations

import time

import pytest
import trio

from equeue import AdminClient, AsyncAdminClient, Message, wire
from equeue.broker import Broker, EmbeddedBroker
from equeue.client import Client
from equeue.control import ResetTarget
from equeue.errors import (
    ClientClosed,
    ConfigError,
    GroupNotFound,
    InvalidName,
    TopicExists,
    TopicNotFound,
    TopicPaused,
)


def _produce(c: Client, topic: str, queue: int, bodies: list[str], key: str | None = None) -> None:
    c.produce(wire.ProduceRequest(topic, queue, [wire.encode_entry(Message(b, key=key)) for b in bodies]))


def test_topic_lifecycle(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    with AdminClient(b) as admin, Client(b) as c:
        info = admin.create_topic("orders", 2, retention_ms=3_600_000)
        assert (info.name, info.queues, info.retention_ms) == ("orders", 2, 3_600_000)
        with pytest.raises(TopicExists):
            admin.create_topic("orders", 2)
        assert admin.create_topic("orders", 2, exist_ok=True).name == "orders"
        assert "orders" in {t.name for t in admin.list_topics(include_internal=False)}

        _produce(c, "orders", 0, ["a", "b", "c"])
        _produce(c, "orders", 1, ["d"])
        d = admin.describe_topic("orders")
        assert d.info.queues == 2 and d.owners == ["", ""]
        assert [q.count if q is not None else None for q in d.queues] == [3, 1]

        # paused: the broker refuses produce and every view says so; resumed: accepted again
        assert admin.pause_topic("orders").changed
        assert not admin.pause_topic("orders").changed  # already paused: nothing changed
        assert admin.describe_topic("orders").info.paused
        assert next(t for t in admin.list_topics() if t.name == "orders").paused
        with pytest.raises(TopicPaused):
            _produce(c, "orders", 0, ["refused"])
        assert admin.resume_topic("orders").changed
        assert not admin.describe_topic("orders").info.paused
        _produce(c, "orders", 0, ["accepted"])

        assert admin.alter_topic("orders", queues=3).queues == 3
        assert len(admin.describe_topic("orders").queues) == 3

        admin.delete_topic("orders")
        with pytest.raises(TopicNotFound):
            admin.describe_topic("orders")
        assert "orders" not in {t.name for t in admin.list_topics()}


def test_group_offsets_pause_and_delete(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    with AdminClient(b) as admin, Client(b) as c:
        admin.create_topic("t", 2)
        for q in range(2):
            _produce(c, "t", q, [f"{q}-{i}" for i in range(5)])
        c.commit_offset("billing", "t", 0, 2)
        c.commit_offset("billing", "t", 1, 4)
        assert "billing" in {g.group for g in admin.list_groups()}
        d = admin.describe_group("billing")
        assert d.members == [] and {(q.queue_id, q.committed) for q in d.queues} == {(0, 2), (1, 4)}

        assert admin.reset_offsets("billing", "t", ResetTarget.EARLIEST) == {0: 0, 1: 0}
        assert [c.query_offset("billing", "t", q) for q in range(2)] == [0, 0]
        assert admin.reset_offsets("billing", "t", "latest") == {0: 5, 1: 5}
        assert [c.query_offset("billing", "t", q) for q in range(2)] == [5, 5]

        assert admin.pause_group("billing").changed
        assert admin.describe_group("billing").paused
        assert next(g for g in admin.list_groups() if g.group == "billing").paused
        assert admin.resume_group("billing").changed
        assert not admin.describe_group("billing").paused

        answers = admin.delete_group("billing")
        assert sum(a.offsets for a in answers.values()) == 2
        with pytest.raises(GroupNotFound):
            admin.describe_group("billing")
        with pytest.raises(GroupNotFound):
            admin.delete_group("billing")


def test_message_lookups(embedded_broker: EmbeddedBroker) -> None:
    b = embedded_broker.address
    with AdminClient(b) as admin, Client(b) as c:
        admin.create_topic("m", 1)
        before = int(time.time() * 1000)
        _produce(c, "m", 0, ["first", "second"], key="user-42")
        _produce(c, "m", 0, ["other"], key="user-7")
        got = admin.get_message("m", 0, 1)
        assert [m.body for m in got.messages] == [b"second"]
        by_global = admin.get_message("m", global_offset=got.messages[0].global_offset)
        assert [m.body for m in by_global.messages] == [b"second"]
        found = admin.find_by_key("m", "user-42")
        assert sorted(m.body for m in found.messages) == [b"first", b"second"]
        assert admin.offset_for_time("m", 0, before) == 0
        assert admin.offset_for_time("m", 0, int(time.time() * 1000) + 60_000) == 3
        assert admin.list_skipped("m") == {}
        skipped = admin.skip_message("m", 0, 2)
        assert (skipped.queue_offset, skipped.already_skipped) == (2, False)
        assert admin.list_skipped("m") == {0: [2]}
        status = admin.cluster_status()
        assert not status.cluster
        [row] = admin.broker_stats()
        assert row.stats is not None and row.error == ""


def test_bad_input_is_refused_before_anything_is_sent(embedded_broker: EmbeddedBroker) -> None:
    admin = AdminClient(embedded_broker.address)
    try:
        with pytest.raises(InvalidName):
            admin.describe_group("bad name with spaces")
        with pytest.raises(ConfigError):
            admin.reset_offsets("g", "t", "yesterday")
        with pytest.raises(ConfigError):
            admin.get_message("t")
        with pytest.raises(ConfigError):
            admin.create_topic("t", 1, compression="gzip")
    finally:
        admin.close()
    with pytest.raises(ClientClosed):
        admin.list_topics()


async def test_async_admin_client(broker: Broker) -> None:
    with trio.fail_after(30):
        async with AsyncAdminClient(broker.address) as admin:
            assert (await admin.create_topic("a", 2)).queues == 2
            assert (await admin.pause_topic("a")).paused
            assert (await admin.describe_topic("a")).info.paused
            assert (await admin.resume_topic("a")).changed
            report = await admin.cluster_report()
            assert not report.status.cluster and [h.reachable for h in report.health] == [True]
            await admin.delete_topic("a")
            with pytest.raises(TopicNotFound):
                await admin.describe_topic("a")
        with pytest.raises(ClientClosed):
            await admin.list_topics()


def test_a_refusal_is_the_brokers_error_not_an_exception_group(embedded_broker: EmbeddedBroker) -> None:
    """Operations that fan out over the broker groups (a nursery) raise the refusal
    itself, in every front; a closed client raises ClientClosed; arguments are checked
    before any thread starts."""
    with AdminClient(embedded_broker.address) as admin:
        with pytest.raises(InvalidName):
            admin.dlq_list("bad name!")
    with pytest.raises(ConfigError):
        AdminClient("")
    with pytest.raises(ConfigError):
        Client("")


async def test_a_closed_admin_client_refuses_and_a_fan_out_refusal_is_plain(broker: Broker) -> None:
    with trio.fail_after(20):
        async with AsyncAdminClient(broker.address) as admin:
            with pytest.raises(InvalidName):
                await admin.dlq_list("bad name!")
            await admin.aclose()
            with pytest.raises(ClientClosed):
                await admin.list_topics()


async def test_a_recovery_plan_names_a_replica_that_does_not_answer(broker: Broker) -> None:
    """One replica answers (a real broker), the other is registered alive but refuses
    connections: the plan lists both, the second with its error, and chooses the first
    (the registration is the route etcd would give; only it is stood in for)."""
    from equeue import control
    from equeue.client.async_admin import _plan_recovery
    from equeue.security import ClientSecurity

    class Registered:
        security = ClientSecurity()

        async def cluster_status(self) -> control.ClusterStatus:
            brokers = [control.BrokerStatus("b1", "g1", broker.address, 0, True),
                       control.BrokerStatus("b2", "g1", "127.0.0.1:1", 0, True)]  # fmt: skip
            return control.ClusterStatus(True, "g1", "b1", [], True, 1, [control.GroupStatus("g1", brokers, 0, {}, False)])

    class Routes:
        bootstrap = Registered()

    with trio.fail_after(20):
        plan = await _plan_recovery(Routes(), "g1", connect_timeout=1)  # type: ignore[arg-type]
    assert [(c.broker_id, not c.error) for c in plan.candidates] == [("b1", True), ("b2", False)]
    assert plan.leader == "b1"
