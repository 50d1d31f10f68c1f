"""Rate-limited logging for what a peer can trigger again and again: a record that
keeps failing or a message the broker keeps refusing (the consumer), a client whose
requests keep failing inside the broker (the broker's internal-error tracebacks)."""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """Logs a message at most once per ``interval`` seconds per ``key``; the next one
    logged says how many were suppressed in between. ``clock`` is the caller's clock
    (the consumer passes trio's)."""

    def __init__(self, logger: logging.Logger, interval: float, clock: Callable[[], float]) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(
        self, level: int, key: str, msg: str, *args: object, exc_info: BaseException | None = None
    ) -> None:
        """Log ``msg % args`` (with ``exc_info``'s traceback) unless ``key`` was logged
        less than ``interval`` seconds ago; then only count it."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return
        if len(self._last) > 1024:  # keys are queues and topics: bounded, but be safe
            self._last.clear()
        self._last[key] = now
        n = self._suppressed.pop(key, 0)
        if n:
            msg += " (%d more like it in the last %.0f s)"
            args = (*args, n, self.interval)
        self.logger.log(level, msg, *args, exc_info=exc_info)
