"""Test policy.

- ``tests/unit``: pure and fast, no I/O (codec, wire, routing, allocation, config).
- ``tests/integration``: a REAL broker on 127.0.0.1 **port 0** with LMDB in a **temp dir**
  (``tmp_path``), talking real TCP. Never a mocked broker. Async tests run under
  pytest-trio (``trio_mode = true``); every network test is bounded (``trio.fail_after``
  or the pytest-timeout limit) so a hang fails instead of blocking CI.
- ``tests/spark``: one local Spark session shared by every Spark test of the run
  (``tests/spark/conftest.py``; marker ``spark``).
- Crash tests run the broker as a subprocess (``broker_process``) and SIGKILL it.
- Slow tests carry ``@pytest.mark.slow``; CI still runs them.

Parallel runs (pytest-xdist, ``make test``: ``-n 3 --dist loadgroup``): ports 0, temp dirs and a
per-worker etcd keep tests apart. What cannot share a worker or the machine runs in one xdist
group, so one worker runs it alone among its peers (:data:`XDIST_GROUPS`): the Spark tests share
one SparkSession (a JVM per worker would cost more than it saves), the fault campaign's smoke
run owns network namespaces and loads the machine, and the packaging tests share one wheel
built and installed once (a module fixture, built again by every worker that runs one of them).

Waiting:

- **Wait on conditions, never on time.** A test that needs something to have happened
  (a pull parked, an offset committed, N messages handled) waits for exactly that with
  :func:`wait_until` (async, on trio's clock) or :func:`wait_until_sync` (threads,
  subprocesses), bounded by a timeout that fails the test. A ``sleep`` may simulate
  slow work or pace load; it is not a way to wait for something to happen.
- **Inject the clock.** A test of a timer in pure trio code (no real socket I/O) runs on
  trio's ``MockClock`` (the ``autojump_clock`` fixture of pytest-trio), so it takes no
  wall time and cannot be late on a loaded machine. Times the broker stamps on messages
  (retention, delivery times) are wall-clock by contract; tests of those wait for the
  wall clock to pass the stamped time, with a condition.
- Timing is measured by ``bench/``, never asserted here beyond generous bounds; so
  hypothesis runs without its per-example deadline (a loaded 2-core machine would
  turn it into a timed assertion).
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from hypothesis import settings

from equeue.broker import Broker, EmbeddedBroker, open_broker
from equeue.broker.process import BrokerProcess
from equeue.config import BrokerConfig

settings.register_profile("equeue", deadline=None)
settings.load_profile("equeue")

ROOT = Path(__file__).resolve().parent.parent

#: how often the wait helpers re-check their condition (seconds)
POLL_INTERVAL = 0.005


async def wait_until(
    predicate: Callable[[], object | Awaitable[object]],
    *,
    timeout: float = 10.0,
    interval: float = POLL_INTERVAL,
    what: str = "",
) -> None:
    """Return as soon as ``predicate()`` is truthy (it may be a coroutine function:
    e.g. a stats request), re-checking every ``interval`` seconds on trio's clock (a
    ``MockClock`` too). Fails the test (AssertionError) after ``timeout`` seconds."""
    try:
        with trio.fail_after(timeout):
            while True:
                ok = predicate()
                if inspect.isawaitable(ok):
                    ok = await ok
                if ok:
                    return
                await trio.sleep(interval)
    except trio.TooSlowError:
        raise AssertionError(f"timed out after {timeout:g} s waiting until {what or predicate}") from None


#: path prefix (relative to the repository) -> the xdist group its tests run in
XDIST_GROUPS = {
    "tests/spark/": "spark",
    "tests/chaos/test_chaos_smoke.py": "chaos",
    "tests/packaging/": "packaging",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks (its hook names each group)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put the tests of :data:`XDIST_GROUPS` in their xdist group (used by ``--dist
    loadgroup``), and order the run longest first: the groups (run whole by one worker),
    then the slow tests, then the rest. xdist hands work out in collection order, so a
    long group that starts last no longer ends the run alone."""
    rank: dict[str, int] = {}
    for item in items:
        rel = item.path.relative_to(ROOT).as_posix()
        group = next((g for prefix, g in XDIST_GROUPS.items() if rel.startswith(prefix)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            rank[item.nodeid] = list(XDIST_GROUPS.values()).index(group)
        elif item.get_closest_marker("xdist_group"):  # a module's own group (the browser tests)
            rank[item.nodeid] = len(XDIST_GROUPS)
        else:
            rank[item.nodeid] = len(XDIST_GROUPS) + (1 if item.get_closest_marker("slow") else 2)
    items.sort(key=lambda item: rank[item.nodeid])  # stable: each file keeps its order


@pytest.fixture(autouse=True)
def _grouped_by_xdist(request: pytest.FixtureRequest) -> None:
    """Under ``--dist loadgroup`` a test of an xdist group runs with its group (pytest-xdist
    marks its node id ``@group``): else xdist spreads the group over the workers, and each
    starts its own SparkSession, wheel, browser or cluster. (pytest 9.2 changed node ids so
    that pytest-xdist 3.8 no longer marks them: pyproject.toml keeps pytest below 9.2.)"""
    if request.config.getoption("loadgroup", False) and request.node.get_closest_marker("xdist_group"):
        assert "@" in request.node.nodeid, f"{request.node.nodeid}: --dist loadgroup did not group it"


def wall_ms() -> int:
    """The wall clock in ms: the clock the broker stamps messages and producers with."""
    return time.time_ns() // 1_000_000


async def wait_wall_clock_past(ms: int, *, timeout: float = 10.0) -> None:
    """Wait until the wall clock is past ``ms``: for tests of broker-stamped times
    (a message older than its retention, a mark between two stamps)."""
    await wait_until(lambda: wall_ms() > ms, timeout=timeout, interval=0.001, what=f"the wall clock passes {ms} ms")


T = TypeVar("T")


def in_threads(items: Iterable[T], fn: Callable[[T], object]) -> None:
    """``fn(item)`` for every item at once, one thread each (starting processes costs
    their start-up time, not the sum); raises the first failure once all ended."""
    errors: list[BaseException] = []

    def one(item: T) -> None:
        try:
            fn(item)
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def wait_until_sync(
    predicate: Callable[[], object], *, timeout: float = 10.0, interval: float = POLL_INTERVAL, what: str = ""
) -> None:
    """The blocking twin of :func:`wait_until`, for tests driving threads or child
    processes: poll ``predicate()`` until truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting until {what or predicate}")
        time.sleep(interval)


def make_config(data_dir: Path, **overrides: Any) -> BrokerConfig:
    """A broker config for tests: port 0 on loopback, small map, fast timers."""
    kw: dict[str, Any] = dict(
        data_dir=data_dir, host="127.0.0.1", port=0, map_size=1 << 30, member_expiry=15.0,
        handshake_timeout=2.0, retention_check_interval=3600.0, shutdown_grace=2.0,
    )  # fmt: skip
    kw.update(overrides)
    return BrokerConfig(**kw)


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Broker]:
    """A live broker in this test's trio loop."""
    async with open_broker(make_config(tmp_path / "data")) as b:
        yield b


@pytest.fixture
def embedded_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A live broker in a background thread, for blocking (sync) tests."""
    with EmbeddedBroker(make_config(tmp_path / "data")) as b:
        yield b


@pytest.fixture
def broker_process(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``broker_process(*args)`` starts a broker subprocess on a fixed data dir."""
    procs: list[BrokerProcess] = []

    def factory(*args: str, data_dir: Path | None = None, port: int = 0) -> BrokerProcess:
        p = BrokerProcess(data_dir or tmp_path / "data", *args, port=port).start()
        procs.append(p)
        return p

    yield factory
    for p in procs:
        p.kill()
