"""The nemesis: a fault schedule drawn from the seed alone, and its execution.

:func:`schedule` draws episodes from ``random.Random(seed)``: each episode is one
fault (60 %) or two at once (40 %), each with its kind, start, duration, target
description (a broker group and a role, "leader" or "follower", or an etcd member)
and a tie-breaker; then a quiet gap. The same seed and the same capabilities (namespaces
or loopback) give the same schedule, and a longer run begins with the schedule of a
shorter one. Targets are resolved against the cluster when the fault starts ("the
leader of g1" is whoever leads g1 then); the history records whom each fault hit.

Kinds (docs/chaos.md, "The nemesis"):

=========================  =================================================================
``kill-broker``            SIGKILL a broker; started again after the duration
``pause-broker``           SIGSTOP a broker; SIGCONT after the duration
``restart-broker``         SIGTERM (clean stop), started again after the duration
``rolling-restart``        every replica of a group, one by one: SIGTERM, start, back in sync
``kill-etcd``              SIGKILL an etcd member (the etcd leader or any); started again
``pause-etcd``             SIGSTOP an etcd member; SIGCONT
``partition-isolate``      one node (broker or etcd member) cut from every other node and the clients
``partition-halves``       the nodes split in two random halves (clients still see all)
``partition-oneway``       a node stops hearing from some others (or they from it)
``partition-leader-etcd``  "bridged": a group's leader cut from every etcd member only
``partition-follower``     "bridged": a follower cut from its leader only
``degrade``                slow, lossy link of one node (netem, or tbf + random loss)
``etcd-proxy``             a broker's etcd proxy black-holes, delays, or drops etcd's answers
                           after etcd applied the request (unknown outcomes)
``disk-full``              a broker's tmpfs data directory filled to the last block
``replica-add-remove``     a group's spare joins as a new replica, catches up, and leaves
``stop-etcd``              every etcd member stopped (SIGTERM); started again
``handover``               ``equeue cluster handover --group G``: the leader hands its group
                           to its most advanced in-sync follower
``etcd-restore``           etcd backed up (``etcdctl snapshot save``), then, a little later,
                           every member wiped and restored from that backup; after the
                           duration the operator recovers the groups that need it
                           (``equeue cluster recover --yes``); topic changes wait meanwhile
=========================  =================================================================
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from equeue.errors import EQueueError
from tests.chaos.cluster import Cluster
from tests.chaos.etcdproxy import EtcdProxyError, set_mode
from tests.chaos.history import History
from tests.chaos.net import CLIENT, Network, NetworkUnavailable
from tests.chaos.workload import Probe
from tests.conftest import in_threads

__all__ = ["KINDS", "Fault", "Nemesis", "schedule", "schedule_digest"]

#: kind -> (weight, what it needs: "" always, "partition", "degrade", "tmpfs")
KINDS: dict[str, tuple[int, str]] = {
    "kill-broker": (4, ""),
    "pause-broker": (2, ""),
    "restart-broker": (1, ""),
    "rolling-restart": (1, ""),
    "kill-etcd": (1, ""),
    "pause-etcd": (1, ""),
    "partition-isolate": (2, "partition"),
    "partition-halves": (1, "partition"),
    "partition-oneway": (1, "partition"),
    "partition-leader-etcd": (2, "partition"),
    "partition-follower": (1, "partition"),
    "degrade": (2, "degrade"),
    "etcd-proxy": (3, ""),
    "disk-full": (1, "tmpfs"),
    "replica-add-remove": (1, ""),
    "stop-etcd": (1, ""),
    "etcd-restore": (1, "etcdctl"),
    "handover": (1, ""),
}
#: the etcd proxy's fault modes (tests.chaos.etcdproxy)
PROXY_MODES = ("blackhole", "delay", "drop-answers")
ROOT = str(Path(__file__).resolve().parents[2])
#: the workload runs this long before the first fault, and at least this long after the last
WARMUP, COOLDOWN = 3.0, 2.0


@attrs.frozen
class Fault:
    """One scheduled fault. ``at``: seconds after the workload began (the schedule's
    time; the real start may be later when an episode overran)."""

    kind: str
    at: float
    duration: float
    group: str
    role: str
    pick: int
    params: dict[str, Any] = attrs.field(factory=dict)


def schedule(seed: int, seconds: float, groups: list[str], partitions: bool, degrade: bool,
             tmpfs: bool = False, etcdctl: bool = False) -> list[list[Fault]]:  # fmt: skip
    """The episodes of a run of ``seconds`` (module docstring)."""
    rng = random.Random(seed)
    have = {
        "": True,
        "partition": partitions,
        "degrade": degrade,
        "tmpfs": tmpfs,
        "etcdctl": etcdctl,
    }
    kinds = [k for k, (_, need) in KINDS.items() if have[need]]
    weights = [KINDS[k][0] for k in kinds]
    episodes: list[list[Fault]] = []
    t = WARMUP
    while True:
        count = 1 if rng.random() < 0.6 else 2
        chosen: list[str] = []
        while len(chosen) < count:
            k = rng.choices(kinds, weights)[0]
            if k not in chosen:
                chosen.append(k)
        faults = [_draw(k, t, rng, groups) for k in chosen]
        end = t + max(f.duration for f in faults)
        if end > seconds - COOLDOWN:
            break
        episodes.append(faults)
        t = end + rng.uniform(2.0, 6.0)
    return episodes


def _draw(kind: str, t: float, rng: random.Random, groups: list[str]) -> Fault:
    group = rng.choice(groups)
    role = "leader" if rng.random() < 0.6 else "follower"
    duration = round(rng.uniform(2.0, 8.0), 2)
    pick = rng.randrange(1 << 30)
    params: dict[str, Any] = {}
    if kind in ("kill-etcd", "pause-etcd"):
        group, role = "", "leader" if rng.random() < 0.5 else "any"
    elif kind == "restart-broker":
        duration = round(rng.uniform(0.0, 3.0), 2)
    elif kind in ("rolling-restart", "handover"):
        duration, role = 0.0, "all" if kind == "rolling-restart" else "leader"
    elif kind == "partition-isolate":
        params["etcd"] = rng.random() < 0.3
    elif kind == "partition-oneway":
        params["reverse"] = rng.random() < 0.5
    elif kind == "partition-leader-etcd":
        role = "leader"
    elif kind == "partition-follower":
        role = "follower"
    elif kind == "etcd-proxy":
        params = {"mode": rng.choice(PROXY_MODES), "delay_ms": rng.randrange(200, 1500)}
    elif kind == "replica-add-remove":
        role = "spare"
        duration = round(rng.uniform(5.0, 10.0), 2)
    elif kind in ("stop-etcd", "etcd-restore"):
        group, role = "", "all"
        params = {"drift": round(rng.uniform(0.5, 3.0), 2)} if kind == "etcd-restore" else {}
    elif kind == "degrade":
        params = {"delay_ms": rng.randrange(20, 300), "jitter_ms": rng.randrange(0, 50),
                  "loss_pct": round(rng.uniform(1, 15), 1), "rate_kbit": rng.choice([256, 512, 1024, 2048]),
                  "etcd": rng.random() < 0.25}  # fmt: skip
    return Fault(kind, round(t, 2), duration, group, role, pick, params)


def schedule_digest(episodes: list[list[Fault]]) -> str:
    """A short digest of a schedule (two runs with one seed print the same)."""
    data = json.dumps([[attrs.asdict(f) for f in e] for e in episodes], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:12]


class Nemesis:
    """Runs a schedule against ``cluster`` (module docstring); every fault's start and
    end, and whom it hit, go to the history. :meth:`heal_all` undoes everything."""

    def __init__(self, history: History, cluster: Cluster, net: Network, probe: Probe,
                 admin_lock: trio.Lock | None = None) -> None:  # fmt: skip
        self.h, self.cluster, self.net, self.probe = history, cluster, net, probe
        #: the workload's topic changes wait while etcd is restored from a backup
        self.admin_lock = admin_lock or trio.Lock()
        self.counts: dict[str, int] = {}
        self.skipped: dict[str, int] = {}
        self.busy: set[str] = set()
        #: (receiver, sender) pairs cut, per running fault
        self._cuts: dict[int, set[tuple[str, str]]] = {}
        self._next = 0

    async def run(self, episodes: list[list[Fault]], t0: float) -> None:
        """Each episode at its time (``t0``: trio time the workload began), or at once
        when the previous one overran."""
        for n, faults in enumerate(episodes):
            await trio.sleep_until(t0 + faults[0].at)
            async with trio.open_nursery() as nursery:
                for f in faults:
                    nursery.start_soon(self._one, n, f)

    # ------------------------------------------------------------------ one fault
    async def _one(self, episode: int, f: Fault) -> None:
        try:
            targets, undo = await self._apply(f)
        except (EQueueError, EtcdProxyError, NetworkUnavailable, OSError) as exc:
            self.h.nemesis("error", episode=episode, kind=f.kind, error=str(exc)[:300])
            return
        if not targets:
            self.skipped[f.kind] = self.skipped.get(f.kind, 0) + 1
            self.h.nemesis("skipped", episode=episode, kind=f.kind, why="no target")
            return
        self.counts[f.kind] = self.counts.get(f.kind, 0) + 1
        try:
            if f.duration > 0:
                await trio.sleep(f.duration)  # the fault's duration, from the schedule
        finally:
            with trio.CancelScope(shield=True):
                try:
                    await undo()
                except (EQueueError, EtcdProxyError, NetworkUnavailable, OSError) as exc:
                    self.h.nemesis(
                        "error", episode=episode, kind=f.kind, error=f"heal: {str(exc)[:300]}"
                    )
                self.busy.difference_update(targets)
                self.h.nemesis("stop", episode=episode, kind=f.kind, targets=targets)

    async def _apply(self, f: Fault) -> tuple[list[str], Callable[[], Any]]:
        """Resolve ``f``'s targets, start it and record it; returns (targets, undo)."""
        rng = random.Random(f.pick)
        k = f.kind
        run = trio.to_thread.run_sync
        c = self.cluster

        async def nothing() -> None:
            pass

        if k in ("kill-broker", "pause-broker", "restart-broker"):
            node, was_leader = self._broker(f, rng)
            if node is None:
                return [], nothing
            self._start(f, [node], was_leader=was_leader, group=c.group_of(node))
            if k == "pause-broker":
                await run(c.freeze, node)
                return [node], lambda: run(c.thaw, node)
            await run(c.kill if k == "kill-broker" else c.terminate, node)
            return [node], lambda: self._revive(node)
        if k in ("kill-etcd", "pause-etcd"):
            node = await self._etcd(f, rng)
            if node is None:
                return [], nothing
            self._start(f, [node])
            if k == "pause-etcd":
                await run(c.freeze, node)
                return [node], lambda: run(c.thaw, node)
            await run(c.kill, node)
            return [node], lambda: self._revive(node)
        if k == "rolling-restart":
            members = [n for n in c.members(f.group) if n not in self.busy and c.live(n)]
            if len(members) != len(c.members(f.group)):
                return [], nothing
            self.busy.update(members)
            self._start(f, members)
            for node in members:
                await run(c.terminate, node)
                await self._revive(node)
                await self._wait_in_sync(f.group, node, 30.0)
            return members, nothing
        if k == "etcd-proxy":
            node, was_leader = self._broker(f, rng)
            if node is None:
                return [], nothing
            mode = f.params["mode"] + (
                f" {f.params['delay_ms']}" if f.params["mode"] == "delay" else ""
            )
            control = c.proxies[node].control_path
            await set_mode(control, mode)
            self._start(f, [node], was_leader=was_leader, group=c.group_of(node), mode=mode)
            return [node], lambda: set_mode(control, "pass")
        if k == "disk-full":
            node, was_leader = self._broker(f, rng)
            if node is None:
                return [], nothing
            self.busy.add(node)
            filled = await run(c.fill_disk, node)
            self._start(f, [node], was_leader=was_leader, group=c.group_of(node), filled=filled)
            return [node], lambda: run(c.free_disk, node)
        if k == "replica-add-remove":
            spare = c.spare(f.group)
            if spare in self.busy or spare in c.added:
                return [], nothing
            self.busy.add(spare)
            self._start(f, [spare], group=f.group)
            try:
                await run(c.add_spare, f.group)
            except BaseException:
                self.busy.discard(spare)
                raise
            await self._wait_in_sync(f.group, spare, 30.0)
            self.h.nemesis("note", node=spare, what="added", broker=c.brokers[spare].broker_id)
            return [spare], lambda: run(c.remove_spare, f.group)
        if k == "handover":
            leader = self.probe.leader_now(f.group)
            if leader is None or leader in self.busy:
                return [], nothing
            self._start(f, [leader], group=f.group)
            cmd = [sys.executable, "-m", "equeue", "cluster", "handover", "--group", f.group, "--broker",
                   ",".join(c.address(n) for n in c.members(f.group) if c.live(n))]  # fmt: skip
            with trio.move_on_after(30):
                r = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT)
                out = (r.stdout + r.stderr).decode(errors="replace").strip()
                self.h.nemesis("handover", group=f.group, rc=r.returncode, output=out[-400:])
            return [leader], nothing
        if k == "stop-etcd":
            members = list(c.etcd)
            if any(n in self.busy or not c.live(n) for n in members):
                return [], nothing
            self._start(f, members)
            await run(in_threads, members, c.terminate)

            async def start_all() -> None:
                await run(in_threads, members, c.revive)

            return members, start_all
        if k == "etcd-restore":
            members = list(c.etcd)
            if any(n in self.busy or not c.live(n) for n in members):
                return [], nothing
            self.busy.update(members)
            await self.admin_lock.acquire()
            try:
                backup = c.root / "etcd-backup.db"
                source = await run(c.etcd_backup, backup)
                await trio.sleep(f.params["drift"])  # the cluster moves on past the backup
                self._start(f, members, backup=source, drift=f.params["drift"])
                await run(c.etcd_restore, backup)
            except BaseException:
                self.admin_lock.release()
                self.busy.difference_update(members)
                raise

            async def operator() -> None:
                try:
                    await self._recover_groups()
                finally:
                    self.admin_lock.release()

            return members, operator
        if k == "degrade":
            node = await self._etcd(f, rng) if f.params.get("etcd") else self._broker(f, rng)[0]
            if node is None:
                return [], nothing
            p = f.params
            self.busy.add(node)
            applied = await run(
                self.net.degrade, node, p["delay_ms"], p["jitter_ms"], p["loss_pct"], p["rate_kbit"]
            )
            self._start(f, [node], applied=applied)
            return [node], lambda: run(self.net.undegrade, node)
        # partitions
        cuts, targets, detail = await self._cuts_for(f, rng)
        if not cuts:
            return [], nothing
        fid = self._next
        self._next += 1
        self._cuts[fid] = cuts
        self.busy.update(targets)
        self._start(f, targets, cuts=sorted(f"{a}<-{b}" for a, b in cuts), **detail)
        await run(self.net.set_partition, self._all_cuts())

        async def undo() -> None:
            self._cuts.pop(fid, None)
            await run(self.net.set_partition, self._all_cuts())

        return targets, undo

    def _start(self, f: Fault, targets: list[str], **detail: Any) -> None:
        self.busy.update(targets)
        self.h.nemesis("start", kind=f.kind, targets=targets, at=f.at, duration=f.duration,
                       pids={n: self.cluster.pid(n) for n in targets if self.cluster.running(n)}, **detail)  # fmt: skip

    def _all_cuts(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for cuts in self._cuts.values():
            out |= cuts
        return out

    async def _cuts_for(
        self, f: Fault, rng: random.Random
    ) -> tuple[set[tuple[str, str]], list[str], dict[str, Any]]:
        c = self.cluster
        nodes = c.nodes
        k = f.kind
        if k == "partition-isolate":
            node = await self._etcd(f, rng) if f.params.get("etcd") else self._broker(f, rng)[0]
            if node is None:
                return set(), [], {}
            others = [n for n in nodes if n != node]
            cuts = {(node, o) for o in [*others, CLIENT]} | {(o, node) for o in others}
            return cuts, [node], {}
        if k == "partition-halves":
            shuffled = sorted(nodes)
            rng.shuffle(shuffled)
            half = len(shuffled) // 2 + rng.randrange(2)
            a, b = shuffled[:half], shuffled[half:]
            cuts = {(x, y) for x in a for y in b} | {(y, x) for x in a for y in b}
            return cuts, sorted(a if len(a) <= len(b) else b), {"sides": [sorted(a), sorted(b)]}
        if k == "partition-oneway":
            node, _ = self._broker(f, rng)
            if node is None:
                return set(), [], {}
            others = [n for n in nodes if n != node]
            senders = rng.sample(others, rng.randint(1, len(others) - 1))
            if f.params.get("reverse"):
                return {(s, node) for s in senders}, [node], {"deaf": sorted(senders), "to": node}
            return {(node, s) for s in senders}, [node], {"deaf": [node], "to": sorted(senders)}
        if k == "partition-leader-etcd":
            node = self.probe.leader_now(f.group)
            if node is None or node in self.busy:
                return set(), [], {}
            return (
                {(node, e) for e in c.etcd} | {(e, node) for e in c.etcd},
                [node],
                {"group": f.group},
            )
        if k == "partition-follower":
            leader = self.probe.leader_now(f.group)
            if leader is None:
                return set(), [], {}
            node, _ = self._broker(f, rng)
            if node is None or node == leader:
                return set(), [], {}
            return {(node, leader), (leader, node)}, [node], {"leader": leader, "group": f.group}
        raise ValueError(k)

    # ------------------------------------------------------------------ targets
    def _broker(self, f: Fault, rng: random.Random) -> tuple[str | None, bool]:
        """The broker ``f`` means (its group's leader or a follower), if live and not
        already hit; the leader falls back to any live member when none is known.
        Returns (node, whether it led)."""
        c = self.cluster
        group = f.group or rng.choice(c.group_names)
        leader = self.probe.leader_now(group)
        live = [n for n in c.members(group) if c.live(n) and n not in self.busy]
        if f.role == "leader" and leader in live:
            return leader, True
        candidates = [n for n in live if n != leader] or live
        if not candidates:
            return None, False
        node = candidates[rng.randrange(len(candidates))]
        return node, node == leader

    async def _etcd(self, f: Fault, rng: random.Random) -> str | None:
        c = self.cluster
        live = [n for n in c.etcd if c.live(n) and n not in self.busy]
        if not live:
            return None
        if f.role == "leader":
            ids: dict[str, str] = {}
            leader_id = ""
            for n in live:
                st = await trio.to_thread.run_sync(c.etcd[n].status)
                if st is not None:
                    ids[str(st.get("header", {}).get("member_id"))] = n
                    leader_id = str(st.get("leader", leader_id))
            if leader_id in ids:
                return ids[leader_id]
        return live[rng.randrange(len(live))]

    async def _recover_groups(self, timeout: float = 45.0) -> None:
        """The operator after etcd was restored (docs/cluster.md, "When etcd loses its
        data: recovery"): every group without a serving leader is recovered with
        ``equeue cluster recover --group G --yes``, again until it has one."""
        c = self.cluster
        with trio.move_on_after(timeout):
            pending = list(c.group_names)
            while pending:
                for group in list(pending):
                    if await self.probe.settled_leader(group) is not None:
                        pending.remove(group)
                        continue
                    cmd = [sys.executable, "-m", "equeue", "cluster", "recover", "--group", group,
                           "--broker", ",".join(c.address(n) for n in c.members(group) if c.live(n)), "--yes"]  # fmt: skip
                    r = await trio.run_process(
                        cmd, capture_stdout=True, capture_stderr=True, check=False, cwd=ROOT
                    )
                    out = (r.stdout + r.stderr).decode(errors="replace").strip()
                    self.h.nemesis("recover", group=group, rc=r.returncode, output=out[-400:])
                if pending:
                    await trio.sleep(1.0)  # the groups take over after a recovery
            return
        self.h.nemesis("note", what=f"groups without a leader {timeout:g} s after the restore")

    # ------------------------------------------------------------------ healing
    async def _revive(self, node: str) -> None:
        for attempt in range(3):
            try:
                await trio.to_thread.run_sync(self.cluster.revive, node)
                return
            except EQueueError as exc:
                self.h.nemesis("revive-failed", node=node, attempt=attempt, error=str(exc)[-400:])
        raise EQueueError(f"{node} did not start again")

    async def _wait_in_sync(self, group: str, node: str, timeout: float) -> None:
        """Wait until ``node`` is back in its group's in-sync set (rolling restarts)."""
        bid = self.cluster.brokers[node].broker_id
        with trio.move_on_after(timeout):
            while True:
                leader = self.probe.leader_now(group, fresh=1.5)
                seen = self.probe.latest.get(leader) if leader else None
                if (
                    seen is not None
                    and bid in seen[1].isr
                    and (leader == node or seen[1].role == "leader")
                ):
                    return
                await trio.sleep(0.1)
        self.h.nemesis("note", node=node, what=f"not back in sync within {timeout:g} s")

    async def heal_all(self) -> None:
        """Undo every fault: partitions and degradations removed, frozen nodes thawed,
        stopped nodes started."""
        self._cuts.clear()
        await trio.to_thread.run_sync(self.net.heal)
        failed = await trio.to_thread.run_sync(self.cluster.heal_processes)
        self.busy.clear()
        self.h.nemesis("heal-all", failed=failed)
