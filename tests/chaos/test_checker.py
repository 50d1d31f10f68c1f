"""The campaign's checker on hand-made histories (no cluster): a clean run is valid,
and each kind of violation it claims to find is found."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from tests.chaos.checker import check
from tests.chaos.history import History


class Run:
    """A run directory written by hand: a history and the final reads."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.h = History(root / "history.jsonl")
        self.final: list[dict[str, Any]] = []
        self.h.observe("admin", "routes", owners={"t": ["g1", "g2"]})

    def send(self, mid: str, key: str | None, queue: int, offset: int, outcome: str = "ok") -> None:
        body = f"{mid}|x".encode()
        op = self.h.invoke(
            mid.split("-")[0],
            "send",
            mid=mid,
            topic="t",
            key=key,
            crc=zlib.crc32(body),
            len=len(body),
        )
        ack = (
            {"topic": "t", "queue": queue, "offset": offset, "duplicate": False}
            if outcome == "ok"
            else {"error": "x"}
        )
        self.h.complete(op, outcome, mid.split("-")[0], "send", mid=mid, **ack)

    def store(
        self, mid: str, key: str | None, queue: int, offset: int, body: bytes | None = None
    ) -> None:
        b = body if body is not None else f"{mid}|x".encode()
        self.final.append({"kind": "message", "topic": "t", "queue": queue, "offset": offset, "mid": mid,
                           "crc": zlib.crc32(b), "len": len(b), "key": key})  # fmt: skip

    def read(
        self, member: str, group: str, mid: str, key: str | None, queue: int, offset: int
    ) -> None:
        b = f"{mid}|x".encode()
        self.h.observe(member, "read", group=group, topic="t", queue=queue, offset=offset, mid=mid,
                       crc=zlib.crc32(b), len=len(b), key=key)  # fmt: skip

    def status(self, node: str, role: str, epoch: int, group: str = "g1") -> None:
        self.h.observe("status", "status", node=node, group=group, broker=node, role=role, epoch=epoch, leader="",
                       position=0, hw=0, isr=[])  # fmt: skip

    def finish(self) -> list[str]:
        self.h.info("settled", ok=True, detail="")
        self.h.info("verify", rc=0, output="")
        self.h.close()
        with (self.root / "final.jsonl").open("w") as f:
            for q in (0, 1):
                msgs = sorted((m for m in self.final if m["queue"] == q), key=lambda m: m["offset"])
                for m in msgs:
                    f.write(json.dumps(m) + "\n")
                f.write(json.dumps({"kind": "queue", "topic": "t", "queue": q, "group": f"g{q + 1}", "ok": True,
                                    "min": 0, "max": len(msgs), "gap": ""}) + "\n")  # fmt: skip
        return sorted({v.kind for v in check(self.root).violations})


def clean(run: Run) -> Run:
    run.status("b0", "leader", 1)
    run.status("b1", "follower", 1)
    for n, key in enumerate(["p0k1", None, "p0k1"]):
        run.send(f"p0-{n}", key, 0, n)
        run.store(f"p0-{n}", key, 0, n)
    run.send("p1-0", None, 1, 0, outcome="unknown")  # unknown, stored: fine
    run.store("p1-0", None, 1, 0)
    run.send("p1-1", None, 1, 1, outcome="unknown")  # unknown, absent: fine
    run.read("m0", "cg-orderly", "p0-0", "p0k1", 0, 0)
    run.read("m0", "cg-orderly", "p0-2", "p0k1", 0, 2)
    return run


def test_a_clean_history_is_valid(tmp_path: Path) -> None:
    assert clean(Run(tmp_path)).finish() == []


