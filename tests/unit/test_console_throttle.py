"""The console's count of failed sign-ins (pure: an injected clock)."""

from __future__ import annotations

import pytest

from equeue.cli.console.throttle import SignInThrottle


def test_a_key_is_held_after_limit_failures_until_the_oldest_leaves_the_window() -> None:
    now = [0.0]
    t = SignInThrottle(lambda: now[0], limit=3, window=100.0)
    for at in (0.0, 10.0, 20.0):
        assert t.wait("user:a") == 0.0
        now[0] = at
        t.failed("user:a", "addr:x")
    assert t.wait("user:a") == 80.0 and t.wait("addr:x") == 80.0 and t.wait("user:b") == 0.0
    assert t.wait("user:b", "addr:x") == 80.0  # held by the address
    now[0] = 100.0  # the first failure left the window: two remain
    assert t.wait("user:a", "addr:x") == 0.0


def test_a_success_clears_its_key_and_the_keys_are_bounded() -> None:
    now = [0.0]
    t = SignInThrottle(lambda: now[0], limit=2, window=100.0, max_keys=3)
    t.failed("user:a")
    t.failed("user:a")
    assert t.wait("user:a") == 100.0
    t.succeeded("user:a")
    assert t.wait("user:a") == 0.0
    for name in "bcde":
        t.failed(f"user:{name}")
        t.failed(f"user:{name}")
    assert t.wait("user:b") == 0.0  # the oldest key went
    assert t.wait("user:e") == 100.0


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        SignInThrottle(lambda: 0.0, limit=0)


def test_attempts_in_flight_count_so_parallel_guesses_cannot_pass_the_limit() -> None:
    """Ten sign-ins begun at once, none answered yet: the sixth is refused already."""
    now = [0.0]
    t = SignInThrottle(lambda: now[0], limit=5, window=300.0)
    begun = [t.begin("user:a", "addr:x") for _ in range(10)]
    assert begun[:5] == [0.0] * 5 and all(w > 0 for w in begun[5:])
    for _ in range(5):
        t.failed("user:a", "addr:x")
    assert t.begin("user:a") == 300.0 and t.begin("addr:x") == 300.0  # five failures: held for the window
    now[0] = 300.0
    assert t.begin("user:a", "addr:x") == 0.0


def test_a_released_or_successful_attempt_frees_its_slot() -> None:
    t = SignInThrottle(lambda: 0.0, limit=2, window=100.0)
    assert t.begin("user:a", "addr:x") == 0.0 and t.begin("user:a", "addr:x") == 0.0
    assert t.begin("user:a") > 0
    t.released("user:a", "addr:x")  # no answer on the password: nothing counted
    t.failed("user:a", "addr:x")
    assert t.wait("user:a") == 0.0 and t.begin("user:a", "addr:x") == 0.0  # one failure, one in flight
    assert t.wait("user:a") == 100.0
    t.succeeded("user:a", "addr:x")  # the name's failures go; the address keeps its one
    assert t.wait("user:a") == 0.0 and t._pending == {}
