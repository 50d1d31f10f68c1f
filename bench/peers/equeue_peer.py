"""equeue adapter of the peer harness (``bench/peers/run.py``).

``run.py`` imports this file (``make_server``, ``server_settings``, versions) and runs
its client roles as separate processes::

    <PYTHON> equeue_peer.py worker <role> '<json args>'

on the broker's port in ``PEERBENCH_PORT``, with the column's settings (``run.PLAN``)
in the args' ``variant``. Every role uses the public SDK the way a user would:
``AsyncProducer`` / ``AsyncConsumer`` (trio) by default, or the blocking ``Producer`` /
``Consumer`` with ``api=sync``. Model mapping: topic ``orders`` with 4 queues, key
``key-<i>`` routed by ``crc32(key) % 4`` (the harness's queue), consumer group ``g``.

What counts as acknowledged:

- produce: the broker's answer to the produce request, sent only after the batch is
  committed to LMDB (``--flush sync``: and fsynced, group commit; ``--flush async``:
  in the OS page cache, fsynced every 500 ms);
- consume: the group's committed offset. The members commit their final offsets
  (awaited) before ``t_end``; ``C1``/``C2`` members own exactly the queues the harness
  gives them (a static allocation callable, leases granted by the broker).

Variant keys: ``flush`` (sync|async, default sync), ``api`` (async|sync, default
async), ``pub_mode`` (gather|async, P1/P2), ``max_pull_batch`` (default: the harness
batch, 100), ``fetch_batch`` (L1 pull batch, default 100).

Standalone (``run.py`` runs it as its ``equeue-rss`` step)::

    .venv/bin/python bench/peers/equeue_peer.py rss [--messages 1000000] [--flush sync] \
        [--out peerbench-results/equeue-rss.json]

starts a broker on a free port, produces and drains ``--messages`` 100-byte messages
and prints the broker's RSS before, after producing and after draining.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

sys.dont_write_bytecode = True
_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
sys.path.insert(0, _HERE)
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)  # the project (also pip-installed -e into .venv)
import peerlib as C  # noqa: E402

LABEL = "equeue"
TOPIC = "orders"
GROUP = "g"
NQ = C.NUM_QUEUES

Variant = dict[str, str]


# --------------------------------------------------------------------------- server side
def _flush(variant: Variant) -> str:
    flush = variant.get("flush", "sync")
    if flush not in ("sync", "async"):
        raise SystemExit(f"flush must be sync or async, not {flush!r}")
    return flush


def server_settings(variant: Variant) -> dict[str, Any]:
    """Settings shown in the report, including what an acknowledgement means."""
    flush = _flush(variant)
    ack = (
        "produce ack after the batch is committed to LMDB and fsynced (group commit: one "
        "fsync per write transaction, shared by every request in it)"
        if flush == "sync"
        else "produce ack after the batch is committed to LMDB (OS page cache); fsync every 500 ms"
    )
    return {
        "host": C.HOST, "port": "free port per run",
        "flush": flush + ("" if flush == "sync" else " (--flush-interval 0.5)"),
        "ack": ack,
        "consumer ack": "committed group offset (commit awaited before t_end in C1/C2; "
                        "periodic, every 5 s, in L1)",
        "store": "LMDB, one group-commit write transaction per batch of requests, map 8 GiB",
        "topic": f"{TOPIC}: {NQ} queues; key routing crc32(key) % {NQ}",
        "client": f"{variant.get('api', 'async')} SDK "
                  f"({'AsyncProducer/AsyncConsumer (trio)' if variant.get('api', 'async') == 'async' else 'Producer/Consumer (blocking)'})",
        "consumer pull batch": variant.get("max_pull_batch", "100 (harness batch)"),
        "consumer pull answers": "whole stored batches (up to 256 records; a streaming producer's "
        "batches): the consumer hands out the 100 it asked for and serves its next pulls of the "
        "queue from the rest, with no request, as a Kafka consumer serves max.poll.records",
        "retention": "72h (default)",
    }  # fmt: skip


def make_server(variant: Variant, workdir: str, port: int) -> C.Server:
    """The broker command (not started): fresh LMDB dir inside ``workdir``."""
    py = os.environ.get("PEERBENCH_PYTHON") or sys.executable
    argv = [py, "-m", "equeue", "broker", "start", "--host", C.HOST, "--port", str(port),
            "--data-dir", os.path.join(workdir, "data"), "--flush", _flush(variant),
            "--log-level", "warning"]  # fmt: skip
    return C.Server("equeue", argv, os.path.join(workdir, "server.log"), port)


def server_version() -> str:
    import importlib.metadata as md

    try:
        v = md.version("equeue-broker")
    except md.PackageNotFoundError:
        v = "dev"
    rev = subprocess.run(["git", "-C", _ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "-C", _ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return f"equeue {v} (git {rev or '?'}{'+local changes' if dirty else ''}), Python {sys.version.split()[0]}"


def client_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"equeue SDK": "same tree as the broker"}
    for pkg in ("trio", "lmdb", "attrs", "cattrs"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


# --------------------------------------------------------------------------- helpers
def _addr() -> str:
    """This run's broker address (``PEERBENCH_PORT``)."""
    return f"{C.HOST}:{C.port()}"