def test_an_acknowledged_message_missing_is_lost(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    run.send("p0-3", None, 1, 1)
    assert run.finish() == ["lost"]


def test_stored_twice_changed_moved_and_never_sent(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    run.store("p0-1", None, 1, 1)  # p0-1 again
    run.store("zz-1", None, 1, 2)
    run.send("p0-4", None, 1, 3)
    run.store("p0-4", None, 1, 3, body=b"p0-4|changed")
    run.send("p0-7", None, 1, 9)  # acknowledged at offset 9, stored at 4
    run.store("p0-7", None, 1, 4)
    assert run.finish() == ["corrupt", "duplicate", "moved", "phantom"]


def test_a_key_out_of_order_and_a_read_that_is_gone(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    run.send("p0-5", "p0k9", 1, 2)
    run.send("p0-6", "p0k9", 1, 1)
    run.store("p0-6", "p0k9", 1, 1)
    run.store("p0-5", "p0k9", 1, 2)
    run.read("m1", "cg-plain", "p9-9", None, 1, 7)
    assert run.finish() == ["key-order", "read-gone"]


def test_the_orderly_group_skipping_ahead_in_a_key(tmp_path: Path) -> None:
    run = Run(tmp_path)
    for n in range(3):
        run.send(f"p0-{n}", "p0k1", 0, n)
        run.store(f"p0-{n}", "p0k1", 0, n)
    run.read("m0", "cg-orderly", "p0-0", "p0k1", 0, 0)
    run.read("m0", "cg-orderly", "p0-2", "p0k1", 0, 2)  # p0-1 never handled before it
    run.read("m0", "cg-plain", "p0-2", "p0k1", 0, 2)  # the plain group may
    assert run.finish() == ["orderly-order"]


def test_a_committed_offset_going_back(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    op = run.h.invoke("m0", "commit", group="g", topic="t", queue=0, offset=9)
    run.h.complete(op, "ok", "m0", "commit", group="g", topic="t", queue=0, offset=9)
    op = run.h.invoke("offsets", "query", group="g", topic="t", queue=0)
    run.h.complete(op, "ok", "offsets", "query", group="g", topic="t", queue=0, offset=5)
    assert run.finish() == ["offset-backwards"]


def test_epochs_going_back_and_two_leaders_of_one_epoch(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    run.status("b1", "leader", 2)
    run.status("b0", "leader", 2)
    run.status("b0", "follower", 1)  # a follower reports etcd's record: not judged
    assert run.finish() == ["two-leaders"]
    run = clean(Run(tmp_path))
    run.status("b1", "leader", 3)
    run.status("b0", "leader", 2)  # asked after b1 had led at 3
    assert run.finish() == ["epoch-decreased"]
    run = clean(Run(tmp_path))
    run.status("b0", "leader", 3)
    run.status("b0", "leader", 2)
    assert run.finish() == ["epoch-decreased"]


def test_a_leader_answer_overlapping_a_newer_one_is_not_judged(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    sent = run.h.now()  # b0's request went out before b1 answered: its answer may be older
    run.h.observe("status", "status", sent=run.h.now(), node="b1", group="g1", broker="b1", role="leader", epoch=3,
                  leader="", position=0, hw=0, isr=[])  # fmt: skip
    run.h.observe("status", "status", sent=sent, node="b0", group="g1", broker="b0", role="leader", epoch=2,
                  leader="", position=0, hw=0, isr=[])  # fmt: skip
    assert run.finish() == []


def test_two_brokers_naming_different_holders_at_once(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    # one after the other (a failover, then the new leader's lease): fine
    run.h.observe("leases", "leases", node="b0", group="cg", sent=run.h.now(), held={"t/0": "m0"})
    run.h.observe("leases", "leases", node="b1", group="cg", sent=run.h.now(), held={"t/0": "m1"})
    assert run.finish() == []
    run = clean(Run(tmp_path))
    sent = run.h.now()  # b1's request went out before b0 answered: the windows overlap
    run.h.observe("leases", "leases", node="b0", group="cg", sent=sent, held={"t/0": "m0"})
    run.h.observe(
        "leases", "leases", node="b1", group="cg", sent=sent, held={"t/0": "m1", "t/1": "m1"}
    )
    run.h.observe(
        "leases", "leases", node="b2", group="cg", sent=sent, held={"t/1": "m1"}
    )  # same holder: fine
    assert run.finish() == ["two-holders"]


def test_an_acks_leader_loss_is_counted_not_a_violation(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    run.h.info("config", acks={"g1": "all", "g2": "leader"})
    run.send("p0-3", None, 1, 1)  # queue 1 belongs to g2: acks leader
    r_kinds = run.finish()
    assert r_kinds == []
    r = check(tmp_path)
    assert (r.leader_acked, r.leader_lost) == (1, ["p0-3"])
    run = clean(Run(tmp_path))
    run.h.info("config", acks={"g1": "all", "g2": "leader"})
    run.send("p0-3", None, 0, 3)  # queue 0 belongs to g1: acks all
    assert run.finish() == ["lost"]


def test_failovers_with_and_without_another_fault(tmp_path: Path) -> None:
    run = clean(Run(tmp_path))
    t = run.h.now()
    run.h.nemesis("start", kind="kill-broker", targets=["b0"], was_leader=True, group="g1")
    run.send("p2-0", None, 0, 3)
    run.store("p2-0", None, 0, 3)
    run.h.nemesis("stop", kind="kill-broker", targets=["b0"])
    run.h.nemesis("start", kind="pause-etcd", targets=["e0"])
    run.h.nemesis("start", kind="pause-broker", targets=["g2-1"])  # another group: does not count
    run.h.nemesis("start", kind="kill-broker", targets=["b1"], was_leader=True, group="g1")
    run.send("p2-1", None, 0, 4)
    run.store("p2-1", None, 0, 4)
    run.h.nemesis("stop", kind="kill-broker", targets=["b1"])
    run.h.nemesis("stop", kind="pause-etcd", targets=["e0"])
    assert run.finish() == []
    r = check(tmp_path)
    assert len(r.failovers) == 2 and len(r.failovers_alone) == 1
    assert r.failovers_alone[0] < run.h.now() - t
