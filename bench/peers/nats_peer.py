"""NATS JetStream peer of the harness: server command line and client worker roles.

Model mapping: topic ``orders`` with 4 queues = one stream ``ORDERS`` with subjects
``orders.0..3``, file storage, 1 replica. A consumer group is one durable pull
consumer per queue (``filter_subject orders.<q>``, AckPolicy=all, so acking a fetched
batch's last message commits the batch, like a committed offset). ``consumer_mode=shared``
(``nats-shared``) uses one durable over the stream that both members fetch from
(AckPolicy=explicit, one ack per message), NATS's own way to share work. Client:
nats-py (asyncio; ``bench/peers/requirements.txt``); server: Debian's ``nats-server``.

Roles run as ``<python> nats_peer.py worker <role> '<json args>'`` (``run.py``), on the
port in ``PEERBENCH_PORT``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peerlib as C  # noqa: E402

STREAM = "ORDERS"
SUBJECTS = [f"orders.{q}" for q in range(C.NUM_QUEUES)]
Variant = dict[str, str]


# --------------------------------------------------------------------------- server side
def server_settings(variant: Variant) -> dict[str, Any]:
    return {
        "listen": f"{C.HOST}, free port per run", "jetstream": "enabled (-js)",
        "store_dir": "<run dir>/js (fresh per run)",
        "stream": "ORDERS, subjects orders.0..3, storage=file, replicas=1, retention=limits, "
                  "no limits, duplicate_window=0 (no Nats-Msg-Id headers sent)",
        "fsync": _fsync_note(),
        "GOMAXPROCS": f"default ({os.cpu_count()})",
    }  # fmt: skip


def _fsync_note() -> str:
    v = server_version()
    if "v2.9." in v or "v2.8." in v:
        return ("no per-message fsync; nats-server 2.9 has no sync_interval/sync_always option "
                "(added in 2.10); its file store syncs blocks in the background")  # fmt: skip
    return f"server default ({v}; no sync option set on the command line)"


def make_server(variant: Variant, workdir: str, port: int) -> C.Server:
    argv = ["nats-server", "-a", C.HOST, "-p", str(port), "-js",
            "-sd", os.path.join(workdir, "js"), "-l", os.path.join(workdir, "nats.log")]  # fmt: skip
    return C.Server("nats", argv, os.path.join(workdir, "server.out"), port)


def server_version() -> str:
    try:
        return subprocess.run(
            ["nats-server", "--version"], capture_output=True, text=True
        ).stdout.strip()
    except FileNotFoundError:
        return "nats-server not installed"


def client_versions() -> dict[str, Any]:
    import importlib.metadata as md

    return {"nats-py": md.version("nats-py")}


# --------------------------------------------------------------------------- roles (asyncio)
async def _connect() -> tuple[Any, Any]:
    import nats

    nc = await nats.connect(
        f"nats://{C.HOST}:{C.port()}", connect_timeout=5, max_reconnect_attempts=0
    )
    return nc, nc.jetstream(timeout=30)


def _count(counts: Any, q: int) -> int:
    return int(counts[str(q)] if isinstance(counts, dict) else counts[q])


async def role_setup(a: dict[str, Any]) -> dict[str, Any]:
    from nats.js import api

    nc, js = await _connect()
    await js.add_stream(api.StreamConfig(
        name=STREAM, subjects=SUBJECTS, storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS, num_replicas=1, duplicate_window=0))  # fmt: skip
    mode = a.get("consumer_mode")
    if mode == "perqueue":
        for q in range(C.NUM_QUEUES):
            await js.add_consumer(STREAM, api.ConsumerConfig(
                durable_name=f"c-q{q}", filter_subject=SUBJECTS[q],
                ack_policy=api.AckPolicy.ALL, deliver_policy=api.DeliverPolicy.ALL,
                max_ack_pending=10000))  # fmt: skip
    elif mode == "shared":
        await js.add_consumer(STREAM, api.ConsumerConfig(
            durable_name="shared", ack_policy=api.AckPolicy.EXPLICIT,
            deliver_policy=api.DeliverPolicy.ALL, max_ack_pending=10000))  # fmt: skip
    elif mode == "l1":
        await js.add_consumer(STREAM, api.ConsumerConfig(
            durable_name="l1", ack_policy=api.AckPolicy.ALL,
            deliver_policy=api.DeliverPolicy.ALL, max_ack_pending=10000))  # fmt: skip
    await nc.close()
    return {"ok": True, "consumer_mode": mode}


async def role_produce(a: dict[str, Any]) -> dict[str, Any]:
    """P1/P2 and the C prefill. ``pub_mode=gather``: ``asyncio.gather`` of ``batch``
    ``js.publish()`` coroutines; ``async``: ``batch`` ``js.publish_async()`` futures, then
    awaited together. Measured until every PubAck is in."""
    n, size, batch, mode = a["n"], a["size"], a["batch"], a.get("pub_mode", "gather")
    if mode not in ("gather", "async"):
        raise ValueError(f"pub_mode {mode!r}")
    payloads, queues = C.make_messages(n, size, a.get("seed", 1))
    subj = [SUBJECTS[q] for q in queues]
    nc, js = await _connect()
    acks = 0
    res: list[Any] = []
    c0, t0 = time.process_time(), time.perf_counter()
    for start in range(0, n, batch):
        group = range(start, min(start + batch, n))
        if mode == "gather":
            res = await asyncio.gather(*[js.publish(subj[i], payloads[i]) for i in group])
        else:
            res = await asyncio.gather(
                *[await js.publish_async(subj[i], payloads[i]) for i in group]
            )
        acks += len(res)
    t1, c1 = time.perf_counter(), time.process_time()
    await nc.close()
    el = t1 - t0
    return {"msgs": n, "acks": acks, "last_seq": res[-1].seq, "seconds": el, "msgs_per_s": n / el,
            "MB_per_s": n * size / el / 1e6, "client_cpu_s": c1 - c0, "pub_mode": mode}  # fmt: skip


async def role_produce_sync(a: dict[str, Any]) -> dict[str, Any]:
    """P3: ``await js.publish()`` for each message before sending the next."""
    n, size = a["n"], a["size"]
    payloads, queues = C.make_messages(n, size, a.get("seed", 1))
    subj = [SUBJECTS[q] for q in queues]
    nc, js = await _connect()
    lat = [0] * n
    pc = time.perf_counter_ns
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        s = pc()
        await js.publish(subj[i], payloads[i])
        lat[i] = pc() - s
    t1, c1 = time.perf_counter(), time.process_time()
    await nc.close()
    el = t1 - t0
    out = {"msgs": n, "seconds": el, "msgs_per_s": n / el, "client_cpu_s": c1 - c0}
    out.update({"lat_" + k: v for k, v in C.lat_summary_ns(lat).items()})
    return out


async def _wait_acked(js: Any, durables: list[str], timeout: float = 30) -> tuple[list[Any], int]:
    """Poll ``consumer_info`` until every durable reports nothing ack-pending."""
    deadline = time.time() + timeout
    while True:
        infos = [await js.consumer_info(STREAM, d) for d in durables]
        pend = sum(i.num_ack_pending for i in infos)
        if pend == 0 or time.time() > deadline:
            return infos, pend
        await asyncio.sleep(0.001)


async def role_consume(a: dict[str, Any]) -> dict[str, Any]:
    """C1/C2 member, per-queue durables: one ``fetch`` of <= 100 from one queue per
    step, round-robin; ack of each batch's last message (``ack_sync`` on each queue's
    last batch); the clock stops when no durable has anything ack-pending."""
    if a.get("consumer_mode", "perqueue") == "shared":
        return await _consume_shared(a)
    queues, counts, batch = a["queues"], a["counts"], a["batch"]
    nc, js = await _connect()
    durables = {q: f"c-q{q}" for q in queues}
    subs = {q: await js.pull_subscribe_bind(durable=durables[q], stream=STREAM) for q in queues}
    remaining = {q: _count(counts, q) for q in queues}
    total = sum(remaining.values())
    got = nbytes = 0
    C.wait_until(a["start_at"])
    c0, t0 = time.process_time(), time.time()
    active = [q for q in queues if remaining[q] > 0]
    while active:
        for q in list(active):
            msgs = await subs[q].fetch(min(batch, remaining[q]), timeout=5)
            nbytes += sum(len(m.data) for m in msgs)
            remaining[q] -= len(msgs)
            got += len(msgs)
            if remaining[q] <= 0:
                active.remove(q)
                await msgs[-1].ack_sync()  # AckPolicy=all: commits the whole queue
            else:
                await msgs[-1].ack()  # AckPolicy=all: one ack commits the batch
    infos, pend = await _wait_acked(js, list(durables.values()))
    t1, c1 = time.time(), time.process_time()
    await nc.close()
    return {"msgs": got, "expected": total, "bytes": nbytes, "t_start": t0, "t_end": t1,
            "seconds": t1 - t0, "msgs_per_s": got / (t1 - t0), "client_cpu_s": c1 - c0,
            "ack_pending_after": pend,
            "ack_floor": [i.ack_floor.stream_seq for i in infos]}  # fmt: skip


async def _consume_shared(a: dict[str, Any]) -> dict[str, Any]:
    """Both members fetch from the one durable ``shared`` (an ack per message). A member
    stops after an empty fetch; its end is the ack of its last non-empty batch."""
    import nats.errors

    batch = a["batch"]
    nc, js = await _connect()
    sub = await js.pull_subscribe_bind(durable="shared", stream=STREAM)
    got = nbytes = 0
    C.wait_until(a["start_at"])
    c0, t0 = time.process_time(), time.time()
    t_last = t0
    while True:
        try:
            msgs = await sub.fetch(batch, timeout=0.5)
        except (TimeoutError, nats.errors.TimeoutError):
            break
        nbytes += sum(len(m.data) for m in msgs)
        for m in msgs[:-1]:
            await m.ack()
        await msgs[-1].ack_sync()
        got += len(msgs)
        t_last = time.time()
    c1 = time.process_time()
    info = await js.consumer_info(STREAM, "shared")
    await nc.close()
    return {"msgs": got, "bytes": nbytes, "t_start": t0, "t_end": t_last,
            "seconds": t_last - t0, "msgs_per_s": got / max(1e-9, t_last - t0),
            "client_cpu_s": c1 - c0, "ack_pending_after": info.num_ack_pending,
            "num_pending_after": info.num_pending}  # fmt: skip


async def role_l1_consume(a: dict[str, Any]) -> dict[str, Any]:
    """L1 consumer: one durable over the stream, ``fetch(100, timeout=1)`` in a loop
    (the pull waits in the server while empty); receive time = ``time.time_ns()`` when
    ``fetch`` returns; one ack (AckPolicy=all) per batch."""
    import nats.errors

    expected, ready = a["expected"], a["ready_file"]
    batch = a.get("fetch_batch", 100)
    nc, js = await _connect()
    sub = await js.pull_subscribe_bind(durable="l1", stream=STREAM)
    unpack = C.TS.unpack_from
    lat: list[int] = []
    polls = timeouts = 0
    deadline = time.time() + a["max_seconds"]
    open(ready, "w").close()
    while len(lat) < expected and time.time() < deadline:
        try:
            msgs = await sub.fetch(batch, timeout=1.0)
        except (TimeoutError, nats.errors.TimeoutError):
            timeouts += 1
            continue
        now = time.time_ns()
        polls += 1
        lat.extend(now - unpack(m.data)[0] for m in msgs)
        await msgs[-1].ack()
    await nc.close()
    out = {"received": len(lat), "expected": expected, "polls": polls, "timeouts": timeouts,
           "fetch_batch": batch}  # fmt: skip
    out.update({"lat_" + k: v for k, v in C.lat_summary_ns(lat).items()})
    return out


async def role_l1_produce(a: dict[str, Any]) -> dict[str, Any]:
    """L1 producer: fixed rate, one awaited ``js.publish`` per message, the payload
    starting with the 8-byte send time. Paced by ``time.sleep`` (asyncio's timers wake
    on epoll's millisecond grid)."""
    rate, seconds = a["rate"], a["seconds"]
    n = rate * seconds
    fillers, queues = C.make_messages(n, a["size"] - 8, a.get("seed", 7))
    subj = [SUBJECTS[q] for q in queues]
    nc, js = await _connect()
    pack = C.TS.pack
    pacer = C.Pacer(n, rate)
    for i in pacer:
        await js.publish(subj[i], pack(time.time_ns()) + fillers[i])
    result = pacer.result()
    await nc.close()
    return result


async def role_check(a: dict[str, Any]) -> dict[str, Any]:
    nc, js = await _connect()
    si = await js.stream_info(STREAM)
    await nc.close()
    return {"stream_msgs": si.state.messages, "stream_bytes": si.state.bytes,
            "last_seq": si.state.last_seq}  # fmt: skip


ROLES = {k[5:]: v for k, v in list(globals().items()) if k.startswith("role_")}

if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "worker":
        C.emit(asyncio.run(ROLES[sys.argv[2]](json.loads(sys.argv[3]))))
    else:
        print(__doc__)
