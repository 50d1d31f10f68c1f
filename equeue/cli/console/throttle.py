"""Failed sign-ins, counted per user name and per client address, so that the console
cannot be used to guess passwords at the speed of its connections to the brokers.

Each attempt at the console opens a SCRAM handshake with a broker, and the broker
pauses briefly after a refusal; but many browsers (or one script with many
connections) could still try in parallel. After ``limit`` failures of one user name,
or from one client address, within ``window`` seconds, further sign-ins for it are
refused at once (HTTP 429, without asking a broker) until the oldest of those
failures is ``window`` seconds old. A successful sign-in clears its user name's
failures. What is kept is bounded: the oldest keys go past ``max_keys``.

An attempt counts from its start, not from its answer: :meth:`SignInThrottle.begin`
reserves a slot of each key before the SCRAM exchange is awaited, and
:meth:`~SignInThrottle.failed`, :meth:`~SignInThrottle.succeeded` or
:meth:`~SignInThrottle.released` settle it. So at most ``limit`` attempts per key are
ever in flight or failed within the window, however many are sent in parallel.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

__all__ = ["SignInThrottle"]


class SignInThrottle:
    """Failures per key (``"user:<name>"``, ``"addr:<host>"``) in the last ``window``
    seconds of ``clock``."""

    def __init__(
        self, clock: Callable[[], float], *, limit: int = 5, window: float = 300.0, max_keys: int = 10_000
    ) -> None:
        if limit < 1 or window <= 0 or max_keys < 1:
            raise ValueError("limit and max_keys must be at least 1, and window positive")
        self._clock = clock
        self.limit = limit
        self.window = window
        self._max_keys = max_keys
        self._failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()
        #: attempts begun and not settled yet, per key (bounded by the requests in flight)
        self._pending: dict[str, int] = {}

    def wait(self, *keys: str) -> float:
        """Seconds before a sign-in for ``keys`` may be tried (0: now). Attempts in
        flight count as failures; when they alone fill a key, the wait is 1 s (their
        answer is due within seconds)."""
        now = self._clock()
        longest = 0.0
        for key in keys:
            times = self._recent(key, now)
            failures = len(times) if times is not None else 0
            if failures + self._pending.get(key, 0) >= self.limit:
                longest = max(longest, times[0] + self.window - now if times else 1.0)
        return longest

    def begin(self, *keys: str) -> float:
        """Start a sign-in for ``keys``: 0 and a slot of each key reserved (settle it
        with :meth:`failed`, :meth:`succeeded` or :meth:`released`), or the seconds to
        wait (:meth:`wait`) and nothing reserved."""
        wait = self.wait(*keys)
        if wait <= 0:
            for key in keys:
                self._pending[key] = self._pending.get(key, 0) + 1
        return wait

    def released(self, *keys: str) -> None:
        """A begun sign-in for ``keys`` ended without an answer on the password (bad
        form, no broker answered, cancelled): its slots are freed, nothing is counted."""
        for key in keys:
            left = self._pending.get(key, 0) - 1
            if left > 0:
                self._pending[key] = left
            else:
                self._pending.pop(key, None)

    def failed(self, *keys: str) -> None:
        """A begun sign-in for ``keys`` was refused (wrong user name or password): its
        slots become failures."""
        self.released(*keys)
        now = self._clock()
        for key in keys:
            times = self._recent(key, now)
            if times is None:
                times = self._failures[key] = collections.deque(maxlen=self.limit)
            times.append(now)
            self._failures.move_to_end(key)
        while len(self._failures) > self._max_keys:
            self._failures.popitem(last=False)

    def succeeded(self, *keys: str) -> None:
        """A begun sign-in for ``keys`` went through: its slots are freed and the first
        key's (the user name's) failures forgotten."""
        self.released(*keys)
        if keys:
            self._failures.pop(keys[0], None)

    def _recent(self, key: str, now: float) -> collections.deque[float] | None:
        times = self._failures.get(key)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        return times
