"""Client-side lease expiry (docs/consumer.md, "Across a failover"): a member whose
heartbeats to its broker stop being answered for ``lease_expiry`` stops handing out
what it buffered from that broker's queues (the broker has expired it by then and
another member may hold them), like RocketMQ's client lock expiry; and a member whose
connection to a queue's broker breaks hands out nothing it buffered from that queue
until the lease is confirmed there again. Real broker processes (SIGSTOP, SIGKILL)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import trio

from equeue.broker.process import BrokerProcess
from equeue.client import AsyncClient
from equeue.consumer import AsyncConsumer
from equeue.models import Message
from equeue.producer import AsyncProducer
from tests.conftest import wait_until

N = 300


async def test_a_member_cut_off_from_its_broker_stops_handing_out_buffered_messages() -> None:
    with BrokerProcess() as b:
        try:
            with trio.fail_after(90):
                async with AsyncClient(b.address) as admin, AsyncProducer(b.address) as p:
                    await admin.create_topic("t", 1)
                    for h in [await p.send_async("t", str(i).encode()) for i in range(N)]:
                        await h
                handled: list[int] = []
                frozen = trio.Event()

                async def handler(m: Message) -> None:
                    handled.append(m.queue_offset)
                    if len(handled) == 5:
                        os.kill(b.pid, signal.SIGSTOP)  # heartbeats go unanswered from now on
                        frozen.set()
                    await trio.sleep(0.02)  # slow: the rest waits in the member's buffer

                async with AsyncConsumer(
                    b.address, "g", "t", start_from="earliest", concurrency=1, heartbeat_interval=0.2,
                    rebalance_interval=0.2, lease_expiry=1.5, connect_timeout=1.0, close_timeout=1.0,
                ) as c:  # fmt: skip
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(c.run, handler)
                        await frozen.wait()
                        at_freeze = len(handled)
                        # everything pulled before the freeze sits in the buffer: N - 5 would
                        # take 6 s to hand out; the lease expires after 1.5 s
                        await wait_until(lambda: not c.statistics().queues, timeout=20,
                                         what="the member dropped the queue of the unreachable broker")  # fmt: skip
                        dropped_at = len(handled)
                        assert c.dispatcher.ready_count == 0, "buffered messages still waiting to be handed out"
                        assert dropped_at < N - 50, (at_freeze, dropped_at)
                        os.kill(b.pid, signal.SIGCONT)
                        nursery.cancel_scope.cancel()
        finally:
            os.kill(b.pid, signal.SIGCONT)


async def test_a_member_whose_broker_died_hands_out_nothing_buffered_until_its_lease_is_confirmed(
    tmp_path: Path,
) -> None:
    """When the connection to a queue's broker breaks (its leader died), the member
    stops handing out what it buffered from that queue at once -- a new leader may
    grant the lease to another member -- and goes on only after a pull or a heartbeat
    is answered there again (here: the broker restarted, which has no leases)."""
    b = BrokerProcess(tmp_path / "data").start()
    restarted: list[BrokerProcess] = []
    try:
        with trio.fail_after(90):
            async with AsyncClient(b.address) as admin, AsyncProducer(b.address) as p:
                await admin.create_topic("t", 1)
                for h in [await p.send_async("t", str(i).encode()) for i in range(N)]:
                    await h
            starts: list[float] = []
            killed = trio.Event()
            up = trio.Event()

            async def handler(m: Message) -> None:
                starts.append(time.monotonic())
                if len(starts) == 5:
                    b.kill()
                    killed.set()
                if not up.is_set():  # slow until the broker is back: the rest waits in the member's buffer
                    await trio.sleep(0.02)

            async with AsyncConsumer(
                b.address, "g", "t", start_from="earliest", concurrency=1, heartbeat_interval=0.2,
                rebalance_interval=0.2, connect_timeout=1.0, close_timeout=1.0,
            ) as c:  # fmt: skip
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(c.run, handler)
                    await killed.wait()
                    await wait_until(lambda: [q.suspended for q in c.assignments.queues.values()] == [True], timeout=20,
                                     what="the queue of the dead broker suspended")  # fmt: skip
                    suspended_at = time.monotonic()
                    assert c.dispatcher.ready_count > 0, "the buffered messages are kept"
                    restarted.append(await trio.to_thread.run_sync(
                        lambda: BrokerProcess(tmp_path / "data", port=b.port).start()
                    ))  # fmt: skip
                    up_at = time.monotonic()
                    up.set()  # the buffer has served its purpose: hand out the rest at full speed
                    try:
                        await wait_until(lambda: len(starts) >= N, timeout=60, what="every message handled")
                    finally:
                        nursery.cancel_scope.cancel()
            # (the consumer closed while its broker is up: commit and leave answered at
            # once, not given up after connect_timeout + 5 s)
            during = [round(s - suspended_at, 3) for s in starts if suspended_at < s < up_at]
            assert not during, f"handed out while the lease was unconfirmed (s after the suspension): {during[:5]}"
    finally:
        for r in restarted:
            r.kill()
        b.close()
