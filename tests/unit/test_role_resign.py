"""ReplicaRole: a leader whose store is not consistent when its takeover lands (a
repair or a copy committed after its campaign began) gives the leadership back, so
another in-sync replica leads; alone in the ISR it keeps the key (no one else may)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio

from equeue.broker.replication.role import ReplicaRole
from equeue.config import BrokerConfig

T = TypeVar("T")


@attrs.define
class State:
    leader_id: str | None
    leader_address: str | None
    epoch: int
    isr: tuple[str, ...]


class Election:
    """Leads at epoch 2 until it resigns (then the other member leads)."""

    def __init__(self, isr: tuple[str, ...]) -> None:
        self.state = State("me", "me:1", 2, isr)
        self.changed = trio.Event()
        self.resigned = 0

    def is_leader(self) -> bool:
        return self.state.leader_id == "me"

    def fenced(self) -> bool:
        return False

    def serving(self) -> bool:
        return self.is_leader()

    def nudge(self) -> None:
        pass

    async def resign(self) -> bool:
        self.resigned += 1
        self.state = State("other", "other:1", 2, self.state.isr)
        return True

    async def set_isr(self, members: Any) -> bool:
        return True


class Replication:
    """A replication log whose repair is not complete: position below consistent_at."""

    position, consistent_at, last_epoch, log_start = 5, 10, 2, 0

    def reload(self) -> None:
        pass


class Store:
    next_global = 0
    replication = Replication()


class Appender:
    async def call(self, fn: Callable[[], T]) -> T:
        return fn()

    def refuse(self, exc: BaseException | None) -> None:
        pass


def role(tmp_path: Path, election: Election) -> ReplicaRole:
    return ReplicaRole(
        store=Store(), appender=Appender(), election=election, follower=None, parked=None,  # type: ignore[arg-type]
        leases=None, lifecycle=None, leader_duties=None, config=BrokerConfig(data_dir=tmp_path),  # type: ignore[arg-type]
        broker_id="me",
    )  # fmt: skip


async def test_an_inconsistent_leader_resigns_when_another_member_can_lead(tmp_path: Path) -> None:
    election = Election(("me", "other"))
    r = role(tmp_path, election)
    with trio.fail_after(5):
        await r._lead(2)
    assert election.resigned == 1 and r.leader_log is None and not election.is_leader()


async def test_an_inconsistent_leader_alone_in_the_isr_keeps_the_key(tmp_path: Path) -> None:
    election = Election(("me",))
    r = role(tmp_path, election)
    with trio.fail_after(5):
        await r._lead(2)
    assert election.resigned == 0 and r.leader_log is None and election.is_leader()