def _api(a: dict[str, Any]) -> str:
    return str((a.get("variant") or {}).get("api") or "async")


def _keys(n: int) -> list[str]:
    return [f"key-{i}" for i in range(n)]


def _rss_kb(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB."""
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def _rss_split_mb(pid: int) -> dict[str, float]:
    """RssAnon (Python heap) and RssFile (mapped LMDB pages, page cache) in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def _broker_pid(port: int) -> int | None:
    """PID of the process listening on 127.0.0.1:port (found via /proc, same user)."""
    want = f":{port:04X}"
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[1].endswith(want) and parts[3] == "0A":  # LISTEN
                        inodes.add(f"socket:[{parts[9]}]")
        except OSError:
            continue
    if not inodes:
        return None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    return int(pid)
        except OSError:
            continue
    return None


class RssSampler:
    """Samples the broker's VmRSS every ``interval`` s in a daemon thread (max, last)."""

    def __init__(self, interval: float = 0.1) -> None:
        self.pid = _broker_pid(C.port())
        self.max_kb = 0
        self.samples = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        while self.pid and not self._stop.wait(interval):
            try:
                rss, _ = _rss_kb(self.pid)
            except OSError:
                return
            self.max_kb = max(self.max_kb, rss)
            self.samples += 1

    def __enter__(self) -> RssSampler:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(1)

    def result(self) -> dict[str, Any]:
        if not self.pid:
            return {"broker_rss_max_mb": None}
        rss, hwm = _rss_kb(self.pid)
        return {
            "broker_rss_max_mb": round(max(self.max_kb, rss) / 1024, 1),
            "broker_rss_end_mb": round(rss / 1024, 1),
            "broker_hwm_mb": round(hwm / 1024, 1),
        }


# --------------------------------------------------------------------------- roles
def role_setup(a: dict[str, Any]) -> dict[str, Any]:
    """Create topic ``orders`` with 4 queues (the group is created by its first member)."""
    import trio

    from equeue.client import AsyncClient

    async def main() -> dict[str, Any]:
        async with AsyncClient(_addr()) as c:
            await c.create_topic(TOPIC, NQ, exist_ok=True)
            info = await c.get_route(TOPIC, False)
        return {"topic": TOPIC, "queues": info.queues, "consumer_mode": a.get("consumer_mode")}

    return trio.run(main)


def role_produce(a: dict[str, Any]) -> dict[str, Any]:
    """P1/P2 and prefill, keyed messages.

    ``pub_mode=gather`` (the harness default): groups of ``batch``, ``send_batch`` per
    group, every ack of a group awaited before the next group is sent (one group in
    flight, as the Redis pipeline and the NATS gather do). ``pub_mode=async`` (the
    prefill, or ``pub_mode=async`` in the variant): the SDK's streaming path, ``send_async`` for
    every message then ``flush()``; the producer batches per queue (linger 5 ms) with
    up to 8 requests in flight per queue, and every handle's ack is checked.
    """
    n, size, batch = a["n"], a["size"], a["batch"]
    payloads, _queues = C.make_messages(n, size, a.get("seed", 1))
    keys = _keys(n)
    mode = a.get("pub_mode", "gather")
    from equeue.models import Message
    from equeue.producer import AsyncProducer, Producer

    with RssSampler() as rss:
        if _api(a) == "sync":
            with Producer(_addr()) as p:
                p.queue_count(TOPIC)  # route lookup before the clock (like a connect)
                c0, t0 = time.process_time(), time.perf_counter()
                acks = 0
                for s in range(0, n, batch):
                    e = min(s + batch, n)
                    if mode == "async":
                        hs = [p.send_async(TOPIC, payloads[i], key=keys[i]) for i in range(n)]
                        p.flush()
                        acks = sum(1 for h in hs if h.result(60).queue_offset >= 0)
                        break
                    res = p.send_batch(
                        TOPIC, [Message(payloads[i], key=keys[i]) for i in range(s, e)]
                    )
                    acks += len(res)
                t1, c1 = time.perf_counter(), time.process_time()
        else:
            import trio

            async def main() -> tuple[float, float, float, float, int]:
                async with AsyncProducer(_addr()) as p:
                    await p.queue_count(TOPIC)
                    c0, t0 = time.process_time(), time.perf_counter()
                    acks = 0
                    for s in range(0, n, batch):
                        e = min(s + batch, n)
                        if mode == "async":
                            hs = [
                                await p.send_async(TOPIC, payloads[i], key=keys[i])
                                for i in range(n)
                            ]
                            await p.flush()
                            for h in hs:
                                if (await h.wait()).queue_offset >= 0:
                                    acks += 1
                            break
                        res = await p.send_batch(
                            TOPIC, [Message(payloads[i], key=keys[i]) for i in range(s, e)]
                        )
                        acks += len(res)
                    t1, c1 = time.perf_counter(), time.process_time()
                return c0, t0, t1, c1, acks

            c0, t0, t1, c1, acks = trio.run(main)
    assert acks == n, (acks, n)
    el = t1 - t0
    out = {"msgs": n, "acks": acks, "seconds": el, "msgs_per_s": n / el,
           "MB_per_s": n * size / el / 1e6, "client_cpu_s": c1 - c0, "api": _api(a)}  # fmt: skip
    out.update(rss.result())
    return out


def role_produce_sync(a: dict[str, Any]) -> dict[str, Any]:
    """P3: ``send`` one message at a time, each ack awaited before the next."""
    n, size = a["n"], a["size"]
    payloads, _queues = C.make_messages(n, size, a.get("seed", 1))
    keys = _keys(n)
    lat = [0] * n
    pc = time.perf_counter_ns
    from equeue.producer import AsyncProducer, Producer

    if _api(a) == "sync":
        with Producer(_addr()) as p:
            p.queue_count(TOPIC)
            c0, t0 = time.process_time(), time.perf_counter()
            for i in range(n):
                s = pc()
                p.send(TOPIC, payloads[i], key=keys[i])
                lat[i] = pc() - s
            t1, c1 = time.perf_counter(), time.process_time()
    else:
        import trio

        async def main() -> tuple[float, float, float, float]:
            async with AsyncProducer(_addr()) as p:
                await p.queue_count(TOPIC)
                c0, t0 = time.process_time(), time.perf_counter()
                for i in range(n):
                    s = pc()
                    await p.send(TOPIC, payloads[i], key=keys[i])
                    lat[i] = pc() - s
                t1, c1 = time.perf_counter(), time.process_time()
            return c0, t0, t1, c1

        c0, t0, t1, c1 = trio.run(main)
    el = t1 - t0
    out = {"msgs": n, "seconds": el, "msgs_per_s": n / el, "client_cpu_s": c1 - c0, "api": _api(a)}
    out.update({"lat_" + k: v for k, v in C.lat_summary_ns(lat).items()})
    return out


def _static_allocation(owners: dict[int, str]) -> Any:
    """An allocation callable giving queue q of ``orders`` to ``owners[q]``.

    Until every designated owner has joined it raises, so the consumer keeps its
    current (empty) assignment and rebalances again when the group changes; a member
    therefore never grabs another member's queues while that member is joining.
    """

    def allocate(
        queues: list[tuple[str, int]], members: list[str]
    ) -> dict[str, list[tuple[str, int]]]:
        missing = set(owners.values()) - set(members)
        if missing:
            raise LookupError(f"waiting for members {sorted(missing)}")
        out: dict[str, list[tuple[str, int]]] = {m: [] for m in members}
        for t, q in queues:
            out[owners.get(q, members[0]) if t == TOPIC else members[0]].append((t, q))
        return out

    return allocate


def _owners(queues: list[int], name: str) -> dict[int, str]:
    """Queue -> member name: mine for ``queues``; the harness gives m0 the first half."""
    if len(queues) == NQ:
        return {q: name for q in range(NQ)}
    other = "m1" if name == "m0" else "m0"
    return {q: (name if q in queues else other) for q in range(NQ)}


def _consumer_options(a: dict[str, Any], batch: int) -> dict[str, Any]:
    v = a.get("variant") or {}
    mpb = int(v.get("max_pull_batch", batch))
    return dict(start_from="earliest", pull_batch=min(batch, mpb), max_pull_batch=mpb,
                heartbeat_interval=1.0, rebalance_interval=1.0)  # fmt: skip


def _mark_done(a: dict[str, Any]) -> None:
    """Tell the other members of this run that this one has stopped its clock."""
    if a.get("barrier_dir"):
        open(os.path.join(a["barrier_dir"], f"consumer-{a['name']}.done"), "w").close()


def _all_done(a: dict[str, Any]) -> bool:
    """Whether every member of this run (``members``) has stopped its clock."""
    d = a.get("barrier_dir")
    if not d:
        return True
    done = [f for f in os.listdir(d) if f.startswith("consumer-") and f.endswith(".done")]
    return len(done) >= int(a.get("members", 1))


def role_consume(a: dict[str, Any]) -> dict[str, Any]:
    """C1/C2 member: joins group ``g`` at ``start_at`` owning exactly ``queues``, counts
    the messages with a no-op handler, stops at the expected count, commits (awaited;
    our ack) and stops the clock. Join, lease acquisition and pulls are inside it.

    Then it stays in the group (heartbeating) until every member has stopped its clock
    (files in ``barrier_dir``), at most 120 s: the static allocation gives a member its
    queues only once it has seen every owner, so a member that finished and left before
    the other one saw it would leave that one waiting for ever."""
    import logging

    logging.getLogger("equeue.consumer").setLevel(logging.CRITICAL)  # "waiting for m1" noise
    queues, counts, batch, name = a["queues"], a["counts"], a["batch"], a["name"]
    cnt = (
        {int(k): v for k, v in counts.items()}
        if isinstance(counts, dict)
        else dict(enumerate(counts))
    )
    expected = sum(cnt[q] for q in queues)
    opts = _consumer_options(a, batch)
    alloc = _static_allocation(_owners(queues, name))
    got = 0
    nbytes = 0
    from equeue.consumer import AsyncConsumer, Consumer

    with RssSampler() as rss:
        if _api(a) == "sync":
            lock = threading.Lock()
            c = Consumer(_addr(), GROUP, TOPIC, consumer_id=name, allocation=alloc, **opts)

            def handler(m: Any) -> None:
                nonlocal got, nbytes
                with lock:
                    got += 1
                    nbytes += len(m.body)
                    if got == expected:
                        c.stop()

            C.wait_until(a["start_at"])
            c0, t0 = time.process_time(), time.time()
            c.run(handler)
            c.commit()
            t1, c1 = time.time(), time.process_time()
            stats = c.statistics()
            _mark_done(a)
            deadline = time.monotonic() + 120
            while not _all_done(a) and time.monotonic() < deadline:
                time.sleep(0.01)
            c.close()
        else:
            import trio

            async def main() -> tuple[float, float, float, float, Any, list[int]]:
                nonlocal got, nbytes
                c = AsyncConsumer(_addr(), GROUP, TOPIC, consumer_id=name, allocation=alloc, **opts)

                async def handler(m: Any) -> None:
                    nonlocal got, nbytes
                    got += 1
                    nbytes += len(m.body)
                    if got == expected:
                        c.stop()

                await trio.sleep_until(trio.current_time() + max(0.0, a["start_at"] - time.time()))
                c0, t0 = time.process_time(), time.time()
                async with c:
                    await c.run(handler)
                    await c.commit()
                    t1, c1 = time.time(), time.process_time()
                    stats = c.statistics()
                    committed = [await c.client.query_offset(GROUP, TOPIC, q) for q in queues]
                    _mark_done(a)
                    with trio.move_on_after(120):
                        while not _all_done(a):
                            await trio.sleep(0.01)
                return c0, t0, t1, c1, stats, committed

            c0, t0, t1, c1, stats, committed = trio.run(main)
    out = {"msgs": got, "expected": expected, "bytes": nbytes, "t_start": t0, "t_end": t1,
           "seconds": t1 - t0, "msgs_per_s": got / (t1 - t0), "client_cpu_s": c1 - c0,
           "queues_owned": stats.queues, "rebalances": stats.rebalances, "api": _api(a)}  # fmt: skip
    if _api(a) != "sync":
        out["committed"] = committed
        out["committed_ok"] = committed == [cnt[q] for q in queues]
    out.update(rss.result())
    return out


def role_l1_consume(a: dict[str, Any]) -> dict[str, Any]:
    """L1 consumer: one member long-polling all 4 queues; receive time =
    ``time.time_ns()`` when the handler gets the message (after the pull returned and
    the batch was decoded and dispatched)."""
    import trio

    from equeue.consumer import AsyncConsumer

    expected, ready = a["expected"], a["ready_file"]
    fb = int(a.get("fetch_batch", 100))
    lat: list[int] = []
    unpack = C.TS.unpack_from

    async def main() -> dict[str, Any]:
        async with AsyncConsumer(_addr(), GROUP, TOPIC, consumer_id="l1", start_from="earliest",
                                 pull_batch=min(32, fb), max_pull_batch=fb) as c:  # fmt: skip

            async def handler(m: Any) -> None:
                lat.append(time.time_ns() - unpack(m.body)[0])
                if len(lat) >= expected:
                    c.stop()

            with trio.fail_after(20):
                while len(c.statistics().queues) < NQ or not all(
                    q.started for q in c.assignments.queues.values()
                ):
                    await trio.sleep(0.01)
            open(ready, "w").close()
            with trio.move_on_after(a["max_seconds"]):
                await c.run(handler)
            return {"stats": c.statistics()}

    r = trio.run(main)
    out: dict[str, Any] = {"received": len(lat), "expected": expected,
                           "polls": None, "rebalances": r["stats"].rebalances}  # fmt: skip
    out.update({"lat_" + k: v for k, v in C.lat_summary_ns(lat).items()})
    return out


def role_l1_produce(a: dict[str, Any]) -> dict[str, Any]:
    """L1 producer: ``send`` one message at a time at a fixed rate (each ack awaited),
    8-byte send timestamp first in the body, paced by ``time.sleep`` as the harness's
    own producers are. ``api=async``: ``AsyncProducer``; ``api=sync``: blocking
    ``Producer``.

    The async producer sleeps with ``time.sleep`` too, blocking its loop for the gap:
    trio's timers wake on epoll's millisecond grid (``trio.sleep(0.0003)`` sleeps
    about 1.2 ms here), which alone held this producer to about 1,250 msg/s of the
    2,000 asked. Nothing of the producer has to run in the gap: its one send was
    answered before it."""
    from equeue.producer import AsyncProducer, Producer

    rate, seconds = a["rate"], a["seconds"]
    n = rate * seconds
    fillers, _queues = C.make_messages(n, a["size"] - 8, a.get("seed", 7))
    keys = _keys(n)
    pack = C.TS.pack
    if _api(a) == "sync":
        late = 0
        with Producer(_addr()) as p:
            p.queue_count(TOPIC)
            t0 = time.time() + 0.05
            for i in range(n):
                target = t0 + i / rate
                d = target - time.time()
                if d > 0:
                    time.sleep(d)
                elif d < -0.001:
                    late += 1
                p.send(TOPIC, pack(time.time_ns()) + fillers[i], key=keys[i])
            el = time.time() - t0
    else:
        import trio

        async def main() -> tuple[float, int]:
            late = 0
            async with AsyncProducer(_addr()) as p:
                await p.queue_count(TOPIC)
                t0 = time.time() + 0.05
                for i in range(n):
                    target = t0 + i / rate
                    d = target - time.time()
                    if d > 0:
                        time.sleep(d)  # not trio.sleep: see the docstring
                    elif d < -0.001:
                        late += 1
                    await p.send(TOPIC, pack(time.time_ns()) + fillers[i], key=keys[i])
                return time.time() - t0, late

        el, late = trio.run(main)
    return {"sent": n, "seconds": el, "achieved_rate": n / el, "late_gt_1ms": late, "api": _api(a)}


def role_check(a: dict[str, Any]) -> dict[str, Any]:
    """Per-queue max offsets, group commits, broker stats and RSS after the run."""
    import trio

    from equeue.client import AsyncClient

    async def main() -> dict[str, Any]:
        async with AsyncClient(_addr()) as c:
            qs = [await c.queue_offsets(TOPIC, q) for q in range(NQ)]
            committed = [await c.query_offset(GROUP, TOPIC, q) for q in range(NQ)]
            st = await c.stats()
        return {"max_offsets": [q.max_offset for q in qs], "committed": committed,
                "transactions": st.transactions, "store_mb": round(st.store_bytes / 1e6, 1),
                "flush": st.flush}  # fmt: skip

    out = trio.run(main)
    out["loadavg"] = list(os.getloadavg())
    pid = _broker_pid(C.port())
    if pid:
        rss, hwm = _rss_kb(pid)
        out.update(broker_rss_mb=round(rss / 1024, 1), broker_hwm_mb=round(hwm / 1024, 1))
    return out


ROLES = {k[5:]: v for k, v in globals().items() if k.startswith("role_")}


# --------------------------------------------------------------------------- standalone
def rss_drain(messages: int, flush: str, out: str | None) -> None:
    """Produce then drain ``messages`` x 100 B through a fresh broker; print its RSS
    (and write the figures as JSON to ``out``, read by render_docs.py)."""
    import shutil
    import tempfile

    import trio

    from equeue.consumer import AsyncConsumer
    from equeue.producer import AsyncProducer

    tmp = tempfile.mkdtemp(prefix="equeue-rss-")
    port = C.free_port()
    os.environ["PEERBENCH_PORT"] = str(port)  # _addr() and _broker_pid() of this process
    srv = make_server({"flush": flush}, tmp, port)
    srv.argv[0] = sys.executable
    srv.start()
    try:
        pid = srv.pid
        role_setup({})
        fig: dict[str, Any] = {
            "messages": messages,
            "flush": flush,
            "idle_mb": _rss_kb(pid)[0] / 1024,
        }
        print(f"broker pid {pid}; idle RSS {fig['idle_mb']:.1f} MiB", flush=True)
        body = b"x" * 100

        async def produce() -> None:
            async with AsyncProducer(_addr()) as p:
                for s in range(0, messages, 10_000):
                    for i in range(s, min(messages, s + 10_000)):
                        await p.send_async(TOPIC, body, key=f"key-{i}")
                    await p.flush()

        t = time.perf_counter()
        trio.run(produce)
        rss, hwm = _rss_kb(pid)
        fig["after_produce_mb"] = rss / 1024
        fig["after_produce_anon_mb"] = _rss_split_mb(pid).get("RssAnon")
        print(f"produced {messages:,} in {time.perf_counter() - t:.1f} s; RSS {rss / 1024:.1f} MiB "
              f"(peak {hwm / 1024:.1f})", flush=True)  # fmt: skip
        peak = [0]

        async def drain() -> None:
            got = 0
            async with AsyncConsumer(_addr(), "rss", TOPIC, start_from="earliest") as c:

                async def handler(m: Any) -> None:
                    nonlocal got
                    got += 1
                    if got % 50_000 == 0:
                        peak[0] = max(peak[0], _rss_kb(pid)[0])
                    if got == messages:
                        c.stop()

                await c.run(handler)

        t = time.perf_counter()
        trio.run(drain)
        rss, hwm = _rss_kb(pid)
        split = _rss_split_mb(pid)
        fig.update(drain_max_mb=max(peak[0], rss) / 1024, after_drain_mb=rss / 1024, peak_mb=hwm / 1024,
                   anon_mb=split.get("RssAnon"), file_mb=split.get("RssFile"),
                   loadavg=list(os.getloadavg()))  # fmt: skip
        if out:
            with open(out, "w") as f:
                json.dump(fig, f, indent=1)
        print(f"drained {messages:,} in {time.perf_counter() - t:.1f} s; RSS during drain max "
              f"{peak[0] / 1024:.1f} MiB, after {rss / 1024:.1f} MiB (peak {hwm / 1024:.1f}; anonymous "
              f"{split.get('RssAnon', 0):.1f}, file-backed {split.get('RssFile', 0):.1f})", flush=True)  # fmt: skip
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "worker":
        args = json.loads(sys.argv[3])
        args.setdefault("variant", {})
        C.emit(ROLES[sys.argv[2]](args))
    elif sys.argv[1:2] == ["rss"]:
        import argparse

        ap = argparse.ArgumentParser()
        ap.add_argument("cmd")
        ap.add_argument("--messages", type=int, default=1_000_000)
        ap.add_argument("--flush", default="sync")
        ap.add_argument("--out", default=None, help="write the figures as JSON here")
        ns = ap.parse_args()
        rss_drain(ns.messages, ns.flush, ns.out)
    else:
        print(__doc__)
