"""The tests' wait helpers (tests/conftest.py), on trio's MockClock: no wall time."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from tests.conftest import wait_until


async def test_wait_until_returns_once_the_condition_holds(autojump_clock: trio.testing.MockClock) -> None:
    flag = trio.Event()

    async def later() -> None:
        await trio.sleep(3)
        flag.set()

    start = trio.current_time()
    async with trio.open_nursery() as n:
        n.start_soon(later)
        await wait_until(flag.is_set, timeout=5)
    assert 3 <= trio.current_time() - start < 3.1


async def test_wait_until_awaits_an_async_predicate(autojump_clock: trio.testing.MockClock) -> None:
    calls = 0

    async def third_time() -> bool:
        nonlocal calls
        calls += 1
        await trio.sleep(1)
        return calls == 3

    await wait_until(third_time, timeout=10)
    assert calls == 3


async def test_wait_until_fails_the_test_after_its_timeout(autojump_clock: trio.testing.MockClock) -> None:
    start = trio.current_time()
    with pytest.raises(AssertionError, match="timed out after 2 s waiting until nothing happens"):
        await wait_until(lambda: False, timeout=2, what="nothing happens")
    assert trio.current_time() - start == pytest.approx(2)
