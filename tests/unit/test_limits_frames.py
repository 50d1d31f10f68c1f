"""Pieces of the connection limits that need no broker: the codec's view of a frame
still arriving, and the broker-wide budget for unfinished frames."""

from __future__ import annotations

import trio
from hypothesis import given
from hypothesis import strategies as st

from equeue.broker.connection import FrameBudget
from equeue.codec import NEED_DATA, Connection, Hello, Request, Role


def _server() -> tuple[Connection, Connection]:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.send(Hello()))
    assert isinstance(server.next_event(), Hello)
    return client, server


def test_partial_frame_size_is_known_once_the_length_prefix_is() -> None:
    assert Connection(Role.SERVER).partial_frame_size == 0  # no handshake yet
    client, server = _server()
    frame = client.send(Request(1, 2, b"x" * 1000))
    server.receive_data(frame[:3])
    assert server.next_event() is NEED_DATA and server.partial_frame_size == 0
    server.receive_data(frame[3:500])
    assert server.next_event() is NEED_DATA and server.partial_frame_size == len(frame)
    server.receive_data(frame[500:])
    assert isinstance(server.next_event(), Request) and server.partial_frame_size == 0


@given(st.lists(st.binary(max_size=300), min_size=1, max_size=5), st.integers(min_value=1, max_value=400))
def test_partial_frame_size_names_the_next_frame_whatever_the_split(payloads: list[bytes], cut: int) -> None:
    client, server = _server()
    frames = [client.send(Request(i + 1, 2, p)) for i, p in enumerate(payloads)]
    data = b"".join(frames)
    cut = min(cut, len(data) - 1)
    server.receive_data(data[:cut])
    done = 0
    while server.next_event() is not NEED_DATA:
        done += 1
    whole = sum(len(f) for f in frames[:done])
    expected = len(frames[done]) if cut - whole >= 4 else 0
    assert server.partial_frame_size == expected


async def test_the_frame_budget_makes_a_reservation_wait_until_one_is_released() -> None:
    budget = FrameBudget(100)
    await budget.reserve(60)
    granted = trio.Event()

    async def second() -> None:
        await budget.reserve(60)
        granted.set()

    async with trio.open_nursery() as n:
        n.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        assert not granted.is_set() and budget.reserved == 60
        budget.release(60)
        await granted.wait()
    assert budget.reserved == 60
    budget.release(60)
    await budget.reserve(1000)  # more than the limit: takes the whole budget
    assert budget.reserved == 100
    budget.release(1000)
    assert budget.reserved == 0
