"""One campaign run, end to end: ``python -m tests.chaos --seed N --minutes M [--dir D]``.

1. a network (namespaces, or loopback), a 3-member etcd and 3 broker groups of 3
   replicas (g1 and g2 ``--acks all``, g3 ``--acks leader``; lease TTL 2 s), each
   broker behind its own etcd fault proxy and, as root, on a tmpfs of its own;
2. the workload (``tests.chaos.workload``) for ``M`` minutes while the nemesis runs
   the seed's schedule;
3. heal everything, wait until every group has one leader with all 3 replicas in
   sync, a little more traffic, then stop the producers, let the consumers catch up
   and stop them;
4. read every queue whole from its group's leader (``final.jsonl``) and run
   ``equeue cluster verify``;
5. the checker's verdict (``tests.chaos.checker``); exit 1 on any violation.

Everything the run made (processes, namespaces, the bridge) is removed at the end,
on Ctrl-C and SIGTERM too (``finally`` and ``atexit``); an earlier run killed with
SIGKILL is cleaned up by the next one.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import random
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from equeue import Message, PullResult, wire
from equeue.client.async_client import AsyncClient
from equeue.errors import EQueueError
from tests.chaos.checker import check, excerpt, render
from tests.chaos.cluster import ETCDCTL, LEASE_TTL, Cluster
from tests.chaos.history import History
from tests.chaos.nemesis import Fault, Nemesis, schedule, schedule_digest
from tests.chaos.net import Network, cleanup_stale, open_network
from tests.chaos.workload import Probe, Workload, split_body

__all__ = ["Options", "main", "run"]

ROOT = Path(__file__).resolve().parents[2]
#: the broker groups and their --acks (the acks-leader group's losses are counted, not violations)
ACKS = {"g1": "all", "g2": "all", "g3": "leader"}
#: bounds of the end of a run (seconds)
SETTLE_TIMEOUT, DRAIN_TIMEOUT, VERIFY_TIMEOUT = 60.0, 15.0, 30.0


@attrs.frozen
class Options:
    seed: int
    minutes: float
    run_dir: Path
    netns: bool = True
    producers: int = 3
    keep_data: bool = False


def say(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------- the async part
async def _settle(probe: Probe, cluster: Cluster, timeout: float) -> tuple[bool, str]:
    """Wait until every etcd member is healthy and every group has one serving leader
    with every replica in sync; (ok, what was last missing)."""
    missing = "nothing checked"
    with trio.move_on_after(timeout):
        while True:
            sick = [
                n for n, m in cluster.etcd.items() if not await trio.to_thread.run_sync(m.healthy)
            ]
            missing = f"etcd members not healthy: {sick}" if sick else ""
            for group in cluster.group_names if not sick else []:
                leader = await probe.settled_leader(group)
                st = probe.latest.get(leader)[1] if leader else None  # type: ignore[index]
                if st is None:
                    missing = f"group {group} has no settled leader"
                    break
                if len(st.isr) < len(cluster.members(group)):
                    missing = (
                        f"group {group}: in-sync set {len(st.isr)} of {len(cluster.members(group))}"
                    )
                    break
            if not missing:
                return True, ""
            await trio.sleep(0.25)
    return False, missing


async def _final_reads(
    probe: Probe, cluster: Cluster, wl: Workload, path: Path, h: History
) -> None:
    """Every queue of every topic, read whole at its group's leader, into ``path``."""
    await wl.record_routes(list(wl.topics))
    assert wl.router is not None
    routes = {t: wl.router.cached(t) for t in wl.topics}
    owners = {t: list(r.owners) for t, r in routes.items() if r is not None}
    leaders: dict[str, str | None] = {}
    for group in cluster.group_names:
        leaders[group] = None
        with trio.move_on_after(20):
            while leaders[group] is None:
                leaders[group] = await probe.settled_leader(group)
                if leaders[group] is None:
                    await trio.sleep(0.25)
    with path.open("w") as out:
        for topic, own in sorted(owners.items()):
            for q, group in enumerate(own):
                leader = leaders.get(group)
                rec: dict[str, object] = {
                    "kind": "queue",
                    "topic": topic,
                    "queue": q,
                    "group": group,
                    "leader": leader,
                }
                if leader is None:
                    out.write(
                        json.dumps({**rec, "ok": False, "error": f"group {group} has no leader"})
                        + "\n"
                    )
                    continue
                try:
                    msgs, lo, hi, gap = await _read_queue(probe, leader, topic, q)
                except (EQueueError, OSError, trio.TooSlowError) as exc:
                    out.write(
                        json.dumps({**rec, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
                        + "\n"
                    )
                    continue
                for m in msgs:
                    mid, crc, n = split_body(m.body)
                    out.write(json.dumps({"kind": "message", "topic": topic, "queue": q, "offset": m.queue_offset,
                                          "mid": mid, "crc": crc, "len": n, "key": m.key}) + "\n")  # fmt: skip
                out.write(
                    json.dumps(
                        {**rec, "ok": True, "min": lo, "max": hi, "count": len(msgs), "gap": gap}
                    )
                    + "\n"
                )
    h.info("final-read", queues=sum(len(o) for o in owners.values()), leaders=leaders)


async def _read_queue(
    probe: Probe, node: str, topic: str, q: int
) -> tuple[list[Message], int, int, str]:
    """(messages, min offset, end, a gap's description or "") of one queue at ``node``."""
    out: list[Message] = []
    offset, lo, gap = 0, -1, ""
    while True:
        req = wire.PullRequest(topic, q, offset, max_messages=1000)

        async def pull(c: AsyncClient, req: wire.PullRequest = req) -> PullResult:
            return await c.pull(req)

        res = await probe.ask(node, pull, timeout=20)
        if lo < 0:
            lo = res.min_offset
            offset = max(offset, lo)
        for m in res.messages:
            if m.queue_offset != offset and not gap:
                gap = f"offset {m.queue_offset} read where {offset} was due"
            out.append(m)
            offset = m.queue_offset + 1
        if not res.messages or offset >= res.max_offset:
            if offset != res.max_offset and not gap:
                gap = f"read up to {offset}, end {res.max_offset}"
            return out, lo, res.max_offset, gap


async def _verify(cluster: Cluster, h: History) -> None:
    cmd = [sys.executable, "-m", "equeue", "cluster", "verify", "--broker", cluster.bootstrap,
           "--timeout", str(VERIFY_TIMEOUT)]  # fmt: skip
    with trio.move_on_after(VERIFY_TIMEOUT + 60):
        r = await trio.run_process(
            cmd, capture_stdout=True, capture_stderr=True, check=False, cwd=str(ROOT)
        )
        output = (r.stdout + r.stderr).decode(errors="replace")
        h.info("verify", rc=r.returncode, output=output[-3000:])
        return
    h.info("verify", rc=-1, output="timed out")


async def _campaign(opts: Options, cluster: Cluster, net: Network, h: History, episodes: list[list[Fault]],
                    on_signal: Callable[[], None]) -> None:  # fmt: skip
    """The workload, the nemesis, the heal and the final reads (module docstring, 2-4)."""
    seconds = opts.minutes * 60
    async with Probe(cluster) as probe, trio.open_nursery() as top:
        wl = Workload(h, cluster, probe, opts.seed, opts.producers)
        nem = Nemesis(h, cluster, net, probe, wl.admin_lock)

        async def signals() -> None:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as received:
                async for sig in received:
                    say(f"signal {sig}: stopping")
                    on_signal()
                    top.cancel_scope.cancel()

        top.start_soon(signals)
        try:
            async with trio.open_nursery() as n:
                await wl.open(n)
                ok, missing = await _settle(probe, cluster, SETTLE_TIMEOUT)
                if not ok:
                    raise EQueueError(f"the new cluster did not settle: {missing}")
                wl.start(n)
                t0 = trio.current_time()
                h.info("workload-start", seconds=seconds)
                say(f"workload and nemesis running for {seconds:g} s")
                with trio.move_on_after(seconds + 60):
                    await nem.run(episodes, t0)
                await trio.sleep_until(t0 + seconds)
                say("healing everything")
                h.info("heal")
                await nem.heal_all()
                began = trio.current_time()
                ok, missing = await _settle(probe, cluster, SETTLE_TIMEOUT)
                h.info(
                    "settled", ok=ok, detail=missing, seconds=round(trio.current_time() - began, 2)
                )
                say(
                    f"settled in {trio.current_time() - began:.1f} s"
                    if ok
                    else f"did NOT settle: {missing}"
                )
                acked = wl.acked
                with trio.move_on_after(DRAIN_TIMEOUT):
                    while wl.acked < acked + 100:
                        await trio.sleep(0.1)
                await wl.stop_producing(DRAIN_TIMEOUT + 5)
                h.info("producers-stopped", in_flight=wl.in_flight)
                with trio.move_on_after(DRAIN_TIMEOUT):
                    while not await wl.caught_up():
                        await trio.sleep(0.5)
                await wl.stop_consumers(10)
                h.info("consumers-stopped")
                say("reading every queue from its leader, then equeue cluster verify")
                await _final_reads(probe, cluster, wl, opts.run_dir / "final.jsonl", h)
                await _verify(cluster, h)
                n.cancel_scope.cancel()
        finally:
            top.cancel_scope.cancel()


# ---------------------------------------------------------------------- the sync part
def _start(run_dir: Path, want_netns: bool) -> tuple[Network, Cluster]:
    """The network and the started cluster; when the cluster cannot start in
    namespaces (a host whose bridged traffic is filtered, say), loopback instead."""
    net, why = open_network(Cluster.node_names(groups=len(ACKS)), want_netns)
    say(f"network: {net.describe()}" + (f" (namespaces unavailable: {why})" if why else ""))
    cluster = Cluster(run_dir, net, groups=len(ACKS), acks=ACKS, tmpfs=net.kind == "netns")
    try:
        cluster.start_etcd()
        cluster.start_brokers()
        return net, cluster
    except BaseException as exc:
        cluster.close()
        cluster.unmount()
        net.close()
        if net.kind != "netns" or not isinstance(exc, EQueueError):
            raise
        say(f"the cluster did not start in namespaces ({str(exc)[:300]}); on loopback instead")
    shutil.rmtree(run_dir / "data", ignore_errors=True)
    return _start(run_dir, False)


def run(opts: Options) -> int:
    """One run (module docstring); 0 when the checker finds no violation, 1 on a
    violation, 2 when the run failed before its verdict, 130 when interrupted."""
    run_dir = opts.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "logs").mkdir(exist_ok=True)
    # the SDK's warnings (failovers seen by the clients) go to a file, not the terminal
    logging.basicConfig(filename=run_dir / "logs" / "harness.log", level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)  # fmt: skip
    say(f"seed {opts.seed}, {opts.minutes:g} minutes, run directory {run_dir}")
    say(f"replay: make chaos SEED={opts.seed} MINUTES={opts.minutes:g}")
    stale = cleanup_stale()
    if stale:
        say(f"removed what earlier runs left: {stale}")
    started = time.monotonic()
    made: list[tuple[Network, Cluster]] = []
    mounted: list[Cluster] = []
    history: History | None = None

    def close() -> None:
        while made:
            net, cluster = made.pop()
            say(
                "stopping every process"
                + (" and removing the namespaces and the bridge" if net.kind == "netns" else "")
            )
            cluster.close()
            net.close()

    def unmount(keep: Path | None = None) -> None:
        while mounted:
            mounted.pop().unmount(keep)

    def on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # outside trio.run: the finally below cleans up

    atexit.register(unmount)
    atexit.register(close)
    signal.signal(signal.SIGTERM, on_term)
    interrupted = failed = False

    def on_signal() -> None:
        nonlocal interrupted
        interrupted = True

    try:
        net, cluster = _start(run_dir, opts.netns)
        made.append((net, cluster))
        mounted.append(cluster)
        acks = ", ".join(f"{g} --acks {a}" for g, a in cluster.acks.items())
        say(f"cluster up in {time.monotonic() - started:.1f} s: etcd {cluster.etcd_urls}; brokers {cluster.bootstrap} "
            f"({acks}; --cluster-lease-ttl {LEASE_TTL}; each broker behind its etcd proxy"
            f"{'; data on tmpfs' if cluster.tmpfs else ''})")  # fmt: skip
        episodes = schedule(opts.seed, opts.minutes * 60, cluster.group_names, net.can_partition, bool(net.degrade_mode),
                            bool(cluster.tmpfs), os.access(ETCDCTL, os.X_OK))  # fmt: skip
        (run_dir / "schedule.json").write_text(
            json.dumps([[attrs.asdict(f) for f in e] for e in episodes], indent=1)
        )
        say(f"schedule: {len(episodes)} episodes, {sum(len(e) for e in episodes)} faults, digest "
            f"{schedule_digest(episodes)} (schedule.json)")  # fmt: skip
        history = History(run_dir / "history.jsonl")
        history.info("config", seed=opts.seed, minutes=opts.minutes, network=net.kind, describe=net.describe(),
                     nodes={n: (net.ip(n), cluster.pid(n)) for n in cluster.nodes},
                     brokers={n: b.broker_id for n, b in cluster.brokers.items()}, acks=cluster.acks,
                     tmpfs=bool(cluster.tmpfs))  # fmt: skip
        trio.run(_campaign, opts, cluster, net, history, episodes, on_signal)
        errors = cluster.error_lines()
        if errors:
            history.info("broker-errors", lines={n: e[:5] for n, e in errors.items()})
    except KeyboardInterrupt:
        interrupted = True
    except Exception:  # the run could not reach its verdict: say why, clean up
        traceback.print_exc()
        failed = True
    finally:
        if history is not None:
            history.close()
        close()
    if interrupted or failed:
        unmount(run_dir / "data-kept")
        say(
            "interrupted: no verdict"
            if interrupted
            else f"the run failed before its verdict (files in {run_dir})"
        )
        return 130 if interrupted else 2
    report = check(run_dir)
    print(render(report), flush=True)
    v = report.first()
    unmount(run_dir / "data-kept" if v is not None or opts.keep_data else None)
    if v is not None:
        print(f"FIRST VIOLATION [{v.kind}] at t={v.t:.3f} s (history line {v.line}): {v.detail}")
        print("history around it (>> marks the line):")
        print(excerpt(run_dir, v))
    elif not opts.keep_data:
        shutil.rmtree(run_dir / "data", ignore_errors=True)
    say(f"seed {opts.seed}: {'VALID' if report.valid else 'INVALID'} in {time.monotonic() - started:.0f} s; "
        f"history, schedule, final reads and logs in {run_dir}")  # fmt: skip
    return 0 if report.valid else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the schedule's seed (default: a random one, printed)",
    )
    ap.add_argument(
        "--minutes",
        type=float,
        default=5.0,
        help="how long the workload and the nemesis run (default 5)",
    )
    ap.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="the run directory (default /tmp/equeue-chaos/<seed>-<time>)",
    )
    ap.add_argument("--loopback", action="store_true", help="no network namespaces, even as root")
    ap.add_argument("--producers", type=int, default=3, help="producer tasks (default 3)")
    ap.add_argument(
        "--keep-data", action="store_true", help="keep the data directories of a valid run"
    )
    a = ap.parse_args(argv)
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    run_dir = a.dir or Path("/tmp/equeue-chaos") / f"{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return run(Options(seed, a.minutes, run_dir, not a.loopback, a.producers, a.keep_data))
