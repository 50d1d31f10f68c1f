"""The asyncio front (equeue.aio) against a real broker, each test under asyncio.run:
round trip, a Starlette app producing, a worker committing, cancellation, timeouts,
shutdown, uvloop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from equeue import ClientClosed, Message, control
from equeue.aio import AsyncAdminClient, AsyncClient, AsyncConsumer, AsyncProducer
from equeue.broker import EmbeddedBroker
from equeue.errors import TopicNotFound

FAST: dict[str, Any] = dict(heartbeat_interval=0.2, rebalance_interval=0.2, commit_interval=0.2, pull_hold=1.0)


def loop_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("equeue-aio-"))


async def wait_for(cond: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not await cond():
            await asyncio.sleep(0.02)


def test_round_trip_and_iteration(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("rt", 2)
        async with AsyncProducer(addr) as p:
            r = await p.send("rt", b"first", key="k")
            assert r.topic == "rt" and r.queue_offset == 0
            handles = [await p.send_async("rt", f"m{i}", key=f"k{i % 4}") for i in range(200)]
            assert await p.flush() == 0
            results = [await h for h in handles]
            assert all(h.done() for h in handles)
            assert len({(x.queue_id, x.queue_offset) for x in results}) == 200
            assert len(await p.send_batch("rt", [b"b1", b"b2"])) == 2
        got: list[str] = []
        async with AsyncConsumer(addr, "g-rt", "rt", start_from="earliest", **FAST) as con:
            async for msg in con:
                got.append(msg.text)
                if len(got) == 203:
                    con.stop()
        assert sorted(got) == sorted(["first", "b1", "b2", *(f"m{i}" for i in range(200))])
        async with AsyncClient(addr) as c:
            assert sum([await c.query_offset("g-rt", "rt", q) for q in range(2)]) == 203

    asyncio.run(main())
    assert loop_threads() == 0


def test_starlette_app_produces(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncProducer(addr) as producer:

            async def publish(request: Request) -> JSONResponse:
                body = await request.body()
                r = await producer.send("web", body, key=request.path_params["key"])
                return JSONResponse({"queue": r.queue_id, "offset": r.queue_offset})

            app = Starlette(routes=[Route("/publish/{key}", publish, methods=["POST"])])
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as http:
                answers = await asyncio.gather(*(http.post(f"/publish/k{i % 3}", content=f"e{i}") for i in range(30)))
        assert all(a.status_code == 200 for a in answers)
        assert len({(a.json()["queue"], a.json()["offset"]) for a in answers}) == 30
        seen: list[str] = []
        async with AsyncConsumer(addr, "g-web", "web", start_from="earliest", **FAST) as con:
            async for msg in con:
                seen.append(msg.text)
                if len(seen) == 30:
                    con.stop()
        assert sorted(seen) == sorted(f"e{i}" for i in range(30))

    asyncio.run(main())


def test_worker_async_handler_commits(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("jobs", 2)
        async with AsyncProducer(addr) as p:
            for i in range(40):
                await p.send_async("jobs", f"j{i}")
            await p.flush()
        loop = asyncio.get_running_loop()
        handled: list[str] = []
        failed_once: set[str] = set()
        assigned: list[set[tuple[str, int]]] = []

        async def on_assigned(queues: set[tuple[str, int]]) -> None:
            assert asyncio.get_running_loop() is loop  # listeners run on the caller's loop
            assigned.append(queues)

        async with AsyncConsumer(addr, "g-jobs", "jobs", start_from="earliest", on_assigned=on_assigned, **FAST) as con:

            async def handler(msg: Message) -> None:
                assert asyncio.get_running_loop() is loop  # handlers run on the caller's loop
                await asyncio.sleep(0.001)
                if msg.text == "j7" and msg.text not in failed_once:
                    failed_once.add(msg.text)
                    raise RuntimeError("fails once: retried")
                handled.append(msg.text)
                if len(set(handled)) == 40:
                    await con.commit()
                    con.stop()

            await con.run(handler)
            assert con.statistics().consumed >= 40
        assert set(handled) == {f"j{i}" for i in range(40)} and "j7" in failed_once
        assert assigned and {q for qs in assigned for q in qs} >= {("jobs", 0), ("jobs", 1)}
        async with AsyncClient(addr) as c:
            assert sum([await c.query_offset("g-jobs", "jobs", q) for q in range(2)]) == 40

    asyncio.run(main())


def test_chunk_failure_goes_to_retry_and_dead_letter(embedded_broker: EmbeddedBroker) -> None:
    """A chunk crosses to the asyncio loop once (its handler calls share one task); a
    message failing inside it is retried, then dead-lettered, while the rest of its chunk
    is processed once and committed."""
    addr = embedded_broker.address
    n = 300

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("chunked", 1)
        async with AsyncProducer(addr) as p:
            for i in range(n):
                await p.send_async("chunked", f"c{i}")
            await p.flush()
        per_task: dict[asyncio.Task[Any], list[str]] = {}
        poison: list[Message] = []
        calls: list[str] = []
        async with AsyncConsumer(addr, "g-chunked", "chunked", start_from="earliest", max_reconsume_times=1,
                                 retry_delays=[0.05], **FAST) as con:  # fmt: skip

            async def handler(msg: Message) -> None:
                task = asyncio.current_task()
                assert task is not None
                seen = per_task.setdefault(task, [])
                seen.append(msg.text)
                calls.append(msg.text)
                if not poison and len(seen) > 1 and msg.reconsume_times == 0:
                    poison.append(msg)  # not the first of its chunk: its chunk goes on after it
                if poison and msg.text == poison[0].text:
                    raise RuntimeError("poison")

            running = asyncio.ensure_future(con.run(handler))

            async def settled() -> bool:
                st = con.statistics()
                return st.dead_lettered == 1 and st.consumed >= n - 1

            await wait_for(settled)
            await con.commit()
            con.stop()
            await running
        bad = poison[0]
        chunk = next(seen for seen in per_task.values() if bad.text in seen)
        assert len(chunk) > 1 and len(per_task) < len(calls)  # chunks, not one hop per message
        assert calls.count(bad.text) == 2  # first try, then once from the retry topic
        others = [t for t in calls if t != bad.text]
        assert sorted(others) == sorted(f"c{i}" for i in range(n) if f"c{i}" != bad.text)  # each once
        async with AsyncClient(addr) as c:
            assert await c.query_offset("g-chunked", "chunked", 0) == n
            page = await c.dlq_list("g-chunked")
            assert [(d.origin_topic, d.origin_offset, d.reconsume_times) for d in page.letters] == [
                ("chunked", bad.queue_offset, 1)
            ]

    asyncio.run(main())


def test_cancel_send_and_run_timeout(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("cx", 1)
        async with AsyncProducer(addr, linger=0.5) as p:
            await p.send("cx", b"warm")  # the route is known: the next send buffers at once
            task = asyncio.create_task(p.send("cx", b"cancelled-wait"))
            await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await p.flush() == 0  # the buffered message was still sent
        started = asyncio.Event()
        async with AsyncConsumer(addr, "g-cx", "cx", start_from="earliest", **FAST) as con:

            async def slow(msg: Message) -> None:
                started.set()
                await asyncio.sleep(60)

            run = asyncio.create_task(con.run(slow))
            await asyncio.wait_for(started.wait(), 10)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            # a timeout: the wait ends at the deadline (the handler is cancelled, not done)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.3):
                    await con.run(slow)
        async with AsyncClient(addr) as c:
            assert await c.query_offset("g-cx", "cx", 0) == 0  # nothing finished: nothing committed
        got: list[str] = []
        async with AsyncConsumer(addr, "g-cx", "cx", **FAST) as con:
            async for msg in con:
                got.append(msg.text)
                if len(got) == 2:
                    break
        assert got == ["warm", "cancelled-wait"]  # delivered again

    asyncio.run(main())


def test_shutdown(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address

    async def main() -> None:
        p = AsyncProducer(addr)
        with pytest.raises(ClientClosed):
            await p.send("sd", b"not open")
        await p.start()
        assert loop_threads() == 1
        h = await p.send_async("sd", b"x")
        await p.aclose()  # flushes
        assert (await h).queue_offset == 0
        assert loop_threads() == 0
        with pytest.raises(ClientClosed):
            await p.send("sd", b"closed")
        await p.aclose()  # idempotent
        left = AsyncClient(addr)
        await left.start()
        await left.list_topics()
        # left open on purpose: asyncio.run ends; its loop thread ends when it is collected

    asyncio.run(main())


def test_admin_client_creates_describes_pauses_and_deletes_a_topic(embedded_broker: EmbeddedBroker) -> None:
    addr = embedded_broker.address

    async def main() -> None:
        before = loop_threads()  # an earlier test's client left open ends when collected
        async with AsyncAdminClient(addr) as admin:
            assert loop_threads() == before + 1
            info = await admin.create_topic("adm", 2)
            assert info.name == "adm" and info.queues == 2
            async with AsyncProducer(addr) as p:
                await p.send("adm", b"before")
                d = await admin.describe_topic("adm")
                assert d.info.queues == 2 and sum(q.count for q in d.queues if q is not None) == 1
                assert (await admin.pause_topic("adm")).changed
                assert (await admin.describe_topic("adm")).info.paused
                assert next(t for t in await admin.list_topics() if t.name == "adm").paused
                held = await p.send_async("adm", b"held")  # refused while paused, resent after
                assert (await admin.resume_topic("adm")).changed
                assert not (await admin.describe_topic("adm")).info.paused
                assert (await held).topic == "adm"
            await admin.delete_topic("adm")
            with pytest.raises(TopicNotFound):
                await admin.describe_topic("adm")
            assert "adm" not in {t.name for t in await admin.list_topics()}
        assert loop_threads() == before
        with pytest.raises(ClientClosed):
            await admin.list_topics()

    asyncio.run(main())


def test_uvloop(embedded_broker: EmbeddedBroker) -> None:
    import uvloop  # a dev dependency: the test runs, never skips
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncProducer(addr) as p:
            await p.send("uv", b"u1")
        async with AsyncConsumer(addr, "g-uv", "uv", start_from="earliest", **FAST) as con:

            async def handler(msg: Message) -> None:
                assert msg.text == "u1"
                con.stop()

            await con.run(handler)

    uvloop.run(main())


def test_manual_assignment_seek_and_low_level_calls(embedded_broker: EmbeddedBroker) -> None:
    """The asyncio consumer's assign and seek, and the client's request-level methods
    (call, send_back), forward to the trio cores."""
    addr = embedded_broker.address

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("man", 1)
        async with AsyncProducer(addr) as p:
            for i in range(5):
                await p.send("man", f"m{i}")
        async with AsyncConsumer(addr, None, (), start_from="earliest", **FAST) as con:
            con.assign([("man", 0)])
            assert con.assignment() == {("man", 0)}
            con.seek("man", 0, 3)
            got: list[str] = []
            async for msg in con:
                got.append(msg.text)
                if msg.text == "m4":
                    con.stop()
            assert got == ["m3", "m4"]
        async with AsyncClient(addr) as c:
            stats = await c.call(control.QueueOffsets("man", 0), control.QueueStats)
            assert stats.max_offset == 5
            answer = await c.send_back("g-man", "man", 0, 1, reconsume_times=0)
            assert isinstance(answer, control.SendBackAnswer)

    asyncio.run(main())


def test_aclosing_ends_an_iteration_at_break_and_listeners_commit_during_the_close(
    embedded_broker: EmbeddedBroker,
) -> None:
    """``contextlib.aclosing`` ends the iteration at ``break`` (a new one may start at
    once, and a commit covers the messages handled); during the close an ``on_revoked``
    listener can still call the front (here: commit)."""
    from contextlib import aclosing

    addr = embedded_broker.address
    revoked: list[set[tuple[str, int]]] = []
    consumers: list[AsyncConsumer] = []

    async def on_revoked(queues: set[tuple[str, int]]) -> None:
        await consumers[0].commit()  # during the close: the front still takes calls
        revoked.append(queues)

    async def main() -> None:
        async with AsyncClient(addr) as c:
            await c.create_topic("ac", 1)
        async with AsyncProducer(addr) as p:
            await p.send_batch("ac", [f"m{i}" for i in range(10)])
        fast = {**FAST, "commit_interval": 60.0}
        con = AsyncConsumer(addr, "g-ac", "ac", start_from="earliest", on_revoked=on_revoked, **fast)
        consumers.append(con)
        async with con:
            seen: list[str] = []
            async with aclosing(aiter(con)) as messages:
                async for msg in messages:
                    seen.append(msg.text)
                    if len(seen) == 3:
                        break
            await con.commit()  # m0, m1 are done; m2 (the one broken on) is not
            async with AsyncClient(addr) as c:
                assert await c.query_offset("g-ac", "ac", 0) == 2
            async with aclosing(aiter(con)) as messages:  # a new iteration at once
                async for msg in messages:
                    seen.append(msg.text)
                    if msg.text == "m9":
                        break
            assert seen == ["m0", "m1", "m2", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"]
        assert revoked == [{("ac", 0)}]

    asyncio.run(main())
